#include "plexus/executors/xla/lapack/internal/ffi_call.h"

#include <algorithm>
#include <complex>
#include <cstddef>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace plexus::xla::lapack::internal {
namespace {

// The bytes of `T` up to the end of `field`: what a struct_size must cover
// before that field is read.
#define PLEXUS_FFI_SIZE_THROUGH(T, field) \
  (offsetof(T, field) + sizeof(static_cast<T*>(nullptr)->field))

// XLA_FFI_Error_Create on `api`, or null where the framework has none (it
// then sees a success: there is no other way to report).
XLA_FFI_Error* MakeError(const XLA_FFI_Api* api, const absl::Status& status) {
  if (api == nullptr ||
      api->struct_size <
          PLEXUS_FFI_SIZE_THROUGH(XLA_FFI_Api, XLA_FFI_Error_Create) ||
      api->XLA_FFI_Error_Create == nullptr) {
    return nullptr;
  }
  const std::string message(status.message());
  XLA_FFI_Error_Create_Args args{};
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.message = message.c_str();  // copied by XLA
  args.errc = static_cast<XLA_FFI_Error_Code>(status.code());
  return api->XLA_FFI_Error_Create(&args);
}

// Answers the metadata query: the version of the framework (`api`), if its
// major version is ours and its minor one is not newer than the headers'.
XLA_FFI_Error* AnswerMetadata(const XLA_FFI_Api* api,
                              XLA_FFI_Metadata_Extension* extension) {
  if (extension->extension_base.struct_size <
          XLA_FFI_Metadata_Extension_STRUCT_SIZE ||
      extension->metadata == nullptr ||
      extension->metadata->struct_size < XLA_FFI_Metadata_STRUCT_SIZE) {
    return MakeError(api, absl::FailedPreconditionError(
                              "the XLA FFI metadata query is shorter than "
                              "the LAPACK handlers know"));
  }
  const XLA_FFI_Api_Version& framework = api->api_version;
  if (framework.major_version != XLA_FFI_API_MAJOR) {
    return MakeError(
        api, absl::FailedPreconditionError(absl::StrCat(
                 "the LAPACK handlers speak XLA FFI API ", XLA_FFI_API_MAJOR,
                 ".x, the framework ", framework.major_version, ".",
                 framework.minor_version)));
  }
  XLA_FFI_Metadata& metadata = *extension->metadata;
  metadata.api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
  metadata.api_version.extension_start = nullptr;
  metadata.api_version.major_version = XLA_FFI_API_MAJOR;
  metadata.api_version.minor_version =
      std::min(framework.minor_version, XLA_FFI_API_MINOR);
  metadata.traits = 0;
  // Nothing past `traits`: a 0.2 framework's metadata ends there.
  return nullptr;
}

absl::StatusOr<FfiBuffer> ReadBuffer(const void* raw, XLA_FFI_DataType dtype,
                                     absl::string_view kind, int i,
                                     absl::string_view what) {
  const auto* buffer = static_cast<const XLA_FFI_Buffer*>(raw);
  if (buffer == nullptr || buffer->struct_size < XLA_FFI_Buffer_STRUCT_SIZE) {
    return absl::InvalidArgumentError(absl::StrCat(kind, " ", i, " (", what,
                                                   ") is not a buffer XLA FFI "
                                                   "API 0.2 describes"));
  }
  if (buffer->dtype != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        kind, " ", i, " (", what, ") is ", DataTypeName(buffer->dtype),
        ", expected ", DataTypeName(dtype)));
  }
  FfiBuffer out;
  out.dtype = buffer->dtype;
  out.data = buffer->data;
  out.dims = absl::Span<const int64_t>(
      buffer->dims, static_cast<size_t>(std::max<int64_t>(0, buffer->rank)));
  return out;
}

}  // namespace

template <>
XLA_FFI_DataType DataTypeOf<float>() {
  return XLA_FFI_DataType_F32;
}
template <>
XLA_FFI_DataType DataTypeOf<double>() {
  return XLA_FFI_DataType_F64;
}
template <>
XLA_FFI_DataType DataTypeOf<std::complex<float>>() {
  return XLA_FFI_DataType_C64;
}
template <>
XLA_FFI_DataType DataTypeOf<std::complex<double>>() {
  return XLA_FFI_DataType_C128;
}
template <>
XLA_FFI_DataType DataTypeOf<int32_t>() {
  return XLA_FFI_DataType_S32;
}

