"""plexus.jit: JAX functions as Plexus programs.

JAX is the client-side tracer and compiler front end only. `jit` lowers a
function with `jax.export` to a StableHLO portable artifact for the slice's
islands, reads its output shapes from the lowering, and registers it as an
XLA program; workers compile it through their PJRT plugin (once per device
assignment, cached) and run it. Calls take and return pytrees of futures,
like any other program, and join graphs.

Islands. The devices of a slice on one worker form an island. The function
is lowered once as an SPMD program over the k devices of an island (a 1-D
abstract mesh named by `axis_name`, the context mesh while tracing, so the
function may use jax.shard_map and collectives over that axis; the client
needs no such devices); every island runs it on its own shards, and
XLA's own collectives work inside the island. Arguments are seen per
island: a `split(a)` array of global length L along `a` over a slice of n
devices appears to the function with length L * k / n (the island's shards
concatenated in slice order) and is split again over the island's k
devices (islands of different sizes get a module each); a replicated
array appears whole. Outputs follow `out_shardings`:
  - replicated(): the island's value (the same on every island, e.g. an
    optimizer update of replicated parameters);
  - split(a): the island's value is one block of the global array along a;
  - partial(): each island's value is an addend of the global value (a
    data-parallel gradient before the runtime's all-reduce between islands).

Meshes of several axes (client.slice(mesh={"data": 2, "fsdp": 2, "tensor":
2}, dcn_axes=("data",))): the island's mesh is the sub-mesh of the axes
that are not DCN axes, with their names, so the function may name "fsdp"
and "tensor" as under jax.jit. in_shardings / out_shardings are
PartitionSpecs over the whole mesh: their DCN axes say which part of the
array an island holds (a dimension split over ("data", "fsdp") appears
divided by data's size), their other axes are the island's NamedSharding
(_island_layout.py). A function that names a DCN axis gets an error saying so;
a sum over the DCN axes is a partial() output and an all_reduce.

Across islands (a slice over several islands, split over an axis crossing
them) each island's result must be its part of what jax.jit computes over
the whole mesh: _dcn_check.py reads the function's jaxpr, from the trace
that gives the output shapes, and refuses what is not (a sum into a
replicated output, random draws over a split dimension, ...), naming the
output, the primitive and the axis.

Dtypes and keys. Every JAX dtype with a whole-byte element travels (JAX's
x64 switch decides whether 64-bit ones lower as such); sub-byte ones (int4,
float4_e2m1fn) are refused naming the argument. A typed PRNG key array
(jax.random.key) travels as its key data (uint32, with the impl's trailing
dimension) and is rewrapped inside the function; a key output is a future
whose .dtype is the key dtype and whose result() is a key array again.

Weak types and static arguments. A Python scalar argument is lowered
weakly typed, as jax.jit traces it (bf16 * 2.0 stays bfloat16), and a
weakly typed output is a weakly typed future. static_argnums and
static_argnames as in jax.jit: each value compiles a program, cached.

What the workers cannot run (host callbacks; jaxlib's LAPACK kernels on
CPU) is refused while lowering, naming the program, its arguments and the
JAX functions (_plugin_support.py).

Donation. donate_argnums / donate_argnames as in jax.jit: each donated leaf
is lowered as jax.jit lowers it (aliased to an output of the same layout,
`tf.aliasing_output`), and the call consumes it: its future is released by
the call and refused afterwards, naming the program (a donated jax.Array is
deleted). The worker writes the output over the input's device memory
where nothing else reads it (no other call in flight, fetch, transfer or
lineage); else the output gets memory of its own, as it would undonated. A
donated leaf no output matches warns, naming it, and stays valid, as in
jax.jit.
"""
import collections
import inspect
import warnings

import numpy as np

from . import _core, _dcn_check, _plugin_support
from ._future import Future, signature
from ._island_layout import IslandLayout, abstract_mesh
from ._program import Spec
from ._sharding import (_is_partition_spec, _sharding, _sharding_repr, partial,
                        replicated, split)
from ._stablehlo import aliased_inputs, serialized
from ._jax_version import JAX_NEWEST, JAX_OLDEST, check_jax_version  # noqa: F401
from ._xla_program import XlaProgram, _is_key_dtype

