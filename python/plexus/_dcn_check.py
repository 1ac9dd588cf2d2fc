"""Whether a plexus.jit function computes across islands what jax.jit
computes over the whole mesh: a static analysis of its jaxpr.

plexus.jit lowers the function for ONE island and every island runs it on
its own part of the arguments (_jit.py, _island_layout.py). Where an
argument is split over an axis that crosses islands (a DCN axis; on a 1-D
slice spread over several hosts, its one axis) each island sees only its
block of that dimension, and the function body cannot tell. Most programs
still compute, island by island, their block of jax.jit's answer (an
elementwise function, a matmul that keeps the split dimension free). Some do
not: a sum over the split dimension gives each island the sum of its own
part; `jax.random.normal(key, x.shape)` draws the same numbers on every
island; `x - x.mean(0)` centres each island on its own mean. This module
decides, before anything runs, which case a function is in, and refuses
the second with an error that names the program, the output and the axis,
and says what to write instead. It never accepts what it cannot show to be
right: a primitive it does not know, reached by a value that differs
between islands, is refused naming the primitive.

Three modules: _dcn_value.py (the abstract Value and how values join),
_dcn_rules.py (the rule table, one entry per primitive), and this one (the
driver over the jaxpr, the control-flow rules that run it on sub-jaxprs,
and the check of the outputs against out_shardings).

The abstract value of each array in the jaxpr (`Value`):
  split    per dimension, the DCN axes that split it (the island holds one
           block of it, the blocks of all islands make jax.jit's array);
  varies   per unsplit dimension, None where the value is the same at every
           position along it (a broadcast, a constant), else what makes it
           position dependent ("iota", "random_bits", "argument w"): such a
           dimension has the island's size, not jax.jit's, and meeting a
           split dimension elementwise it pairs the island's block with the
           start of the array where jax.jit pairs it with the whole;
  partial  the DCN axes over which the island's value is an addend of
           jax.jit's (a sum over a split dimension), each with where it was
           made;
  zero     the value is known to be all zeros (AD's zero cotangents);
  bad      None, or why the island's value is neither a block nor an
           addend of jax.jit's (and what to write instead): it is refused
           if it reaches an output.

Rules (one function per family, a table from primitive name to rule):
  elementwise   per dimension the operands must agree: split over the same
                axes, or not split and constant along it. A partial value
                passes linear primitives (add, sub, neg, a float cast, ...)
                when every other operand is partial over the same axes or
                zero; mul / div / select_n when the other operands are the
                same on every island; any other primitive of a partial value
                is refused (the sum of maxima is not the maximum of sums).
  structural    broadcast_in_dim, reshape, transpose, squeeze, slice, pad,
                concatenate, split, rev, dynamic_(update_)slice, gather,
                scatter: a split dimension may be carried whole, never cut,
                reversed, padded, indexed or moved to a position that needs
                another island's block. A reshape may merge or divide a
                split dimension when it is the major-most of its group:
                shapes in the function are read as derived from the
                island's shapes (x.reshape(b, t, h, d) with b = x.shape[0]).
  reductions    reduce_sum (and dot_general contracting, scatter-add into
                zeros, cumsum of a partial) over a split dimension makes the
                value partial over its axes. reduce_max/min/prod/and/or,
                argmax/argmin, cumulative ops, sort, top_k and windows over
                a split dimension are refused: no out_shardings makes
                them right.
  dot_general   batch dimensions as elementwise, free dimensions carried,
                contracted split dimensions (both operands split alike, or
                the other constant along it) make the result partial.
  sources       iota, random_bits, random_split, rng_bit_generator make
                position-dependent dimensions (see `varies`).
  control flow  jit/pjit, closed_call, custom_jvp/vjp, remat, shard_map
                are followed into their jaxpr; cond joins its branches and
                refuses a branch index that differs between islands; while
                and scan iterate their carry to a fixed point, and refuse a
                trip count that differs between islands or a scan over a
                split dimension. Collectives inside shard_map run over the
                island's own axes: psum is linear, pmax/pmin elementwise,
                all_gather/ppermute keep a split dimension.

Outputs, by out_shardings:
  replicated()       the value must be the same on every island (nothing
                     split, partial or bad);
  split / P(...)     each dimension must be split over exactly the DCN axes
                     the sharding names for it;
  partial()          the island's value must be an addend over every DCN
                     axis: partial (a sum) or zero; a value split over a
                     DCN axis is also taken, as the addend partial()
                     declares (its islands' blocks are summed, the output
                     has the island's shape); a value the same on every
                     island is refused (all_reduce would multiply it by the
                     number of islands), as is any bad value.
"""
import numpy as np

