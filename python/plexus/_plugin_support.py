"""What a plexus.jit function may use that the workers cannot run.

A worker runs a module through its PJRT plugin alone, in a process with no
Python and no jaxlib. Two things JAX lowers are served by the process that
traced the function, not by XLA:

  - host callbacks (jax.debug.print, jax.debug.callback, jax.pure_callback,
    jax.experimental.io_callback) call back into that Python process, and
    cannot run on a worker;
  - jaxlib's CPU kernels (LAPACK: jnp.linalg.solve, inv, det, cholesky,
    eigh, svd, qr, eig, jax.scipy.linalg.*) are FFI handlers that jaxlib
    registers in that process; the CPU plugin the workers load
    (xla-cpu-pjrt) has none. The workers register handlers of their own
    for the LAPACK targets that jnp.linalg lowers to
    (executors/xla/lapack/lapack_handlers.h, listed by
    _core.lapack_targets()); a module that calls any other jaxlib kernel
    would fail to compile on the worker ("No FFI handler registered for
    lapack_sgees_ffi").

Host callbacks and the kernels the workers have no handler for are refused
while the program is lowered, on the client, naming the program, the JAX
functions, the missing targets and what to do instead.
"""
import re

from . import _core

# Callback primitive -> the JAX API that binds it.
_HOST_CALLBACKS = {
    "debug_print": "jax.debug.print",
    "debug_callback": "jax.debug.callback (or jax.debug.print, "
                      "jax.debug.breakpoint)",
    "pure_callback": "jax.pure_callback",
    "io_callback": "jax.experimental.io_callback",
}

# Linear-algebra primitives that lower to jaxlib's LAPACK kernels on CPU.
_LAPACK_PRIMITIVES = {
    "lu", "cholesky", "eigh", "svd", "geqrf", "geqp3",
    "householder_product", "triangular_solve", "eig", "schur",
    "hessenberg", "tridiagonal", "tridiagonal_solve", "qr", "ormqr",
}

# Custom call targets that jaxlib registers for the CPU (its LAPACK
# module: LAPACK, BLAS and the perturbed tridiagonal solve of
# jax.scipy.linalg.eigh_tridiagonal).
_JAXLIB_CPU_TARGET = re.compile(
    r"^((lapack|blas)_\w+|tridiagonal_solve_perturbed_ffi)$")
# The routine of a LAPACK target ("lapack_sgees_ffi" -> "gees").
_LAPACK_ROUTINE = re.compile(r"^lapack_[sdcz](\w+?)(_ffi)?$")
# The primitives whose CPU lowering calls each routine (to name them).
_ROUTINE_PRIMITIVES = {
    "getrf": ("lu",), "potrf": ("cholesky",), "syevd": ("eigh",),
    "heevd": ("eigh",), "gesdd": ("svd",), "gesvd": ("svd",),
    "geqrf": ("geqrf", "qr"), "orgqr": ("householder_product", "qr"),
    "ungqr": ("householder_product", "qr"), "geev": ("eig",),
    "trsm": ("triangular_solve",), "gees": ("schur",),
    "gehrd": ("hessenberg",), "sytrd": ("tridiagonal",),
    "hetrd": ("tridiagonal",), "geqp3": ("geqp3", "qr"),
    "ormqr": ("ormqr",), "unmqr": ("ormqr",),
    "gtsv": ("tridiagonal_solve",),
}
_OTHER_TARGET_PRIMITIVES = {
    "tridiagonal_solve_perturbed_ffi": ("tridiagonal_solve",),
}
# The targets the workers serve (executors/xla/lapack/lapack_handlers.h).
_SERVED = frozenset(_core.lapack_targets())
_CUSTOM_CALL = re.compile(r'custom_call @"?([\w.$-]+)"?|'
                          r'call_target_name = "([\w.$-]+)"')


def export_checks_to_disable(platform):
    """jax.export's safety checks to disable for `platform`: the one that
    refuses a custom call target jaxlib gives no compatibility guarantee
    for (lapack_?gesvd_ffi, jax.lax.linalg.svd with SvdAlgorithm.QR), for
    the targets the workers serve. That guarantee is for a module stored
    and loaded later by another jaxlib; a plexus.jit module is compiled at
    once by workers of the client's own build, whose handlers take what
    this jax emits."""
    if platform != "cpu":
        return []
    import jax
    return [jax.export.DisabledSafetyCheck.custom_call(t)
            for t in sorted(_SERVED)]


def _walk(jaxpr, path=()):
    """(names of the enclosing jitted functions, equation) for every
    equation of `jaxpr` and of the jaxprs inside it."""
    for eqn in jaxpr.eqns:
        yield path, eqn
        inner = path
        if eqn.primitive.name in ("pjit", "jit") and "name" in eqn.params:
            inner = path + (str(eqn.params["name"]),)
        for value in eqn.params.values():
            for sub in _jaxprs(value):
                yield from _walk(sub, inner)


