#include "plexus/executors/xla/lapack/internal/lapack_kernels.h"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

// LAPACK's Fortran symbols as OpenBLAS exports them (LP64). Character
// arguments are followed, after the last argument, by their hidden lengths
// (gfortran's convention; the routines OpenBLAS implements in C ignore
// them). Fortran COMPLEX is laid out as std::complex.
using fc = std::complex<float>;
using zc = std::complex<double>;
using flen = size_t;
extern "C" {
// clang-format off
void sgetrf_(const int* m, const int* n, float* a, const int* lda, int* ipiv, int* info);
void dgetrf_(const int* m, const int* n, double* a, const int* lda, int* ipiv, int* info);
void cgetrf_(const int* m, const int* n, fc* a, const int* lda, int* ipiv, int* info);
void zgetrf_(const int* m, const int* n, zc* a, const int* lda, int* ipiv, int* info);

void spotrf_(const char* uplo, const int* n, float* a, const int* lda, int* info, flen);
void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info, flen);
void cpotrf_(const char* uplo, const int* n, fc* a, const int* lda, int* info, flen);
void zpotrf_(const char* uplo, const int* n, zc* a, const int* lda, int* info, flen);

void ssyevd_(const char* jobz, const char* uplo, const int* n, float* a, const int* lda, float* w, float* work, const int* lwork, int* iwork, const int* liwork, int* info, flen, flen);
void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w, double* work, const int* lwork, int* iwork, const int* liwork, int* info, flen, flen);
void cheevd_(const char* jobz, const char* uplo, const int* n, fc* a, const int* lda, float* w, fc* work, const int* lwork, float* rwork, const int* lrwork, int* iwork, const int* liwork, int* info, flen, flen);
void zheevd_(const char* jobz, const char* uplo, const int* n, zc* a, const int* lda, double* w, zc* work, const int* lwork, double* rwork, const int* lrwork, int* iwork, const int* liwork, int* info, flen, flen);

void sgesdd_(const char* jobz, const int* m, const int* n, float* a, const int* lda, float* s, float* u, const int* ldu, float* vt, const int* ldvt, float* work, const int* lwork, int* iwork, int* info, flen);
void dgesdd_(const char* jobz, const int* m, const int* n, double* a, const int* lda, double* s, double* u, const int* ldu, double* vt, const int* ldvt, double* work, const int* lwork, int* iwork, int* info, flen);
void cgesdd_(const char* jobz, const int* m, const int* n, fc* a, const int* lda, float* s, fc* u, const int* ldu, fc* vt, const int* ldvt, fc* work, const int* lwork, float* rwork, int* iwork, int* info, flen);
void zgesdd_(const char* jobz, const int* m, const int* n, zc* a, const int* lda, double* s, zc* u, const int* ldu, zc* vt, const int* ldvt, zc* work, const int* lwork, double* rwork, int* iwork, int* info, flen);

void sgesvd_(const char* jobu, const char* jobvt, const int* m, const int* n, float* a, const int* lda, float* s, float* u, const int* ldu, float* vt, const int* ldvt, float* work, const int* lwork, int* info, flen, flen);
void dgesvd_(const char* jobu, const char* jobvt, const int* m, const int* n, double* a, const int* lda, double* s, double* u, const int* ldu, double* vt, const int* ldvt, double* work, const int* lwork, int* info, flen, flen);
void cgesvd_(const char* jobu, const char* jobvt, const int* m, const int* n, fc* a, const int* lda, float* s, fc* u, const int* ldu, fc* vt, const int* ldvt, fc* work, const int* lwork, float* rwork, int* info, flen, flen);
void zgesvd_(const char* jobu, const char* jobvt, const int* m, const int* n, zc* a, const int* lda, double* s, zc* u, const int* ldu, zc* vt, const int* ldvt, zc* work, const int* lwork, double* rwork, int* info, flen, flen);

