"""The rule table of the DCN check: for each primitive (by name), a rule
from the abstract Values of its inputs to its outputs' (the families are
in _dcn_check.py's docstring). A rule returns None where it cannot tell;
the driver then refuses any value that differs between islands.

Control flow (jit, cond, while, scan, ...), whose rules run the driver on
a sub-jaxpr, is the driver's own (_dcn_check.CONTROL_FLOW): nothing here
imports back up.
"""
import numpy as np

from ._dcn_value import _ADVICE_TWO_PROGRAMS, Value, _axes_str, _join, _ndim, _shape


# ------------------------------------------------------- elementwise rules


def _linear(eqn, ins):
    """add, sub, neg, ...: a partial value stays partial when every operand
    is partial over the same axes or zero."""
    out = _join(ins, _shape(eqn.outvars[0]), eqn.primitive.name)
    if out.bad:
        return [out]
    partial = [v for v in ins if v.partial and not v.zero]
    if partial:
        axes = set(partial[0].partial)
        for v in ins:
            if not v.zero and set(v.partial) != axes:
                return [_not_linear(eqn, partial[0], v)]
        out.partial = dict(partial[0].partial)
    out.zero = all(v.zero for v in ins)
    return [out] * len(eqn.outvars)


def _not_linear(eqn, p, other):
    origin = "; ".join(p.partial.values())
    if not other.crosses():
        why = (f"{eqn.primitive.name} adds a per-island addend ({origin}) to "
               "a value that is the same on every island: summed over "
               "islands, that value would be counted once per island")
    else:
        why = (f"{eqn.primitive.name} combines a per-island addend "
               f"({origin}) with a value split across islands: each island "
               "would use the sum of its own part where jax.jit uses the "
               "sum of the whole")
    return Value.refused(_ndim(eqn.outvars[0]), why, _ADVICE_TWO_PROGRAMS)


def _product(eqn, ins, linear_in=None):
    """mul, div, select_n: linear in one operand (`linear_in`: which may be
    partial) when the others are the same on every island."""
    out = _join(ins, _shape(eqn.outvars[0]), eqn.primitive.name)
    if out.bad:
        return [out]
    out.zero = eqn.primitive.name == "mul" and any(v.zero for v in ins)
    partial = [i for i, v in enumerate(ins) if v.partial and not v.zero]
    if not partial:
        return [out]
    allowed = range(len(ins)) if linear_in is None else linear_in
    if eqn.primitive.name == "select_n":
        cases = ins[1:]
        axes = set(ins[partial[0]].partial)
        if (0 in partial or any(not v.zero and set(v.partial) != axes
                                for v in cases)
                or ins[0].axes() & axes):
            return [_nonlinear_of_partial(eqn, ins[partial[0]])]
        out.partial = dict(ins[partial[0]].partial)
        out.zero = all(v.zero for v in cases)
        return [out]
    if len(partial) > 1 or partial[0] not in allowed:
        return [_nonlinear_of_partial(eqn, ins[partial[0]])]
    p = ins[partial[0]]
    for i, v in enumerate(ins):
        if i != partial[0] and v.axes() & set(p.partial):
            return [_nonlinear_of_partial(eqn, p)]
    out.partial = dict(p.partial)
    return [out]


def _nonlinear_of_partial(eqn, p):
    origin = "; ".join(p.partial.values())
    return Value.refused(_ndim(eqn.outvars[0]), (
        f"{eqn.primitive.name} of a per-island addend ({origin}): applied "
        "to each island's part of a sum it does not give its value of the "
        "whole sum"), _ADVICE_TWO_PROGRAMS)


def _nonlinear(eqn, ins):
    """exp, max, eq, ...: elementwise, a partial operand refused."""
    out = _join(ins, _shape(eqn.outvars[0]), eqn.primitive.name)
    if out.bad:
        return [out] * len(eqn.outvars)
    p = next((v for v in ins if v.partial and not v.zero), None)
    if p is not None:
        return [_nonlinear_of_partial(eqn, p)] * len(eqn.outvars)
    return [Value(out.split, out.varies) for _ in eqn.outvars]


