"""How a slice's layouts look from inside one island (the slice's devices on
one worker), for lowering a plexus.jit function (_jit.py): the island's
abstract mesh, its shapes and PartitionSpecs, and the errors of a function
that names an axis crossing islands."""
import numpy as np

from . import _core


def abstract_mesh(sizes, names):
    """An abstract mesh whose axes are all Auto: jax.jit's default until
    jax 0.11 made Explicit the default (the GPU machine's jax), under which
    an island's sharded lowering changes meaning. Said explicitly, the same
    program lowers on both."""
    from jax.sharding import AbstractMesh
    try:
        from jax.sharding import AxisType
    except ImportError:  # older jax: every axis is Auto
        return AbstractMesh(tuple(sizes), tuple(names))
    return AbstractMesh(tuple(sizes), tuple(names),
                        axis_types=(AxisType.Auto,) * len(names))



class IslandLayout:
    """How a slice's layouts look from inside one island (the slice's
    devices on one worker), for lowering.

    A 1-D mesh without dcn_axes (the original model): the island is a 1-D
    abstract mesh named `axis_name` of its k devices; a split(a) array of
    length L over n devices appears with length L * k / n, split over it.

    A mesh of several axes (or one with dcn_axes): the island is the
    sub-mesh of the axes that are not DCN axes, with their names and
    sizes, so code naming them ("fsdp", "tensor") works unchanged. A
    PartitionSpec's DCN axes say which part of the array the island holds
    (dimension d appears divided by the sizes of the DCN axes splitting
    it); its other axes become the island's NamedSharding.
    """

    def __init__(self, slice_, islands, axis_name, what):
        self._axis = axis_name
        self._what = what
        self.axes = tuple(slice_.axis_names)
        self.sizes = tuple(int(x) for x in slice_.mesh_shape)
        self.dcn = tuple(slice_.dcn_axes)
        self.multi = len(self.axes) > 1 or bool(self.dcn)
        # The axes whose points lie on different islands: a 1-D slice over
        # several islands has its one axis; a mesh, its DCN axes (size > 1).
        size = dict(zip(self.axes, self.sizes))
        self.crossing = () if len(islands) < 2 else (
            tuple(a for a in self.dcn if size[a] > 1) if self.multi
            else self.axes[:1])
        if not self.multi:
            return
        self.ici = tuple(a for a in self.axes if a not in self.dcn)
        self.ici_sizes = tuple(n for a, n in zip(self.axes, self.sizes)
                               if a not in self.dcn)
        per_island = int(np.prod(self.ici_sizes, dtype=np.int64))
        mesh = ", ".join(f"{a!r}: {n}" for a, n in zip(self.axes, self.sizes))
        if not self.dcn and len(islands) > 1:
            raise _core.InvalidArgumentError(
                f"{what}: the slice's mesh {{{mesh}}} spans {len(islands)} "
                "islands (hosts); say which of its axes cross them: "
                "client.slice(mesh=..., dcn_axes=(...))")
        for worker, devs in islands:
            if len(devs) != per_island:
                raise _core.InvalidArgumentError(
                    f"{what}: the slice's mesh {{{mesh}}} has "
                    f"dcn_axes {self.dcn}, so each island must hold the "
                    f"{per_island} devices of the other axes, but worker "
                    f"{worker} holds {len(devs)}; ask for the slice with "
                    "client.slice(mesh=..., dcn_axes=(...)) naming the "
                    "axes that cross hosts")

    def island_mesh(self, k):
        """(axis sizes, axis names) of the island's abstract mesh."""
        if not self.multi:
            return (k,), (self._axis,)
        return self.ici_sizes, self.ici

    def _dims(self, sh, ndim):
        """Per array dimension, the names of the mesh axes splitting it."""
        if sh[0] == "split":
            return [self.axes if d == sh[1] else () for d in range(ndim)]
        if sh[0] == "mesh":
            _, sizes, names, dims = sh
            return [tuple(names[a] for a in axes) for axes in dims]
        return [()] * ndim

    def check_input(self, what, dtype, shape, sh, n):
        if sh[0] == "mesh" and (tuple(sh[1]) != self.sizes
                                or tuple(sh[2]) != self.axes):
            raise _core.InvalidArgumentError(
                f"{what} is laid out over another mesh "
                f"({_core.sharding_str(sh)}); give its layout on this "
                "slice in in_shardings (the runtime moves it there)")
        size = dict(zip(self.axes, self.sizes))
        for d, names in enumerate(self._dims(sh, len(shape))):
            parts = int(np.prod([size[a] for a in names], dtype=np.int64))
            if shape[d] % parts:
                raise _core.InvalidArgumentError(
                    f"{what}: dimension {d} of {dtype}{list(shape)} does not "
                    f"split evenly over {parts} devices")

    def island_spec(self, sh, ndim):
        """The island's PartitionSpec entries for a core sharding."""
        if not self.multi:
            entries = [None] * ndim
            if sh[0] == "split":
                entries[sh[1]] = self._axis
            return entries
        entries = []
        for names in self._dims(sh, ndim):
            inner = tuple(a for a in names if a not in self.dcn)
            entries.append(None if not inner else
                           inner[0] if len(inner) == 1 else inner)
        return entries

    def crossing_dims(self, sh, ndim):
        """Per dimension, the axes crossing islands that split it: each
        island holds one block of that dimension (_dcn_check.py)."""
        if sh[0] == "partial":
            return "partial"
        if not self.multi:
            return [self.crossing if sh[0] == "split" and d == sh[1] else ()
                    for d in range(ndim)]
        return [tuple(a for a in names if a in self.crossing)
                for names in self._dims(sh, ndim)]

    def _dcn_parts(self, names):
        size = dict(zip(self.axes, self.sizes))
        return int(np.prod([size[a] for a in names if a in self.dcn],
                           dtype=np.int64))

    def island_shape(self, shape, sh, k, n):
        """The shape of the island's part of a global array."""
        local = list(shape)
        if not self.multi:
            if sh[0] == "split":  # the island's k shards of n
                local[sh[1]] = local[sh[1]] // n * k
            return local
        for d, names in enumerate(self._dims(sh, len(shape))):
            local[d] //= self._dcn_parts(names)
        return local

    def global_shape(self, what, dtype, shape, sh, k, n):
        """The global shape of an output the island computes as `shape`."""
        if not self.multi:
            if sh[0] == "split":
                axis = sh[1]
                if shape[axis] % k:
                    raise _core.InvalidArgumentError(
                        f"{what}: dimension {axis} of {dtype}{shape} does "
                        f"not split over the island's {k} devices")
                shape[axis] = shape[axis] // k * n
            return shape
        size = dict(zip(self.axes, self.sizes))
        for d, names in enumerate(self._dims(sh, len(shape))):
            inner = int(np.prod([size[a] for a in names if a not in self.dcn],
                                dtype=np.int64))
            if shape[d] % inner:
                raise _core.InvalidArgumentError(
                    f"{what}: dimension {d} of {dtype}{shape} does not split "
                    f"over the island's {inner} devices")
            shape[d] *= self._dcn_parts(names)
        return shape

    def traces_with_dcn_axes(self, jax, flat_fn, specs, k, n):
        """Whether the function, which failed to trace over the island's
        mesh, traces once the DCN axes are there too (as axes of size 1,
        for this diagnosis only): then it names one of them."""
        if not self.multi or not self.dcn:
            return False
        from jax.sharding import NamedSharding, PartitionSpec
        sizes = tuple(1 if a in self.dcn else n_
                      for a, n_ in zip(self.axes, self.sizes))
        mesh = abstract_mesh(sizes, self.axes)
        avals = [jax.ShapeDtypeStruct(
            tuple(self.island_shape(shape, sh, k, n)), np.dtype(dtype),
            sharding=NamedSharding(mesh, PartitionSpec(
                *self.island_spec(sh, len(shape)))))
            for dtype, shape, sh, _ in specs]
        try:
            with jax.sharding.use_abstract_mesh(mesh):
                jax.eval_shape(flat_fn, *avals)
        except Exception:  # noqa: BLE001 - it fails for another reason
            return False
        return True

    def explain_dcn_axis(self, e, named=False):
        """Raises a clear error if `e` comes from the function naming a DCN
        axis, which the island's mesh does not have (`named`: known to)."""
        if not self.multi:
            return
        text = str(e)
        for a in self.dcn:
            if (named and len(self.dcn) == 1) or any(
                    p in text for p in (f"'{a}'", f'"{a}"',
                                        f"axis name: {a}", f"axis: {a}")):
                raise _core.InvalidArgumentError(
                    f"{self._what}: mesh axis {a!r} crosses islands (dcn_axes {self.dcn}): "
                    "inside a program XLA partitions over the island's own "
                    f"axes {self.ici} only, so a collective or sharding "
                    f"constraint cannot name {a!r}. Between islands Plexus "
                    f"moves the data: shard over {a!r} with in_shardings / "
                    "out_shardings, and sum over it by returning the value "
                    "with out_shardings=plexus.partial() and calling "
                    f"all_reduce. ({type(e).__name__}: {e})") from e
        if named:
            raise _core.InvalidArgumentError(
                f"{self._what}: the function names one of the mesh axes "
                f"{self.dcn}, which cross islands (dcn_axes): inside a "
                f"program XLA partitions over the island's own axes "
                f"{self.ici} only. Shard over them with in_shardings / "
                "out_shardings, and sum over them with "
                "out_shardings=plexus.partial() and all_reduce. "
                f"({type(e).__name__}: {e})") from e
