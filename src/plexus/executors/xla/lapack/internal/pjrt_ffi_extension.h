// Internal to executors/xla/lapack: the part of the PJRT FFI extension
// (PJRT_Extension_Type_FFI in the plugin's extension chain) that registers
// an XLA FFI handler for a custom call target.
//
// The xla-cpu-pjrt wheel ships pjrt_c_api.h but not the extension's header
// (XLA's xla/pjrt/c/pjrt_c_api_ffi_extension.h), so its C layout is written
// down here, as that header has it at the plugin's build (PJRT C API 0.81)
// and as the plugin itself reports it: the extension is 48 bytes (the base,
// then three function pointers), and PJRT_FFI_Register_Handler refuses
// arguments shorter than 52 bytes. Only x86-64 / aarch64 Linux (LP64) are
// built for.
//
// The extension:
//
//   offset  size  field
//        0    24  PJRT_Extension_Base (struct_size, type, next)
//       24     8  register a type id          (not used here)
//       32     8  add user data to a context  (not used here)
//       40     8  register a handler          (RegisterHandlerFn)
//
// The arguments of register a handler:
//
//   offset  size  field
//        0     8  struct_size          kRegisterHandlerArgsSize
//        8     8  target_name          the custom call target, not
//       16     8  target_name_size     NUL-terminated
//       24     8  handler              XLA_FFI_Handler* (a typed FFI
//                                      handler: XLA FFI API >= 0.1)
//       32     8  platform_name        as XLA names it ("Host" for CPU)
//       40     8  platform_name_size
//       48     4  traits               bit 0: command-buffer compatible
//
// The plugin reads only the bytes struct_size says it was given, and
// refuses fewer than it knows; an extension shorter than 48 bytes
// predates handler registration.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pjrt_c_api.h"  // from the xla-cpu-pjrt wheel (CMakeLists.txt)

namespace plexus::xla::lapack::internal {

struct RegisterHandlerArgs {
  size_t struct_size;
  const char* target_name;
  size_t target_name_size;
  void* handler;
  const char* platform_name;
  size_t platform_name_size;
  uint32_t traits;
};
inline constexpr size_t kRegisterHandlerArgsSize = 52;
static_assert(offsetof(RegisterHandlerArgs, traits) + sizeof(uint32_t) ==
                  kRegisterHandlerArgsSize,
              "PJRT FFI extension: register-handler arguments are 52 bytes");

using RegisterHandlerFn = PJRT_Error* (*)(RegisterHandlerArgs* args);

struct FfiExtension {
  PJRT_Extension_Base base;
  void* register_type_id;
  void* add_user_data;
  RegisterHandlerFn register_handler;
};
inline constexpr size_t kFfiExtensionSize = 48;
static_assert(offsetof(FfiExtension, register_handler) +
                      sizeof(RegisterHandlerFn) ==
                  kFfiExtensionSize,
              "PJRT FFI extension: 48 bytes with register_handler");

}  // namespace plexus::xla::lapack::internal
