#include "plexus/executors/xla/xla_executor.h"

#include <algorithm>

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
  {
    absl::MutexLock lock(&cache_mu_);
    for (const auto& e : cache_[key]) {
      if (e->module == module && e->options == compile_options) entry = e;
    }
    if (entry == nullptr) {
      SweepLocked();  // before growing: forget modules no program uses
      entry = std::make_shared<Entry>();
      entry->module = module;
      entry->options = compile_options;
      cache_[key].push_back(entry);
    }
  }
  // A request that finds the compile under way waits here for it.
  absl::MutexLock lock(&entry->mu);
  if (entry->done) {
    if (!entry->error.ok()) {
      cache_hits_++;
      return entry->error;
    }
    if (auto alive = entry->executable.lock()) {
      cache_hits_++;
      return alive;
    }
    // Freed since (every program using it was unloaded): compile again.
  }
  const absl::Time start = absl::Now();
  auto compiled = (*runtime)->Compile(module, compile_options);
  const int64_t micros = absl::ToInt64Microseconds(absl::Now() - start);
  compiles_++;
  compile_micros_ += micros;
  entry->done = true;
  if (!compiled.ok()) {
    SPDLOG_WARN("XLA: compile failed: {}", compiled.status().ToString());
    entry->error = compiled.status();
    return entry->error;
  }
  SPDLOG_INFO("XLA: compiled a {}-byte module for {} device(s) in {} ms",
              module.size(), (*compiled)->num_partitions(), micros / 1000);
  std::shared_ptr<const PjrtExecutable> exe(std::move(*compiled));
  entry->executable = exe;
  return exe;
}

void XlaExecutor::SweepLocked() {
  for (auto bucket = cache_.begin(); bucket != cache_.end();) {
    auto& entries = bucket->second;
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [](const std::shared_ptr<Entry>& e) {
                                   // An entry being compiled is locked: keep
                                   // it.
                                   if (!e->mu.TryLock()) return false;
                                   const bool gone = e->done && e->error.ok() &&
                                                     e->executable.expired();
                                   e->mu.Unlock();
                                   return gone;
                                 }),
                  entries.end());
    if (entries.empty()) {
      cache_.erase(bucket++);
    } else {
      ++bucket;
    }
  }
}

}  // namespace plexus::xla