# Plexus dtypes (common/types.cc): every whole-byte JAX dtype.
_DTYPES = ("float32", "float64", "int32", "int64", "bfloat16", "float16",
           "int8", "uint8", "bool", "int16", "uint16", "uint32", "uint64",
           "complex64", "complex128", "float8_e5m2", "float8_e4m3fn",
           "float8_e4m3b11fnuz", "float8_e5m2fnuz", "float8_e4m3fnuz",
           "float8_e4m3", "float8_e3m4", "float8_e8m0fnu")
_SUB_BYTE = ("int1", "uint1", "int2", "uint2", "int4", "uint4",
             "float4_e2m1fn")


_JAX = None

def _jax():
    """Imports JAX on first use (plexus itself does not need it), refusing
    a jax outside the supported range."""
    global _JAX
    if _JAX is None:
        import jax
        check_jax_version(jax.__version__)
        _JAX = jax
    return _JAX


def jit(fn=None, slice=None, *, in_shardings=None, out_shardings=None,
        static_argnums=(), static_argnames=(), donate_argnums=(),
        donate_argnames=(), name=None, axis_name="devices", platform="cpu"):
    """Makes `fn` a Plexus program on `slice`.

    in_shardings: a pytree prefix of the (non-static) arguments giving the
        sharding of arrays passed by value (None: replicated; a
        PartitionSpec, plexus.P or jax's, over the slice's mesh axes;
        plexus.split(a)); futures keep their own, but for a future laid out
        over another slice's mesh the program takes the in_shardings
        layout, and the runtime moves it there.
    out_shardings: a pytree prefix of the outputs (None: replicated).
    static_argnums, static_argnames: arguments that are Python values
        baked into the program (hashable), as in jax.jit: by position or
        by name, each completing the other from the signature (a static
        name passed by position is static, and the reverse); each distinct
        value compiles its own program, kept for later calls.
    donate_argnums, donate_argnames: as in jax.jit: a call consumes its
        donated futures (later uses are refused), and the output of the
        same layout is written over a donated input's device memory where
        nothing else reads it. A donated leaf no output matches warns and
        stays valid.
    axis_name: the island's axis name on a 1-D slice (on a mesh of
        several axes the island has the mesh's own non-DCN axes).
    platform: what the workers' PJRT plugin runs ("cpu", "cuda").
    The returned object compiles on first call for each input signature,
    like jax.jit; `.lower(*specs)` gives the program for one signature.
    Without `fn` it is a decorator: @plexus.jit(slice=s).
    """
    if slice is None:
        raise TypeError("plexus.jit needs the slice to run on: "
                        "plexus.jit(fn, slice) or @plexus.jit(slice=s)")
    options = dict(in_shardings=in_shardings, out_shardings=out_shardings,
                   static_argnums=static_argnums,
                   static_argnames=static_argnames,
                   donate_argnums=donate_argnums,
                   donate_argnames=donate_argnames, name=name,
                   axis_name=axis_name, platform=platform)
    if fn is None:
        return lambda f: jit(f, slice, **options)
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    if isinstance(static_argnames, str):
        static_argnames = (static_argnames,)
    if isinstance(donate_argnums, int):
        donate_argnums = (donate_argnums,)
    if isinstance(donate_argnames, str):
        donate_argnames = (donate_argnames,)
    name = name or getattr(fn, "__name__", "jit")
    _check_argnums(name, "donate_argnums", donate_argnums)
    jitted = Jitted(fn, slice, in_shardings, out_shardings, name, axis_name,
                    platform, tuple(sorted(static_argnums)),
                    tuple(static_argnames))
    both = sorted(set(donate_argnums) & set(jitted._static)) + sorted(
        set(donate_argnames) & set(jitted._static_names))
    if both:
        raise _core.InvalidArgumentError(
            f"program '{name}': argument {both[0]} is both static and donated")
    jitted._donate = (tuple(sorted(donate_argnums)), tuple(donate_argnames))
    return jitted


def _check_argnums(name, what, argnums):
    """InvalidArgumentError unless every one of `argnums` (`what`, for the
    message) is a non-negative integer."""
    for i in argnums:
        if not isinstance(i, int) or i < 0:
            raise _core.InvalidArgumentError(
                f"program '{name}': {what} must be non-negative integers, "
                f"got {i!r}")


