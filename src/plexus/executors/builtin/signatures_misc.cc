// The signatures of the kernels that create arrays (fill, iota), of the
// all_reduce collective, and of the kernels for tests and benchmarks
// (assert_finite, busy_wait, device_sleep). Their bodies are in
// kernels_misc.cc.
#include <memory>
#include <vector>

#include "plexus/executors/builtin/attrs.h"
#include "plexus/executors/builtin/catalogue.h"
#include "plexus/executors/builtin/internal/misc_ops.h"
#include "plexus/executors/builtin/internal/registration.h"
#include "plexus/executors/builtin/internal/signature_checks.h"

namespace plexus::builtin::internal {
namespace {

// fill and iota: no arguments, output described by attributes.
class CreationSignature : public KernelSignature {
 public:
  absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>& inputs, int num_shards,
      const Attrs& attrs) const override {
    if (auto s = CheckArgs(inputs, 0, num_shards); !s.ok()) return s;
    if (auto v = GetFloatAttr(attrs, "value", 0.0); !v.ok()) return v.status();
    auto out = CreatedArray(attrs, num_shards);
    if (!out.ok()) return out.status();
    return std::vector<ArgSpec>{*out};
  }
};

// all_reduce: sums the shards' local arrays; every shard gets the sum. A
// split input's pieces are summed (not concatenated), so the output's
// global spec is the input's local spec.
class AllReduceSignature : public KernelSignature {
 public:
  absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>& inputs, int num_shards,
      const Attrs&) const override {
    if (auto s = CheckArgs(inputs, 1, num_shards); !s.ok()) return s;
    return std::vector<ArgSpec>{
        {LocalOf(inputs[0], num_shards), Sharding::Replicated()}};
  }

  bool is_collective() const override { return true; }
  // Sums with AccumulateInto, which knows every dtype but the 8-bit floats.
  bool AcceptsDType(DType dtype) const override { return CanAccumulate(dtype); }
};

// A kernel of one argument whose output is a copy of it.
class CopyingSignature : public KernelSignature {
 public:
  absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>& inputs, int num_shards,
      const Attrs& attrs) const override {
    if (auto s = CheckArgs(inputs, 1, num_shards); !s.ok()) return s;
    if (auto s = CheckArgsAndAttrs(inputs, attrs); !s.ok()) return s;
    return std::vector<ArgSpec>{inputs[0]};
  }

 protected:
  virtual absl::Status CheckArgsAndAttrs(const std::vector<ArgSpec>& inputs,
                                         const Attrs& attrs) const = 0;
};

// assert_finite: copies a float array, failing at run time on NaN or Inf.
class AssertFiniteSignature : public CopyingSignature {
 protected:
  absl::Status CheckArgsAndAttrs(const std::vector<ArgSpec>& inputs,
                                 const Attrs&) const override {
    return CheckFloat(inputs, 0);
  }
};

// busy_wait and device_sleep: wait for attribute `micros` microseconds,
// then copy their argument, whatever its dtype.
class WaitSignature : public CopyingSignature {
 public:
  bool AcceptsDType(DType) const override { return true; }  // bytes only

 protected:
  absl::Status CheckArgsAndAttrs(const std::vector<ArgSpec>&,
                                 const Attrs& attrs) const override {
    return WaitMicros(attrs).status();
  }
};

}  // namespace

