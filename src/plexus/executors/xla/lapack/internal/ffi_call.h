// Internal to executors/xla/lapack: one call of an XLA FFI handler, read
// from XLA's call frame through XLA's FFI C API (xla/ffi/api/c_api.h, from
// jaxlib: CMakeLists.txt) alone.
//
// Why not the C++ binding of ffi.h: jaxlib 0.10.2 ships the headers of XLA
// FFI API 0.3, and the CPU plugin's XLA (xla-cpu-pjrt 0.0.1) speaks 0.2.
// Its registry refuses a handler that reports 0.3 ("the handler's API
// version (0.3) is incompatible with the framework's API version (0.2)";
// PJRT_FFI_Register_Handler drops that error, and compiling then says "No
// FFI handler registered"), and ffi.h's handlers write a metadata field
// (state_type_id) that lies past the size a 0.2 framework declares. What
// is read here (the call frame up to its attributes, buffers, scalar
// attributes) and the one function called (XLA_FFI_Error_Create) are the
// same in 0.2 and 0.3, and each struct's size is checked before it is read.
//
// Thread-safe: a call is read-only.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "xla/ffi/api/c_api.h"  // jaxlib's XLA FFI headers (CMakeLists.txt)

namespace plexus::xla::lapack::internal {

// An operand or result buffer: its element type, memory and dimensions
// (logical, major to minor; the memory is in the layout the custom call
// asked for).
struct FfiBuffer {
  XLA_FFI_DataType dtype = XLA_FFI_DataType_INVALID;
  void* data = nullptr;
  absl::Span<const int64_t> dims;
};

class FfiCall {
 public:
  // `frame` has been checked by Serve.
  explicit FfiCall(const XLA_FFI_CallFrame* frame) : frame_(frame) {}

  // InvalidArgument unless the call has exactly `args` buffer operands,
  // `rets` buffer results and the attributes named `attrs` (in any order),
  // naming what differs.
  absl::Status Expect(int args, int rets,
                      std::initializer_list<absl::string_view> attrs) const;
  // Operand / result `i` (0-based, after Expect), refused unless its
  // element type is `dtype`; `what` names it in the error.
  absl::StatusOr<FfiBuffer> Arg(int i, XLA_FFI_DataType dtype,
                                absl::string_view what) const;
  absl::StatusOr<FfiBuffer> Ret(int i, XLA_FFI_DataType dtype,
                                absl::string_view what) const;
  // The uint8 scalar attribute `name`.
  absl::StatusOr<uint8_t> U8Attr(absl::string_view name) const;

 private:
  const XLA_FFI_CallFrame* frame_;
};

using FfiFn = absl::Status (*)(const FfiCall& call);

// Serves one call of a handler whose work is `fn`: answers XLA's metadata
// query (at registration: the FFI API version the handler speaks, the
// framework's own, 0.x, up to the headers' 0.3, and no traits), returns
// at once outside the execute stage, and otherwise runs `fn`, its error
// becoming XLA's (the run fails with its code and message).
XLA_FFI_Error* Serve(XLA_FFI_CallFrame* frame, FfiFn fn);

// The element type of buffers of T (float, double, std::complex<float>,
// std::complex<double>, int32_t).
template <typename T>
XLA_FFI_DataType DataTypeOf();

// A name for an element type in errors ("f32", "s32", "c64").
std::string DataTypeName(XLA_FFI_DataType dtype);

}  // namespace plexus::xla::lapack::internal