from . import _core
from ._dcn_rules import RULES
from ._dcn_value import (_ADVICE_SUM, Value, _axes_str, _join_branches, _ndim,
                         _shape)


# --------------------------------------------------------- control flow


def _sub_jaxpr(eqn):
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        j = eqn.params.get(key)
        if j is not None and (hasattr(j, "eqns") or hasattr(j, "jaxpr")):
            return j
    return None


def _call(eqn, ins):
    """jit, closed_call, custom_jvp_call, custom_vjp_call, remat,
    shard_map: the body's outputs from its inputs."""
    j = _sub_jaxpr(eqn)
    if j is None:
        return None  # unknown: the caller refuses
    inner = j.jaxpr if hasattr(j, "jaxpr") else j
    consts = j.consts if hasattr(j, "consts") else []
    n = len(inner.invars)
    return _run(inner, consts, ins[len(ins) - n:])


def _cond(eqn, ins):
    index, ops = ins[0], ins[1:]
    if index.crosses():
        return _all_refused(eqn, (
            "cond chooses its branch from a value that differs between "
            "islands: each island would run its own branch"),
            "Decide on values that are the same on every island (or with "
            "jnp.where, elementwise)")
    outs = [_run(b.jaxpr, b.consts, ops) for b in eqn.params["branches"]]
    return [_join_branches(list(vs), "cond") for vs in zip(*outs)]


def _all_refused(eqn, why, instead):
    return [Value.refused(_ndim(o), why, instead) for o in eqn.outvars]


def _fixpoint(body, consts, carry, why, count=8):
    """Carry values joined with the body's until they stop changing."""
    for _ in range(count):
        out = body(consts, carry)
        new = [_join_branches([c, o], why) for c, o in zip(carry, out)]
        if all(_same(a, b) for a, b in zip(new, carry)):
            return new
        carry = new
    return [Value.refused(c.ndim, f"{why} carries a value whose layout "
                          "across islands does not settle",
                          "Keep the loop's carry laid out as on entry")
            for c in carry]


def _same(a, b):
    return (a.split == b.split and a.varies == b.varies
            and set(a.partial) == set(b.partial) and a.zero == b.zero
            and (a.bad is None) == (b.bad is None))


def _while(eqn, ins):
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = ins[:nc], ins[nc:nc + nb], ins[nc + nb:]
    body, cond = p["body_jaxpr"], p["cond_jaxpr"]
    carry = _fixpoint(
        lambda consts, c: _run(body.jaxpr, body.consts, consts + c),
        bconsts, carry, "while")
    pred = _run(cond.jaxpr, cond.consts, cconsts + carry)[0]
    if pred.crosses():
        return _all_refused(eqn, (
            "the while loop's condition differs between islands: each "
            "island would run its own number of iterations"),
            "Make the loop's condition depend only on values that are the "
            "same on every island")
    return carry


def _scan_counts(params):
    """How many of scan's operands are constants and how many its carry:
    jax 0.12 gives them as ft_in, a tree of (consts, carry, xs); older jax
    as num_consts and num_carry."""
    if "ft_in" in params:
        consts, carry, _ = params["ft_in"].unpack()
        return len(consts), len(carry)
    return params["num_consts"], params["num_carry"]