def _static_arguments(name, parameters, argnums, argnames):
    """The static arguments' positions and names. As in jax.jit, where only
    one of the two is given it is completed from the signature (a
    parameter that can be passed either way is static both ways); where
    both are given they are taken as they are."""
    parameters = list(parameters)
    either = [p.name if p.kind == p.POSITIONAL_OR_KEYWORD else None
              for p in parameters]
    known = {p.name for p in parameters if p.kind != p.VAR_POSITIONAL}
    takes_any = not parameters or any(p.kind == p.VAR_KEYWORD
                                      for p in parameters)
    for a in argnames:
        if not isinstance(a, str):
            raise _core.InvalidArgumentError(
                f"program '{name}': static_argnames must be strings, got "
                f"{a!r}")
        if not takes_any and a not in known:
            raise _core.InvalidArgumentError(
                f"program '{name}': static_argnames names {a!r}, which is "
                f"not a parameter of the function ({', '.join(known)})")
    _check_argnums(name, "static_argnums", argnums)
    if argnums and argnames:
        return tuple(sorted(set(argnums))), tuple(argnames)
    positions = set(argnums) | {i for i, n in enumerate(either)
                                if n is not None and n in argnames}
    names = tuple(argnames) + tuple(
        n for i, n in enumerate(either) if i in argnums and n is not None)
    return tuple(sorted(positions)), names


