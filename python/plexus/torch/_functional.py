"""Torch code as pure JAX functions, through torchax: a module's forward
as a function of its parameters, and any torch function of tensors."""
import numpy as np
import torch

from ._errors import torch_errors


def _env():
    import torchax
    return torchax.default_env()


class Functional:
    """`module`'s forward as a pure JAX function of (params, *inputs).

    params is a dict of parameter name (as module.named_parameters() gives
    it; a tied parameter once) to array; the module's buffers are constants
    of the function. Inputs and outputs are JAX arrays; the function
    traces under jax.jit, jax.grad and plexus.jit, and computes what the
    module's forward computes in eager PyTorch (to float32 rounding).
    Tensors the forward creates (torch.arange, torch.ones) are created on
    torchax's device, so a forward written for the CPU traces unchanged."""

    def __init__(self, module):
        from torchax import interop
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"plexus.torch.Functional takes a torch.nn.Module,"
                            f" not {type(module).__name__}")
        self.module = module
        self._jm = interop.JittableModule(module)
        self.__name__ = type(module).__name__

    def init_params(self):
        """The module's parameters now, as numpy arrays (copies)."""
        return {k: v.detach().cpu().numpy().copy()
                for k, v in self._jm.params.items()}

    def __call__(self, params, *inputs):
        import jax.numpy as jnp
        env = _env()
        buffers = {k: jnp.asarray(v.detach().cpu().numpy())
                   for k, v in self._jm.buffers.items()}
        with torch_errors(f"module {self.__name__}"):
            p, b, args = env.j2t_iso((params, buffers, inputs))
            with env, torch.device("jax"):
                out = self._jm.functional_call("forward", p, b, *args)
            return env.t2j_iso(out)


def jax_function(fn):
    """The torch function `fn` (tensors in, tensors out) as a JAX function
    (arrays in, arrays out), traceable like Functional."""
    def run(*args):
        env = _env()
        with torch_errors(f"torch function {getattr(fn, '__name__', fn)}"):
            targs = env.j2t_iso(args)
            with env, torch.device("jax"):
                out = fn(*targs)
            return env.t2j_iso(out)
    run.__name__ = getattr(fn, "__name__", "torch_function")
    return run
