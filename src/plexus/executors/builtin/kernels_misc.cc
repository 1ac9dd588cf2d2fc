// The bodies of the kernels that create arrays (fill, iota), of the
// all_reduce collective, and of the kernels for tests and benchmarks
// (assert_finite, busy_wait, device_sleep). Their signatures are in
// signatures_misc.cc.
#include <sys/prctl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "plexus/executors/builtin/internal/misc_ops.h"
#include "plexus/executors/builtin/internal/signature_checks.h"
#include "plexus/executors/builtin/kernel_support.h"

namespace plexus::builtin::internal {
namespace {

// Checks that the caller's output buffer is this shard's piece of the
// array the attributes describe.
absl::StatusOr<ArgSpec> CheckCreatedOutput(const KernelContext& ctx,
                                           const char* kernel) {
  if (auto s = CheckRunArity(ctx, kernel, 0, 1); !s.ok()) return s;
  auto global = CreatedArray(AttrsOf(ctx), ctx.num_shards);
  if (!global.ok()) return global.status();
  const TensorSpec local = LocalOf(*global, ctx.num_shards);
  if (ctx.outputs[0].spec != local) {
    return absl::InvalidArgumentError(absl::StrCat(
        kernel, " of ", global->ToString(), " over ", ctx.num_shards,
        " shards gives ", local.ToString(), " per shard, but the output is ",
        ctx.outputs[0].spec.ToString()));
  }
  return global;
}

// fill: every element is attribute `value` (default 0).
class FillBody : public KernelBody {
 public:
  absl::Status Run(const KernelContext& ctx) const override {
    auto global = CheckCreatedOutput(ctx, "fill");
    if (!global.ok()) return global.status();
    auto value = GetFloatAttr(AttrsOf(ctx), "value", 0.0);
    if (!value.ok()) return value.status();
    const MutableTensor& out = ctx.outputs[0];
    return VisitDType(out.spec.dtype, [&](auto zero) {
      using T = decltype(zero);
      std::fill_n(out.as<T>(), out.spec.num_elements(), static_cast<T>(*value));
      return absl::OkStatus();
    });
  }
};

// iota: each element is its row-major index in the global array, so the
// shards of a split iota assemble into one global iota.
class IotaBody : public KernelBody {
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
    return VisitDType(out.spec.dtype, [&](auto zero) {
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

// all_reduce: sums the shards' local arrays through the worker's
// collectives; every shard gets the sum.
class AllReduceBody : public KernelBody {
 public:
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
};

// assert_finite: copies a float array, failing at run time on NaN or Inf.
class AssertFiniteBody : public KernelBody {
 public:
  absl::Status Run(const KernelContext& ctx) const override {
    if (auto s = CheckRunArity(ctx, "assert_finite", 1, 1); !s.ok()) return s;
    if (auto s = CopyInputToOutput(ctx); !s.ok()) return s;
    const ConstTensor& in = ctx.inputs[0];
    return VisitFloatDType("assert_finite", in.spec.dtype, [&](auto zero) {
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
};

// busy_wait: spins (never sleeps) for attribute `micros` microseconds by
// the context's clock, then copies its argument. Benchmarks use it as a
// program of known duration.
class BusyWaitBody : public KernelBody {
 public:
  absl::Status Run(const KernelContext& ctx) const override {
    if (auto s = CheckRunArity(ctx, "busy_wait", 1, 1); !s.ok()) return s;
    auto micros = WaitMicros(AttrsOf(ctx));
    if (!micros.ok()) return micros.status();
    const absl::Time deadline = ctx.clock->Now() + absl::Microseconds(*micros);
    while (ctx.clock->Now() < deadline) {
    }
    return CopyInputToOutput(ctx);
  }
};

// device_sleep: holds its device for attribute `micros` microseconds without
// using a CPU core (it sleeps, spinning only the last 150 µs for precision),
// then copies its input. It stands for device
// time on an accelerator — the host thread waits while the device computes —
// so scheduling benchmarks measure the runtime, not CPU contention, on
// machines with fewer cores than devices. It sleeps and spins by the
// context's clock.
class DeviceSleepBody : public KernelBody {
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
    const absl::Time deadline = ctx.clock->Now() + absl::Microseconds(*micros);
    if (*micros > kSpinMicros) {
      ctx.clock->SleepFor(absl::Microseconds(*micros - kSpinMicros));
    }
    while (ctx.clock->Now() < deadline) {
    }
    return CopyInputToOutput(ctx);
  }
};

}  // namespace

void AddMiscBodies(KernelBodies& bodies) {
  AddBody<FillBody>(bodies, "fill");
  AddBody<IotaBody>(bodies, "iota");
  AddBody<AllReduceBody>(bodies, "all_reduce");
  AddBody<AssertFiniteBody>(bodies, "assert_finite");
  AddBody<BusyWaitBody>(bodies, "busy_wait");
  AddBody<DeviceSleepBody>(bodies, "device_sleep");
}

}  // namespace plexus::builtin::internal