def _scan(eqn, ins):
    p = eqn.params
    nc, nk = _scan_counts(p)
    consts, carry, xs = ins[:nc], ins[nc:nc + nk], ins[nc + nk:]
    for x in xs:
        if x.split and x.split[0]:
            return _all_refused(eqn, (
                f"scan runs along dimension 0, which is split across islands "
                f"over {_axes_str(x.split[0])}: each island would scan its "
                "own part from the initial carry"),
                "Scan over a dimension that is not split across islands")
    sliced = [Value(x.split[1:], x.varies[1:], x.partial, x.zero, x.bad)
              for x in xs]
    j = p["jaxpr"]

    def body(c_, c):
        return _run(j.jaxpr, j.consts, c_ + c + sliced)

    carry = _fixpoint(body, consts, carry, "scan")
    ys = body(consts, carry)[nk:]
    return carry + [Value(((),) + y.split, ("scan",) + y.varies, y.partial,
                          y.zero, y.bad) for y in ys]


# Rules that follow a sub-jaxpr with the driver, beside _dcn_rules.RULES.
CONTROL_FLOW = {
    "jit": _call, "pjit": _call, "closed_call": _call, "core_call": _call,
    "custom_jvp_call": _call, "custom_vjp_call": _call,
    "custom_vjp_call_jaxpr": _call, "remat": _call, "remat2": _call,
    "checkpoint": _call, "shard_map": _call,
    "cond": _cond, "while": _while, "scan": _scan,
}


# ---------------------------------------------------------- the driver


def _constant(value, ndim):
    """The Value of a constant of the jaxpr (a literal or a closed-over
    array): the same on every island, position dependent where it is not
    the same along a dimension."""
    try:
        a = np.asarray(value)
    except Exception:  # noqa: BLE001 - e.g. a key array: assume the worst
        return Value.replicated(ndim, "a constant")
    if a.ndim != ndim or a.dtype == object:
        return Value.replicated(ndim, "a constant")
    varies = []
    for d in range(ndim):
        first = np.take(a, [0], axis=d) if a.shape[d] else a
        varies.append(None if a.shape[d] <= 1 or np.array_equal(
            a, np.broadcast_to(first, a.shape)) else "a constant")
    zero = a.size > 0 and a.dtype.kind in "biufc" and not np.any(a)
    return Value([()] * ndim, varies, zero=bool(zero))


def _normalise(v, var):
    """Size-1 dimensions are the same all along; an axis splitting two
    dimensions, or splitting one and summed, leaves each island a diagonal
    block of jax.jit's value."""
    shape = _shape(var)
    if v.bad or len(shape) != v.ndim:
        return v
    seen = set(v.partial)
    for d, axes in enumerate(v.split):
        for a in axes:
            if a in seen:
                return Value.refused(v.ndim, (
                    f"dimension {d} and another dimension (or a sum) are "
                    f"split across islands over the same axis {a!r}, e.g. "
                    "an outer product of two split vectors: each island "
                    "holds only a diagonal block of jax.jit's value"),
                    "Split only one dimension over the axis, and replicate "
                    "the other operand")
            seen.add(a)
    v.varies = tuple(None if s == 1 else x for s, x in zip(shape, v.varies))
    return v


def _run(jaxpr, consts, ins):
    """The Values of `jaxpr`'s outputs given its inputs'."""
    env = {}

    from jax.extend.core import Literal

    def read(x):
        if isinstance(x, Literal):
            return _constant(x.val, _ndim(x))
        return env[x]

    for var, c in zip(jaxpr.constvars, consts):
        env[var] = _constant(c, _ndim(var))
    for var, v in zip(jaxpr.invars, ins):
        env[var] = v
    for eqn in jaxpr.eqns:
        ins_ = [read(x) for x in eqn.invars]
        outs = _apply(eqn, ins_)
        for var, v in zip(eqn.outvars, outs):
            env[var] = _normalise(v, var)
    return [read(x) for x in jaxpr.outvars]