def _convert(eqn, ins):
    """convert_element_type: linear between floating (complex) dtypes."""
    src, dst = eqn.invars[0].aval.dtype, eqn.params["new_dtype"]
    if _inexact(src) and _inexact(dst):
        return _linear(eqn, ins)
    outs = _nonlinear(eqn, ins)
    if ins[0].zero and not outs[0].bad:
        outs[0].zero = True  # 0 in any dtype is 0 (jnp.pad's fill, say)
    return outs


def _inexact(dtype):
    return np.issubdtype(np.dtype(dtype), np.inexact) or str(dtype) in (
        "bfloat16",) or str(dtype).startswith("float8")


# -------------------------------------------------------- structural rules


def _carried(v, split, varies):
    """`v`'s partial / zero with a new layout."""
    return Value(split, varies, v.partial, v.zero)


def _broadcast_in_dim(eqn, ins):
    v, shape = ins[0], _shape(eqn.outvars[0])
    src = _shape(eqn.invars[0])
    split, varies = [()] * len(shape), [None] * len(shape)
    for od, d in zip(range(v.ndim), eqn.params["broadcast_dimensions"]):
        if src[od] == 1 and shape[d] != 1:
            if v.split[od]:
                return [_cut(eqn, v, od, "broadcasts")]
            continue
        split[d], varies[d] = v.split[od], v.varies[od]
    return [_carried(v, split, varies)]


def _cut(eqn, v, d, verb, instead=None):
    """A value refused because `eqn` `verb` dimension d of `v`, split
    across islands."""
    return Value.refused(_ndim(eqn.outvars[0]), (
        f"{eqn.primitive.name} {verb} dimension {d}, which is split across "
        f"islands over {_axes_str(v.split[d])}: each island holds only its "
        "part of it, so the result would need the other islands' parts"),
        instead or (
            "Keep the split dimension whole in the function (or gather it "
            "first: out_shardings that leave it split, then a program with "
            "in_shardings that replicate it)"))


def _reshape(eqn, ins):
    v = ins[0]
    src, dst = _shape(eqn.invars[0]), _shape(eqn.outvars[0])
    if eqn.params.get("dimensions") is not None and v.crosses():
        return [_cut(eqn, v, next(d for d in range(v.ndim)
                                  if v.split[d]) if any(v.split) else 0,
                     "transposes")]
    split, varies = [()] * len(dst), [None] * len(dst)
    for d in range(len(src)):
        if src[d] == 1 and v.split[d]:
            return [_cut(eqn, v, d, "drops or moves")]
    for ins_g, outs_g in _reshape_groups(src, dst):
        cut = [d for d in ins_g if v.split[d]]
        if cut and (len(cut) > 1 or cut[0] != ins_g[0] or not outs_g):
            return [_cut(eqn, v, cut[-1], "merges or divides (not as the "
                         "major-most dimension)")]
        if cut:
            split[outs_g[0]] = v.split[cut[0]]
        origin = next((v.varies[d] for d in ins_g if v.varies[d]), None)
        for d in outs_g:
            if not split[d]:
                varies[d] = origin
    return [_carried(v, split, varies)]


def _reshape_groups(src, dst):
    """Pairs (input dims, output dims), the non-1 dimensions of src and dst
    grouped where their products meet."""
    a = [d for d in range(len(src)) if src[d] != 1]
    b = [d for d in range(len(dst)) if dst[d] != 1]
    groups, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        gi, gj, pi, pj = [], [], 1, 1
        while True:
            if pi <= pj and i < len(a):
                gi.append(a[i])
                pi *= src[a[i]]
                i += 1
            elif j < len(b):
                gj.append(b[j])
                pj *= dst[b[j]]
                j += 1
            else:
                break
            if pi == pj and gi and gj:
                break
        groups.append((gi, gj))
    return groups


def _transpose(eqn, ins):
    v, perm = ins[0], eqn.params["permutation"]
    return [_carried(v, [v.split[p] for p in perm],
                     [v.varies[p] for p in perm])]


