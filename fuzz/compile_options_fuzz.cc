// Fuzz target: the compile-options reader (xla::CheckCompileOptions), the
// gate between the bytes a client sends with an XLA program and the PJRT
// plugin, which aborts the worker on some malformed options.
//
// Input: u8 island size (mod 9), that many device ids (int8), then the
// serialized xla.CompileOptionsProto. Besides crashes, it checks what the
// gate promises: options it passes name one replica and one partition per
// device of an island of distinct, non-negative devices.
#include <cstdio>
#include <cstdlib>
#include <set>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "plexus/executors/xla/compile_options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  plexus::fuzz::InputReader in(data, size);
  std::vector<int> devices(in.U8() % 9);
  for (int& d : devices) d = static_cast<int8_t>(in.U8());
  const std::string options = in.Rest();
  const absl::Status s = plexus::xla::CheckCompileOptions(options, devices);
  if (!s.ok()) {
    if (s.code() != absl::StatusCode::kInvalidArgument || s.message().empty()) {
      std::fprintf(stderr, "unexpected error: %s\n", s.ToString().c_str());
      std::abort();
    }
    return 0;
  }
  const std::set<int> distinct(devices.begin(), devices.end());
  if (devices.empty() || distinct.size() != devices.size() ||
      *distinct.begin() < 0) {
    std::fprintf(stderr, "options passed for an island XLA cannot run on\n");
    std::abort();
  }
  return 0;
}
