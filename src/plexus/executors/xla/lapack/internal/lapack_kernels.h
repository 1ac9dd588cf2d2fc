// Internal to executors/xla/lapack: the LAPACK routines behind the FFI
// handlers (lapack_handlers.cc), over batches of column-major matrices in
// memory the caller owns. No XLA here, so they are tested directly
// (lapack_kernels_test.cc).
//
// LAPACK is the one in Debian's OpenBLAS (libopenblas0-pthread 0.3.21,
// LP64: 32-bit integers), called through its Fortran symbols. Each routine
// runs once per matrix of the batch; the workspace is asked of LAPACK
// (lwork = -1) once per call and shared by the batch. A matrix whose sizes
// do not fit LAPACK's 32-bit integers is refused (InvalidArgument). What
// LAPACK reports about the data (a singular or non-positive-definite
// matrix, a decomposition that did not converge) is not an error here: it
// is written to `info`, one per matrix, as LAPACK's INFO, for the caller
// to act on (JAX turns such results into NaNs).
//
// Thread-compatible: calls on distinct memory may run concurrently.
#pragma once

#include <complex>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"

namespace plexus::xla::lapack {

// `count` matrices of rows x cols elements, column-major (the element at
// row i, column j at i + j * rows), one after another.
template <typename T>
struct MatrixBatch {
  T* data = nullptr;
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;

  T* matrix(int64_t b) const { return data + b * rows * cols; }
};

// The real type of T's elements: float for std::complex<float>.
template <typename T>
struct RealOf {
  using type = T;
};
template <typename R>
struct RealOf<std::complex<R>> {
  using type = R;
};
template <typename T>
using Real = typename RealOf<T>::type;

template <typename T>
inline constexpr bool kIsComplex = !std::is_same_v<T, Real<T>>;

// The letter LAPACK names T's routines by: s, d, c, z.
template <typename T>
char TypePrefix();

// LU with partial pivoting (?getrf): `a` is overwritten with L (unit
// diagonal, not stored) and U; ipiv[b * min(m, n) + i] is the 1-based row
// that row i was swapped with, as LAPACK gives it.
template <typename T>
absl::Status Getrf(MatrixBatch<T> a, int32_t* ipiv, int32_t* info);

// Cholesky (?potrf) of square matrices: the `uplo` ('L' or 'U') triangle of
// `a` is overwritten with the factor; the other triangle is left as it was.
template <typename T>
absl::Status Potrf(char uplo, MatrixBatch<T> a, int32_t* info);

// Eigenvalues, and with mode 'V' eigenvectors, of symmetric (Hermitian)
// matrices by divide and conquer (?syevd, ?heevd), reading the `uplo`
// triangle of `a`. w[b * n + i]: the eigenvalues in ascending order; with
// mode 'V', `a` is overwritten with the eigenvectors as columns.
template <typename T>
absl::Status Syevd(char mode, char uplo, MatrixBatch<T> a, Real<T>* w,
                   int32_t* info);

// Singular values, and with mode 'A' (all) or 'S' (the first min(m, n))
// singular vectors, by divide and conquer (?gesdd). `a` is destroyed;
// s[b * min(m, n) + i]: the singular values, descending; `u` (m rows) and
// `vt` (its rows as leading dimension) are written only with 'A' or 'S'.
template <typename T>
absl::Status Gesdd(char mode, MatrixBatch<T> a, Real<T>* s, MatrixBatch<T> u,
                   MatrixBatch<T> vt, int32_t* info);

// The same by the QR algorithm (?gesvd, jobu = jobvt = mode): slower,
// sometimes more accurate (jax.lax.linalg.svd with SvdAlgorithm.QR).
template <typename T>
absl::Status Gesvd(char mode, MatrixBatch<T> a, Real<T>* s, MatrixBatch<T> u,
                   MatrixBatch<T> vt, int32_t* info);

// QR (?geqrf): `a` is overwritten with R above its diagonal and the
// Householder reflectors below; tau[b * min(m, n) + i]: their scalars.
template <typename T>
absl::Status Geqrf(MatrixBatch<T> a, T* tau);

// The m x n matrix Q with orthonormal columns (?orgqr, ?ungqr) from the
// first k reflectors that Geqrf left in `a` (m >= n >= k), in place;
// tau[b * k + i].
template <typename T>
absl::Status Orgqr(MatrixBatch<T> a, const T* tau, int64_t k);

// Eigenvalues, and with 'V' left and/or right eigenvectors, of general
// square matrices (?geev); `a` is read, not written. Real T: the
// eigenvalues as wr + i wi (a complex pair adjacent, the one with the
// positive imaginary part first) and the eigenvectors unpacked from
// LAPACK's real pairs into complex columns, each of unit norm with its
// largest component real. `vl` / `vr` are written only where asked for.
template <typename T>
absl::Status RealGeev(char left, char right, MatrixBatch<const T> a, T* wr,
                      T* wi, std::complex<T>* vl, std::complex<T>* vr,
                      int32_t* info);
// The same for complex T: the eigenvalues w[b * n + i].
template <typename T>
absl::Status ComplexGeev(char left, char right, MatrixBatch<const T> a, T* w,
                         T* vl, T* vr, int32_t* info);

// Solves op(a) x = b (side 'L') or x op(a) = b (side 'R') for x, with `a`
// triangular (`uplo` 'L' or 'U', `diag` 'U' for a unit diagonal, 'N'
// otherwise) and op 'N' (none), 'T' (transpose) or 'C' (conjugate
// transpose): ?trsm with alpha 1, `b` overwritten with x. `a` holds one
// matrix per matrix of `b`.
template <typename T>
absl::Status Trsm(char side, char uplo, char trans, char diag,
                  MatrixBatch<const T> a, MatrixBatch<T> b);

}  // namespace plexus::xla::lapack