def _squeeze(eqn, ins):
    v, dims = ins[0], [d % ins[0].ndim for d in eqn.params["dimensions"]]
    for d in dims:
        if v.split[d]:
            return [_cut(eqn, v, d, "drops")]
    keep = [d for d in range(v.ndim) if d not in dims]
    return [_carried(v, [v.split[d] for d in keep],
                     [v.varies[d] for d in keep])]


def _rev(eqn, ins):
    v = ins[0]
    for d in eqn.params["dimensions"]:
        if v.split[d]:
            return [_cut(eqn, v, d, "reverses")]
    return [_carried(v, v.split, v.varies)]


def _slice(eqn, ins):
    v, src = ins[0], _shape(eqn.invars[0])
    p = eqn.params
    strides = p.get("strides") or (1,) * v.ndim
    for d in range(v.ndim):
        if v.split[d] and (p["start_indices"][d] != 0 or strides[d] != 1
                           or p["limit_indices"][d] != src[d]):
            return [_cut(eqn, v, d, "takes part of")]
    return [_carried(v, v.split, v.varies)]


def _dynamic_slice(eqn, ins):
    v, idx = ins[0], ins[1:]
    src = _shape(eqn.invars[0])
    for d in range(v.ndim):
        if v.split[d] and eqn.params["slice_sizes"][d] != src[d]:
            return [_cut(eqn, v, d, "takes part of")]
    if any(i.crosses() for i in idx):
        return [_index_differs(eqn)]
    return [_carried(v, v.split, v.varies)]


def _index_differs(eqn):
    return Value.refused(_ndim(eqn.outvars[0]), (
        f"{eqn.primitive.name} takes its start index from a value that "
        "differs between islands"),
        "Compute the index from values that are the same on every island")


def _dynamic_update_slice(eqn, ins):
    v, upd, idx = ins[0], ins[1], ins[2:]
    src, usz = _shape(eqn.invars[0]), _shape(eqn.invars[1])
    for d in range(v.ndim):
        if (v.split[d] or upd.split[d]) and usz[d] != src[d]:
            return [_cut(eqn, v if v.split[d] else upd, d, "updates part of")]
    if any(i.crosses() for i in idx):
        return [_index_differs(eqn)]
    return _linear(eqn, [v, upd])


def _concatenate(eqn, ins):
    dim = eqn.params["dimension"]
    for v in ins:
        if v.split[dim]:
            return [_cut(eqn, v, dim, "concatenates along")]
    out = _linear(eqn, ins)[0]
    if not out.bad:
        origin = next((v.varies[dim] for v in ins if v.varies[dim]), None)
        out.varies = out.varies[:dim] + (origin or "concatenate",) + \
            out.varies[dim + 1:]
    return [out]


def _pad(eqn, ins):
    v, fill = ins
    for d, (lo, hi, interior) in enumerate(eqn.params["padding_config"]):
        if v.split[d] and (lo or hi or interior):
            return [_cut(eqn, v, d, "pads")]
    if v.partial and not v.zero and not fill.zero:
        return [_nonlinear_of_partial(eqn, v)]
    if fill.crosses():
        return [_index_differs(eqn)]
    varies = [v.varies[d] if not any(c) else (v.varies[d] or "pad")
              for d, c in enumerate(eqn.params["padding_config"])]
    return [Value(v.split, varies, v.partial, v.zero and fill.zero)]


def _split(eqn, ins):
    v, axis = ins[0], eqn.params["axis"]
    if v.split[axis]:
        return [_cut(eqn, v, axis, "splits")] * len(eqn.outvars)
    return [_carried(v, v.split, v.varies) for _ in eqn.outvars]


