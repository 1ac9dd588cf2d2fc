"""plexus.torch: PyTorch programs on Plexus.

A torch nn.Module's forward, its loss and gradients, and torch.optim.AdamW's
update run as plexus.jit programs on a slice. torchax (the `torchax` package)
turns the torch code into JAX functions while tracing: every torch op is
dispatched to its JAX lowering, so what a worker runs is the StableHLO of
the module's arithmetic, and parameters and optimizer state are pytrees of
futures on the workers, named as module.named_parameters() names them.

    import plexus.torch as pt
    model = pt.Functional(gpt)                  # forward(params, tokens)
    trainer = pt.DataParallel(gpt, loss_fn, pt.AdamW(lr=3e-3), slice_)
    params, state = trainer.init()
    loss, params, state = trainer.step(params, state, tokens, targets)

What does not lower is refused while tracing, naming the torch op and the
line of the module that called it (TorchOpNotLowered, raised as
plexus.UnimplementedError); tensors are checked in torch's terms (a tensor
on another device than the CPU, a dtype other than the one traced).
Autograd is JAX's (jax.grad over the traced forward), not torch's; buffers
are constants of the program (a buffer the forward updates, such as
BatchNorm's running statistics, is not carried).
"""
from ._adamw import AdamW
from ._data_parallel import DataParallel
from ._errors import TorchOpNotLowered
from ._functional import Functional, jax_function
from ._pipeline import pipeline
from ._program import TorchJitted, jit, put, to_numpy

__all__ = ["AdamW", "DataParallel", "Functional", "TorchJitted",
           "TorchOpNotLowered", "jax_function", "jit", "pipeline", "put",
           "to_numpy"]
