// Kernels that create arrays (fill, iota), the all_reduce collective, and
// kernels for tests and benchmarks (assert_finite, busy_wait).
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <thread>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "plexus/executors/builtin/kernel_support.h"

namespace plexus::builtin {
namespace {

using internal::AttrsOf;
using internal::CheckArgs;
using internal::CheckRunArity;
using internal::KernelRegistrar;

// The output of fill and iota, from attributes shape, dtype (default
// "float32") and split_axis (default -1: replicated).
absl::StatusOr<ArgSpec> CreatedArray(const Attrs& attrs, int num_shards) {
  auto shape = GetIntsAttr(attrs, "shape");
  if (!shape.ok()) return shape.status();
  for (int64_t d : *shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attribute 'shape' has a negative dimension: ", ShapeString(*shape)));
    }
  }
  auto dtype_name = GetStringAttr(attrs, "dtype", "float32");
  if (!dtype_name.ok()) return dtype_name.status();
  auto dtype = ParseDType(*dtype_name);
  if (!dtype.ok()) return dtype.status();
  if (!IsArithmeticDType(*dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attribute 'dtype': built-in kernels compute in float32, float64, "
        "int32 and int64, not ",
        *dtype_name));
  }
  auto split_axis = GetIntAttr(attrs, "split_axis", -1);
  if (!split_axis.ok()) return split_axis.status();
  const int64_t rank = static_cast<int64_t>(shape->size());
  if (*split_axis < -1 || *split_axis >= rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attribute 'split_axis' must be -1 (replicated) or in [0, ", rank,
        ") for shape ", ShapeString(*shape), ", got ", *split_axis));
  }
  ArgSpec out{{*dtype, *shape},
              *split_axis < 0 ? Sharding::Replicated()
                              : Sharding::Split(static_cast<int>(*split_axis))};
  if (auto local = out.Local(num_shards); !local.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("output: ", local.status().message()));
  }
  return out;
}

// Checks that the caller's output buffer is this shard's piece of the
// array the attributes describe.
absl::StatusOr<ArgSpec> CheckCreatedOutput(const KernelContext& ctx,
                                           const char* kernel) {
  if (auto s = CheckRunArity(ctx, kernel, 0, 1); !s.ok()) return s;
  auto global = CreatedArray(AttrsOf(ctx), ctx.num_shards);
  if (!global.ok()) return global.status();
  const TensorSpec local = internal::LocalOf(*global, ctx.num_shards);
  if (ctx.outputs[0].spec != local) {
    return absl::InvalidArgumentError(absl::StrCat(
        kernel, " of ", global->ToString(), " over ", ctx.num_shards,
        " shards gives ", local.ToString(), " per shard, but the output is ",
        ctx.outputs[0].spec.ToString()));
  }
  return global;
}

// Base of fill and iota: no arguments, output described by attributes.
class CreationKernel : public Kernel {
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

// fill: every element is attribute `value` (default 0).
class FillKernel : public CreationKernel {
 public:
  absl::Status Run(const KernelContext& ctx) const override {
    auto global = CheckCreatedOutput(ctx, "fill");
    if (!global.ok()) return global.status();
    auto value = GetFloatAttr(AttrsOf(ctx), "value", 0.0);
    if (!value.ok()) return value.status();
    const MutableTensor& out = ctx.outputs[0];
    return internal::VisitDType(out.spec.dtype, [&](auto zero) {
      using T = decltype(zero);
      std::fill_n(out.as<T>(), out.spec.num_elements(), static_cast<T>(*value));
      return absl::OkStatus();
    });
  }
};

// iota: each element is its row-major index in the global array, so the
// shards of a split iota assemble into one global iota.
class IotaKernel : public CreationKernel {
 public:
  absl::Status Run(const KernelContext& ctx) const override {
    auto global = CheckCreatedOutput(ctx, "iota");
    if (!global.ok()) return global.status();
    const MutableTensor& out = ctx.outputs[0];
    // View the local array as [outer, len, inner] around the split axis;
    // the shard's rows start at `offset` within the global length.
    int64_t outer = 1, len = out.spec.num_elements(), inner = 1, offset = 0;
    int64_t global_len = len;
    if (global->sharding.is_split()) {
      const int axis = global->sharding.axis;
      len = out.spec.shape[axis];
      global_len = global->global.shape[axis];
      offset = ctx.shard * len;
      for (int i = 0; i < axis; ++i) outer *= out.spec.shape[i];
      for (size_t i = axis + 1; i < out.spec.shape.size(); ++i) {
        inner *= out.spec.shape[i];
      }
    }
    return internal::VisitDType(out.spec.dtype, [&](auto zero) {
      using T = decltype(zero);
      T* data = out.as<T>();
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t l = 0; l < len; ++l) {
          const int64_t global_row = o * global_len + offset + l;
          for (int64_t i = 0; i < inner; ++i) {
            data[(o * len + l) * inner + i] =
                static_cast<T>(global_row * inner + i);
          }
        }
      }
      return absl::OkStatus();
    });
  }
};

