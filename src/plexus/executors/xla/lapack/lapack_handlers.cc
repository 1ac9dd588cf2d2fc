#include "plexus/executors/xla/lapack/lapack_handlers.h"

#include <complex>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "plexus/executors/xla/internal/pjrt_support.h"
#include "plexus/executors/xla/lapack/internal/ffi_call.h"
#include "plexus/executors/xla/lapack/internal/lapack_kernels.h"
#include "plexus/executors/xla/lapack/internal/pjrt_ffi_extension.h"

namespace plexus::xla::lapack {
namespace {

using internal::DataTypeOf;
using internal::FfiBuffer;
using internal::FfiCall;

// `status` with the target `routine` is of, for element type T, in front.
template <typename T>
absl::Status Named(const char* routine, absl::Status status) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("lapack_", std::string(1, TypePrefix<T>()),
                                   routine, "_ffi: ", status.message()));
}

// What a call must have, one buffer at a time: operands first, then
// results.
struct Want {
  bool result;
  XLA_FFI_DataType dtype;
  const char* what;
};

// The call's buffers, in `wants`' order, once it has exactly those
// operands and results and the attributes `attrs`.
absl::StatusOr<std::vector<FfiBuffer>> Read(
    const FfiCall& call, std::initializer_list<Want> wants,
    std::initializer_list<absl::string_view> attrs) {
  int args = 0;
  int rets = 0;
  for (const Want& w : wants) (w.result ? rets : args)++;
  if (absl::Status s = call.Expect(args, rets, attrs); !s.ok()) return s;
  std::vector<FfiBuffer> out;
  int arg = 0;
  int ret = 0;
  for (const Want& w : wants) {
    absl::StatusOr<FfiBuffer> b = w.result ? call.Ret(ret++, w.dtype, w.what)
                                           : call.Arg(arg++, w.dtype, w.what);
    if (!b.ok()) return b.status();
    out.push_back(*b);
  }
  return out;
}

// The attributes `names`, in order, as LAPACK's letters.
absl::StatusOr<std::vector<char>> Letters(
    const FfiCall& call, std::initializer_list<absl::string_view> names) {
  std::vector<char> out;
  for (absl::string_view name : names) {
    absl::StatusOr<uint8_t> v = call.U8Attr(name);
    if (!v.ok()) return v.status();
    out.push_back(static_cast<char>(*v));
  }
  return out;
}

// A buffer of dimensions [batch..., rows, cols], as LAPACK sees it.
struct Matrices {
  int64_t count = 1;  // the product of the batch dimensions
  int64_t rows = 0;
  int64_t cols = 0;
};

std::string DimsString(absl::Span<const int64_t> dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ","), "]");
}

int64_t Product(absl::Span<const int64_t> dims) {
  return std::accumulate(dims.begin(), dims.end(), int64_t{1},
                         std::multiplies<>());
}

// The matrices of `dims`, or InvalidArgument naming `what` where it is not
// a batch of matrices (square ones if `square`).
absl::StatusOr<Matrices> MatricesOf(const char* what,
                                    absl::Span<const int64_t> dims,
                                    bool square) {
  if (dims.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has shape ", DimsString(dims),
                     ": a batch of matrices has at least 2 dimensions"));
  }
  Matrices m;
  m.count = Product(dims.subspan(0, dims.size() - 2));
  m.rows = dims[dims.size() - 2];
  m.cols = dims[dims.size() - 1];
  if (square && m.rows != m.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has shape ", DimsString(dims),
                     ": the matrices must be square"));
  }
  return m;
}

// The batch dimensions of a buffer of matrices.
absl::Span<const int64_t> BatchDims(absl::Span<const int64_t> dims) {
  return dims.subspan(0, dims.size() - 2);
}

// InvalidArgument unless `dims` are `batch` followed by `tail`.
absl::Status Expect(const char* what, absl::Span<const int64_t> dims,
                    absl::Span<const int64_t> batch,
                    std::initializer_list<int64_t> tail) {
  std::vector<int64_t> want(batch.begin(), batch.end());
  want.insert(want.end(), tail.begin(), tail.end());
  if (absl::Span<const int64_t>(want) != dims) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has shape ", DimsString(dims), ", expected ",
                     DimsString(want)));
  }
  return absl::OkStatus();
}