def _gather(eqn, ins):
    """operand[indices]: the operand's indexed dimensions must not be split;
    its offset dimensions are carried whole; the indices' dimensions (and
    batching ones) become the result's batch dimensions."""
    v, ix = ins
    dn, sizes = eqn.params["dimension_numbers"], eqn.params["slice_sizes"]
    src = _shape(eqn.invars[0])
    out_nd = _ndim(eqn.outvars[0])
    if ix.partial or ix.bad:
        return [_index_differs(eqn)]
    for d in dn.start_index_map:
        if v.split[d]:
            return [_cut(eqn, v, d, "indexes into")]
    if ix.split and ix.split[-1]:
        return [_cut(eqn, ix, ix.ndim - 1, "reads index vectors along")]
    split, varies = [()] * out_nd, [None] * out_nd
    offset = [d for d in range(v.ndim) if d not in dn.collapsed_slice_dims
              and d not in dn.operand_batching_dims]
    for od, d in zip(dn.offset_dims, offset):
        if v.split[d] and sizes[d] != src[d]:
            return [_cut(eqn, v, d, "takes part of")]
        split[od], varies[od] = v.split[d], v.varies[d]
    batch_out = [d for d in range(out_nd) if d not in dn.offset_dims]
    batch_ix = list(range(ix.ndim - 1))
    pairs = dict(zip(dn.start_indices_batching_dims, dn.operand_batching_dims))
    for od, d in zip(batch_out, batch_ix):
        operand_d = pairs.get(d)
        parts = [Value([ix.split[d]], [ix.varies[d]])]
        if operand_d is not None:
            parts.append(Value([v.split[operand_d]], [v.varies[operand_d]]))
        joined = _join(parts, (2,), "gather")
        if joined.bad:
            return [Value.refused(out_nd, *joined.bad)]
        split[od], varies[od] = joined.split[0], joined.varies[0] or (
            None if ix.split[d] else ix.varies[d])
    if v.partial and ix.axes() & set(v.partial):
        return [_nonlinear_of_partial(eqn, v)]
    return [Value(split, varies, v.partial, v.zero)]


def _scatter(eqn, ins):
    """operand.at[indices].op(updates): the operand's indexed dimensions
    must not be split; window dimensions are carried whole; an update split
    across islands along its scatter dimensions makes a scatter-add into
    zeros partial (each island adds its part), and anything else refused."""
    v, ix, upd = ins[0], ins[1], ins[2]
    dn = eqn.params["dimension_numbers"]
    name = eqn.primitive.name
    out_nd = v.ndim
    if ix.partial or ix.bad:
        return [_index_differs(eqn)]
    for d in dn.scatter_dims_to_operand_dims:
        if v.split[d]:
            return [_cut(eqn, v, d, "indexes into")]
    window = [d for d in range(v.ndim) if d not in dn.inserted_window_dims
              and d not in dn.operand_batching_dims]
    usz, src = _shape(eqn.invars[2]), _shape(eqn.invars[0])
    split, varies = list(v.split), list(v.varies)
    for ud, d in zip(dn.update_window_dims, window):
        if (v.split[d] or upd.split[ud]) and usz[ud] != src[d]:
            return [_cut(eqn, v if v.split[d] else upd, d, "updates part of")]
        joined = _join([Value([v.split[d]], [v.varies[d]]),
                        Value([upd.split[ud]], [upd.varies[ud]])], (2,), name)
        if joined.bad:
            return [Value.refused(out_nd, *joined.bad)]
        split[d] = joined.split[0]
        varies[d] = joined.varies[0] or v.varies[d] or upd.varies[ud]
    scatter_u = [d for d in range(upd.ndim) if d not in dn.update_window_dims]
    batch = dict(zip(dn.scatter_indices_batching_dims,
                     dn.operand_batching_dims))
    made = {}
    for k, ud in enumerate(scatter_u):
        # The k-th scatter dimension of the updates and of the indices
        # (and the operand's, for a batching dimension) pair elementwise.
        parts = [Value([upd.split[ud]], [upd.varies[ud]])]
        if k < ix.ndim - 1:
            parts.append(Value([ix.split[k]], [ix.varies[k]]))
        if k in batch:
            d = batch[k]
            parts.append(Value([v.split[d]], [v.varies[d]]))
        joined = _join(parts, (2,), name)
        if joined.bad:
            return [Value.refused(out_nd, *joined.bad)]
        axes = joined.split[0]
        if k in batch:  # each island scatters into its own block
            split[batch[k]] = axes
            if axes:
                varies[batch[k]] = None
            continue
        if not axes:
            continue
        if name not in ("scatter-add", "scatter_add"):
            return [_cut(eqn, upd if upd.split[ud] else ix, ud if upd.split[
                ud] else k, "scatters updates split along")]
        for a in axes:
            made[a] = (f"{name} of updates whose dimension {ud} is split "
                       f"across islands over {a!r}")
    if made:
        if not v.zero and not set(made) <= set(v.partial):
            return [Value.refused(out_nd, (
                f"{name} adds each island's part of the updates to an "
                "operand that is not zero: summed over islands the operand "
                "would be counted once per island"))]
        partial = dict(v.partial)
        partial.update(made)
        return [Value(split, varies, partial)]
    if name in ("scatter-add", "scatter_add", "scatter_sub"):
        return _linear_values(eqn, v, upd, split, varies)
    if v.partial or upd.partial:
        return [_nonlinear_of_partial(eqn, v if v.partial else upd)]
    return [Value(split, varies)]