void sgeqrf_(const int* m, const int* n, float* a, const int* lda, float* tau, float* work, const int* lwork, int* info);
void dgeqrf_(const int* m, const int* n, double* a, const int* lda, double* tau, double* work, const int* lwork, int* info);
void cgeqrf_(const int* m, const int* n, fc* a, const int* lda, fc* tau, fc* work, const int* lwork, int* info);
void zgeqrf_(const int* m, const int* n, zc* a, const int* lda, zc* tau, zc* work, const int* lwork, int* info);

void sorgqr_(const int* m, const int* n, const int* k, float* a, const int* lda, const float* tau, float* work, const int* lwork, int* info);
void dorgqr_(const int* m, const int* n, const int* k, double* a, const int* lda, const double* tau, double* work, const int* lwork, int* info);
void cungqr_(const int* m, const int* n, const int* k, fc* a, const int* lda, const fc* tau, fc* work, const int* lwork, int* info);
void zungqr_(const int* m, const int* n, const int* k, zc* a, const int* lda, const zc* tau, zc* work, const int* lwork, int* info);

void sgeev_(const char* jobvl, const char* jobvr, const int* n, float* a, const int* lda, float* wr, float* wi, float* vl, const int* ldvl, float* vr, const int* ldvr, float* work, const int* lwork, int* info, flen, flen);
void dgeev_(const char* jobvl, const char* jobvr, const int* n, double* a, const int* lda, double* wr, double* wi, double* vl, const int* ldvl, double* vr, const int* ldvr, double* work, const int* lwork, int* info, flen, flen);
void cgeev_(const char* jobvl, const char* jobvr, const int* n, fc* a, const int* lda, fc* w, fc* vl, const int* ldvl, fc* vr, const int* ldvr, fc* work, const int* lwork, float* rwork, int* info, flen, flen);
void zgeev_(const char* jobvl, const char* jobvr, const int* n, zc* a, const int* lda, zc* w, zc* vl, const int* ldvl, zc* vr, const int* ldvr, zc* work, const int* lwork, double* rwork, int* info, flen, flen);

void strsm_(const char* side, const char* uplo, const char* transa, const char* diag, const int* m, const int* n, const float* alpha, const float* a, const int* lda, float* b, const int* ldb, flen, flen, flen, flen);
void dtrsm_(const char* side, const char* uplo, const char* transa, const char* diag, const int* m, const int* n, const double* alpha, const double* a, const int* lda, double* b, const int* ldb, flen, flen, flen, flen);
void ctrsm_(const char* side, const char* uplo, const char* transa, const char* diag, const int* m, const int* n, const fc* alpha, const fc* a, const int* lda, fc* b, const int* ldb, flen, flen, flen, flen);
void ztrsm_(const char* side, const char* uplo, const char* transa, const char* diag, const int* m, const int* n, const zc* alpha, const zc* a, const int* lda, zc* b, const int* ldb, flen, flen, flen, flen);
// clang-format on
}