// all_reduce: sums the shards' local arrays; every shard gets the sum. A
// split input's pieces are summed (not concatenated), so the output's
// global spec is the input's local spec.
class AllReduceKernel : public Kernel {
 public:
  absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>& inputs, int num_shards,
      const Attrs&) const override {
    if (auto s = CheckArgs(inputs, 1, num_shards); !s.ok()) return s;
    return std::vector<ArgSpec>{
        {internal::LocalOf(inputs[0], num_shards), Sharding::Replicated()}};
  }

  absl::Status Run(const KernelContext& ctx) const override {
    if (auto s = CheckRunArity(ctx, "all_reduce", 1, 1); !s.ok()) return s;
    if (ctx.collectives == nullptr) {
      return absl::FailedPreconditionError(
          "all_reduce needs the worker's collectives, but "
          "KernelContext::collectives is null");
    }
    if (ctx.inputs[0].spec != ctx.outputs[0].spec) {
      return absl::InvalidArgumentError(
          absl::StrCat("all_reduce of ", ctx.inputs[0].spec.ToString(),
                       " into ", ctx.outputs[0].spec.ToString()));
    }
    return ctx.collectives->AllReduceSum(ctx.inputs[0], ctx.outputs[0]);
  }

  bool is_collective() const override { return true; }
  // Sums with AccumulateInto, which knows every dtype but the 8-bit floats.
  bool AcceptsDType(DType dtype) const override { return CanAccumulate(dtype); }
};

// A kernel of one argument whose output is a copy of it.
class CopyingKernel : public Kernel {
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
class AssertFiniteKernel : public CopyingKernel {
 public:
  absl::Status Run(const KernelContext& ctx) const override {
    if (auto s = CheckRunArity(ctx, "assert_finite", 1, 1); !s.ok()) return s;
    if (auto s = internal::CopyInputToOutput(ctx); !s.ok()) return s;
    const ConstTensor& in = ctx.inputs[0];
    return internal::VisitFloatDType(
        "assert_finite", in.spec.dtype, [&](auto zero) {
          using T = decltype(zero);
          const T* data = in.as<T>();
          for (int64_t i = 0; i < in.spec.num_elements(); ++i) {
            if (!std::isfinite(data[i])) {
              return absl::InvalidArgumentError(
                  absl::StrCat("non-finite value ", data[i], " at index ", i));
            }
          }
          return absl::OkStatus();
        });
  }

 protected:
  absl::Status CheckArgsAndAttrs(const std::vector<ArgSpec>& inputs,
                                 const Attrs&) const override {
    return internal::CheckFloat(inputs, 0);
  }
};

// busy_wait: spins (never sleeps) for attribute `micros` microseconds, then
// copies its argument. Benchmarks use it as a program of known duration.
class BusyWaitKernel : public CopyingKernel {
 public:
  absl::Status Run(const KernelContext& ctx) const override {
    if (auto s = CheckRunArity(ctx, "busy_wait", 1, 1); !s.ok()) return s;
    auto micros = Micros(AttrsOf(ctx));
    if (!micros.ok()) return micros.status();
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::microseconds(*micros);
    while (std::chrono::steady_clock::now() < deadline) {
    }
    return internal::CopyInputToOutput(ctx);
  }
  bool AcceptsDType(DType) const override { return true; }  // bytes only

 protected:
  absl::Status CheckArgsAndAttrs(const std::vector<ArgSpec>&,
                                 const Attrs& attrs) const override {
    return Micros(attrs).status();
  }

