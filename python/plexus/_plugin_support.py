"""What a plexus.jit function may use that the workers cannot run.

A worker runs a module through its PJRT plugin alone, in a process with no
Python and no jaxlib. Two things JAX lowers are served by the process that
traced the function, not by XLA, and so cannot run on a worker:

  - host callbacks (jax.debug.print, jax.debug.callback, jax.pure_callback,
    jax.experimental.io_callback) call back into that Python process;
  - jaxlib's CPU kernels (LAPACK: jnp.linalg.solve, inv, cholesky, eigh,
    svd, qr, eig, jax.scipy.linalg.*) are FFI handlers that jaxlib
    registers in that process (its `_lapack` module, with LAPACK routines
    it takes from scipy); the CPU plugin the workers load (xla-cpu-pjrt)
    has none, so the module would fail to compile on the worker ("No FFI
    handler registered for lapack_sgetrf_ffi").

Both are refused while the program is lowered, on the client, naming the
program, the JAX functions and what to do instead.
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
    "hessenberg", "tridiagonal", "tridiagonal_solve", "qr",
}

# Custom call targets that jaxlib registers for the CPU (LAPACK, BLAS).
_JAXLIB_CPU_TARGET = re.compile(r"^(lapack|blas)_\w+$")
_CUSTOM_CALL = re.compile(r'custom_call @"?([\w.$-]+)"?|'
                          r'call_target_name = "([\w.$-]+)"')


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
    if b"lapack_" in module or b"blas_" in module:
        refuse_jaxlib_kernels(exported.mlir_module(), jaxpr_of, what,
                              platform)


def check_failed_lowering(jaxpr_of, what):
    """After jax.export failed: raises the clearer error where the cause is
    a host callback (jax.export says only "serialization of host_callbacks
    is not yet implemented")."""
    try:
        jaxpr = jaxpr_of()
    except Exception:  # noqa: BLE001 - the caller reports the failure
        return
    refuse_host_callbacks(jaxpr, what)


def refuse_jaxlib_kernels(module_text, jaxpr_of, what, platform):
    """Raises UnimplementedError if the module (its MLIR text) calls
    jaxlib's CPU kernels, naming the JAX functions that call them
    (`jaxpr_of()` gives the function's ClosedJaxpr, traced only then)."""
    if platform != "cpu":
        return
    targets = []
    for m in _CUSTOM_CALL.finditer(module_text):
        target = m.group(1) or m.group(2)
        if _JAXLIB_CPU_TARGET.match(target) and target not in targets:
            targets.append(target)
    if not targets:
        return
    callers = {}  # the outermost jitted function (solve) -> its primitives
    try:
        for path, eqn in _walk(jaxpr_of().jaxpr):
            if eqn.primitive.name in _LAPACK_PRIMITIVES:
                used = callers.setdefault(path[0] if path else None, [])
                if eqn.primitive.name not in used:
                    used.append(eqn.primitive.name)
    except Exception:  # noqa: BLE001 - the names only make the message
        callers = {}   # better; the targets say what is refused
    calls = ", ".join(
        ", ".join(used) if caller is None else
        f"{caller} ({', '.join(used)})" for caller, used in callers.items())
    calls = f"calls {calls}, which lower" if calls else "lowers"
    raise _core.UnimplementedError(
        f"{what}: the function {calls} to jaxlib's LAPACK kernels "
        f"(custom calls {', '.join(targets)}: jnp.linalg.solve, inv, "
        "cholesky, eigh, svd, qr, eig and jax.scipy.linalg use them on "
        "CPU). jaxlib registers those kernels in the Python process that "
        "traced the function; the workers' CPU PJRT plugin (xla-cpu-pjrt) "
        "has no LAPACK handlers, so the program cannot run there. Compute "
        "the decomposition on the client (jax.jit on the fetched values), "
        "or without LAPACK in the program (e.g. an iterative solver such "
        "as jax.scipy.sparse.linalg.cg)")