std::string DataTypeName(XLA_FFI_DataType dtype) {
  switch (dtype) {
    case XLA_FFI_DataType_F32:
      return "f32";
    case XLA_FFI_DataType_F64:
      return "f64";
    case XLA_FFI_DataType_C64:
      return "c64";
    case XLA_FFI_DataType_C128:
      return "c128";
    case XLA_FFI_DataType_S32:
      return "s32";
    case XLA_FFI_DataType_U8:
      return "u8";
    default:
      return absl::StrCat("element type ", static_cast<int>(dtype));
  }
}

absl::Status FfiCall::Expect(
    int args, int rets, std::initializer_list<absl::string_view> attrs) const {
  if (frame_->args.size != args || frame_->rets.size != rets) {
    return absl::InvalidArgumentError(absl::StrCat(
        "called with ", frame_->args.size, " operands and ", frame_->rets.size,
        " results, expected ", args, " and ", rets));
  }
  for (int i = 0; i < args; ++i) {
    if (frame_->args.types[i] != XLA_FFI_ArgType_BUFFER) {
      return absl::InvalidArgumentError(
          absl::StrCat("operand ", i, " is not a buffer"));
    }
  }
  for (int i = 0; i < rets; ++i) {
    if (frame_->rets.types[i] != XLA_FFI_RetType_BUFFER) {
      return absl::InvalidArgumentError(
          absl::StrCat("result ", i, " is not a buffer"));
    }
  }
  std::vector<std::string> got;
  for (int64_t i = 0; i < frame_->attrs.size; ++i) {
    const XLA_FFI_ByteSpan* name = frame_->attrs.names[i];
    got.emplace_back(name->ptr, name->len);
  }
  std::vector<std::string> want(attrs.begin(), attrs.end());
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  if (got != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("called with attributes {", absl::StrJoin(got, ", "),
                     "}, expected {", absl::StrJoin(want, ", "), "}"));
  }
  return absl::OkStatus();
}

absl::StatusOr<FfiBuffer> FfiCall::Arg(int i, XLA_FFI_DataType dtype,
                                       absl::string_view what) const {
  return ReadBuffer(frame_->args.args[i], dtype, "operand", i, what);
}

absl::StatusOr<FfiBuffer> FfiCall::Ret(int i, XLA_FFI_DataType dtype,
                                       absl::string_view what) const {
  return ReadBuffer(frame_->rets.rets[i], dtype, "result", i, what);
}

absl::StatusOr<uint8_t> FfiCall::U8Attr(absl::string_view name) const {
  for (int64_t i = 0; i < frame_->attrs.size; ++i) {
    const XLA_FFI_ByteSpan* n = frame_->attrs.names[i];
    if (absl::string_view(n->ptr, n->len) != name) continue;
    const auto* scalar =
        static_cast<const XLA_FFI_Scalar*>(frame_->attrs.attrs[i]);
    if (frame_->attrs.types[i] != XLA_FFI_AttrType_SCALAR ||
        scalar->dtype != XLA_FFI_DataType_U8) {
      return absl::InvalidArgumentError(
          absl::StrCat("attribute ", name, " is not a ui8 scalar"));
    }
    return *static_cast<const uint8_t*>(scalar->value);
  }
  return absl::InvalidArgumentError(absl::StrCat("no attribute ", name));
}

XLA_FFI_Error* Serve(XLA_FFI_CallFrame* frame, FfiFn fn) {
  if (frame == nullptr) return nullptr;
  const XLA_FFI_Api* api = frame->api;
  if (frame->struct_size < XLA_FFI_CallFrame_STRUCT_SIZE) {
    return MakeError(
        api, absl::FailedPreconditionError(absl::StrCat(
                 "an XLA FFI call frame of ", frame->struct_size,
                 " bytes, shorter than the ", XLA_FFI_CallFrame_STRUCT_SIZE,
                 " the LAPACK handlers read")));
  }
  if (frame->extension_start != nullptr &&
      frame->extension_start->type == XLA_FFI_Extension_Metadata) {
    return AnswerMetadata(api, reinterpret_cast<XLA_FFI_Metadata_Extension*>(
                                   frame->extension_start));
  }
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return nullptr;
  if (frame->args.struct_size < PLEXUS_FFI_SIZE_THROUGH(XLA_FFI_Args, args) ||
      frame->rets.struct_size < PLEXUS_FFI_SIZE_THROUGH(XLA_FFI_Rets, rets) ||
      frame->attrs.struct_size < XLA_FFI_Attrs_STRUCT_SIZE) {
    return MakeError(api, absl::FailedPreconditionError(
                              "the XLA FFI call frame's operands, results or "
                              "attributes are shorter than the LAPACK "
                              "handlers read"));
  }
  absl::Status status = fn(FfiCall(frame));
  return status.ok() ? nullptr : MakeError(api, status);
}

}  // namespace plexus::xla::lapack::internal
