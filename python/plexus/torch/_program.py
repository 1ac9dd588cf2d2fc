"""plexus.torch.jit and put: torch tensors as program arguments, checked
in torch's terms (device, dtype) before they become futures."""
import numpy as np
import torch

from .. import _core
from .._future import Future
from .._jit import jit as _plexus_jit


def _x64():
    import jax
    return bool(jax.config.jax_enable_x64)


def to_numpy(name, tensor, traced_dtype=None):
    """The numpy array a torch tensor travels as, or InvalidArgumentError
    naming the argument: a tensor on another device than the CPU (the
    workers hold the data; the client sends host memory), a dtype other
    than the one the program was traced for (`traced_dtype`, a torch
    dtype), and a float64 tensor while JAX's 64-bit types are off (it would
    run as float32). An int64 tensor travels as int32 when they are off
    (indices), if its values fit."""
    if tensor.device.type != "cpu":
        raise _core.InvalidArgumentError(
            f"argument {name} is a tensor on device {tensor.device}; Plexus "
            "programs take CPU tensors (the client sends host memory to the "
            f"workers): pass {name}.cpu()")
    if traced_dtype is not None and tensor.dtype != traced_dtype:
        raise _core.InvalidArgumentError(
            f"argument {name} is a {tensor.dtype} tensor, but the program "
            f"was traced for {traced_dtype}; pass {name}.to({traced_dtype})"
            " (a new program for another dtype would be a second compile)")
    a = tensor.detach().numpy()
    if _x64():
        return a
    if a.dtype == np.float64:
        raise _core.InvalidArgumentError(
            f"argument {name} is a torch.float64 tensor; Plexus traces torch "
            "programs with JAX's 64-bit types off, so it would run as "
            f"float32: pass {name}.float() (or set jax_enable_x64 to trace "
            "float64)")
    if a.dtype == np.int64:
        if a.size and (a.min() < -2**31 or a.max() >= 2**31):
            raise _core.InvalidArgumentError(
                f"argument {name}: an int64 tensor with values outside "
                "int32, which it travels as while JAX's 64-bit types are off")
        return a.astype(np.int32)
    return a


def put(slice_, tensor, sharding=None, name="tensor"):
    """A future on `slice_` holding a CPU torch tensor's values (checked
    as to_numpy checks them), laid out by `sharding` (None: replicated)."""
    return slice_.put(to_numpy(name, tensor), sharding)


class TorchJitted:
    """plexus.jit over a JAX function of torch code (Functional,
    jax_function), taking torch tensors as well as futures and arrays.

    The first call fixes each tensor argument's torch dtype; a later call
    with another dtype is refused in torch's terms, as is a tensor on
    another device than the CPU (to_numpy)."""

    def __init__(self, fn, slice_, **options):
        self._jitted = _plexus_jit(fn, slice_, **options)
        self._dtypes = None  # torch dtype of each positional argument

    @property
    def slice(self):
        return self._jitted.slice

    def __call__(self, *args):
        import jax
        is_leaf = lambda x: isinstance(x, (torch.Tensor, Future))  # noqa
        pairs, treedef = jax.tree_util.tree_flatten_with_path(
            args, is_leaf=is_leaf)
        dtypes = [x.dtype if isinstance(x, torch.Tensor) else None
                  for _, x in pairs]
        if self._dtypes is None or len(self._dtypes) != len(dtypes):
            self._dtypes = dtypes
        leaves = [to_numpy(_arg_name(path), x, traced)
                  if isinstance(x, torch.Tensor) else x
                  for (path, x), traced in zip(pairs, self._dtypes)]
        return self._jitted(*jax.tree_util.tree_unflatten(treedef, leaves))


def _arg_name(path):
    """args[0]['w'] for the path of a leaf of the argument tuple."""
    import jax
    return "args" + jax.tree_util.keystr(path)


def jit(fn, slice, **options):
    """plexus.jit(fn, slice, **options) for a JAX function of torch code,
    whose calls also take torch tensors (TorchJitted)."""
    return TorchJitted(fn, slice, **options)