void RegisterMiscSignatures(KernelCatalogue& catalogue) {
  catalogue.Register(
      "fill", std::make_unique<CreationSignature>(),
      KernelDoc{
          "Makes an array whose every element is `value`.",
          {{"shape", "ints", "", "the array's shape"},
           {"dtype", "string", "\"float32\"",
            "float32, float64, int32 or int64"},
           {"split_axis", "int", "-1",
            "the axis split over the slice; -1: "
            "replicated"},
           {"value", "float", "0.0", "every element's value"}},
          "None.",
          "One array of `shape` and `dtype`, split(split_axis) or "
          "replicated.",
          "ones = s.program(\"fill\", shape=[4], value=1.5, split_axis=0)()\n"
          "assert ones.sharding == \"split(0)\"\n"
          "assert np.asarray(ones).tolist() == [1.5] * 4\n"});
  catalogue.Register(
      "iota", std::make_unique<CreationSignature>(),
      KernelDoc{
          "Makes an array whose every element is its row-major index.",
          {{"shape", "ints", "", "the array's shape"},
           {"dtype", "string", "\"float32\"",
            "float32, float64, int32 or int64"},
           {"split_axis", "int", "-1",
            "the axis split over the slice; -1: "
            "replicated"}},
          "None.",
          "One array of `shape` and `dtype`, split(split_axis) or "
          "replicated; the shards of a split iota assemble into one iota.",
          "i = s.program(\"iota\", shape=[2, 2], dtype=\"int32\", "
          "split_axis=1)()\n"
          "assert np.asarray(i).tolist() == [[0, 1], [2, 3]]\n"});
  catalogue.Register(
      "all_reduce", std::make_unique<AllReduceSignature>(),
      KernelDoc{
          "Sums the devices' local arrays; every device gets the sum (a "
          "collective over the slice, between workers over the data plane).",
          {},
          "One argument of any dtype but the 8-bit floats, any sharding: "
          "usually partial (a data-parallel gradient). A split argument's "
          "pieces "
          "are summed, not concatenated.",
          "One replicated array whose global spec is the argument's per-device "
          "spec.",
          "x = s.put(np.arange(4, dtype=np.float32), plexus.split(0))\n"
          "part = s.program(\"reduce_sum\", x, axis=0)(x)\n"
          "total = s.program(\"all_reduce\", part)(part)\n"
          "assert total.sharding == \"replicated\"\n"
          "assert float(np.asarray(total)) == 6.0\n"});
  catalogue.Register(
      "assert_finite", std::make_unique<AssertFiniteSignature>(),
      KernelDoc{
          "Copies a float array, failing at run time on a NaN or an infinity "
          "(the error names the value and its index).",
          {},
          "One argument, float32 or float64, any sharding.",
          "A copy, with the argument's spec and sharding.",
          "x = s.put(np.array([1.0, np.inf], np.float32))\n"
          "y = s.program(\"assert_finite\", x)(x)\n"
          "try:\n"
          "    np.asarray(y)\n"
          "    raise AssertionError(\"no error\")\n"
          "except plexus.InvalidArgumentError as e:\n"
          "    assert \"non-finite value inf at index 1\" in str(e)\n"});
  catalogue.Register(
      "busy_wait", std::make_unique<WaitSignature>(),
      KernelDoc{"Spins a CPU core for `micros` microseconds, then copies its "
                "argument: "
                "a program of known duration for benchmarks.",
                {{"micros", "int", "", "how long to spin (0 or more)"}},
                "One argument of any dtype and sharding.",
                "A copy, with the argument's spec and sharding.",
                "x = s.put(np.arange(3, dtype=np.uint32))\n"
                "y = s.program(\"busy_wait\", x, micros=100)(x)\n"
                "assert np.asarray(y).tolist() == [0, 1, 2]\n"});
  catalogue.Register(
      "device_sleep", std::make_unique<WaitSignature>(),
      KernelDoc{
          "Holds its device for `micros` microseconds without using a CPU core "
          "(as a device computing would), then copies its argument.",
          {{"micros", "int", "", "how long to hold the device (0 or more)"}},
          "One argument of any dtype and sharding.",
          "A copy, with the argument's spec and sharding.",
          "x = s.put(np.ones(2, np.float32), plexus.split(0))\n"
          "y = s.program(\"device_sleep\", x, micros=1000)(x)\n"
          "assert np.asarray(y).tolist() == [1, 1]\n"});
}

}  // namespace plexus::builtin::internal