def _linear_values(eqn, a, b, split, varies):
    for p, other in ((a, b), (b, a)):
        if p.partial and not p.zero and not other.zero and (
                set(other.partial) != set(p.partial)):
            return [_not_linear(eqn, p, other)]
    partial = dict(b.partial)
    partial.update(a.partial)
    return [Value(split, varies, partial, a.zero and b.zero)]


# ----------------------------------------------------------- reductions


def _reduce(eqn, ins):
    """reduce_sum over a split dimension makes the value partial; any other
    reduction over one, or of a partial value, is refused."""
    v, axes = ins[0], eqn.params["axes"]
    name = eqn.primitive.name
    keep = [d for d in range(v.ndim) if d not in axes]
    partial = dict(v.partial)
    for d in axes:
        if not v.split[d]:
            continue
        if name != "reduce_sum":
            return [_mixed(eqn, v, d)] * len(eqn.outvars)
        for a in v.split[d]:
            partial[a] = (f"reduce_sum over dimension {d}, split across "
                          f"islands over {a!r}")
    if v.partial and name != "reduce_sum":
        return [_nonlinear_of_partial(eqn, v)] * len(eqn.outvars)
    return [Value([v.split[d] for d in keep], [v.varies[d] for d in keep],
                  partial, v.zero) for _ in eqn.outvars]


def _mixed(eqn, v, d):
    name = eqn.primitive.name
    return Value.refused(_ndim(eqn.outvars[0]), (
        f"{name} over dimension {d}, which is split across islands over "
        f"{_axes_str(v.split[d])}: each island gets the {name} of its own "
        f"part, not of the whole array as jax.jit does, and unlike a sum no "
        f"out_shardings combines the parts into it"), (
        "Reduce over that dimension in a program whose input holds it whole "
        "(in_shardings that do not split it over the axis), or return the "
        "parts (keep the dimension split) and combine them in a later "
        "program"))


def _cumulative(eqn, ins):
    v, axis = ins[0], eqn.params["axis"]
    if v.split[axis]:
        return [_mixed(eqn, v, axis)]
    if v.partial and eqn.primitive.name != "cumsum":
        return [_nonlinear_of_partial(eqn, v)]
    varies = list(v.varies)
    varies[axis] = varies[axis] or eqn.primitive.name
    return [Value(v.split, varies, v.partial, v.zero)]


def _sort(eqn, ins):
    dim = eqn.params["dimension"] if "dimension" in eqn.params else (
        eqn.params.get("axis", ins[0].ndim - 1))
    dim %= ins[0].ndim
    for v in ins:
        if v.split[dim]:
            return [_mixed(eqn, v, dim)] * len(eqn.outvars)
    out = _nonlinear(eqn, ins)[0]
    if out.bad:
        return [out] * len(eqn.outvars)
    varies = list(out.varies)
    varies[dim] = varies[dim] or eqn.primitive.name
    return [Value(out.split, varies) for _ in eqn.outvars]