absl::Status FirstError(std::initializer_list<absl::Status> statuses) {
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Copies operand `in` into result `out` (of the same shape) unless XLA gave
// both the same memory (an aliased result).
template <typename T>
void CopyUnlessAliased(const FfiBuffer& in, const FfiBuffer& out) {
  if (in.data != out.data) {
    std::memcpy(out.data, in.data, Product(in.dims) * sizeof(T));
  }
}

template <typename T>
MatrixBatch<T> BatchOf(const FfiBuffer& buffer, const Matrices& m) {
  return MatrixBatch<T>{static_cast<T*>(buffer.data), m.count, m.rows, m.cols};
}

template <typename T>
T* Data(const FfiBuffer& buffer) {
  return static_cast<T*>(buffer.data);
}

// The handlers' work, one function per routine: reads the call as JAX
// emits it (lapack_handlers.h), checks that its shapes agree, and runs the
// routine over the batch.

// getrf: a -> (lu, ipiv, info).
template <typename T>
absl::Status GetrfCall(const FfiCall& call) {
  return Named<T>("getrf", [&]() -> absl::Status {
    auto b = Read(call,
                  {{false, DataTypeOf<T>(), "a"},
                   {true, DataTypeOf<T>(), "the factored matrix"},
                   {true, XLA_FFI_DataType_S32, "ipiv"},
                   {true, XLA_FFI_DataType_S32, "info"}},
                  {});
    if (!b.ok()) return b.status();
    const FfiBuffer& x = (*b)[0];
    const FfiBuffer& y = (*b)[1];
    const FfiBuffer& ipiv = (*b)[2];
    const FfiBuffer& info = (*b)[3];
    absl::StatusOr<Matrices> m = MatricesOf("a", x.dims, false);
    if (!m.ok()) return m.status();
    auto batch = BatchDims(x.dims);
    if (absl::Status s = FirstError({
            Expect("the factored matrix", y.dims, batch, {m->rows, m->cols}),
            Expect("ipiv", ipiv.dims, batch, {std::min(m->rows, m->cols)}),
            Expect("info", info.dims, batch, {}),
        });
        !s.ok()) {
      return s;
    }
    CopyUnlessAliased<T>(x, y);
    return Getrf(BatchOf<T>(y, *m), Data<int32_t>(ipiv), Data<int32_t>(info));
  }());
}

// potrf {uplo}: a -> (factor, info).
template <typename T>
absl::Status PotrfCall(const FfiCall& call) {
  return Named<T>("potrf", [&]() -> absl::Status {
    auto b = Read(call,
                  {{false, DataTypeOf<T>(), "a"},
                   {true, DataTypeOf<T>(), "the factor"},
                   {true, XLA_FFI_DataType_S32, "info"}},
                  {"uplo"});
    if (!b.ok()) return b.status();
    auto letters = Letters(call, {"uplo"});
    if (!letters.ok()) return letters.status();
    const FfiBuffer& x = (*b)[0];
    const FfiBuffer& y = (*b)[1];
    const FfiBuffer& info = (*b)[2];
    absl::StatusOr<Matrices> m = MatricesOf("a", x.dims, true);
    if (!m.ok()) return m.status();
    auto batch = BatchDims(x.dims);
    if (absl::Status s = FirstError({
            Expect("the factor", y.dims, batch, {m->rows, m->cols}),
            Expect("info", info.dims, batch, {}),
        });
        !s.ok()) {
      return s;
    }
    CopyUnlessAliased<T>(x, y);
    return Potrf((*letters)[0], BatchOf<T>(y, *m), Data<int32_t>(info));
  }());
}

// syevd / heevd {mode, uplo}: a -> (v, w, info).
template <typename T>
absl::Status SyevdCall(const FfiCall& call) {
  return Named<T>(kIsComplex<T> ? "heevd" : "syevd", [&]() -> absl::Status {
    auto b = Read(call,
                  {{false, DataTypeOf<T>(), "a"},
                   {true, DataTypeOf<T>(), "the eigenvectors"},
                   {true, DataTypeOf<Real<T>>(), "the eigenvalues"},
                   {true, XLA_FFI_DataType_S32, "info"}},
                  {"mode", "uplo"});
    if (!b.ok()) return b.status();
    auto letters = Letters(call, {"mode", "uplo"});
    if (!letters.ok()) return letters.status();
    const FfiBuffer& x = (*b)[0];
    const FfiBuffer& v = (*b)[1];
    const FfiBuffer& w = (*b)[2];
    const FfiBuffer& info = (*b)[3];
    absl::StatusOr<Matrices> m = MatricesOf("a", x.dims, true);
    if (!m.ok()) return m.status();
    auto batch = BatchDims(x.dims);
    if (absl::Status s = FirstError({
            Expect("the eigenvectors", v.dims, batch, {m->rows, m->cols}),
            Expect("the eigenvalues", w.dims, batch, {m->rows}),
            Expect("info", info.dims, batch, {}),
        });
        !s.ok()) {
      return s;
    }
    CopyUnlessAliased<T>(x, v);
    return Syevd((*letters)[0], (*letters)[1], BatchOf<T>(v, *m),
                 Data<Real<T>>(w), Data<int32_t>(info));
  }());
}

// The two SVD routines, of the same signature.
enum class SvdAlgorithm { kDivideAndConquer, kQr };

// gesdd / gesvd {mode}: a -> (a destroyed, s, u, vt, info).
template <typename T, SvdAlgorithm algorithm>
absl::Status SvdCall(const FfiCall& call) {
  const bool qr = algorithm == SvdAlgorithm::kQr;
  return Named<T>(qr ? "gesvd" : "gesdd", [&]() -> absl::Status {
    auto b = Read(call,
                  {{false, DataTypeOf<T>(), "a"},
                   {true, DataTypeOf<T>(), "the destroyed a"},
                   {true, DataTypeOf<Real<T>>(), "the singular values"},
                   {true, DataTypeOf<T>(), "u"},
                   {true, DataTypeOf<T>(), "vt"},
                   {true, XLA_FFI_DataType_S32, "info"}},
                  {"mode"});
    if (!b.ok()) return b.status();
    auto letters = Letters(call, {"mode"});
    if (!letters.ok()) return letters.status();
    const FfiBuffer& x = (*b)[0];
    const FfiBuffer& a = (*b)[1];
    const FfiBuffer& s = (*b)[2];
    const FfiBuffer& u = (*b)[3];
    const FfiBuffer& vt = (*b)[4];
    const FfiBuffer& info = (*b)[5];
    absl::StatusOr<Matrices> m = MatricesOf("a", x.dims, false);
    if (!m.ok()) return m.status();
    absl::StatusOr<Matrices> mu = MatricesOf("u", u.dims, false);
    if (!mu.ok()) return mu.status();
    absl::StatusOr<Matrices> mvt = MatricesOf("vt", vt.dims, false);
    if (!mvt.ok()) return mvt.status();
    auto batch = BatchDims(x.dims);
    if (absl::Status st = FirstError({
            Expect("the destroyed a", a.dims, batch, {m->rows, m->cols}),
            Expect("the singular values", s.dims, batch,
                   {std::min(m->rows, m->cols)}),
            Expect("u", u.dims, batch, {m->rows, mu->cols}),
            Expect("vt", vt.dims, batch, {mvt->rows, m->cols}),
            Expect("info", info.dims, batch, {}),
        });
        !st.ok()) {
      return st;
    }
    CopyUnlessAliased<T>(x, a);
    return (qr ? Gesvd<T> : Gesdd<T>)((*letters)[0], BatchOf<T>(a, *m),
                                      Data<Real<T>>(s), BatchOf<T>(u, *mu),
                                      BatchOf<T>(vt, *mvt),
                                      Data<int32_t>(info));
  }());
}

// geqrf: a -> (reflectors and r, tau).
template <typename T>
absl::Status GeqrfCall(const FfiCall& call) {
  return Named<T>("geqrf", [&]() -> absl::Status {
    auto b = Read(call,
                  {{false, DataTypeOf<T>(), "a"},
                   {true, DataTypeOf<T>(), "the factored matrix"},
                   {true, DataTypeOf<T>(), "tau"}},
                  {});
    if (!b.ok()) return b.status();
    const FfiBuffer& x = (*b)[0];
    const FfiBuffer& y = (*b)[1];
    const FfiBuffer& tau = (*b)[2];
    absl::StatusOr<Matrices> m = MatricesOf("a", x.dims, false);
    if (!m.ok()) return m.status();
    auto batch = BatchDims(x.dims);
    if (absl::Status s = FirstError({
            Expect("the factored matrix", y.dims, batch, {m->rows, m->cols}),
            Expect("tau", tau.dims, batch, {std::min(m->rows, m->cols)}),
        });
        !s.ok()) {
      return s;
    }
    CopyUnlessAliased<T>(x, y);
    return Geqrf(BatchOf<T>(y, *m), Data<T>(tau));
  }());
}

// orgqr / ungqr: (a, tau) -> q.
template <typename T>
absl::Status OrgqrCall(const FfiCall& call) {
  return Named<T>(kIsComplex<T> ? "ungqr" : "orgqr", [&]() -> absl::Status {
    auto b = Read(call,
                  {{false, DataTypeOf<T>(), "a"},
                   {false, DataTypeOf<T>(), "tau"},
                   {true, DataTypeOf<T>(), "q"}},
                  {});
    if (!b.ok()) return b.status();
    const FfiBuffer& x = (*b)[0];
    const FfiBuffer& tau = (*b)[1];
    const FfiBuffer& q = (*b)[2];
    absl::StatusOr<Matrices> m = MatricesOf("a", x.dims, false);
    if (!m.ok()) return m.status();
    auto batch = BatchDims(x.dims);
    const int64_t k = tau.dims.empty() ? -1 : tau.dims.back();
    if (absl::Status s = FirstError({
            Expect("tau", tau.dims, batch, {k}),
            Expect("q", q.dims, batch, {m->rows, m->cols}),
        });
        !s.ok()) {
      return s;
    }
    CopyUnlessAliased<T>(x, q);
    return Orgqr(BatchOf<T>(q, *m), Data<T>(tau), k);
  }());
}

// The shapes geev's vectors and info must have, for n x n matrices.
absl::Status CheckGeevShapes(absl::Span<const int64_t> batch, int64_t n,
                             const FfiBuffer& vl, const FfiBuffer& vr,
                             const FfiBuffer& info) {
  return FirstError({
      Expect("the left eigenvectors", vl.dims, batch, {n, n}),
      Expect("the right eigenvectors", vr.dims, batch, {n, n}),
      Expect("info", info.dims, batch, {}),
  });
}

// geev of real matrices {compute_left, compute_right}:
// a -> (wr, wi, vl, vr complex, info).
template <typename T>
absl::Status RealGeevCall(const FfiCall& call) {
  using C = std::complex<T>;
  return Named<T>("geev", [&]() -> absl::Status {
    auto b = Read(call,
                  {{false, DataTypeOf<T>(), "a"},
                   {true, DataTypeOf<T>(), "wr"},
                   {true, DataTypeOf<T>(), "wi"},
                   {true, DataTypeOf<C>(), "the left eigenvectors"},
                   {true, DataTypeOf<C>(), "the right eigenvectors"},
                   {true, XLA_FFI_DataType_S32, "info"}},
                  {"compute_left", "compute_right"});
    if (!b.ok()) return b.status();
    auto letters = Letters(call, {"compute_left", "compute_right"});
    if (!letters.ok()) return letters.status();
    const FfiBuffer& x = (*b)[0];
    absl::StatusOr<Matrices> m = MatricesOf("a", x.dims, true);
    if (!m.ok()) return m.status();
    auto batch = BatchDims(x.dims);
    if (absl::Status s = FirstError({
            Expect("wr", (*b)[1].dims, batch, {m->rows}),
            Expect("wi", (*b)[2].dims, batch, {m->rows}),
            CheckGeevShapes(batch, m->rows, (*b)[3], (*b)[4], (*b)[5]),
        });
        !s.ok()) {
      return s;
    }
    return RealGeev((*letters)[0], (*letters)[1], BatchOf<const T>(x, *m),
                    Data<T>((*b)[1]), Data<T>((*b)[2]), Data<C>((*b)[3]),
                    Data<C>((*b)[4]), Data<int32_t>((*b)[5]));
  }());
}

// geev of complex matrices {compute_left, compute_right}:
// a -> (w, vl, vr, info).
template <typename T>
absl::Status ComplexGeevCall(const FfiCall& call) {
  return Named<T>("geev", [&]() -> absl::Status {
    auto b = Read(call,
                  {{false, DataTypeOf<T>(), "a"},
                   {true, DataTypeOf<T>(), "the eigenvalues"},
                   {true, DataTypeOf<T>(), "the left eigenvectors"},
                   {true, DataTypeOf<T>(), "the right eigenvectors"},
                   {true, XLA_FFI_DataType_S32, "info"}},
                  {"compute_left", "compute_right"});
    if (!b.ok()) return b.status();
    auto letters = Letters(call, {"compute_left", "compute_right"});
    if (!letters.ok()) return letters.status();
    const FfiBuffer& x = (*b)[0];
    absl::StatusOr<Matrices> m = MatricesOf("a", x.dims, true);
    if (!m.ok()) return m.status();
    auto batch = BatchDims(x.dims);
    if (absl::Status s = FirstError({
            Expect("the eigenvalues", (*b)[1].dims, batch, {m->rows}),
            CheckGeevShapes(batch, m->rows, (*b)[2], (*b)[3], (*b)[4]),
        });
        !s.ok()) {
      return s;
    }
    return ComplexGeev((*letters)[0], (*letters)[1], BatchOf<const T>(x, *m),
                       Data<T>((*b)[1]), Data<T>((*b)[2]), Data<T>((*b)[3]),
                       Data<int32_t>((*b)[4]));
  }());
}

// trsm {side, uplo, trans_x, diag}: (a, b) -> x.
template <typename T>
absl::Status TrsmCall(const FfiCall& call) {
  return Named<T>("trsm", [&]() -> absl::Status {
    auto b = Read(call,
                  {{false, DataTypeOf<T>(), "a"},
                   {false, DataTypeOf<T>(), "b"},
                   {true, DataTypeOf<T>(), "x"}},
                  {"side", "uplo", "trans_x", "diag"});
    if (!b.ok()) return b.status();
    auto letters = Letters(call, {"side", "uplo", "trans_x", "diag"});
    if (!letters.ok()) return letters.status();
    const FfiBuffer& a = (*b)[0];
    const FfiBuffer& rhs = (*b)[1];
    const FfiBuffer& x = (*b)[2];
    absl::StatusOr<Matrices> ma = MatricesOf("a", a.dims, true);
    if (!ma.ok()) return ma.status();
    absl::StatusOr<Matrices> mb = MatricesOf("b", rhs.dims, false);
    if (!mb.ok()) return mb.status();
    if (absl::Status s =
            Expect("x", x.dims, BatchDims(rhs.dims), {mb->rows, mb->cols});
        !s.ok()) {
      return s;
    }
    CopyUnlessAliased<T>(rhs, x);
    const std::vector<char>& l = *letters;
    return Trsm(l[0], l[1], l[2], l[3], BatchOf<const T>(a, *ma),
                BatchOf<T>(x, *mb));
  }());
}

// The XLA FFI handler doing `Fn`'s work.
template <internal::FfiFn Fn>
XLA_FFI_Error* Handler(XLA_FFI_CallFrame* frame) {
  return internal::Serve(frame, Fn);
}

// ------------------------------------------------------------ the table

struct Entry {
  std::string_view target;
  XLA_FFI_Handler* handler;
};

using F32 = float;
using F64 = double;
using C64 = std::complex<float>;
using C128 = std::complex<double>;

constexpr Entry kHandlers[] = {
    {"lapack_sgetrf_ffi", Handler<GetrfCall<F32>>},
    {"lapack_dgetrf_ffi", Handler<GetrfCall<F64>>},
    {"lapack_cgetrf_ffi", Handler<GetrfCall<C64>>},
    {"lapack_zgetrf_ffi", Handler<GetrfCall<C128>>},
    {"lapack_spotrf_ffi", Handler<PotrfCall<F32>>},
    {"lapack_dpotrf_ffi", Handler<PotrfCall<F64>>},
    {"lapack_cpotrf_ffi", Handler<PotrfCall<C64>>},
    {"lapack_zpotrf_ffi", Handler<PotrfCall<C128>>},
    {"lapack_ssyevd_ffi", Handler<SyevdCall<F32>>},
    {"lapack_dsyevd_ffi", Handler<SyevdCall<F64>>},
    {"lapack_cheevd_ffi", Handler<SyevdCall<C64>>},
    {"lapack_zheevd_ffi", Handler<SyevdCall<C128>>},
    {"lapack_sgesdd_ffi",
     Handler<SvdCall<F32, SvdAlgorithm::kDivideAndConquer>>},
    {"lapack_dgesdd_ffi",
     Handler<SvdCall<F64, SvdAlgorithm::kDivideAndConquer>>},
    {"lapack_cgesdd_ffi",
     Handler<SvdCall<C64, SvdAlgorithm::kDivideAndConquer>>},
    {"lapack_zgesdd_ffi",
     Handler<SvdCall<C128, SvdAlgorithm::kDivideAndConquer>>},
    {"lapack_sgesvd_ffi", Handler<SvdCall<F32, SvdAlgorithm::kQr>>},
    {"lapack_dgesvd_ffi", Handler<SvdCall<F64, SvdAlgorithm::kQr>>},
    {"lapack_cgesvd_ffi", Handler<SvdCall<C64, SvdAlgorithm::kQr>>},
    {"lapack_zgesvd_ffi", Handler<SvdCall<C128, SvdAlgorithm::kQr>>},
    {"lapack_sgeqrf_ffi", Handler<GeqrfCall<F32>>},
    {"lapack_dgeqrf_ffi", Handler<GeqrfCall<F64>>},
    {"lapack_cgeqrf_ffi", Handler<GeqrfCall<C64>>},
    {"lapack_zgeqrf_ffi", Handler<GeqrfCall<C128>>},
    {"lapack_sorgqr_ffi", Handler<OrgqrCall<F32>>},
    {"lapack_dorgqr_ffi", Handler<OrgqrCall<F64>>},
    {"lapack_cungqr_ffi", Handler<OrgqrCall<C64>>},
    {"lapack_zungqr_ffi", Handler<OrgqrCall<C128>>},
    {"lapack_sgeev_ffi", Handler<RealGeevCall<F32>>},
    {"lapack_dgeev_ffi", Handler<RealGeevCall<F64>>},
    {"lapack_cgeev_ffi", Handler<ComplexGeevCall<C64>>},
    {"lapack_zgeev_ffi", Handler<ComplexGeevCall<C128>>},
    {"lapack_strsm_ffi", Handler<TrsmCall<F32>>},
    {"lapack_dtrsm_ffi", Handler<TrsmCall<F64>>},
    {"lapack_ctrsm_ffi", Handler<TrsmCall<C64>>},
    {"lapack_ztrsm_ffi", Handler<TrsmCall<C128>>},
};

// The header's list is this table's targets, in order.
constexpr bool TableMatchesTargets() {
  if (std::size(kHandlers) != kLapackTargets.size()) return false;
  for (size_t i = 0; i < kLapackTargets.size(); ++i) {
    if (kHandlers[i].target != kLapackTargets[i]) return false;
  }
  return true;
}
static_assert(
    TableMatchesTargets(),
    "kLapackTargets (lapack_handlers.h) must list kHandlers' targets");

}  // namespace