class Jitted:
    """A JAX function bound to a slice; compiled per input signature."""

    def __init__(self, fn, slice_, in_shardings, out_shardings, name,
                 axis_name, platform, static_argnums=(), static_argnames=()):
        self._fn = fn
        self._slice = slice_
        self._in_shardings = in_shardings
        self._out_shardings = out_shardings
        self._name = name
        self._axis = axis_name
        self._platform = platform
        self._cache = {}       # (treedef, leaf specs) -> XlaProgram
        self._by_futures = {}  # (treedef, futures' core specs) -> same
        # (resizes, the signatures) -> same, for calls whose arguments are
        # all futures, positional, none static: the common training-loop
        # call, found without flattening the arguments.
        self._by_positional = {}
        self._donate = ((), ())  # donate_argnums, donate_argnames
        try:
            parameters = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):  # a builtin or C function
            parameters = ()
        self._params = [p.name for p in parameters if p.kind in (
            p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self._static, self._static_names = _static_arguments(
            name, parameters, static_argnums, static_argnames)

    @property
    def slice(self):
        return self._slice

    def __call__(self, *args, **kwargs):
        if not kwargs and self._by_positional:
            sigs, fs = [], []
            for x in args:
                if type(x) is not Future:
                    break
                sig = x._sig
                sigs.append(signature(x) if sig is None else sig)
                fs.append(x._f)
            else:
                compiled = self._by_positional.get(
                    (self._slice._s.resizes, tuple(sigs)))
                if compiled is not None:
                    return compiled._invoke_checked(fs)
        jax = _jax()
        static, args, kwargs = self._split_static(args, kwargs)
        args = (args, kwargs)  # one pytree: positional, then keyword
        leaves, treedef = jax.tree_util.tree_flatten(args)
        fast_key = None
        # A resized slice (Slice.resize) has another mesh: compiled again.
        resizes = self._slice._s.resizes
        sigs, fs = [], []
        for x in leaves:
            if type(x) is not Future:
                break
            sig = x._sig
            sigs.append(signature(x) if sig is None else sig)
            fs.append(x._f)
        else:
            # Fast path (a training loop): every leaf a future, so the
            # signature is read off the futures (one loop: a 100-leaf call
            # spent ~120 µs in the generators this replaced).
            fast_key = (resizes, static, treedef, tuple(sigs))
            compiled = self._by_futures.get(fast_key)
            if compiled is not None:
                return compiled._invoke_checked(fs)
        specs = self._as_plexus_error(self._leaf_specs, args)
        key = (resizes, static, treedef, tuple(specs))
        compiled = self._cache.get(key)
        if compiled is None:
            compiled = self._as_plexus_error(self._lower, treedef, specs,
                                             static)
            self._cache[key] = compiled
        if fast_key is not None:
            self._by_futures[fast_key] = compiled
            if (not self._static and not self._static_names and not args[1]
                    and all(type(x) is Future for x in args[0])):
                self._by_positional[fast_key[0], fast_key[3]] = compiled
        return compiled._call_leaves(leaves)

    def lower(self, *args, **kwargs):
        """The program for the signature of `args` (Specs, futures, arrays
        or jax.ShapeDtypeStructs, and the static values); calls with other
        shapes are refused. Its calls take the non-static arguments."""
        jax = _jax()
        static, args, kwargs = self._split_static(args, kwargs)
        args = (args, kwargs)
        treedef = jax.tree_util.tree_structure(
            args, is_leaf=lambda x: isinstance(x, Spec))
        specs = self._as_plexus_error(self._leaf_specs, args)
        return self._as_plexus_error(self._lower, treedef, specs, static)

    def _as_plexus_error(self, fn, *args):
        """fn(*args), any exception but a Plexus error becoming the
        matching one, naming the program."""
        try:
            return fn(*args)
        except _core.PlexusError:
            raise
        except Exception as e:  # noqa: BLE001 - every error becomes Plexus's
            raise _plexus_error(e)(
                f"program '{self._name}': {type(e).__name__}: {e}") from e

    def _split_static(self, args, kwargs):
        """((position or name, value) of each static argument, the other
        positional ones, the other keyword ones)."""
        if not self._static and not self._static_names:
            return (), args, kwargs
        static = []
        for i in self._static:
            if i < len(args):
                static.append((i, args[i]))
            elif not (i < len(self._params) and self._params[i] in kwargs):
                raise _core.InvalidArgumentError(
                    f"program '{self._name}': static argument {i} missing "
                    f"({len(args)} arguments given)")
        static += [(k, kwargs[k]) for k in self._static_names if k in kwargs]
        for where, value in static:
            try:
                hash(value)
            except TypeError as e:
                what = (self._params[where] if isinstance(where, int)
                        and where < len(self._params) else where)
                raise _core.InvalidArgumentError(
                    f"program '{self._name}': static argument {what} must be "
                    f"hashable (each value compiles a program of its own), "
                    f"got {type(value).__name__}: {e}") from e
        return (tuple(static),
                tuple(a for i, a in enumerate(args) if i not in self._static),
                {k: v for k, v in kwargs.items()
                 if k not in self._static_names})

    @property
    def compiled_signatures(self):
        return len(self._cache)

    # ------------------------------------------------------------ internals

    def _leaf_specs(self, args):
        """A _Leaf per argument leaf; `args` is (positional, keyword).
        in_shardings covers the positional ones, as in jax.jit; keyword
        arrays passed by value are replicated."""
        jax = _jax()
        positional, keyword = args
        is_spec = lambda x: isinstance(x, Spec)  # noqa: E731
        shardings = _broadcast_prefix(
            jax, self._in_shardings, positional,
            jax.tree_util.tree_structure(positional, is_leaf=is_spec),
            "in_shardings")
        shardings += [None] * len(jax.tree_util.tree_leaves(
            keyword, is_leaf=is_spec))
        paths = jax.tree_util.tree_flatten_with_path(args, is_leaf=is_spec)[0]
        specs = []
        for (path, x), sh in zip(paths, shardings):
            what = (f"program '{self._name}' argument "
                    f"{self._arg_name(path)}")
            key = None
            if isinstance(x, Future):
                dtype = np.dtype(x._f.dtype)
                shape, key = tuple(x._f.shape), x._key
                if np.dtype(jax.dtypes.canonicalize_dtype(dtype)) != dtype:
                    raise _core.InvalidArgumentError(
                        f"{what} is a {dtype} future, but JAX computes it in "
                        f"{np.dtype(jax.dtypes.canonicalize_dtype(dtype))} "
                        "(enable jax_enable_x64, or make it in that dtype)")
                fsh = x._f.sharding
                if fsh[0] == "mesh" and sh is not None and (
                        tuple(fsh[1]) != tuple(self._slice.mesh_shape)
                        or tuple(fsh[2]) != tuple(self._slice.axis_names)):
                    # Laid out over another slice's mesh: the program takes
                    # it as in_shardings says, and the runtime moves it.
                    try:
                        fsh = _sharding(sh, self._slice, len(shape))
                    except (TypeError, ValueError) as e:
                        raise _core.InvalidArgumentError(
                            f"{what}: {e}") from e
                specs.append(_Leaf(str(dtype), shape, fsh, key, x._weak))
                continue
            # A Python scalar is weakly typed, as jax.jit types it (it takes
            # the dtype of the arrays it meets: bf16 * 2.0 is bf16), and so
            # is a weakly typed jax.Array or ShapeDtypeStruct.
            weak = type(x) in (int, float, complex) or bool(
                getattr(x, "weak_type", False))
            if isinstance(x, Spec):
                shape, dtype, sh = x.shape, x.dtype, x.sharding
            elif hasattr(x, "shape") and hasattr(x, "dtype"):
                shape, dtype = tuple(x.shape), x.dtype
            else:
                a = np.asarray(x)
                shape, dtype = a.shape, a.dtype
            if _is_key_dtype(jax, dtype):
                key = _key_impl(jax, x)
                data = jax.eval_shape(
                    jax.random.key_data,
                    jax.ShapeDtypeStruct(tuple(shape), dtype))
                shape, dtype = tuple(data.shape), data.dtype
            dtype = _dtype_of(jax, dtype, what)
            if type(x) is int and not (np.iinfo(dtype).min <= x
                                       <= np.iinfo(dtype).max):
                raise _core.InvalidArgumentError(
                    f"{what}: the Python int {x} does not fit JAX's {dtype} "
                    "(jax.jit raises OverflowError; pass an array of a wider "
                    "dtype, with jax_enable_x64 for 64 bits)")
            try:
                core_sh = _sharding(sh, self._slice, len(shape))
            except (TypeError, ValueError) as e:
                raise _core.InvalidArgumentError(f"{what}: {e}") from e
            specs.append(_Leaf(str(dtype), tuple(int(d) for d in shape),
                               core_sh, key, weak))
        return specs

    def _arg_name(self, path):
        """The Python name of an argument leaf: x, params['w'], kw['b']."""
        jax = _jax()
        keystr = jax.tree_util.keystr
        if not path:
            return "?"
        if path[0].idx == 1:  # keyword
            return path[1].key + keystr(tuple(path[2:]))
        i = path[1].idx  # among the dynamic positional arguments
        positions = [p for p in range(i + len(self._static) + 1)
                     if p not in self._static]
        pos = positions[i]
        name = (self._params[pos] if pos < len(self._params)
                else f"args[{pos}]")
        return name + keystr(tuple(path[2:]))

    def _islands(self):
        """Devices grouped by worker: [(worker, [device, ...])], in slice
        order."""
        groups = collections.OrderedDict()
        for d in self._slice.devices:
            groups.setdefault(d["worker"], []).append(d["device"])
        return list(groups.items())

    def _lower(self, treedef, specs, static=()):
        jax = _jax()
        from jax._src import compiler

        islands = self._islands()
        n = sum(len(devs) for _, devs in islands)
        what = f"program '{self._name}'"
        names = self._leaf_names(treedef)
        layout = IslandLayout(self._slice, islands, self._axis, what)
        for name, (dtype, shape, sh, _) in zip(names, specs):
            if sh[0] == "partial":
                raise _core.InvalidArgumentError(
                    f"{what} argument {name}: XLA programs take replicated "
                    "or split inputs, not partial ones; all_reduce it first")
            layout.check_input(f"{what} argument {name}", dtype, shape, sh, n)

        # One module per island size (hosts may hold different numbers of
        # the slice's devices); they agree on what each device holds.
        modules, tree, outputs = {}, None, None
        donated = self._donated_leaves(names)
        aliases = None  # (input, output) pairs the first module aliases
        for k in sorted({len(devs) for _, devs in islands}):
            exported, out_kinds, tree, out_keys = self._export(
                treedef, specs, static, k, n, names, layout, donated)
            if aliases is None:
                aliases = aliased_inputs(exported)
            per_device = self._outputs(exported, out_kinds, k, n, layout)
            if outputs is not None and per_device != outputs:
                raise _core.InvalidArgumentError(
                    f"{what}: islands of different sizes give outputs "
                    f"{outputs} and {per_device}; make the outputs' shapes "
                    "follow the split inputs'")
            outputs = per_device
            modules[k] = serialized(exported, self._slice, what)

        # One entry per distinct device assignment, with the workers that
        # run it (they compile it as soon as the program is registered), and
        # its module when the island's size is not the first island's.
        first_k = len(islands[0][1])
        assignments = {}
        for worker, devs in islands:
            d = tuple(devs)
            if d not in assignments:
                opts = compiler.get_compile_options(
                    num_replicas=1, num_partitions=len(d),
                    device_assignment=np.array([d]))
                module = b"" if len(d) == first_k else modules[len(d)]
                assignments[d] = (opts.SerializeAsString(), [], module)
            assignments[d][1].append(worker)
        # A donated input is written over by the output XLA aliases it to,
        # where the two are one layout over the slice (else it is copied).
        pairs = [(i, o) for i, o in aliases
                 if tuple(specs[i][:3]) == tuple(outputs[o])]
        core = self._slice._client._core.compile_xla(
            self._slice._s, self._name, modules[first_k], self._platform,
            [(list(d), o, w, m) for d, (o, w, m) in assignments.items()],
            [(np.dtype(dt), sh, s) for dt, sh, s, _ in specs],
            [(np.dtype(dt), sh, s) for dt, sh, s in outputs],
            donated=pairs)
        self._warn_donation(names, donated, {i for i, _ in pairs})
        return XlaProgram(core, self._slice._client, treedef, tree,
                          [key for *_, key in specs], out_keys,
                          [bool(a.weak_type) for a in exported.out_avals])

    def _leaf_names(self, treedef):
        """The Python name of each argument leaf of `treedef`."""
        jax = _jax()
        marks = jax.tree_util.tree_unflatten(treedef,
                                             list(range(treedef.num_leaves)))
        return [self._arg_name(path) for path, _ in
                jax.tree_util.tree_flatten_with_path(marks)[0]]

    def _donated_leaves(self, names):
        """The argument leaves that donate_argnums / donate_argnames name,
        by index."""
        nums, argnames = self._donate
        if not nums and not argnames:
            return ()
        donated = [p for i, p in enumerate(self._params)
                   if i in nums or p in argnames]
        donated += [f"args[{i}]" for i in nums if i >= len(self._params)]
        donated += [a for a in argnames if a not in self._params]
        return tuple(i for i, n in enumerate(names) if any(
            n == d or n.startswith(d + "[") for d in donated))

    def _warn_donation(self, names, donated, used):
        """Warns, as jax.jit does, naming the donated arguments that no
        output of the same layout can be written over (they stay valid)."""
        unusable = [names[i] for i in donated if i not in used]
        if unusable:
            warnings.warn(
                f"program '{self._name}': some donated buffers were not "
                f"usable: {', '.join(unusable)} (no output of the same "
                "shape, dtype and sharding; they stay valid)", UserWarning,
                stacklevel=5)

    def _export(self, treedef, specs, static, k, n, names, layout,
                donated=()):
        """The StableHLO of the function for an island of k of the slice's
        n devices: (exported, output shardings, output tree, output key
        impls)."""
        jax = _jax()
        from jax.sharding import NamedSharding, PartitionSpec
        what = f"program '{self._name}'"
        # An abstract mesh: lowering for k devices needs none of them here.
        mesh = abstract_mesh(*layout.island_mesh(k))

        def island_sharding(sh, ndim):
            return NamedSharding(mesh, PartitionSpec(
                *layout.island_spec(sh, ndim)))

        avals, in_sh = [], []
        for leaf in specs:
            dtype, shape, sh, _ = leaf
            local = layout.island_shape(shape, sh, k, n)
            sharding = island_sharding(sh, len(shape))
            avals.append(jax.ShapeDtypeStruct(tuple(local), np.dtype(dtype),
                                              sharding=sharding,
                                              weak_type=leaf.weak))
            in_sh.append(sharding)

        fn = self._fn
        out_tree, out_keys = [], []
        in_keys = [key for *_, key in specs]

        fixed = {i: v for i, v in static if isinstance(i, int)}
        named = {k: v for k, v in static if isinstance(k, str)}

        def with_static(dynamic):
            """The full argument list: static values at their positions."""
            args, rest = [], iter(dynamic)
            for i in range(len(dynamic) + len(fixed)):
                args.append(fixed[i] if i in fixed else next(rest))
            return args

        def flat_fn(*leaves):
            # Typed keys travel as their key data: rewrap them.
            leaves = [x if impl is None else
                      jax.random.wrap_key_data(x, impl=impl)
                      for x, impl in zip(leaves, in_keys)]
            positional, keyword = jax.tree_util.tree_unflatten(treedef, leaves)
            out = fn(*with_static(positional), **keyword, **named)
            flat, tree = jax.tree_util.tree_flatten(out)
            out_tree.append(tree)
            keys = [_key_impl(jax, x) if _is_key_dtype(jax, getattr(
                x, "dtype", None)) else None for x in flat]
            out_keys.append(keys)
            return [x if impl is None else jax.random.key_data(x)
                    for x, impl in zip(flat, keys)]

        # Trace once to learn the outputs' tree, then give their shardings.
        # The island's mesh is the context mesh while tracing: the function
        # may use jax.shard_map (with collectives over `axis_name`) and
        # with_sharding_constraint with bare PartitionSpecs.
        in_mesh = jax.sharding.use_abstract_mesh
        try:
            with in_mesh(mesh):
                jaxpr, shapes = jax.make_jaxpr(flat_fn, return_shape=True)(
                    *avals)
        except Exception as e:  # the user's function failed to trace
            layout.explain_dcn_axis(e)
            if layout.traces_with_dcn_axes(jax, flat_fn, specs, k, n):
                layout.explain_dcn_axis(e, named=True)
            raise _plexus_error(e)(
                f"{what}: JAX could not trace the function for arguments "
                f"({_signature(names, specs)}): {type(e).__name__}: {e}"
            ) from e
        tree = out_tree[-1]
        out_kinds = [_sharding(s, self._slice, len(a.shape)) for s, a in zip(
            _broadcast_prefix(jax, self._out_shardings,
                              jax.tree_util.tree_unflatten(tree, shapes), tree,
                              "out_shardings"), shapes)]
        out_sh = [island_sharding(sh, len(a.shape))
                  for sh, a in zip(out_kinds, shapes)]
        if layout.crossing:
            # What each island computes must be its part of jax.jit's
            # answer over the whole mesh, or the program is refused here.
            _dcn_check.check(
                jaxpr,
                [layout.crossing_dims(sh, len(shape))
                 for _, shape, sh, _ in specs], names,
                [layout.crossing_dims(sh, len(a.shape))
                 for sh, a in zip(out_kinds, shapes)],
                _output_names(jax, tree), layout.crossing, what)
        flat_fn.__name__ = flat_fn.__qualname__ = self._name

        def jaxpr_of():
            """The function's jaxpr, to name what the workers cannot run."""
            return jaxpr

        try:
            # keep_unused: the module takes every argument the program
            # declares. Locations name operations only, not the caller's
            # source lines, so the same function lowered from two call sites
            # (or clients) is the same module and the workers' compile cache
            # serves it.
            # Donated leaves are aliased to outputs in the module
            # (tf.aliasing_output); jax's own warning about those it cannot
            # alias is replaced by one naming them (_warn_donation).
            from jax._src import config
            with config.traceback_in_locations_limit(0), in_mesh(mesh), \
                    warnings.catch_warnings():
                warnings.filterwarnings(
                    "ignore", message="Some donated buffers were not usable")
                exported = jax.export.export(
                    jax.jit(flat_fn, in_shardings=in_sh,
                            out_shardings=out_sh, keep_unused=True,
                            donate_argnums=donated),
                    platforms=[self._platform],
                    disabled_checks=_plugin_support.export_checks_to_disable(
                        self._platform))(*avals)
        except Exception as e:
            _plugin_support.check_failed_lowering(
                jaxpr_of, f"{what}, arguments ({_signature(names, specs)})",
                e, self._platform)
            layout.explain_dcn_axis(e)
            raise _plexus_error(e)(
                f"{what}: JAX could not lower the function for arguments "
                f"({_signature(names, specs)}): {type(e).__name__}: {e}"
            ) from e
        _plugin_support.check_lowered(
            exported, jaxpr_of,
            f"{what}, arguments ({_signature(names, specs)})", self._platform)
        return exported, out_kinds, tree, out_keys[-1]

    def _outputs(self, exported, out_kinds, k, n, layout):
        """The outputs' global (dtype, shape, sharding) from an island of k
        devices' lowering."""
        what = f"program '{self._name}'"
        outputs = []
        for o, (aval, sh) in enumerate(zip(exported.out_avals, out_kinds)):
            dtype = str(np.dtype(aval.dtype))
            if dtype not in _DTYPES:
                raise _core.InvalidArgumentError(
                    f"{what} output {o}: dtype {dtype} "
                    + ("has elements smaller than a byte"
                       if dtype in _SUB_BYTE else "is not a Plexus dtype")
                    + "; cast it in the function (Plexus moves every "
                    "whole-byte dtype)")
            shape = layout.global_shape(f"{what} output {o}", dtype,
                                        list(aval.shape), sh, k, n)
            outputs.append((dtype, tuple(shape), sh))
        return outputs


class _Leaf(collections.namedtuple("_Leaf", "dtype shape sharding key")):
    """An argument leaf as the program takes it: dtype name, shape and core
    sharding of what travels, and the key impl when it is a typed PRNG key
    (its key data travels). `weak`: JAX types it weakly (a Python scalar);
    an attribute beside the four fields, which code unpacks, but part of
    equality and hash, so that the program cache tells the two apart."""

    def __new__(cls, dtype, shape, sharding, key=None, weak=False):
        leaf = super().__new__(cls, dtype, shape, sharding, key)
        leaf.weak = bool(weak)
        return leaf

    def __eq__(self, other):
        return tuple.__eq__(self, other) is True and self.weak == getattr(
            other, "weak", False)

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash((tuple(self), self.weak))


def _key_impl(jax, x):
    """The impl name of a typed key array (or a ShapeDtypeStruct of one)."""
    try:
        return str(jax.random.key_impl(x))
    except Exception:  # noqa: BLE001 - a ShapeDtypeStruct: its dtype knows
        return x.dtype._impl.name


def _dtype_of(jax, dtype, what):
    """The canonical numpy dtype of a leaf, or an error naming it."""
    try:
        dtype = np.dtype(dtype)
    except TypeError as e:
        raise _core.InvalidArgumentError(
            f"{what}: {dtype!r} is not an array dtype") from e
    if dtype.name in _SUB_BYTE:
        raise _core.InvalidArgumentError(
            f"{what}: dtype {dtype.name} has elements smaller than a byte; "
            "Plexus moves whole-byte dtypes only (cast it to int8, uint8 "
            "or wider)")
    dtype = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
    if dtype.name not in _DTYPES:
        raise _core.InvalidArgumentError(
            f"{what}: dtype {dtype} is not an array dtype JAX and Plexus "
            f"share ({', '.join(_DTYPES)})")
    return dtype


def _signature(names, specs):
    """x: float32[8] split(0), k: key<threefry2x32>[] ..."""
    parts = []
    for name, (dtype, shape, sh, key) in zip(names, specs):
        if key is not None:
            parts.append(f"{name}: key<{key}> data {dtype}{list(shape)} "
                         f"{_sharding_repr(sh)}")
        else:
            parts.append(f"{name}: {dtype}{list(shape)} {_sharding_repr(sh)}")
    return ", ".join(parts)


def _output_names(jax, tree):
    """The name of each output leaf of `tree`: "output" for a lone array,
    else "output [1]['w']"."""
    marks = jax.tree_util.tree_unflatten(tree, list(range(tree.num_leaves)))
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(marks)[0]]
    return [f"output {jax.tree_util.keystr(p)}" if p else "output"
            for p in paths]


def _plexus_error(e):
    """The Plexus error class for an exception raised by JAX or user code
    while tracing or lowering."""
    if isinstance(e, NotImplementedError):
        return _core.UnimplementedError
    if isinstance(e, MemoryError):
        return _core.ResourceExhaustedError
    return _core.InvalidArgumentError


def _broadcast_prefix(jax, prefix, full, full_tree, what):
    """One entry of `prefix` (a pytree prefix of `full`) per leaf of full."""
    if prefix is None:
        return [None] * full_tree.num_leaves
    try:
        grouped = jax.tree_util.tree_map(
            lambda p, sub: _Group([p] * len(jax.tree_util.tree_leaves(sub))),
            prefix, full, is_leaf=_is_sharding_leaf)
    except ValueError as e:
        raise _core.InvalidArgumentError(
            f"{what} must be a pytree prefix of the "
            f"{'arguments' if what == 'in_shardings' else 'outputs'}: {e}"
        ) from e
    return [s for group in jax.tree_util.tree_leaves(
        grouped, is_leaf=lambda x: isinstance(x, _Group)) for s in group.items]


class _Group:
    __slots__ = ("items",)

    def __init__(self, items):
        self.items = items


def _is_sharding_leaf(x):
    return x is None or _is_partition_spec(x) or (
        type(x).__name__ == "NamedSharding") or (
        isinstance(x, tuple) and len(x) == 2 and
        x[0] in ("replicated", "split", "partial")) or (
        isinstance(x, tuple) and len(x) == 4 and x[0] == "mesh")


__all__ = ["jit", "Jitted", "XlaProgram", "partial", "replicated", "split"]