namespace plexus::xla::lapack {

template <>
char TypePrefix<float>() {
  return 's';
}
template <>
char TypePrefix<double>() {
  return 'd';
}
template <>
char TypePrefix<fc>() {
  return 'c';
}
template <>
char TypePrefix<zc>() {
  return 'z';
}

namespace {

// Each type's routines, under one name.
template <typename T>
struct Routines;

template <>
struct Routines<float> {
  static constexpr auto getrf = sgetrf_;
  static constexpr auto potrf = spotrf_;
  static constexpr auto syevd = ssyevd_;
  static constexpr auto gesdd = sgesdd_;
  static constexpr auto gesvd = sgesvd_;
  static constexpr auto geqrf = sgeqrf_;
  static constexpr auto orgqr = sorgqr_;
  static constexpr auto geev = sgeev_;
  static constexpr auto trsm = strsm_;
};
template <>
struct Routines<double> {
  static constexpr auto getrf = dgetrf_;
  static constexpr auto potrf = dpotrf_;
  static constexpr auto syevd = dsyevd_;
  static constexpr auto gesdd = dgesdd_;
  static constexpr auto gesvd = dgesvd_;
  static constexpr auto geqrf = dgeqrf_;
  static constexpr auto orgqr = dorgqr_;
  static constexpr auto geev = dgeev_;
  static constexpr auto trsm = dtrsm_;
};
template <>
struct Routines<fc> {
  static constexpr auto getrf = cgetrf_;
  static constexpr auto potrf = cpotrf_;
  static constexpr auto syevd = cheevd_;
  static constexpr auto gesdd = cgesdd_;
  static constexpr auto gesvd = cgesvd_;
  static constexpr auto geqrf = cgeqrf_;
  static constexpr auto orgqr = cungqr_;
  static constexpr auto geev = cgeev_;
  static constexpr auto trsm = ctrsm_;
};
template <>
struct Routines<zc> {
  static constexpr auto getrf = zgetrf_;
  static constexpr auto potrf = zpotrf_;
  static constexpr auto syevd = zheevd_;
  static constexpr auto gesdd = zgesdd_;
  static constexpr auto gesvd = zgesvd_;
  static constexpr auto geqrf = zgeqrf_;
  static constexpr auto orgqr = zungqr_;
  static constexpr auto geev = zgeev_;
  static constexpr auto trsm = ztrsm_;
};

// A size LAPACK takes (a 32-bit integer), or InvalidArgument naming the
// routine and the matrix.
template <typename T>
absl::Status FitsInt(const char* routine, int64_t rows, int64_t cols) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (rows < 0 || cols < 0 || rows > kMax || cols > kMax ||
      (rows > 0 && cols > kMax / rows)) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(1, TypePrefix<T>()), routine, ": a ", rows,
                     "x", cols, " matrix does not fit LAPACK's 32-bit sizes"));
  }
  return absl::OkStatus();
}

// The workspace size LAPACK answered a query (lwork = -1) with.
template <typename T>
int WorkSize(const T& answer) {
  return std::max(1, static_cast<int>(std::real(answer)));
}

template <typename T>
absl::Status CheckMode(const char* routine, const char* what, char value,
                       const char* allowed) {
  for (const char* c = allowed; *c != '\0'; ++c) {
    if (*c == value) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(1, TypePrefix<T>()), routine, ": ", what,
                   " is '", std::string(1, value), "' (",
                   static_cast<int>(value), "), not one of \"", allowed, "\""));
}

}  // namespace