absl::Status RegisterLapackHandlers(const PJRT_Api* api) {
  const PJRT_Extension_Base* found = api->extension_start;
  while (found != nullptr && found->type != PJRT_Extension_Type_FFI) {
    found = found->next;
  }
  if (found == nullptr) {
    return absl::FailedPreconditionError(
        "the PJRT plugin has no FFI extension, so no LAPACK handlers can be "
        "registered");
  }
  if (found->struct_size < internal::kFfiExtensionSize) {
    return absl::FailedPreconditionError(
        absl::StrCat("the PJRT plugin's FFI extension (", found->struct_size,
                     " bytes) cannot register handlers; it needs ",
                     internal::kFfiExtensionSize));
  }
  const auto* extension =
      reinterpret_cast<const internal::FfiExtension*>(found);
  if (extension->register_handler == nullptr) {
    return absl::FailedPreconditionError(
        "the PJRT plugin's FFI extension gives no way to register handlers");
  }
  PjrtScope scope(api);
  for (const Entry& entry : kHandlers) {
    internal::RegisterHandlerArgs args;
    std::memset(&args, 0, sizeof(args));
    args.struct_size = internal::kRegisterHandlerArgsSize;
    args.target_name = entry.target.data();
    args.target_name_size = entry.target.size();
    args.handler = reinterpret_cast<void*>(entry.handler);
    args.platform_name = kLapackPlatform.data();
    args.platform_name_size = kLapackPlatform.size();
    if (absl::Status s =
            scope.ToStatus(extension->register_handler(&args),
                           absl::StrCat("registering the FFI handler for ",
                                        std::string(entry.target), " on ",
                                        std::string(kLapackPlatform)));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace plexus::xla::lapack
