"""Shardings: how an array lies over a slice's devices, as the user names
it (None, plexus.P(...), a jax PartitionSpec or NamedSharding,
plexus.split(axis), plexus.replicated()) and as the binding takes it (a
tuple, see _sharding below).

Imports only the binding.
"""
from . import _core


class P(tuple):
    """A PartitionSpec over a slice's mesh axes, as in jax.sharding
    (jax.sharding.PartitionSpec is taken too).

    One entry per array dimension (missing trailing ones: None): None (not
    split), a mesh axis name, or a tuple of names (the dimension is split
    over them, the first major). Mesh axes no entry names hold replicas.
    """

    def __new__(cls, *entries):
        return super().__new__(cls, entries)

    def __repr__(self):
        return "P(" + ", ".join(repr(e) for e in self) + ")"


def replicated():
    return ("replicated", 0)


def split(axis):
    return ("split", int(axis))


def partial():
    return ("partial", 0)


def _is_partition_spec(spec):
    t = type(spec)
    return isinstance(spec, P) or (
        t.__module__.split(".")[0] == "jax"
        and t.__name__ in ("PartitionSpec", "P"))


def _sharding(spec, slice_, ndim):
    """Normalises None / P(...) / jax PartitionSpec / ("split", a) to the
    core's tuple: ("replicated"|"split"|"partial", axis), or ("mesh", axis
    sizes, axis names, per dimension the indices of its axes) for a
    PartitionSpec that is neither a 1-D split nor replicated."""
    if spec is None:
        return replicated()
    if type(spec).__name__ == "NamedSharding":  # jax's: its spec
        spec = spec.spec
    if _is_partition_spec(spec):
        return _mesh_sharding(tuple(spec), tuple(slice_.axis_names),
                              tuple(slice_.mesh_shape), ndim)
    if isinstance(spec, tuple) and len(spec) == 2 and spec[0] in (
            "replicated", "split", "partial"):
        return spec
    if isinstance(spec, tuple) and len(spec) == 4 and spec[0] == "mesh":
        return _core.canonical_sharding(spec)
    raise TypeError(f"not a sharding: {spec!r} (use None, plexus.P(...), "
                    "jax.sharding.PartitionSpec(...), plexus.split(axis) or "
                    "plexus.replicated())")


def _mesh_sharding(entries, axes, sizes, ndim):
    """The core sharding of PartitionSpec `entries` over the mesh `axes`
    (of `sizes`) for an array of `ndim` dimensions."""
    mesh = ", ".join(f"{a!r}: {n}" for a, n in zip(axes, sizes))
    spec = "P(" + ", ".join(repr(e) for e in entries) + ")"
    if len(entries) > ndim:
        raise ValueError(f"{spec} has {len(entries)} entries but the array "
                         f"has {ndim} dimensions")
    dims, used = [], set()
    for e in entries + (None,) * (ndim - len(entries)):
        names = () if e is None else (tuple(e) if isinstance(
            e, (tuple, list)) else (e,))
        idx = []
        for name in names:
            if name not in axes:
                raise ValueError(f"{spec} names {name!r}, which is not an "
                                 f"axis of the slice's mesh {{{mesh}}}")
            if name in used:
                raise ValueError(f"{spec} names mesh axis {name!r} twice")
            used.add(name)
            idx.append(axes.index(name))
        dims.append(tuple(idx))
    return _core.canonical_sharding(("mesh", sizes, axes, tuple(dims)))


def _sharding_repr(t):
    if t[0] == "mesh":
        return _core.sharding_str(t)
    kind, axis = t
    return f"split({axis})" if kind == "split" else kind
