// Internal to executors/xla: what the files of the PJRT runtime share to
// speak the PJRT C API (pjrt_runtime.cc: the plugin, its client, devices
// and executables; pjrt_run.cc: runs and their buffers).
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "pjrt_c_api.h"  // from the xla-cpu-pjrt wheel (CMakeLists.txt)
#include "plexus/common/types.h"
#include "plexus/executors/builtin/kernel.h"

namespace plexus::xla {

// Zero-initialised PJRT argument struct with its size set, as the C API
// requires for forward and backward compatibility.
template <typename T>
T Args(size_t struct_size) {
  T args;
  std::memset(&args, 0, sizeof(args));
  args.struct_size = struct_size;
  return args;
}
#define PJRT_ARGS(type) Args<type>(type##_STRUCT_SIZE)

absl::StatusCode CodeOf(PJRT_Error_Code code);

// The names threads the plugin starts take (ScopedThreadName): its pools
// for runs (the CPU plugin's dispatch threads; its intra-op Eigen pool names
// itself "tf_XLAEigen") and the threads its compiler starts.
inline constexpr char kPluginThreadName[] = "pjrt-plugin";
inline constexpr char kCompilerThreadName[] = "pjrt-compile";

// Names the calling thread `name` (at most 15 characters) for its
// lifetime, then gives the thread back its own name. A thread Linux starts
// takes its creator's name, so the threads the plugin starts meanwhile
// (its pools, which it mostly leaves unnamed) carry `name` for good: top -H,
// perf and /proc/PID/task/*/comm tell them from the Plexus thread that
// happened to load the plugin or compile. Not copyable; the calling
// thread's own.
class ScopedThreadName {
 public:
  explicit ScopedThreadName(const char* name);
  ~ScopedThreadName();
  ScopedThreadName(const ScopedThreadName&) = delete;
  ScopedThreadName& operator=(const ScopedThreadName&) = delete;

 private:
  char saved_[16] = {};
  bool restore_ = false;
};

// The plugin at `path`, loaded (dlopen, RTLD_LOCAL), its C API version
// checked and initialised: once per process and path (a plugin is
// initialised once, and never unloaded), whoever asks first.
absl::StatusOr<const PJRT_Api*> OpenPlugin(const std::string& path);
// Plexus dtypes and PJRT element types, one to one.
absl::StatusOr<PJRT_Buffer_Type> BufferType(DType dtype);
absl::StatusOr<DType> FromBufferType(PJRT_Buffer_Type type);

// Owns PJRT objects created during one call and destroys them in order.
class PjrtScope {
 public:
  explicit PjrtScope(const PJRT_Api* api) : api_(api) {}
  ~PjrtScope() {
    for (PJRT_Buffer* b : buffers_) {
      auto a = PJRT_ARGS(PJRT_Buffer_Destroy_Args);
      a.buffer = b;
      Consume(api_->PJRT_Buffer_Destroy(&a));
    }
    // Zero-copy inputs: the host memory is ours again once the plugin is
    // done with it.
    for (PJRT_Event* e : host_done_) {
      Await(e).IgnoreError();
    }
  }
  void Own(PJRT_Buffer* b) { buffers_.push_back(b); }
  void HostDone(PJRT_Event* e) {
    if (e != nullptr) host_done_.push_back(e);
  }
  absl::Status ToStatus(PJRT_Error* error, absl::string_view what) const {
    if (error == nullptr) return absl::OkStatus();
    auto m = PJRT_ARGS(PJRT_Error_Message_Args);
    m.error = error;
    api_->PJRT_Error_Message(&m);
    auto c = PJRT_ARGS(PJRT_Error_GetCode_Args);
    c.error = error;
    PJRT_Error* code_error = api_->PJRT_Error_GetCode(&c);
    absl::StatusCode code =
        code_error == nullptr ? CodeOf(c.code) : absl::StatusCode::kInternal;
    absl::Status s(
        code,
        absl::StrCat(what, ": ", absl::string_view(m.message, m.message_size)));
    Consume(code_error);
    Consume(error);
    return s;
  }
  // Waits for `event`, then destroys it.
  absl::Status Await(PJRT_Event* event) const {
    auto a = PJRT_ARGS(PJRT_Event_Await_Args);
    a.event = event;
    absl::Status s = ToStatus(api_->PJRT_Event_Await(&a), "XLA execution");
    auto d = PJRT_ARGS(PJRT_Event_Destroy_Args);
    d.event = event;
    Consume(api_->PJRT_Event_Destroy(&d));
    return s;
  }

 private:
  void Consume(PJRT_Error* error) const {
    if (error == nullptr) return;
    auto d = PJRT_ARGS(PJRT_Error_Destroy_Args);
    d.error = error;
    api_->PJRT_Error_Destroy(&d);
  }
  const PJRT_Api* api_;
  std::vector<PJRT_Buffer*> buffers_;
  std::vector<PJRT_Event*> host_done_;
};

// A PJRT buffer on `device` over `input`'s host memory, owned by `scope`.
// Store buffers are immutable while a task reads them: a plugin whose
// devices address host memory (CPU) uses them in place until it signals
// done_with_host_buffer; others copy them to the device, from the same
// memory, before signalling.
absl::StatusOr<PJRT_Buffer*> HostBuffer(const PJRT_Api* api,
                                        PJRT_Client* client, bool host_memory,
                                        PjrtScope& scope,
                                        const builtin::ConstTensor& input,
                                        PJRT_Device* device);

// The PJRT client, destroyed with the last of its runtime and its buffers.
struct PjrtClientHandle {
  PjrtClientHandle(const PJRT_Api* api, PJRT_Client* client)
      : api(api), client(client) {}
  ~PjrtClientHandle() {
    auto a = PJRT_ARGS(PJRT_Client_Destroy_Args);
    a.client = client;
    PjrtScope(api).ToStatus(api->PJRT_Client_Destroy(&a), "").IgnoreError();
  }
  const PJRT_Api* const api;
  PJRT_Client* const client;
};

}  // namespace plexus::xla