def _window(eqn, ins):
    """reduce_window_*, select_and_*: a split dimension must have a window
    of one element, stride 1 and no padding."""
    p = eqn.params
    v = ins[0]
    dims = p.get("window_dimensions")
    strides = p.get("window_strides") or (1,) * v.ndim
    padding = p.get("padding") or ((0, 0),) * v.ndim
    for d in range(v.ndim):
        if v.split[d] and (dims is None or dims[d] != 1 or strides[d] != 1
                           or tuple(padding[d]) != (0, 0)):
            return [_mixed(eqn, v, d)] * len(eqn.outvars)
    if eqn.primitive.name == "reduce_window_sum":
        return [Value(v.split, [x or "a window" for x in v.varies],
                      v.partial, v.zero)]
    out = _nonlinear(eqn, ins)[0]
    return [out if out.bad else Value(out.split, [
        x or "a window" for x in out.varies]) for _ in eqn.outvars]


# ------------------------------------------------------- contractions


def _contract(eqn, lhs, rhs, pairs, partial_from):
    """The partial axes a contraction over dimension pairs (l, r) makes, or
    a refused Value."""
    made = {}
    for dl, dr in pairs:
        a, b = lhs.split[dl], rhs.split[dr]
        if a == b and not a:
            continue
        if a and b and a != b:
            return None, Value.refused(_ndim(eqn.outvars[0]), (
                f"{eqn.primitive.name} contracts dimensions split across "
                f"islands over different axes ({_axes_str(a)} and "
                f"{_axes_str(b)})"),
                "Split both operands' contracted dimension alike")
        if not (a and b):
            one, other, d, od = (lhs, rhs, dl, dr) if a else (rhs, lhs, dr, dl)
            if other.varies[od] is not None:
                return None, Value.refused(_ndim(eqn.outvars[0]), (
                    f"{eqn.primitive.name} contracts dimension {d}, split "
                    f"across islands over {_axes_str(a or b)}, with "
                    f"{other.varies[od]}, which is not split: each island "
                    "pairs its own part with the start of the other "
                    "operand"), (
                    "Split the other operand's contracted dimension over "
                    "the same axis in in_shardings"))
        for ax in (a or b):
            made[ax] = (f"{partial_from} over dimension {dl}, split across "
                        f"islands over {ax!r}")
    return made, None


def _dot_general(eqn, ins):
    lhs, rhs = ins
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    nd = _ndim(eqn.outvars[0])
    made, refused = _contract(eqn, lhs, rhs, zip(lc, rc), "dot_general")
    if refused:
        return [refused]
    split, varies = [], []
    for dl, dr in zip(lb, rb):
        j = _join([Value([lhs.split[dl]], [lhs.varies[dl]]),
                   Value([rhs.split[dr]], [rhs.varies[dr]])], (2,),
                  "dot_general")
        if j.bad:
            return [Value.refused(nd, *j.bad)]
        split.append(j.split[0])
        varies.append(j.varies[0])
    for v, skip in ((lhs, set(lc) | set(lb)), (rhs, set(rc) | set(rb))):
        for d in range(v.ndim):
            if d not in skip:
                split.append(v.split[d])
                varies.append(v.varies[d])
    return [_bilinear(eqn, lhs, rhs, Value(split, varies), made)]


def _bilinear(eqn, lhs, rhs, out, made):
    """`out` with the partial axes of a product of lhs and rhs plus `made`."""
    if lhs.zero or rhs.zero:
        out.zero = True
        return out
    p = [v for v in (lhs, rhs) if v.partial]
    if len(p) > 1:
        return _nonlinear_of_partial(eqn, p[0])
    partial = dict(made)
    if p:
        other = rhs if p[0] is lhs else lhs
        if other.axes() & set(p[0].partial) or set(made) & set(p[0].partial):
            return _nonlinear_of_partial(eqn, p[0])
        partial.update(p[0].partial)
    out.partial = partial
    return out


