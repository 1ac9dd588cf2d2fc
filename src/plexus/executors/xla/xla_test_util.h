// Test helpers for the XLA executor (tests and the fuzz corpus generator):
// serialized xla.CompileOptionsProto written by hand in the protobuf wire
// format (the proto itself is in no wheel we install), and a small
// StableHLO module.
#pragma once

#include <cstdint>
#include <string>

namespace plexus::xla::testing {

// Protobuf wire format: a varint, a varint field, a length-delimited field.
inline std::string Varint(uint64_t v) {
  std::string out;
  do {
    unsigned char c = v & 0x7f;
    v >>= 7;
    if (v) c |= 0x80;
    out.push_back(static_cast<char>(c));
  } while (v);
  return out;
}
inline std::string VarintField(int number, uint64_t v) {
  return Varint(static_cast<uint64_t>(number) << 3) + Varint(v);
}
inline std::string LenField(int number, const std::string& bytes) {
  return Varint((static_cast<uint64_t>(number) << 3) | 2) +
         Varint(bytes.size()) + bytes;
}

// CompileOptionsProto { executable_build_options { num_replicas: 1
// num_partitions: 1 device_assignment { replica_count: 1
// computation_count: 1 computation_devices { replica_device_ids: d } } } }
inline std::string OptionsOnDevice(int device) {
  const std::string assignment =
      VarintField(1, 1) + VarintField(2, 1) +
      LenField(3, LenField(1, Varint(static_cast<uint64_t>(device))));
  const std::string build =
      VarintField(4, 1) + VarintField(5, 1) + LenField(9, assignment);
  return LenField(3, build);
}

// f32[2, 3] x, y -> (tanh(x) * y + y, sum(x) as a scalar).
inline constexpr char kTanhModule[] = R"(
module @m {
  func.func public @main(%x: tensor<2x3xf32>, %y: tensor<2x3xf32>)
      -> (tensor<2x3xf32>, tensor<f32>) {
    %t = stablehlo.tanh %x : tensor<2x3xf32>
    %m = stablehlo.multiply %t, %y : tensor<2x3xf32>
    %a = stablehlo.add %m, %y : tensor<2x3xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across
        dimensions = [0, 1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<f32>
    return %a, %s : tensor<2x3xf32>, tensor<f32>
  }
}
)";

// f32[256] x (donatable: aliased to the output), y -> x * 2 + y.
inline constexpr char kDonatingModule[] = R"(
module @m {
  func.func public @main(%x: tensor<256xf32> {tf.aliasing_output = 0 : i32},
                         %y: tensor<256xf32>) -> tensor<256xf32> {
    %two = stablehlo.constant dense<2.0> : tensor<256xf32>
    %d = stablehlo.multiply %x, %two : tensor<256xf32>
    %s = stablehlo.add %d, %y : tensor<256xf32>
    return %s : tensor<256xf32>
  }
}
)";

}  // namespace plexus::xla::testing