 private:
  static absl::StatusOr<int64_t> Micros(const Attrs& attrs) {
    auto micros = GetIntAttr(attrs, "micros");
    if (micros.ok() && *micros < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attribute 'micros' must not be negative, got ", *micros));
    }
    return micros;
  }
};

// device_sleep: holds its device for attribute `micros` microseconds without
// using a CPU core (it sleeps, spinning only the last 150 µs for precision),
// then copies its input. It stands for device
// time on an accelerator — the host thread waits while the device computes —
// so scheduling benchmarks measure the runtime, not CPU contention, on
// machines with fewer cores than devices.
class DeviceSleepKernel : public BusyWaitKernel {
 public:
  absl::Status Run(const KernelContext& ctx) const override {
    if (auto s = CheckRunArity(ctx, "device_sleep", 1, 1); !s.ok()) return s;
    auto micros = GetIntAttr(AttrsOf(ctx), "micros");
    if (!micros.ok()) return micros.status();
    // Sleep as precisely as the kernel allows: the default 50 µs timer slack
    // would stretch every short "device" kernel, and a VM's wake-up takes
    // ~100 µs more, so the last kSpinMicros are spun rather than slept.
    static thread_local bool precise = (prctl(PR_SET_TIMERSLACK, 1UL), true);
    (void)precise;
    constexpr int64_t kSpinMicros = 150;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::microseconds(*micros);
    if (*micros > kSpinMicros) {
      std::this_thread::sleep_for(
          std::chrono::microseconds(*micros - kSpinMicros));
    }
    while (std::chrono::steady_clock::now() < deadline) {
    }
    return internal::CopyInputToOutput(ctx);
  }
};

const KernelRegistrar<FillKernel> kFill(
    "fill",
    {"Makes an array whose every element is `value`.",
     {{"shape", "ints", "", "the array's shape"},
      {"dtype", "string", "\"float32\"", "float32, float64, int32 or int64"},
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
const KernelRegistrar<IotaKernel> kIota(
    "iota",
    {"Makes an array whose every element is its row-major index.",
     {{"shape", "ints", "", "the array's shape"},
      {"dtype", "string", "\"float32\"", "float32, float64, int32 or int64"},
      {"split_axis", "int", "-1",
       "the axis split over the slice; -1: "
       "replicated"}},
     "None.",
     "One array of `shape` and `dtype`, split(split_axis) or "
     "replicated; the shards of a split iota assemble into one iota.",
     "i = s.program(\"iota\", shape=[2, 2], dtype=\"int32\", "
     "split_axis=1)()\n"
     "assert np.asarray(i).tolist() == [[0, 1], [2, 3]]\n"});
const KernelRegistrar<AllReduceKernel> kAllReduce(
    "all_reduce",
    {"Sums the devices' local arrays; every device gets the sum (a "
     "collective over the slice, between workers over the data plane).",
     {},
     "One argument of any dtype but the 8-bit floats, any sharding: "
     "usually partial (a data-parallel gradient). A split argument's pieces "
     "are summed, not concatenated.",
     "One replicated array whose global spec is the argument's per-device "
     "spec.",
     "x = s.put(np.arange(4, dtype=np.float32), plexus.split(0))\n"
     "part = s.program(\"reduce_sum\", x, axis=0)(x)\n"
     "total = s.program(\"all_reduce\", part)(part)\n"
     "assert total.sharding == \"replicated\"\n"
     "assert float(np.asarray(total)) == 6.0\n"});
const KernelRegistrar<AssertFiniteKernel> kAssertFinite(
    "assert_finite",
    {"Copies a float array, failing at run time on a NaN or an infinity "
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
const KernelRegistrar<BusyWaitKernel> kBusyWait(
    "busy_wait",
    {"Spins a CPU core for `micros` microseconds, then copies its argument: "
     "a program of known duration for benchmarks.",
     {{"micros", "int", "", "how long to spin (0 or more)"}},
     "One argument of any dtype and sharding.",
     "A copy, with the argument's spec and sharding.",
     "x = s.put(np.arange(3, dtype=np.uint32))\n"
     "y = s.program(\"busy_wait\", x, micros=100)(x)\n"
     "assert np.asarray(y).tolist() == [0, 1, 2]\n"});
const KernelRegistrar<DeviceSleepKernel> kDeviceSleep(
    "device_sleep",
    {"Holds its device for `micros` microseconds without using a CPU core "
     "(as a device computing would), then copies its argument.",
     {{"micros", "int", "", "how long to hold the device (0 or more)"}},
     "One argument of any dtype and sharding.",
     "A copy, with the argument's spec and sharding.",
     "x = s.put(np.ones(2, np.float32), plexus.split(0))\n"
     "y = s.program(\"device_sleep\", x, micros=1000)(x)\n"
     "assert np.asarray(y).tolist() == [1, 1]\n"});

}  // namespace
}  // namespace plexus::builtin
