"""Programs: a program compiled for a slice (called like a function),
the static inputs it is compiled for (Spec), and graphs of calls sent
in batches.
"""
import threading

import numpy as np

from . import _core
from . import _trace
from ._future import Future, _put
from ._sharding import _sharding_repr


class Spec:
    """A static input of a program: shape, dtype and sharding."""

    def __init__(self, shape, dtype="float32", sharding=None):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.sharding = sharding

    def __repr__(self):
        return f"Spec({self.shape}, {self.dtype}, {self.sharding!r})"


class _Recording(threading.local):
    # The Graph recording on this thread. A class attribute, so that a
    # thread that never opened one reads None without a failed lookup (an
    # AttributeError made and dropped on every call).
    graph = None


_recording = _Recording()


class Program:
    """A program compiled for a slice; call it like a function."""

    def __init__(self, core_program, client):
        self._p = core_program
        self._client = client
        self._num_inputs = len(core_program.inputs)

    @property
    def name(self):
        return self._p.name

    @property
    def input_specs(self):
        return [(tuple(s), d, _sharding_repr(sh)) for d, s, sh in self._p.inputs]

    @property
    def output_specs(self):
        return [(tuple(s), d, _sharding_repr(sh)) for d, s, sh in self._p.outputs]

    def __call__(self, *args):
        if len(args) == self._num_inputs:
            # Every argument a future (a round trip's, a loop's call): no
            # spec read, no put; the client checks each against its input.
            fs = []
            for arg in args:
                if type(arg) is not Future:
                    break
                fs.append(arg._f)
            else:
                wrapped = self._invoke(fs)
                return wrapped[0] if len(wrapped) == 1 else tuple(wrapped)
        # The server's rule (common/argument_count.h), before any put.
        self._p.check_argument_count(len(args))
        inputs = self._p.inputs
        futures = []
        for i, (arg, (dtype, shape, sharding)) in enumerate(zip(args, inputs)):
            if isinstance(arg, Future):
                futures.append(arg._f)
                continue
            a = np.asarray(arg)
            if a.shape != tuple(shape) or a.dtype != dtype:
                raise _core.InvalidArgumentError(
                    f"program '{self.name}' argument {i} has "
                    f"{a.dtype}{list(a.shape)} but the program was compiled "
                    f"for {np.dtype(dtype)}{list(shape)}")
            futures.append(_put(self._client, self._p.slice, a, sharding))
        wrapped = self._invoke(futures)
        return wrapped[0] if len(wrapped) == 1 else tuple(wrapped)

    def _invoke(self, core_futures, sigs=None):
        """Calls (or records in the current graph) with checked inputs;
        returns the list of output Futures (with `sigs`, their signatures:
        signature())."""
        graph = _recording.graph
        site = _trace.call_site(self._client)
        if graph is not None and graph._client is self._client:
            outs = graph._g.call(self._p, core_futures, site)
            graph.calls += 1
        else:
            outs = self._client._core.call(self._p, core_futures, site)
        client = self._client
        if sigs is not None:
            return [Future(o, client, s) for o, s in zip(outs, sigs)]
        return [Future(o, client) for o in outs]

    def __repr__(self):
        return f"Program({self.name!r}, kernel={self._p.kernel!r})"


class Graph:
    """Calls recorded and sent in batches, in order.

        with client.graph():
            y = f(x)
            z = g(y)      # both reach the server in one batch, in order

    A long graph sends a batch each 128 ops recorded (after a wait on a
    result the first at 16 ops, then doubling: the cluster runs its first
    calls while the rest are recorded) and the rest at the block's end.
    Every call recorded is made, as a call outside a graph is: an
    exception in the block does not undo the calls before it.
    """

    def __init__(self, client):
        self._client = client
        self._g = client._core.graph()
        self.calls = 0  # calls recorded, including those already submitted

    def __enter__(self):
        if _recording.graph is not None:
            raise RuntimeError("graphs do not nest")
        _recording.graph = self
        return self

    def __exit__(self, exc_type, *exc):
        _recording.graph = None
        if exc_type is None:
            self._g.submit()
            return False
        # The block raised: its calls were made all the same. If they
        # cannot be sent (the client closed), their outputs say so, and
        # the block's own exception goes on.
        try:
            self._g.submit()
        except _core.PlexusError:
            pass
        return False

    def __len__(self):
        return len(self._g)
