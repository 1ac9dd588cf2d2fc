// A check of the serialized xla.CompileOptionsProto a client sends with an
// XLA program, before it reaches the plugin: XLA CHECK-fails (aborting the
// worker) on some malformed options, e.g. zero replicas. The check reads the
// protobuf wire format without XLA's .proto (no wheel ships it), through
// these fields of xla/pjrt/proto/compile_options.proto and
// xla/xla_data.proto:
//   CompileOptionsProto.executable_build_options = 3
//   ExecutableBuildOptionsProto: num_replicas = 4, num_partitions = 5,
//                                device_assignment = 9
//   DeviceAssignmentProto: replica_count = 1, computation_count = 2,
//                          computation_devices = 3 { replica_device_ids = 1 }
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace plexus::xla {

// OK if `devices` are distinct and non-negative (at least one), and
// `options` parses, asks for one replica and devices.size()
// partitions, and assigns partition p to device devices[p] when it assigns
// devices at all (without an assignment XLA picks device 0, which is only
// right for the island [0]). The error names what is wrong.
absl::Status CheckCompileOptions(absl::string_view options,
                                 const std::vector<int>& devices);

}  // namespace plexus::xla
