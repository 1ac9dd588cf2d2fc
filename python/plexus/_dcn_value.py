"""The abstract values of the DCN check (_dcn_check.py's docstring says
what each field means) and how values meet: where several operands of one
primitive, or the branches of a cond, join into one.

Imports nothing from the package.
"""


_ADVICE_SUM = (
    "Return it with out_shardings=plexus.partial() and sum the islands "
    "with all_reduce (slice.program('all_reduce', out)(out)), or keep the "
    "dimension split (out_shardings naming the axis on it)")


_ADVICE_TWO_PROGRAMS = (
    "Return the sum itself with out_shardings=plexus.partial(), sum the "
    "islands with all_reduce, and use the total in a second program")


class Value:
    """The abstract state of one array of the jaxpr (module docstring)."""

    __slots__ = ("split", "varies", "partial", "zero", "bad")

    def __init__(self, split, varies, partial=None, zero=False, bad=None):
        self.split = tuple(split)
        self.varies = tuple(None if s else v for s, v in zip(split, varies))
        self.partial = dict(partial or {})
        self.zero = zero
        self.bad = bad

    @classmethod
    def replicated(cls, ndim, varies=None, zero=False):
        return cls([()] * ndim, [varies] * ndim, zero=zero)

    @classmethod
    def refused(cls, ndim, why, instead=_ADVICE_SUM):
        return cls([()] * ndim, [None] * ndim, bad=(why, instead))

    @property
    def ndim(self):
        return len(self.split)

    def axes(self):
        """The DCN axes over which the value differs between islands."""
        return {a for s in self.split for a in s} | set(self.partial)

    def crosses(self):
        """Whether the value differs between islands at all."""
        return self.bad is not None or bool(self.axes())


def _axes_str(axes):
    return " x ".join(repr(a) for a in axes)


# ----------------------------------------------------------- joining values


def _join(values, shape, prim):
    """Per dimension of the result `shape`, the split and varies of operands
    combined elementwise (size-1 and lower-rank operands broadcast), or a
    refused Value."""
    split, varies = [], []
    ops = [v for v in values if v.ndim == len(shape)]
    for d, size in enumerate(shape):
        cut = {v.split[d] for v in ops if v.split[d]}
        if len(cut) > 1:
            return Value.refused(len(shape), (
                f"{prim} combines dimension {d} split across islands over "
                f"different axes ({', '.join(_axes_str(c) for c in cut)})"),
                "Give the operands the same sharding of that dimension")
        if cut:
            axes = cut.pop()
            for v in ops:
                if not v.split[d] and v.varies[d] is not None:
                    return Value.refused(len(shape), (
                        f"{prim} combines dimension {d}, split across "
                        f"islands over {_axes_str(axes)}, with "
                        f"{v.varies[d]}, which is not split: each island "
                        "pairs its own part with the same values, where "
                        "jax.jit pairs the whole dimension with the whole"),
                        "Split that value over the same axis in "
                        "in_shardings (or draw it from a per-island input "
                        "that is split)")
            split.append(axes)
            varies.append(None)
        else:
            split.append(())
            varies.append(next((v.varies[d] for v in ops
                                if v.varies[d] is not None and size > 1),
                               None))
    return Value(split, varies)


def _join_branches(values, why):
    """The value that is any of `values` (cond's branches, a loop's carry on
    entry and after an iteration): per dimension as elementwise operands
    join (a value constant along a dimension takes any split of it), summed
    over the same axes unless zero."""
    bad = next((v for v in values if v.bad), None)
    if bad is not None:
        return bad
    out = _join(values, (0,) * values[0].ndim, why)
    if out.bad:
        return out
    sums = [v for v in values if not v.zero]
    if any(set(v.partial) != set(sums[0].partial) for v in sums):
        return Value.refused(values[0].ndim, (
            f"{why} gives a value summed across islands in one case and "
            "not in another"),
            "Make every case a per-island addend, or none")
    out.varies = tuple(next((v.varies[d] for v in values if v.varies[d]),
                            None) if not out.split[d] else None
                       for d in range(out.ndim))
    out.partial = dict(sums[0].partial) if sums else {}
    out.zero = not sums
    return out


def _shape(var):
    return tuple(getattr(var.aval, "shape", ()))


def _ndim(var):
    return len(_shape(var))
