#include "plexus/executors/xla/xla_executor.h"

#include "absl/hash/hash.h"
#include "absl/time/clock.h"
#include "plexus/common/logging.h"

namespace plexus::xla {

absl::StatusOr<const PjrtRuntime*> XlaExecutor::Runtime() {
  absl::MutexLock lock(&load_mu_);
  if (!loaded_) {
    loaded_ = true;
    runtime_ = PjrtRuntime::Load(options_);
    if (runtime_.ok()) {
      SPDLOG_INFO("XLA: PJRT plugin {} (C API {}), platform {}, {} devices",
                  options_.plugin_path, (*runtime_)->api_version(),
                  (*runtime_)->platform(), (*runtime_)->num_devices());
    } else {
      SPDLOG_ERROR("XLA: {}", runtime_.status().ToString());
    }
    absl::MutexLock describe(&describe_mu_);
    description_ = runtime_.ok() ? (*runtime_)->platform()
                                 : std::string(runtime_.status().message());
  }
  if (!runtime_.ok()) return runtime_.status();
  return runtime_->get();
}

std::string XlaExecutor::Describe() {
  absl::MutexLock lock(&describe_mu_);
  return description_;
}

absl::StatusOr<std::shared_ptr<const PjrtExecutable>> XlaExecutor::GetOrCompile(
    const std::string& module, const std::string& compile_options) {
  auto runtime = Runtime();
  if (!runtime.ok()) return runtime.status();
  const size_t key = absl::HashOf(module, compile_options);
  std::shared_ptr<Entry> entry;
  bool mine = false;
  {
    absl::MutexLock lock(&cache_mu_);
    for (const auto& e : cache_[key]) {
      if (e->module == module && e->options == compile_options) entry = e;
    }
    if (entry == nullptr) {
      entry = std::make_shared<Entry>();
      entry->module = module;
      entry->options = compile_options;
      cache_[key].push_back(entry);
      mine = true;
    }
  }
  absl::MutexLock lock(&entry->mu);
  if (!mine) {
    entry->mu.Await(absl::Condition(&entry->done));
    cache_hits_++;
    return entry->result;
  }
  const absl::Time start = absl::Now();
  auto compiled = (*runtime)->Compile(module, compile_options);
  const int64_t micros = absl::ToInt64Microseconds(absl::Now() - start);
  compiles_++;
  compile_micros_ += micros;
  if (compiled.ok()) {
    SPDLOG_INFO("XLA: compiled a {}-byte module for {} device(s) in {} ms",
                module.size(), (*compiled)->num_partitions(), micros / 1000);
    entry->result = std::shared_ptr<const PjrtExecutable>(std::move(*compiled));
  } else {
    SPDLOG_WARN("XLA: compile failed: {}", compiled.status().ToString());
    entry->result = compiled.status();
  }
  entry->done = true;
  return entry->result;
}

}  // namespace plexus::xla
