"""Data-parallel training of a torch module over one slice."""
import collections

import numpy as np

from .. import _core
from .._program import Spec
from .._sharding import partial, split
from ._functional import Functional, jax_function
from ._program import jit, put


class DataParallel:
    """Trains `module` with `loss_fn(output, target)` (a torch function
    returning the mean loss over its batch) and `optimizer` (AdamW)
    data parallel over `slice_`, whose islands must be of one size.

    A step is one graph of three programs, each compiled once: every
    island's loss and gradient over its part of the batch, scaled by the
    island's share of it (plexus.jit, a partial() output); the runtime's
    all_reduce of the flat gradient between islands; the optimizer's
    update of the replicated parameters and state. Its loss and parameters
    are those of one eager PyTorch step over the whole batch, to float32
    rounding."""

    def __init__(self, module, loss_fn, optimizer, slice_):
        import jax
        from jax.flatten_util import ravel_pytree
        self.slice = slice_
        self.model = Functional(module)
        self.optimizer = optimizer
        loss = jax_function(loss_fn)
        share = _island_share(slice_)
        self._params0 = self.model.init_params()
        flat, unravel = ravel_pytree(self._params0)

        def island_grad(params, x, y):
            """This island's addends of the mean loss and its gradient."""
            value, grads = jax.value_and_grad(
                lambda p: loss(self.model(p, x), y) * share)(params)
            return value, ravel_pytree(grads)[0]

        self._grad = jit(island_grad, slice_, name="torch_island_grad",
                         in_shardings=(None, split(0), split(0)),
                         out_shardings=partial())
        self._all_reduce = slice_.program(
            "all_reduce", Spec(flat.shape, "float32", partial()))
        self._update = jit(
            lambda p, s, g: optimizer.update(p, unravel(g), s), slice_,
            name="torch_adamw")

    def init(self):
        """(params, state): the module's parameters and the optimizer's
        first state, as futures replicated over the slice."""
        import jax
        state = self.optimizer.init(self._params0)
        return (jax.tree_util.tree_map(self.slice.put, self._params0),
                jax.tree_util.tree_map(self.slice.put, state))

    def put_batch(self, inputs, targets):
        """CPU tensors as futures split over the slice along dimension 0."""
        return (put(self.slice, inputs, split(0), "inputs"),
                put(self.slice, targets, split(0), "targets"))

    def step(self, params, state, inputs, targets):
        """One training step, recorded as one graph; returns (loss, params,
        state) as futures at once (the loss is fetched as the whole
        batch's mean)."""
        with self.slice._client.graph():
            value, g = self._grad(params, inputs, targets)
            params, state = self._update(params, state, self._all_reduce(g))
        return value, params, state


def _island_share(slice_):
    """k / n: the part of a split batch one island of k of the slice's n
    devices holds (its islands must be of one size)."""
    sizes = collections.Counter(d["host"] for d in slice_.devices)
    if len(set(sizes.values())) != 1:
        raise _core.InvalidArgumentError(
            f"plexus.torch.DataParallel needs islands of one size, got "
            f"{dict(sizes)} devices per host")
    n = sum(sizes.values())
    return np.float32(next(iter(sizes.values())) / n)