template <typename T>
absl::Status Getrf(MatrixBatch<T> a, int32_t* ipiv, int32_t* info) {
  if (absl::Status s = FitsInt<T>("getrf", a.rows, a.cols); !s.ok()) return s;
  const int m = static_cast<int>(a.rows);
  const int n = static_cast<int>(a.cols);
  const int lda = std::max(1, m);
  const int k = std::min(m, n);
  for (int64_t b = 0; b < a.count; ++b) {
    Routines<T>::getrf(&m, &n, a.matrix(b), &lda, ipiv + b * k, &info[b]);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Potrf(char uplo, MatrixBatch<T> a, int32_t* info) {
  if (absl::Status s = FitsInt<T>("potrf", a.rows, a.cols); !s.ok()) return s;
  if (absl::Status s = CheckMode<T>("potrf", "uplo", uplo, "LU"); !s.ok()) {
    return s;
  }
  const int n = static_cast<int>(a.rows);
  const int lda = std::max(1, n);
  for (int64_t b = 0; b < a.count; ++b) {
    Routines<T>::potrf(&uplo, &n, a.matrix(b), &lda, &info[b], 1);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Syevd(char mode, char uplo, MatrixBatch<T> a, Real<T>* w,
                   int32_t* info) {
  const char* routine = kIsComplex<T> ? "heevd" : "syevd";
  if (absl::Status s = FitsInt<T>(routine, a.rows, a.cols); !s.ok()) return s;
  if (absl::Status s = CheckMode<T>(routine, "mode", mode, "NV"); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckMode<T>(routine, "uplo", uplo, "LU"); !s.ok()) {
    return s;
  }
  const int n = static_cast<int>(a.rows);
  const int lda = std::max(1, n);
  if (a.count == 0) return absl::OkStatus();
  T work_size{};
  Real<T> rwork_size{};
  int iwork_size = 0;
  int query = -1;
  int query_info = 0;
  if constexpr (kIsComplex<T>) {
    Routines<T>::syevd(&mode, &uplo, &n, a.data, &lda, w, &work_size, &query,
                       &rwork_size, &query, &iwork_size, &query, &query_info, 1,
                       1);
  } else {
    Routines<T>::syevd(&mode, &uplo, &n, a.data, &lda, w, &work_size, &query,
                       &iwork_size, &query, &query_info, 1, 1);
  }
  std::vector<T> work(WorkSize(work_size));
  std::vector<int> iwork(std::max(1, iwork_size));
  const int lwork = static_cast<int>(work.size());
  const int liwork = static_cast<int>(iwork.size());
  [[maybe_unused]] std::vector<Real<T>> rwork(WorkSize(rwork_size));
  const int lrwork = static_cast<int>(rwork.size());
  for (int64_t b = 0; b < a.count; ++b) {
    if constexpr (kIsComplex<T>) {
      Routines<T>::syevd(&mode, &uplo, &n, a.matrix(b), &lda, w + b * n,
                         work.data(), &lwork, rwork.data(), &lrwork,
                         iwork.data(), &liwork, &info[b], 1, 1);
    } else {
      Routines<T>::syevd(&mode, &uplo, &n, a.matrix(b), &lda, w + b * n,
                         work.data(), &lwork, iwork.data(), &liwork, &info[b],
                         1, 1);
    }
  }
  return absl::OkStatus();
}

// What Gesdd and Gesvd check: the sizes, the mode, and where vectors are
// asked for, u and vt large enough.
template <typename T>
absl::Status CheckSvd(const char* routine, char mode, MatrixBatch<T> a,
                      MatrixBatch<T> u, MatrixBatch<T> vt) {
  if (absl::Status st = FitsInt<T>(routine, a.rows, a.cols); !st.ok()) {
    return st;
  }
  if (absl::Status st = CheckMode<T>(routine, "mode", mode, "ASN"); !st.ok()) {
    return st;
  }
  const int64_t m = a.rows;
  const int64_t n = a.cols;
  const int64_t k = std::min(m, n);
  if (mode != 'N' &&
      (u.count != a.count || vt.count != a.count || u.rows != m ||
       vt.cols != n || u.cols < (mode == 'A' ? m : k) ||
       vt.rows < (mode == 'A' ? n : k))) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(1, TypePrefix<T>()), routine, ": mode '",
        std::string(1, mode), "' of ", a.count, " ", m, "x", n,
        " matrices needs u of ", m, "x", mode == 'A' ? m : k, " and vt of ",
        mode == 'A' ? n : k, "x", n, ", got ", u.count, " of ", u.rows, "x",
        u.cols, " and ", vt.count, " of ", vt.rows, "x", vt.cols));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Gesdd(char mode, MatrixBatch<T> a, Real<T>* s, MatrixBatch<T> u,
                   MatrixBatch<T> vt, int32_t* info) {
  if (absl::Status st = CheckSvd("gesdd", mode, a, u, vt); !st.ok()) {
    return st;
  }
  const int m = static_cast<int>(a.rows);
  const int n = static_cast<int>(a.cols);
  const int k = std::min(m, n);
  const int lda = std::max(1, m);
  const bool vectors = mode != 'N';
  const int ldu = std::max<int>(1, vectors ? m : 1);
  const int ldvt = std::max<int>(1, vectors ? static_cast<int>(vt.rows) : 1);
  if (k == 0) {  // nothing to compute: LAPACK's answer for empty matrices
    std::fill(info, info + a.count, 0);
    return absl::OkStatus();
  }
  if (a.count == 0) return absl::OkStatus();
  // u and vt are not referenced without vectors: one element each stands in.
  T unused_u{};
  T unused_vt{};
  auto u_of = [&](int64_t b) { return vectors ? u.matrix(b) : &unused_u; };
  auto vt_of = [&](int64_t b) { return vectors ? vt.matrix(b) : &unused_vt; };
  std::vector<int> iwork(8 * static_cast<size_t>(k));
  T work_size{};
  int query = -1;
  int query_info = 0;
  // The complex routines' real workspace, by LAPACK 3.11's documentation.
  [[maybe_unused]] std::vector<Real<T>> rwork;
  if constexpr (kIsComplex<T>) {
    const size_t mx = std::max(m, n);
    const size_t mn = k;
    rwork.resize(mode == 'N' ? 7 * mn
                             : std::max(5 * mn * mn + 5 * mn,
                                        2 * mx * mn + 2 * mn * mn + mn));
    Routines<T>::gesdd(&mode, &m, &n, a.data, &lda, s, u_of(0), &ldu, vt_of(0),
                       &ldvt, &work_size, &query, rwork.data(), iwork.data(),
                       &query_info, 1);
  } else {
    Routines<T>::gesdd(&mode, &m, &n, a.data, &lda, s, u_of(0), &ldu, vt_of(0),
                       &ldvt, &work_size, &query, iwork.data(), &query_info, 1);
  }
  std::vector<T> work(WorkSize(work_size));
  const int lwork = static_cast<int>(work.size());
  for (int64_t b = 0; b < a.count; ++b) {
    if constexpr (kIsComplex<T>) {
      Routines<T>::gesdd(&mode, &m, &n, a.matrix(b), &lda, s + b * k, u_of(b),
                         &ldu, vt_of(b), &ldvt, work.data(), &lwork,
                         rwork.data(), iwork.data(), &info[b], 1);
    } else {
      Routines<T>::gesdd(&mode, &m, &n, a.matrix(b), &lda, s + b * k, u_of(b),
                         &ldu, vt_of(b), &ldvt, work.data(), &lwork,
                         iwork.data(), &info[b], 1);
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Gesvd(char mode, MatrixBatch<T> a, Real<T>* s, MatrixBatch<T> u,
                   MatrixBatch<T> vt, int32_t* info) {
  if (absl::Status st = CheckSvd("gesvd", mode, a, u, vt); !st.ok()) {
    return st;
  }
  const int m = static_cast<int>(a.rows);
  const int n = static_cast<int>(a.cols);
  const int k = std::min(m, n);
  const int lda = std::max(1, m);
  const bool vectors = mode != 'N';
  const int ldu = std::max<int>(1, vectors ? m : 1);
  const int ldvt = std::max<int>(1, vectors ? static_cast<int>(vt.rows) : 1);
  if (k == 0) {  // nothing to compute: LAPACK's answer for empty matrices
    std::fill(info, info + a.count, 0);
    return absl::OkStatus();
  }
  if (a.count == 0) return absl::OkStatus();
  T unused_u{};
  T unused_vt{};
  auto u_of = [&](int64_t b) { return vectors ? u.matrix(b) : &unused_u; };
  auto vt_of = [&](int64_t b) { return vectors ? vt.matrix(b) : &unused_vt; };
  T work_size{};
  int query = -1;
  int query_info = 0;
  // The complex routines' real workspace: 5 min(m, n).
  [[maybe_unused]] std::vector<Real<T>> rwork(5 * static_cast<size_t>(k));
  if constexpr (kIsComplex<T>) {
    Routines<T>::gesvd(&mode, &mode, &m, &n, a.data, &lda, s, u_of(0), &ldu,
                       vt_of(0), &ldvt, &work_size, &query, rwork.data(),
                       &query_info, 1, 1);
  } else {
    Routines<T>::gesvd(&mode, &mode, &m, &n, a.data, &lda, s, u_of(0), &ldu,
                       vt_of(0), &ldvt, &work_size, &query, &query_info, 1, 1);
  }
  std::vector<T> work(WorkSize(work_size));
  const int lwork = static_cast<int>(work.size());
  for (int64_t b = 0; b < a.count; ++b) {
    if constexpr (kIsComplex<T>) {
      Routines<T>::gesvd(&mode, &mode, &m, &n, a.matrix(b), &lda, s + b * k,
                         u_of(b), &ldu, vt_of(b), &ldvt, work.data(), &lwork,
                         rwork.data(), &info[b], 1, 1);
    } else {
      Routines<T>::gesvd(&mode, &mode, &m, &n, a.matrix(b), &lda, s + b * k,
                         u_of(b), &ldu, vt_of(b), &ldvt, work.data(), &lwork,
                         &info[b], 1, 1);
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Geqrf(MatrixBatch<T> a, T* tau) {
  if (absl::Status s = FitsInt<T>("geqrf", a.rows, a.cols); !s.ok()) return s;
  const int m = static_cast<int>(a.rows);
  const int n = static_cast<int>(a.cols);
  const int k = std::min(m, n);
  const int lda = std::max(1, m);
  if (a.count == 0 || k == 0) return absl::OkStatus();
  T work_size{};
  int query = -1;
  int info = 0;
  Routines<T>::geqrf(&m, &n, a.data, &lda, tau, &work_size, &query, &info);
  std::vector<T> work(WorkSize(work_size));
  const int lwork = static_cast<int>(work.size());
  for (int64_t b = 0; b < a.count; ++b) {
    // INFO reports only an illegal argument, which these are not.
    Routines<T>::geqrf(&m, &n, a.matrix(b), &lda, tau + b * k, work.data(),
                       &lwork, &info);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Orgqr(MatrixBatch<T> a, const T* tau, int64_t k64) {
  const char* routine = kIsComplex<T> ? "ungqr" : "orgqr";
  if (absl::Status s = FitsInt<T>(routine, a.rows, a.cols); !s.ok()) return s;
  if (!(a.rows >= a.cols && a.cols >= k64 && k64 >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(1, TypePrefix<T>()), routine, ": ", a.rows, "x", a.cols,
        " matrices with ", k64,
        " reflectors each; LAPACK needs rows >= columns >= reflectors"));
  }
  const int m = static_cast<int>(a.rows);
  const int n = static_cast<int>(a.cols);
  const int k = static_cast<int>(k64);
  const int lda = std::max(1, m);
  if (a.count == 0 || n == 0) return absl::OkStatus();
  T work_size{};
  int query = -1;
  int info = 0;
  Routines<T>::orgqr(&m, &n, &k, a.data, &lda, tau, &work_size, &query, &info);
  std::vector<T> work(WorkSize(work_size));
  const int lwork = static_cast<int>(work.size());
  for (int64_t b = 0; b < a.count; ++b) {
    Routines<T>::orgqr(&m, &n, &k, a.matrix(b), &lda, tau + b * k, work.data(),
                       &lwork, &info);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status RealGeev(char left, char right, MatrixBatch<const T> a, T* wr,
                      T* wi, std::complex<T>* vl, std::complex<T>* vr,
                      int32_t* info) {
  if (absl::Status s = FitsInt<T>("geev", a.rows, a.cols); !s.ok()) return s;
  for (auto [what, value] :
       {std::pair{"compute_left", left}, std::pair{"compute_right", right}}) {
    if (absl::Status s = CheckMode<T>("geev", what, value, "NV"); !s.ok()) {
      return s;
    }
  }
  const int n = static_cast<int>(a.rows);
  const int ld = std::max(1, n);
  if (n == 0) {  // nothing to compute: LAPACK's answer for empty matrices
    std::fill(info, info + a.count, 0);
    return absl::OkStatus();
  }
  if (a.count == 0) return absl::OkStatus();
  const size_t nn = static_cast<size_t>(n) * n;
  // geev destroys its input, and gives eigenvectors as real pairs: both in
  // scratch memory.
  std::vector<T> x(nn);
  std::vector<T> l(left == 'V' ? nn : 1);
  std::vector<T> r(right == 'V' ? nn : 1);
  const int ldvl = left == 'V' ? ld : 1;
  const int ldvr = right == 'V' ? ld : 1;
  T work_size{};
  int query = -1;
  int query_info = 0;
  Routines<T>::geev(&left, &right, &n, x.data(), &ld, wr, wi, l.data(), &ldvl,
                    r.data(), &ldvr, &work_size, &query, &query_info, 1, 1);
  std::vector<T> work(WorkSize(work_size));
  const int lwork = static_cast<int>(work.size());
  // Column j of `packed` into complex columns: a real eigenvalue's vector
  // as is; a pair's (wi[j] > 0, then wi[j + 1] < 0) as re +- i im from
  // columns j and j + 1.
  auto unpack = [n](const T* packed, const T* im, std::complex<T>* out) {
    for (int j = 0; j < n; ++j) {
      const T* re_col = packed + static_cast<size_t>(j) * n;
      std::complex<T>* col = out + static_cast<size_t>(j) * n;
      if (im[j] == T(0) || j + 1 == n) {
        for (int i = 0; i < n; ++i) col[i] = std::complex<T>(re_col[i], 0);
        continue;
      }
      const T* im_col = re_col + n;
      std::complex<T>* next = col + n;
      for (int i = 0; i < n; ++i) {
        col[i] = std::complex<T>(re_col[i], im_col[i]);
        next[i] = std::complex<T>(re_col[i], -im_col[i]);
      }
      ++j;
    }
  };
  for (int64_t b = 0; b < a.count; ++b) {
    std::copy(a.matrix(b), a.matrix(b) + nn, x.begin());
    T* wr_b = wr + b * n;
    T* wi_b = wi + b * n;
    Routines<T>::geev(&left, &right, &n, x.data(), &ld, wr_b, wi_b, l.data(),
                      &ldvl, r.data(), &ldvr, work.data(), &lwork, &info[b], 1,
                      1);
    if (info[b] != 0) continue;  // the caller replaces the results
    if (left == 'V') unpack(l.data(), wi_b, vl + b * nn);
    if (right == 'V') unpack(r.data(), wi_b, vr + b * nn);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status ComplexGeev(char left, char right, MatrixBatch<const T> a, T* w,
                         T* vl, T* vr, int32_t* info) {
  if (absl::Status s = FitsInt<T>("geev", a.rows, a.cols); !s.ok()) return s;
  for (auto [what, value] :
       {std::pair{"compute_left", left}, std::pair{"compute_right", right}}) {
    if (absl::Status s = CheckMode<T>("geev", what, value, "NV"); !s.ok()) {
      return s;
    }
  }
  const int n = static_cast<int>(a.rows);
  const int ld = std::max(1, n);
  if (n == 0) {  // nothing to compute: LAPACK's answer for empty matrices
    std::fill(info, info + a.count, 0);
    return absl::OkStatus();
  }
  if (a.count == 0) return absl::OkStatus();
  const size_t nn = static_cast<size_t>(n) * n;
  std::vector<T> x(nn);
  T unused_l{};
  T unused_r{};
  const int ldvl = left == 'V' ? ld : 1;
  const int ldvr = right == 'V' ? ld : 1;
  std::vector<Real<T>> rwork(2 * static_cast<size_t>(n));
  T work_size{};
  int query = -1;
  int query_info = 0;
  Routines<T>::geev(&left, &right, &n, x.data(), &ld, w, &unused_l, &ldvl,
                    &unused_r, &ldvr, &work_size, &query, rwork.data(),
                    &query_info, 1, 1);
  std::vector<T> work(WorkSize(work_size));
  const int lwork = static_cast<int>(work.size());
  for (int64_t b = 0; b < a.count; ++b) {
    std::copy(a.matrix(b), a.matrix(b) + nn, x.begin());
    Routines<T>::geev(&left, &right, &n, x.data(), &ld, w + b * n,
                      left == 'V' ? vl + b * nn : &unused_l, &ldvl,
                      right == 'V' ? vr + b * nn : &unused_r, &ldvr,
                      work.data(), &lwork, rwork.data(), &info[b], 1, 1);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Trsm(char side, char uplo, char trans, char diag,
                  MatrixBatch<const T> a, MatrixBatch<T> b) {
  if (absl::Status s = FitsInt<T>("trsm", b.rows, b.cols); !s.ok()) return s;
  for (auto [what, value, allowed] :
       {std::tuple{"side", side, "LR"}, std::tuple{"uplo", uplo, "LU"},
        std::tuple{"trans_x", trans, "NTC"}, std::tuple{"diag", diag, "NU"}}) {
    if (absl::Status s = CheckMode<T>("trsm", what, value, allowed); !s.ok()) {
      return s;
    }
  }
  const int64_t order = side == 'L' ? b.rows : b.cols;
  if (a.count != b.count || a.rows != order || a.cols != order) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(1, TypePrefix<T>()), "trsm: side '", std::string(1, side),
        "' of ", b.count, " ", b.rows, "x", b.cols, " right-hand sides needs ",
        b.count, " triangular ", order, "x", order, " matrices, got ", a.count,
        " of ", a.rows, "x", a.cols));
  }
  const int m = static_cast<int>(b.rows);
  const int n = static_cast<int>(b.cols);
  const int lda = std::max<int>(1, static_cast<int>(order));
  const int ldb = std::max(1, m);
  const T one(1);
  if (m == 0 || n == 0) return absl::OkStatus();
  for (int64_t i = 0; i < b.count; ++i) {
    Routines<T>::trsm(&side, &uplo, &trans, &diag, &m, &n, &one, a.matrix(i),
                      &lda, b.matrix(i), &ldb, 1, 1, 1, 1);
  }
  return absl::OkStatus();
}

#define PLEXUS_LAPACK_INSTANTIATE(T)                                           \
  template absl::Status Getrf(MatrixBatch<T>, int32_t*, int32_t*);             \
  template absl::Status Potrf(char, MatrixBatch<T>, int32_t*);                 \
  template absl::Status Syevd(char, char, MatrixBatch<T>, Real<T>*, int32_t*); \
  template absl::Status Gesdd(char, MatrixBatch<T>, Real<T>*, MatrixBatch<T>,  \
                              MatrixBatch<T>, int32_t*);                       \
  template absl::Status Gesvd(char, MatrixBatch<T>, Real<T>*, MatrixBatch<T>,  \
                              MatrixBatch<T>, int32_t*);                       \
  template absl::Status Geqrf(MatrixBatch<T>, T*);                             \
  template absl::Status Orgqr(MatrixBatch<T>, const T*, int64_t);              \
  template absl::Status Trsm(char, char, char, char, MatrixBatch<const T>,     \
                             MatrixBatch<T>);
PLEXUS_LAPACK_INSTANTIATE(float)
PLEXUS_LAPACK_INSTANTIATE(double)
PLEXUS_LAPACK_INSTANTIATE(fc)
PLEXUS_LAPACK_INSTANTIATE(zc)
#undef PLEXUS_LAPACK_INSTANTIATE
template absl::Status RealGeev(char, char, MatrixBatch<const float>, float*,
                               float*, fc*, fc*, int32_t*);
template absl::Status RealGeev(char, char, MatrixBatch<const double>, double*,
                               double*, zc*, zc*, int32_t*);
template absl::Status ComplexGeev(char, char, MatrixBatch<const fc>, fc*, fc*,
                                  fc*, int32_t*);
template absl::Status ComplexGeev(char, char, MatrixBatch<const zc>, zc*, zc*,
                                  zc*, int32_t*);

}  // namespace plexus::xla::lapack
