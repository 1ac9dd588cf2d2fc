#include "plexus/executors/xla/xla_executor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
      if ((*runtime_)->platform() == "cpu" &&
          !(*runtime_)->lapack_handlers().ok()) {
        SPDLOG_WARN(
            "XLA: programs calling LAPACK (jnp.linalg) will not compile: {}",
            std::string((*runtime_)->lapack_handlers().message()));
      }
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

uint64_t XlaExecutor::Fingerprint(const std::string& module,
                                  const std::string& compile_options) {
  // FNV-1a over both, the module's length between them: stable across
  // processes and builds, unlike absl::Hash (seeded per process).
  uint64_t h = 14695981039346656037ull;
  auto mix = [&h](const char* data, size_t size) {
    for (size_t i = 0; i < size; ++i) {
      h ^= static_cast<unsigned char>(data[i]);
      h *= 1099511628211ull;
    }
  };
  mix(module.data(), module.size());
  const uint64_t size = module.size();
  mix(reinterpret_cast<const char*>(&size), sizeof(size));
  mix(compile_options.data(), compile_options.size());
  return h;
}

std::shared_ptr<XlaExecutor::Entry> XlaExecutor::FindEntry(
    const std::string& module, const std::string& compile_options,
    bool create) {
  const uint64_t key = Fingerprint(module, compile_options);
  absl::MutexLock lock(&cache_mu_);
  auto bucket = cache_.find(key);
  if (bucket != cache_.end()) {
    for (const auto& e : bucket->second) {
      if (e->module == module && e->options == compile_options) return e;
    }
  }
  if (!create) return nullptr;
  SweepLocked();  // before growing: forget modules no program uses
  auto entry = std::make_shared<Entry>();
  entry->module = module;
  entry->options = compile_options;
  cache_[key].push_back(entry);
  return entry;
}

std::shared_ptr<const PjrtExecutable> XlaExecutor::Lookup(
    const std::string& module, const std::string& compile_options) {
  std::shared_ptr<Entry> entry =
      FindEntry(module, compile_options, /*create=*/false);
  if (entry == nullptr) return nullptr;
  absl::MutexLock lock(&entry->mu);  // waits for a compile under way
  if (!entry->done || !entry->error.ok()) return nullptr;
  std::shared_ptr<const PjrtExecutable> alive = entry->executable.lock();
  if (alive != nullptr) cache_hits_++;
  return alive;
}

absl::StatusOr<std::shared_ptr<const PjrtExecutable>> XlaExecutor::GetOrCompile(
    const std::string& module, const std::string& compile_options) {
  auto runtime = Runtime();
  if (!runtime.ok()) return runtime.status();
  std::shared_ptr<Entry> entry =
      FindEntry(module, compile_options, /*create=*/true);
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
  const absl::Time start = options_.clock->Now();
  auto compiled = (*runtime)->Compile(module, compile_options);
  const int64_t micros =
      absl::ToInt64Microseconds(options_.clock->Now() - start);
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
  entry->error = absl::OkStatus();
  entry->executable = exe;
  entry->serialized.clear();
  return exe;
}

absl::StatusOr<std::shared_ptr<const PjrtExecutable>> XlaExecutor::GetOrLoad(
    const Serialized& serialized, const std::vector<int>& devices) {
  auto runtime = Runtime();
  if (!runtime.ok()) return runtime.status();
  std::shared_ptr<Entry> entry =
      FindEntry(serialized.module, serialized.compile_options, /*create=*/true);
  absl::MutexLock lock(&entry->mu);
  if (entry->done && entry->error.ok()) {
    if (auto alive = entry->executable.lock()) {
      cache_hits_++;
      return alive;
    }
  }
  const absl::Time start = options_.clock->Now();
  auto loaded = (*runtime)->Deserialize(serialized.executable,
                                        serialized.compile_options);
  if (!loaded.ok()) return loaded.status();  // the entry is left as it was
  if ((*loaded)->device_indices() != devices) {
    return absl::FailedPreconditionError(
        absl::StrCat("the serialized executable runs on devices [",
                     absl::StrJoin((*loaded)->device_indices(), ", "),
                     "], not [", absl::StrJoin(devices, ", "), "]"));
  }
  const int64_t micros =
      absl::ToInt64Microseconds(options_.clock->Now() - start);
  serialized_loads_++;
  SPDLOG_INFO(
      "XLA: loaded a {}-byte serialized executable for {} device(s) in {} ms "
      "(not compiled)",
      serialized.executable.size(), (*loaded)->num_partitions(), micros / 1000);
  std::shared_ptr<const PjrtExecutable> exe(std::move(*loaded));
  entry->done = true;
  entry->error = absl::OkStatus();
  entry->executable = exe;
  entry->serialized = serialized.executable;
  return exe;
}

absl::StatusOr<XlaExecutor::Serialized> XlaExecutor::Serialize(
    uint64_t fingerprint) {
  std::vector<std::shared_ptr<Entry>> entries;
  {
    absl::MutexLock lock(&cache_mu_);
    auto bucket = cache_.find(fingerprint);
    if (bucket != cache_.end()) entries = bucket->second;
  }
  bool busy = false;
  absl::Status failed;  // a compile of this content that failed here
  for (const auto& e : entries) {
    std::shared_ptr<const PjrtExecutable> alive;
    std::string loaded_from;
    if (!e->mu.TryLock()) {  // being compiled or loaded
      busy = true;
      continue;
    }
    if (e->done && e->error.ok()) alive = e->executable.lock();
    if (e->done && !e->error.ok()) failed = e->error;
    if (alive != nullptr) loaded_from = e->serialized;
    e->mu.Unlock();
    if (alive == nullptr) continue;
    if (!loaded_from.empty()) {
      return Serialized{e->module, e->options, std::move(loaded_from)};
    }
    auto bytes = alive->runtime().Serialize(*alive);
    if (!bytes.ok()) return bytes.status();
    return Serialized{e->module, e->options, *std::move(bytes)};
  }
  const std::string key =
      absl::StrCat(absl::Hex(fingerprint, absl::kZeroPad16));
  if (busy) {
    return absl::UnavailableError(
        absl::StrCat("executable ", key, " is still being compiled here"));
  }
  if (!failed.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "executable ", key, " failed to compile here: ", failed.message()));
  }
  {
    absl::MutexLock lock(&load_mu_);
    if (loaded_ && !runtime_.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("no executable ", key,
                       " here: this worker's PJRT plugin did not "
                       "load (",
                       runtime_.status().message(), ")"));
    }
  }
  return absl::NotFoundError(absl::StrCat("no executable ", key, " here"));
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