def _conv(eqn, ins):
    """conv_general_dilated: the batch dimension carried, the input feature
    dimension contracted (partial when split alike), spatial dimensions
    never split."""
    lhs, rhs = ins
    p = eqn.params
    dn = p["dimension_numbers"]
    lspec, rspec, ospec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    nd = _ndim(eqn.outvars[0])
    grouped = p.get("feature_group_count", 1) != 1 or \
        p.get("batch_group_count", 1) != 1
    for v, spec in ((lhs, lspec), (rhs, rspec)):
        for d in spec[2:]:
            if v.split[d]:
                return [_cut(eqn, v, d, "convolves over")]
    if grouped and (any(lhs.split) or any(rhs.split)):
        d = next(d for d in range(lhs.ndim) if lhs.split[d]) if any(
            lhs.split) else 0
        return [_cut(eqn, lhs if any(lhs.split) else rhs, d,
                     "groups features or batch along")]
    made, refused = _contract(eqn, lhs, rhs, [(lspec[1], rspec[1])],
                              "conv_general_dilated")
    if refused:
        return [refused]
    split, varies = [()] * nd, ["conv_general_dilated"] * nd
    split[ospec[0]], varies[ospec[0]] = lhs.split[lspec[0]], lhs.varies[
        lspec[0]]
    split[ospec[1]], varies[ospec[1]] = rhs.split[rspec[0]], rhs.varies[
        rspec[0]]
    return [_bilinear(eqn, lhs, rhs, Value(split, varies), made)]


# ------------------------------------------------------------- sources


def _iota(eqn, ins):
    nd = _ndim(eqn.outvars[0])
    varies = [None] * nd
    varies[eqn.params["dimension"]] = "iota (positions counted on the island)"
    return [Value([()] * nd, varies)]


def _random(eqn, ins):
    """random_bits, random_split, rng_bit_generator, ...: the key's
    dimensions carried, the drawn ones position dependent (the same draws
    on every island)."""
    key = ins[0]
    name = eqn.primitive.name
    if key.partial or key.bad:
        return [_nonlinear_of_partial(eqn, key)] * len(eqn.outvars)
    outs = []
    for o in eqn.outvars:
        nd = _ndim(o)
        lead = min(key.ndim, nd)
        split = list(key.split[:lead]) + [()] * (nd - lead)
        varies = list(key.varies[:lead]) + [
            f"{name} over the island's shape (the same numbers on every "
            "island)"] * (nd - lead)
        if name == "rng_bit_generator":
            split, varies = [()] * nd, [varies[-1] if varies else None] * nd
            if key.crosses():
                return [_cut(eqn, key, 0, "draws from a key split along")]
        outs.append(Value(split, varies))
    return outs


def _random_wrap(eqn, ins):
    v = ins[0]
    if v.split and v.split[-1]:
        return [_cut(eqn, v, v.ndim - 1, "reads key data along")]
    return [_carried(v, v.split[:-1], v.varies[:-1])]


def _random_unwrap(eqn, ins):
    v = ins[0]
    return [_carried(v, v.split + ((),), v.varies + ("key data",))]


def _identity(eqn, ins):
    return list(ins[:len(eqn.outvars)])


# ------------------------------------------------------- collectives


def _gathering_collective(eqn, ins):
    """all_gather, all_to_all, psum_scatter inside shard_map, over the
    island's own axes: the dimensions they move along must not be split
    across islands (all_gather only concatenates the island's blocks)."""
    p, v = eqn.params, ins[0]
    name = eqn.primitive.name
    dims = [p[k] for k in ("all_gather_dimension", "split_axis",
                           "concat_axis", "scatter_dimension") if k in p]
    if name != "all_gather":
        for d in dims:
            if d < v.ndim and v.split[d]:
                return [_cut(eqn, v, d, "moves data along")]
    if name == "all_gather" and not p.get("tiled", False) and v.crosses():
        return [_cut(eqn, v, 0, "stacks")] if any(v.split) else [
            _nonlinear_of_partial(eqn, v)]
    if v.partial and name not in ("all_gather",):
        return [_nonlinear_of_partial(eqn, v)]
    nd = _ndim(eqn.outvars[0])
    if nd != v.ndim:
        return [Value.replicated(nd, name)]
    return [Value(v.split, [x or name for x in v.varies], v.partial, v.zero)]


# ------------------------------------------------------------ the table

class _Operand:
    """One operand and its output of a primitive that maps several
    independently (psum of a tuple, ppermute, ...), as an equation."""

    def __init__(self, eqn, i):
        self.primitive, self.params = eqn.primitive, eqn.params
        self.invars, self.outvars = [eqn.invars[i]], [eqn.outvars[i]]


