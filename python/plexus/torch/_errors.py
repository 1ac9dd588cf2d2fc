"""Errors in a torch user's terms: a torch op that does not lower to JAX
names the op and the line of the user's module that called it."""
import contextlib
import linecache
import os

import torch

# Frames in these packages are machinery; the first frame outside them,
# from the innermost out, is the user's line.
_MACHINERY = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch,)) + (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,)


class TorchOpNotLowered(NotImplementedError):
    """A torch op that torchax has no JAX lowering for, or whose lowering
    failed while tracing (a shape that depends on values, ...)."""


def _machinery(filename):
    import jax
    import torchax
    dirs = _MACHINERY + tuple(os.path.dirname(m.__file__) + os.sep
                              for m in (jax, torchax))
    return filename.startswith(dirs) or filename.startswith("<")


def _frames(tb):
    out = []
    while tb is not None:
        out.append(tb.tb_frame)
        tb = tb.tb_next
    return out


def op_and_site(exc):
    """(the torch op being dispatched, 'file:line in Module.forward: code')
    for an exception raised while torchax traced a torch function; either
    is None where the traceback does not show it."""
    op, site = None, None
    for frame in _frames(exc.__traceback__):
        func = frame.f_locals.get("func")
        if isinstance(func, (torch._ops.OpOverload,
                             torch._ops.OpOverloadPacket)):
            op = str(func)
        elif op is None and callable(func) and "torchax" in \
                frame.f_code.co_filename:
            op = getattr(func, "__name__", None) or op
        if not _machinery(frame.f_code.co_filename):
            site = _describe(frame)
    return op, site


def _describe(frame):
    code = frame.f_code
    owner = frame.f_locals.get("self")
    where = code.co_name
    if isinstance(owner, torch.nn.Module):
        where = f"{type(owner).__name__}.{where}"
    line = linecache.getline(code.co_filename, frame.f_lineno).strip()
    return f"{code.co_filename}:{frame.f_lineno} in {where}: {line}"


@contextlib.contextmanager
def torch_errors(what):
    """Runs a torch function under torchax; an exception raised by one of
    its ops becomes a TorchOpNotLowered naming `what`, the op and the
    user's source line (the original chained as its cause)."""
    import torchax
    try:
        yield
    except TorchOpNotLowered:
        raise
    except Exception as e:  # noqa: BLE001 - every op failure is explained
        op, site = op_and_site(e)
        if op is None:
            raise
        raise TorchOpNotLowered(
            f"{what}: torch op {op} does not lower to JAX (torchax "
            f"{torchax.__version__}), called at {site or 'an unknown line'}"
            f": {type(e).__name__}: {e}") from e