def _jaxprs(value):
    if hasattr(value, "eqns"):
        return [value]
    if hasattr(getattr(value, "jaxpr", None), "eqns"):  # a ClosedJaxpr
        return [value.jaxpr]
    if isinstance(value, (tuple, list)):
        return [j for v in value for j in _jaxprs(v)]
    return []


def refuse_host_callbacks(jaxpr, what):
    """Raises UnimplementedError naming the host callbacks in `jaxpr` (a
    ClosedJaxpr), if any."""
    kinds = []
    for _, eqn in _walk(jaxpr.jaxpr):
        kind = _HOST_CALLBACKS.get(eqn.primitive.name)
        if kind is not None and kind not in kinds:
            kinds.append(kind)
    if kinds:
        raise _core.UnimplementedError(
            f"{what}: the function uses {', '.join(kinds)}: a host callback "
            "would call back into this Python process from the worker "
            "that runs the program, and Plexus workers run programs "
            "without Python (host callbacks are not delivered to the "
            "client). Return the value as an output of the program and "
            "print or process it on the client (np.asarray(out), "
            "out.item())")


def check_lowered(exported, jaxpr_of, what, platform):
    """Raises UnimplementedError if the exported module needs what the
    workers cannot run (`jaxpr_of()` gives the function's ClosedJaxpr, to
    name the JAX functions; traced only then)."""
    module = exported.mlir_module_serialized  # its strings, cheaply
    if b"callback" in module:
        refuse_host_callbacks(jaxpr_of(), what)
    if (b"lapack_" in module or b"blas_" in module
            or b"tridiagonal_solve_perturbed" in module):
        refuse_jaxlib_kernels(exported.mlir_module(), jaxpr_of, what,
                              platform)


def check_failed_lowering(jaxpr_of, what, error, platform):
    """After jax.export failed with `error`: raises the clearer error where
    the cause is a host callback (jax.export says only "serialization of
    host_callbacks is not yet implemented") or a jaxlib kernel the workers
    have no handler for (jax.export refuses some, lapack_sgeqp3_ffi among
    them, as targets without a compatibility guarantee, quoting the
    custom call)."""
    try:
        jaxpr = jaxpr_of()
    except Exception:  # noqa: BLE001 - the caller reports the failure
        return
    refuse_host_callbacks(jaxpr, what)
    refuse_jaxlib_kernels(str(error), lambda: jaxpr, what, platform)


def refuse_jaxlib_kernels(module_text, jaxpr_of, what, platform):
    """Raises UnimplementedError if the module (its MLIR text) calls
    jaxlib's CPU kernels that the workers have no handler for, naming the
    JAX functions that call them (`jaxpr_of()` gives the function's
    ClosedJaxpr, traced only then)."""
    if platform != "cpu":
        return
    targets = []
    for m in _CUSTOM_CALL.finditer(module_text):
        target = m.group(1) or m.group(2)
        if (_JAXLIB_CPU_TARGET.match(target) and target not in _SERVED
                and target not in targets):
            targets.append(target)
    if not targets:
        return
    # The primitives that lower to the missing targets (all of the
    # LAPACK ones where a target's routine is not known here).
    wanted = set()
    for target in targets:
        m = _LAPACK_ROUTINE.match(target)
        wanted.update(_ROUTINE_PRIMITIVES.get(m.group(1), ()) if m else
                      _OTHER_TARGET_PRIMITIVES.get(target, ()))
    wanted = wanted or _LAPACK_PRIMITIVES
    callers = {}  # the outermost jitted function (schur) -> its primitives
    try:
        for path, eqn in _walk(jaxpr_of().jaxpr):
            if eqn.primitive.name in wanted:
                used = callers.setdefault(path[0] if path else None, [])
                if eqn.primitive.name not in used:
                    used.append(eqn.primitive.name)
    except Exception:  # noqa: BLE001 - the names only make the message
        callers = {}   # better; the targets say what is refused
    calls = ", ".join(
        ", ".join(used) if caller is None else
        f"{caller} ({', '.join(used)})" for caller, used in callers.items())
    calls = f"calls {calls}, which lower" if calls else "lowers"
    served = sorted({_LAPACK_ROUTINE.match(t).group(1) for t in _SERVED})
    raise _core.UnimplementedError(
        f"{what}: the function {calls} to jaxlib's LAPACK kernels "
        f"{', '.join(targets)}, which the workers have no handler for: "
        "jaxlib registers its kernels in the Python process that traced "
        "the function, and the workers' CPU PJRT plugin (xla-cpu-pjrt) has "
        "none; the workers serve their own for "
        f"{', '.join(served)} (jnp.linalg.solve, inv, det, slogdet, "
        "cholesky, eigh, svd, qr, eig, lstsq, pinv and "
        "jax.scipy.linalg.lu, solve_triangular, cho_solve). Compute this "
        "on the client (jax.jit on the fetched values), or without that "
        "routine in the program")
