// The signatures of park and unpark, the kernels a slice suspended to files
// runs (ClusterState::SuspendSlice, ResumeSlice): the server's own. Only
// the server makes programs of them, with the directory it was given
// (--park-dir) and a key per value; a client's program of either is
// refused, here as it compiles and by the server as it registers. Their
// bodies are in kernels_park.cc.
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/executors/builtin/catalogue.h"
#include "plexus/executors/builtin/internal/registration.h"

namespace plexus::builtin::internal {
namespace {

class ServerOnlySignature : public KernelSignature {
 public:
  explicit ServerOnlySignature(const char* name) : name_(name) {}
  absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>&, int, const Attrs&) const override {
    return absl::PermissionDeniedError(absl::StrCat(
        "kernel '", name_,
        "' is the server's own (it moves a suspended slice's values to and "
        "from files: slice.suspend(to_files=True)); a client's program may "
        "not use it"));
  }
  bool AcceptsDType(DType) const override { return true; }  // bytes only
  bool server_only() const override { return true; }

 private:
  const char* name_;
};

}  // namespace

void RegisterParkSignatures(KernelCatalogue& catalogue) {
  catalogue.Register(
      "park", std::make_unique<ServerOnlySignature>("park"),
      KernelDoc{
          "The server's own: writes each device's block of a suspended "
          "slice's value to a file of the park directory "
          "(slice.suspend(to_files=True)).",
          {{"dir", "string", "", "the server's --park-dir"},
           {"key", "string", "", "the value's file name, less the device's"}},
          "One argument of any dtype and sharding.",
          "One uint8[1] token per device, once its file is written and "
          "synced.",
          "x = s.put(np.arange(4, dtype=np.float32))\n"
          "try:\n"
          "    s.program(\"park\", x, dir=\"/tmp\", key=\"k\")\n"
          "    raise AssertionError(\"no error\")\n"
          "except plexus.PermissionDeniedError as e:\n"
          "    assert \"the server's own\" in str(e)\n"});
  catalogue.Register(
      "unpark", std::make_unique<ServerOnlySignature>("unpark"),
      KernelDoc{
          "The server's own: reads each device's block of a value parked by "
          "`park` back from its file, then deletes the file (slice.resume() "
          "of a slice suspended to files).",
          {{"dir", "string", "", "the server's --park-dir"},
           {"key", "string", "", "the value's file name, less the device's"}},
          "None.",
          "The value as it was parked.",
          "try:\n"
          "    s.program(\"unpark\", dir=\"/tmp\", key=\"k\")\n"
          "    raise AssertionError(\"no error\")\n"
          "except plexus.PermissionDeniedError as e:\n"
          "    assert \"the server's own\" in str(e)\n"});
}

}  // namespace plexus::builtin::internal
