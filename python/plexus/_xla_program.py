"""A JAX function lowered by plexus.jit: a Program whose calls take and
return pytrees, with typed PRNG keys and weak types kept as JAX has them.
JAX is imported on first call (plexus itself does not need it).
"""
import numpy as np

from . import _core
from . import _trace
from ._future import Future, signature
from ._program import Program, _recording


def _is_key_dtype(jax, dtype):
    try:
        return dtype is not None and jax.dtypes.issubdtype(
            dtype, jax.dtypes.prng_key)
    except TypeError:
        return False


def _describe(dtype, shape, key=None):
    if key is not None:
        return f"key<{key}> data {np.dtype(dtype)}{list(shape)}"
    return f"{dtype}{list(shape)}"


class XlaProgram(Program):
    """A lowered JAX function: a Program whose calls take and return
    pytrees."""

    def __init__(self, core_program, client, in_tree, out_tree,
                 in_keys=None, out_keys=None, out_weak=None):
        super().__init__(core_program, client)
        self._in_tree = in_tree
        self._out_tree = out_tree
        self._in_keys = in_keys or [None] * len(core_program.inputs)
        self._out_keys = out_keys or [None] * len(core_program.outputs)
        self._out_weak = out_weak or [False] * len(core_program.outputs)
        self._out_sigs = None  # the outputs' signatures, from a first call
        # The outputs a Future's defaults do not describe: typed keys and
        # weakly typed ones, marked on each call's futures.
        self._out_marks = [
            (i, impl, weak) for i, (impl, weak) in enumerate(
                zip(self._out_keys, self._out_weak))
            if impl is not None or weak]
        # The function returns one array (not a tuple or dict of one): its
        # output is the future itself, unflattened by nothing.
        self._one_leaf_out = (len(self._out_keys) == 1
                              and out_tree.num_nodes == 1)

    def _wrap_keys(self, outs, signed=False):
        """Marks the outputs that are typed keys (their key data) and those
        that are weakly typed, and gives each its signature: every call's
        outputs have the first call's (`signed`: made with them)."""
        for i, impl, weak in self._out_marks:
            f = outs[i]
            if impl is not None:
                f._key = impl
            f._weak = weak
        sigs = self._out_sigs
        if sigs is None:
            self._out_sigs = [signature(f) for f in outs]
        elif not signed:
            for f, sig in zip(outs, sigs):
                f._sig = sig
        return outs

    def __call__(self, *args, **kwargs):
        import jax
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        if treedef != self._in_tree:
            raise _core.InvalidArgumentError(
                f"program '{self.name}' was compiled for arguments "
                f"{self._in_tree}, got {treedef}")
        return self._call_leaves(leaves)

    def _invoke_checked(self, core_futures):
        """Calls with core futures already known to match the inputs."""
        sigs = self._out_sigs
        if sigs is not None and not self._out_marks:
            # A training loop's call (its outputs plain arrays, signed by
            # an earlier call): Program._invoke and _wrap_keys in one
            # frame, a third of this path's Python glue.
            client = self._client
            # Called by Jitted.__call__ only: the frame past it is the
            # first that may be outside the package (depth 3 does not
            # materialize Jitted.__call__'s frame object, new each call).
            site = _trace.call_site(client, 3)
            graph = _recording.graph
            if graph is not None and graph._client is client:
                outs = graph._g.call(self._p, core_futures, site)
                graph.calls += 1
            else:
                outs = client._core.call(self._p, core_futures, site)
            if self._one_leaf_out:
                return Future(outs[0], client, sigs[0])
            import jax
            return jax.tree_util.tree_unflatten(
                self._out_tree,
                [Future(o, client, s) for o, s in zip(outs, sigs)])
        outs = self._wrap_keys(self._invoke(core_futures, sigs),
                               signed=sigs is not None)
        if self._one_leaf_out:
            return outs[0]
        import jax
        return jax.tree_util.tree_unflatten(self._out_tree, outs)

    def _call_leaves(self, leaves):
        import jax
        values = []
        for i, (x, (dtype, shape, _), impl) in enumerate(zip(
                leaves, self._p.inputs, self._in_keys)):
            if isinstance(x, Future):
                f = x._f
                if (tuple(f.shape) != tuple(shape) or f.dtype != dtype
                        or x._key != impl):
                    raise _core.InvalidArgumentError(
                        f"program '{self.name}' argument {i} is "
                        f"{_describe(x.dtype, x.shape)} but the program "
                        f"was compiled for "
                        f"{_describe(dtype, shape, impl)}")
                values.append(x)
            else:
                if _is_key_dtype(jax, getattr(x, "dtype", None)):
                    x = jax.random.key_data(x)
                a = np.asarray(x)
                if a.shape == tuple(shape) and a.dtype != dtype:
                    a = a.astype(dtype)  # JAX's canonical dtype (x64 off)
                values.append(a)
        outs = super().__call__(*values)
        if not isinstance(outs, tuple) or len(self._p.outputs) == 1:
            outs = (outs,)
        return jax.tree_util.tree_unflatten(self._out_tree,
                                            self._wrap_keys(list(outs)))