def _each(rule):
    """`rule` applied to each operand on its own."""
    def apply(eqn, ins):
        return [rule(_Operand(eqn, i), [v])[0] for i, v in enumerate(ins)]
    return apply


_LINEAR = ("add", "sub", "add_any", "neg", "copy", "copy_p", "real", "imag",
           "conj", "complex", "reduce_precision", "stop_gradient")
_NONLINEAR = (
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh",
    "cbrt", "ceil", "clz", "cos", "cosh", "digamma", "erf", "erf_inv",
    "erfc", "exp", "exp2", "expm1", "floor", "igamma", "igammac",
    "igamma_grad_a", "is_finite", "lgamma", "log", "log1p", "logistic",
    "max", "min", "nextafter", "polygamma", "population_count", "pow",
    "integer_pow", "random_gamma_grad", "regularized_incomplete_beta",
    "rem", "round", "rsqrt", "sign", "sin", "sinh", "sqrt", "square", "tan",
    "tanh", "zeta", "bessel_i0e", "bessel_i1e", "and", "or", "not", "xor",
    "shift_left", "shift_right_arithmetic", "shift_right_logical", "eq",
    "ne", "lt", "le", "gt", "ge", "eq_to", "le_to", "lt_to", "clamp",
    "bitcast_convert_type", "threefry2x32", "random_seed", "random_fold_in",
    "random_clone",
    # jax 0.12's: jnp.log2; tanh's derivative 1 - y**2; jnp.polyval's Horner
    # rule, x and its coefficients broadcast elementwise.
    "log2", "one_minus_square", "polynomial")

RULES = {name: _linear for name in _LINEAR}
RULES.update({name: _nonlinear for name in _NONLINEAR})
# Collectives over the island's own axes (inside shard_map): psum adds the
# island's devices' values, ppermute moves them; each operand on its own.
RULES.update({name: _each(_linear) for name in (
    "psum", "psum2", "pbroadcast", "ppermute", "pvary", "psum_invariant")})
RULES.update({name: _each(_nonlinear) for name in ("pmax", "pmin")})
RULES.update({
    "mul": _product,
    "div": lambda e, i: _product(e, i, linear_in=(0,)),
    "select_n": _product,
    "convert_element_type": _convert,
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _reshape,
    "transpose": _transpose,
    "squeeze": _squeeze,
    "rev": _rev,
    "slice": _slice,
    "dynamic_slice": _dynamic_slice,
    "dynamic_update_slice": _dynamic_update_slice,
    "concatenate": _concatenate,
    "pad": _pad,
    "split": _split,
    "gather": _gather,
    "scatter": _scatter, "scatter-add": _scatter, "scatter_add": _scatter,
    "scatter_sub": _scatter, "scatter-mul": _scatter, "scatter_mul": _scatter,
    "scatter-min": _scatter, "scatter_min": _scatter,
    "scatter-max": _scatter, "scatter_max": _scatter,
    "reduce_sum": _reduce, "reduce_max": _reduce, "reduce_min": _reduce,
    "reduce_prod": _reduce, "reduce_and": _reduce, "reduce_or": _reduce,
    "reduce_xor": _reduce, "argmax": _reduce, "argmin": _reduce,
    "cumsum": _cumulative, "cumprod": _cumulative, "cummax": _cumulative,
    "cummin": _cumulative, "cumlogsumexp": _cumulative,
    "sort": _sort, "top_k": _sort,
    "reduce_window_sum": _window, "reduce_window_max": _window,
    "reduce_window_min": _window, "reduce_window": _window,
    "select_and_scatter_add": _window, "select_and_gather_add": _window,
    "dot_general": _dot_general,
    "conv_general_dilated": _conv,
    "iota": _iota,
    "random_bits": _random, "random_split": _random,
    "rng_bit_generator": _random,
    "random_wrap": _random_wrap, "random_unwrap": _random_unwrap,
    "sharding_constraint": _identity, "mesh_cast": _identity,
    "reshard": _identity, "device_put": _identity,
    "optimization_barrier": _identity,
    "all_gather": _gathering_collective, "all_to_all": _gathering_collective,
    "reduce_scatter": _gathering_collective,
    "psum_scatter": _gathering_collective,
})