def _apply(eqn, ins):
    name = eqn.primitive.name
    follows = name in CONTROL_FLOW  # into sub-jaxprs
    rule = CONTROL_FLOW[name] if follows else RULES.get(name)
    bad = next((v for v in ins if v.bad), None)
    if bad is not None and not follows:
        return [Value.refused(_ndim(o), *bad.bad) for o in eqn.outvars]
    try:
        outs = rule(eqn, ins) if rule is not None else None
    except Exception as e:  # noqa: BLE001 - parameters the rule did not expect
        if any(v.crosses() for v in ins):
            return _all_refused(eqn, (
                f"the check could not follow {name} on a value that differs "
                f"between islands ({type(e).__name__}: {e})"),
                f"Apply {name} to values that are the same on every island, "
                "or report it as an issue")
        outs = None
    if outs is None and not any(v.crosses() for v in ins):
        # Nothing differs between islands: the island computes jax.jit's
        # value, position dependent for all we know.
        return [Value.replicated(_ndim(o), name) for o in eqn.outvars]
    if outs is None:
        v = next(v for v in ins if v.crosses())
        axes = v.axes()
        return _all_refused(eqn, (
            f"{name} takes a value that differs between islands (split or "
            f"summed over {_axes_str(sorted(axes))}), and Plexus does not "
            f"know whether {name} keeps each island's part of jax.jit's "
            "value"), (
            f"Apply {name} to values that are the same on every island "
            "(replicate its inputs over the axis with in_shardings), or "
            "report it as an issue"))
    return outs


# ------------------------------------------------------------ outputs


def check(closed_jaxpr, in_dims, in_names, out_dims, out_names, dcn_axes,
          what):
    """Raises InvalidArgumentError unless every output of `closed_jaxpr`
    (the function as one island runs it) is what out_shardings says:
    in_dims / out_dims give per argument / output, per dimension, the DCN
    axes splitting it (an output's entry is "partial" for partial());
    dcn_axes are the axes that cross islands."""
    jaxpr = closed_jaxpr.jaxpr
    ins = []
    for var, dims, name in zip(jaxpr.invars, in_dims, in_names):
        ins.append(_normalise(Value(dims, [f"argument {name}"] * len(dims)),
                              var))
    outs = _run(jaxpr, closed_jaxpr.consts, ins)
    for v, dims, out in zip(outs, out_dims, out_names):
        _check_output(v, dims, dcn_axes, f"{what} {out}")


def _check_output(v, dims, dcn_axes, what):
    def refuse(why, instead):
        raise _core.InvalidArgumentError(
            f"{what}: {why}; across islands the program would not compute "
            f"what jax.jit computes over the whole mesh. {instead}.")

    if v.bad:
        refuse(*v.bad)
    if dims == "partial":
        covered = v.axes()
        missing = [a for a in dcn_axes if a not in covered]
        if missing and not v.zero:
            refuse(
                f"out_shardings=plexus.partial() sums the islands' values, "
                f"but this one is the same on every island over "
                f"{_axes_str(missing)}: the sum would count it once per "
                "island",
                "Declare this output replicated (None in out_shardings), or "
                "compute it from an input split over the axis")
        return
    for a, where in v.partial.items():
        if not v.zero:
            refuse(f"{where} gives each island the sum of its own part only,"
                   f" and out_shardings does not say partial()",
                   _ADVICE_SUM)
    for d, (got, want) in enumerate(zip(v.split, dims)):
        if tuple(got) == tuple(want):
            continue
        if got:
            refuse(f"dimension {d} is split across islands over "
                   f"{_axes_str(got)} (each island holds its part), but "
                   f"out_shardings " + (
                       f"splits it over {_axes_str(want)}" if want else
                       "does not split it across islands"),
                   f"Give the output an out_shardings that splits dimension "
                   f"{d} over {_axes_str(got)} (plexus.P with the axis on "
                   f"it), or reduce it inside the function")
        refuse(f"out_shardings splits dimension {d} across islands over "
               f"{_axes_str(want)}, but the value is the same on every "
               "island (each would hold all of it as its part)",
               f"Compute it from an input split over {_axes_str(want)}, or "
               "declare that dimension not split across islands")
