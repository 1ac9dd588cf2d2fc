#include "plexus/executors/xla/compile_options.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/unknown_field_set.h"

namespace plexus::xla {
namespace {

using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

// The last value of varint field `number`, or -1 when absent.
int64_t Varint(const UnknownFieldSet& set, int number) {
  int64_t value = -1;
  for (int i = 0; i < set.field_count(); ++i) {
    const UnknownField& f = set.field(i);
    if (f.number() == number && f.type() == UnknownField::TYPE_VARINT) {
      value = static_cast<int64_t>(f.varint());
    }
  }
  return value;
}

// The length-delimited fields `number`, in order.
std::vector<std::string> Messages(const UnknownFieldSet& set, int number) {
  std::vector<std::string> out;
  for (int i = 0; i < set.field_count(); ++i) {
    const UnknownField& f = set.field(i);
    if (f.number() == number &&
        f.type() == UnknownField::TYPE_LENGTH_DELIMITED) {
      out.push_back(f.length_delimited());
    }
  }
  return out;
}

// Varints of a packed (or unpacked) repeated int64 field.
bool Int64s(const UnknownFieldSet& set, int number, std::vector<int64_t>* out) {
  for (int i = 0; i < set.field_count(); ++i) {
    const UnknownField& f = set.field(i);
    if (f.number() != number) continue;
    if (f.type() == UnknownField::TYPE_VARINT) {
      out->push_back(static_cast<int64_t>(f.varint()));
    } else if (f.type() == UnknownField::TYPE_LENGTH_DELIMITED) {
      const std::string& bytes = f.length_delimited();
      uint64_t v = 0;
      int shift = 0;
      for (unsigned char c : bytes) {
        if (shift > 63) return false;
        v |= static_cast<uint64_t>(c & 0x7f) << shift;
        shift += 7;
        if ((c & 0x80) == 0) {
          out->push_back(static_cast<int64_t>(v));
          v = 0;
          shift = 0;
        }
      }
      if (shift != 0) return false;  // a truncated varint
    }
  }
  return true;
}

}  // namespace

absl::Status CheckCompileOptions(absl::string_view options,
                                 const std::vector<int>& devices) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("compile options for devices [",
                     absl::StrJoin(devices, ", "), "]: ", what));
  };
  if (devices.empty()) return bad("the island has no devices");
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] < 0) return bad(absl::StrCat("device ", devices[i]));
    for (size_t j = 0; j < i; ++j) {
      if (devices[j] == devices[i]) {
        return bad(absl::StrCat("device ", devices[i], " appears twice"));
      }
    }
  }
  UnknownFieldSet top;
  if (!top.ParseFromArray(options.data(), static_cast<int>(options.size()))) {
    return bad("not a serialized xla.CompileOptionsProto");
  }
  std::vector<std::string> build = Messages(top, 3);
  if (build.empty()) return bad("no executable_build_options");
  UnknownFieldSet eb;
  if (!eb.ParseFromString(build.back())) {
    return bad("executable_build_options do not parse");
  }
  const int64_t replicas = Varint(eb, 4);
  const int64_t partitions = Varint(eb, 5);
  if (replicas != 1) {
    return bad(absl::StrCat("num_replicas must be 1, got ", replicas));
  }
  if (partitions != static_cast<int64_t>(devices.size())) {
    return bad(absl::StrCat("num_partitions is ", partitions,
                            ", the island has ", devices.size(), " devices"));
  }
  std::vector<std::string> assignment = Messages(eb, 9);
  if (assignment.empty()) {
    if (devices == std::vector<int>{0}) return absl::OkStatus();
    return bad("no device assignment (XLA would pick device 0)");
  }
  UnknownFieldSet da;
  if (!da.ParseFromString(assignment.back())) {
    return bad("device_assignment does not parse");
  }
  if (Varint(da, 1) != 1 ||
      Varint(da, 2) != static_cast<int64_t>(devices.size())) {
    return bad(absl::StrCat("device_assignment is ", Varint(da, 1), " x ",
                            Varint(da, 2), ", not 1 x ", devices.size()));
  }
  std::vector<int64_t> assigned;
  for (const std::string& computation : Messages(da, 3)) {
    UnknownFieldSet c;
    if (!c.ParseFromString(computation) || !Int64s(c, 1, &assigned)) {
      return bad("computation_devices do not parse");
    }
  }
  if (assigned != std::vector<int64_t>(devices.begin(), devices.end())) {
    return bad(
        absl::StrCat("assigns devices [", absl::StrJoin(assigned, ", "), "]"));
  }
  return absl::OkStatus();
}

}  // namespace plexus::xla
