// LAPACK handlers: the custom call targets that JAX lowers jnp.linalg to on
// CPU (jaxlib's LAPACK kernels, `lapack_<T><routine>_ffi`), served by XLA
// FFI handlers of Plexus's own over Debian's LAPACK (OpenBLAS), so that a
// worker runs such a program through the CPU PJRT plugin, which has none,
// without Python or jaxlib.
//
// Each handler takes exactly what JAX's CPU lowering emits for its target
// (jax and jaxlib 0.10.2, scripts/setup.sh; read from the custom calls in
// the lowered StableHLO and from jax/_src/lax/linalg.py), for T one of
// s (float32), d (float64), c (complex64), z (complex128):
//
//   target          for               operands       results
//   getrf           lu, solve, inv,   a[..,m,n]      a: L\U; ipiv s32[..,k]
//                   det, slogdet                     (1-based); info s32[..]
//   potrf           cholesky          a[..,n,n]      a: the uplo triangle's
//                                                    factor; info s32[..]
//   syevd (s, d),   eigh, eigvalsh    a[..,n,n]      a: eigenvectors (mode
//   heevd (c, z)                                     'V'); w real[..,n],
//                                                    ascending; info s32[..]
//   gesdd           svd, pinv, lstsq, a[..,m,n]      a: destroyed; s real
//                   norm, cond,                      [..,k]; u[..,m,m|k];
//                   matrix_rank                      vt[..,n|k,n]; info
//   gesvd           svd with          as gesdd
//                   SvdAlgorithm.QR
//   geqrf           qr                a[..,m,n]      a: R and reflectors;
//                                                    tau[..,k]
//   orgqr (s, d),   qr                a[..,m,n],     a: Q (m >= n >= j)
//   ungqr (c, z)                      tau[..,j]
//   geev            eig, eigvals      a[..,n,n]      s, d: wr, wi[..,n],
//                                     (not written)  vl, vr complex[..,n,n];
//                                                    c, z: w, vl, vr; info
//   trsm            solve, inv,       a[..,l,l],     b: x with op(a) x = b
//                   solve_triangular, b[..,m,n]      or x op(a) = b
//                   cho_solve
//
// where k = min(m, n). "a: ..." is a result that aliases that operand
// (output_operand_aliases): the handler copies the operand into it unless
// XLA gave it the same memory. Every matrix is column-major (the custom
// calls' operand and result layouts) and the leading dimensions are a
// batch, each matrix computed on its own. Attributes are LAPACK's letters
// as uint8: uplo 'L'/'U' (potrf, syevd, trsm), mode 'V'/'N' (syevd) or
// 'A'/'S'/'N' (gesdd, gesvd: all, the first k, no singular vectors),
// compute_left / compute_right 'V'/'N' (geev), side 'L'/'R', trans_x
// 'N'/'T'/'C', diag 'N'/'U' (trsm). Results not asked for (u and vt with
// mode 'N', vl or vr with 'N') are left unwritten: JAX drops them.
//
// What LAPACK reports about the data (a singular matrix, one not positive
// definite, no convergence) is its INFO in `info`, one per matrix, exactly
// as jaxlib's kernels give it: JAX's lowering then puts NaNs in the
// results. An error (an ffi::Error that fails the run, its message naming
// the target) means the call was not what JAX emits: a wrong rank, shapes
// that do not agree, an attribute letter LAPACK does not take, a matrix
// too large for LAPACK's 32-bit sizes.
//
// Every other target jaxlib has (gees, gehrd, sytrd, geqp3, ormqr,
// gtsv, ...) has no handler here: programs calling one are refused on the
// client while lowering (python/plexus/_plugin_support.py reads
// kLapackTargets through plexus._core.lapack_targets()).
//
// Thread-safe: handlers keep no state; each call allocates its own
// workspace.
#pragma once

#include <array>
#include <string_view>

#include "absl/status/status.h"

struct PJRT_Api;

namespace plexus::xla::lapack {

// The custom call targets served, in the order they are registered.
inline constexpr std::array<std::string_view, 36> kLapackTargets = {
    "lapack_sgetrf_ffi", "lapack_dgetrf_ffi", "lapack_cgetrf_ffi",
    "lapack_zgetrf_ffi", "lapack_spotrf_ffi", "lapack_dpotrf_ffi",
    "lapack_cpotrf_ffi", "lapack_zpotrf_ffi", "lapack_ssyevd_ffi",
    "lapack_dsyevd_ffi", "lapack_cheevd_ffi", "lapack_zheevd_ffi",
    "lapack_sgesdd_ffi", "lapack_dgesdd_ffi", "lapack_cgesdd_ffi",
    "lapack_zgesdd_ffi", "lapack_sgesvd_ffi", "lapack_dgesvd_ffi",
    "lapack_cgesvd_ffi", "lapack_zgesvd_ffi", "lapack_sgeqrf_ffi",
    "lapack_dgeqrf_ffi", "lapack_cgeqrf_ffi", "lapack_zgeqrf_ffi",
    "lapack_sorgqr_ffi", "lapack_dorgqr_ffi", "lapack_cungqr_ffi",
    "lapack_zungqr_ffi", "lapack_sgeev_ffi",  "lapack_dgeev_ffi",
    "lapack_cgeev_ffi",  "lapack_zgeev_ffi",  "lapack_strsm_ffi",
    "lapack_dtrsm_ffi",  "lapack_ctrsm_ffi",  "lapack_ztrsm_ffi",
};

// The platform the handlers are registered for: XLA's name for its CPU
// backend, under which XLA looks a custom call's handler up when it
// compiles for the CPU plugin.
inline constexpr std::string_view kLapackPlatform = "Host";

// Registers a handler for every target of kLapackTargets with the XLA FFI
// registry of the plugin `api` belongs to (through its PJRT FFI
// extension), for kLapackPlatform. Call it before compiling a program that
// calls them. The registry is the plugin's, one per process: registering
// again (another runtime of the same plugin) is harmless.
// FailedPrecondition where the plugin has no FFI extension, or one that
// predates handler registration; otherwise the plugin's error, naming the
// target it refused.
absl::Status RegisterLapackHandlers(const PJRT_Api* api);

}  // namespace plexus::xla::lapack
