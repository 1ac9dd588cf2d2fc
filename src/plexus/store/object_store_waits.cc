// The object store's waits (object_store.h): for a key's declaration, for
// a shard to be ready (AwaitReady, AwaitInput, OnReady), and the list of
// inputs awaited that "why is it stuck" reads (AwaitedInputs). Each wait
// reads its deadline from the injected clock and says what ended it.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "plexus/common/status_proto.h"
#include "plexus/store/object_store.h"

namespace plexus {

absl::Status ObjectStore::UnknownKeyEndLocked(const BufferKey& key,
                                              bool read) const {
  if (shutdown_) return absl::CancelledError("worker shutting down");
  auto rejected = rejected_.find(key.buffer_id);
  if (rejected != rejected_.end()) return rejected->second;
  if (departed_.contains(ClientOfBuffer(key.buffer_id))) {
    return absl::FailedPreconditionError(
        absl::StrCat(KeyString(key), " belongs to client ",
                     ClientOfBuffer(key.buffer_id), ", which has left"));
  }
  if (read && released_.Contains(key.buffer_id) && !entries_.contains(key)) {
    return ReleasedOnWorkerError(KeyString(key));
  }
  if (temporary_floor_ > 0 &&
      ClientOfBuffer(key.buffer_id) == kServerClientId &&
      IsEarlierTemporary(key.buffer_id - ClientMadeId(kServerClientId, 0),
                         temporary_floor_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        KeyString(key),
        " is a transfer temporary of an earlier server (this one's count "
        "from ",
        temporary_floor_, "): nothing here will declare it"));
  }
  return absl::OkStatus();
}

ObjectStore::KeyWait* ObjectStore::JoinKeyWaitLocked(const BufferKey& key) {
  KeyWait*& slot = key_waits_[key];
  if (slot == nullptr) {
    if (free_key_waits_.empty()) {
      all_key_waits_.push_back(std::make_unique<KeyWait>());
      free_key_waits_.push_back(all_key_waits_.back().get());
    }
    slot = free_key_waits_.back();
    free_key_waits_.pop_back();
  }
  slot->waiters++;
  return slot;  // stable: the map's slot may move, the KeyWait does not
}

void ObjectStore::LeaveKeyWaitLocked(const BufferKey& key, KeyWait* wait) {
  if (--wait->waiters == 0) {
    key_waits_.erase(key);
    free_key_waits_.push_back(wait);
  }
}

bool ObjectStore::AwaitKeyLocked(const BufferKey& key, KeyEvent until,
                                 absl::Time deadline,
                                 const ReadyCallback* on_ready) {
  KeyWait* wait = JoinKeyWaitLocked(key);
  const int declaration = until == KeyEvent::kDeclared ? 1 : 0;
  wait->for_declaration += declaration;
  const uint64_t hook = on_ready != nullptr ? ++next_hook_ : 0;
  if (hook != 0) wait->on_ready.emplace_back(hook, *on_ready);
  const bool timed_out =
      options_.clock->AwaitWithDeadline(&mu_, &wait->cv, deadline);
  wait->for_declaration -= declaration;
  if (hook != 0) {  // not handed out: this wait takes it back
    auto& hooks = wait->on_ready;
    for (auto h = hooks.begin(); h != hooks.end(); ++h) {
      if (h->first == hook) {
        hooks.erase(h);
        break;
      }
    }
  }
  LeaveKeyWaitLocked(key, wait);
  return timed_out;
}

void ObjectStore::SignalKeyLocked(const BufferKey& key, KeyEvent event) {
  if (key_waits_.empty()) return;
  auto it = key_waits_.find(key);
  if (it == key_waits_.end()) return;
  if (event == KeyEvent::kComplete || it->second->for_declaration > 0) {
    it->second->cv.SignalAll();
  }
}

void ObjectStore::SignalKeyWaitsLocked() {
  for (auto& [key, wait] : key_waits_) {
    wait->cv.SignalAll();
    for (auto& [number, poke] : wait->pokes) poke();
  }
}

absl::StatusOr<ObjectStore::Entry*> ObjectStore::AwaitDeclaredLocked(
    const BufferKey& key) {
  const absl::Time deadline =
      options_.clock->Now() + options_.unknown_key_timeout;
  while (true) {
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second.declared) return &it->second;
    if (absl::Status end = UnknownKeyEndLocked(key, /*read=*/false);
        !end.ok()) {
      return end;
    }
    const bool timed_out = AwaitKeyLocked(key, KeyEvent::kDeclared, deadline);
    if (timed_out) {
      it = entries_.find(key);
      if (it != entries_.end() && it->second.declared) return &it->second;
      return absl::NotFoundError(absl::StrCat(
          KeyString(key), " was never declared on this worker (waited ",
          absl::FormatDuration(options_.unknown_key_timeout), ")"));
    }
  }
}

absl::StatusOr<std::shared_ptr<const Storage>> ObjectStore::AwaitReady(
    const BufferKey& key) {
  absl::MutexLock lock(&mu_);
  return AwaitReadyLocked(key, nullptr);
}

absl::StatusOr<std::shared_ptr<const Storage>> ObjectStore::AwaitReady(
    const BufferKey& key, const ReadyCallback& on_ready) {
  absl::MutexLock lock(&mu_);
  return AwaitReadyLocked(key, nullptr, on_ready ? &on_ready : nullptr);
}

std::optional<absl::StatusOr<std::shared_ptr<const Storage>>>
ObjectStore::ReadNowLocked(const BufferKey& key) const {
  if (shutdown_) return absl::CancelledError("worker shutting down");
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    const Entry& e = it->second;
    if (e.state == Entry::State::kReady) {
      return std::shared_ptr<const Storage>(e.data);
    }
    if (e.state == Entry::State::kFailed) return e.status;
    return std::nullopt;
  }
  if (absl::Status end = UnknownKeyEndLocked(key, /*read=*/true); !end.ok()) {
    return end;
  }
  return std::nullopt;
}

std::optional<absl::StatusOr<std::shared_ptr<const Storage>>>
ObjectStore::WatchReady(const BufferKey& key, const ReadyCallback& on_ready,
                        std::function<void()> poke, Watch* watch) {
  absl::MutexLock lock(&mu_);
  auto now = ReadNowLocked(key);
  if (now.has_value()) return now;
  *watch =
      Watch{++next_hook_, options_.clock->Now() + options_.unknown_key_timeout};
  KeyWait* wait = JoinKeyWaitLocked(key);
  wait->pokes.emplace_back(watch->id, std::move(poke));
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    // Pending: its completion (or failure) hands the hook out; no bound.
    it->second.callbacks.push_back(on_ready);
    watch->deadline = absl::InfiniteFuture();
  } else {
    wait->on_ready.emplace_back(watch->id, on_ready);
  }
  return std::nullopt;
}

void ObjectStore::EndWatchLocked(const BufferKey& key, const Watch& watch) {
  auto it = key_waits_.find(key);
  if (it == key_waits_.end()) return;
  KeyWait* wait = it->second;
  auto& pokes = wait->pokes;
  auto poke = std::find_if(pokes.begin(), pokes.end(),
                           [&](const auto& p) { return p.first == watch.id; });
  if (poke == pokes.end()) return;  // ended already
  pokes.erase(poke);
  auto& hooks = wait->on_ready;
  for (auto h = hooks.begin(); h != hooks.end(); ++h) {
    if (h->first == watch.id) {
      hooks.erase(h);
      break;
    }
  }
  LeaveKeyWaitLocked(key, wait);
}

void ObjectStore::EndWatch(const BufferKey& key, const Watch& watch) {
  absl::MutexLock lock(&mu_);
  EndWatchLocked(key, watch);
}

absl::StatusOr<std::shared_ptr<const Storage>> ObjectStore::AwaitWatched(
    const BufferKey& key, const Watch& watch) {
  absl::MutexLock lock(&mu_);
  EndWatchLocked(key, watch);
  return AwaitReadyLocked(key, nullptr, nullptr, watch.deadline);
}

absl::StatusOr<std::shared_ptr<const Storage>> ObjectStore::AwaitInput(
    const BufferKey& key) {
  InputWait wait;
  absl::StatusOr<std::shared_ptr<const Storage>> result;
  {
    absl::MutexLock lock(&mu_);
    result = AwaitReadyLocked(key, &wait);
  }
  if (wait.listed) UnlistWait(&wait);
  return result;
}

void ObjectStore::ListWaitLocked(InputWait* wait, int64_t source_worker) {
  absl::MutexLock lock(&awaited_mu_);
  wait->input.source_worker = source_worker;
  if (wait->listed) return;
  wait->listed = true;
  wait->input.since = options_.clock->Now();
  wait->prev = awaited_tail_;
  (awaited_tail_ != nullptr ? awaited_tail_->next : awaited_head_) = wait;
  awaited_tail_ = wait;
  ++awaited_count_;
}

void ObjectStore::UnlistWait(InputWait* wait) {
  absl::MutexLock lock(&awaited_mu_);
  (wait->prev != nullptr ? wait->prev->next : awaited_head_) = wait->next;
  (wait->next != nullptr ? wait->next->prev : awaited_tail_) = wait->prev;
  --awaited_count_;
}

int ObjectStore::AwaitedInputs(int max, std::vector<AwaitedInput>* out) const {
  out->clear();
  absl::MutexLock lock(&awaited_mu_);
  for (const InputWait* w = awaited_head_;
       w != nullptr && static_cast<int>(out->size()) < max; w = w->next) {
    out->push_back(w->input);
  }
  return awaited_count_;
}

absl::StatusOr<std::shared_ptr<const Storage>> ObjectStore::AwaitReadyLocked(
    const BufferKey& key, InputWait* wait, const ReadyCallback* on_ready,
    absl::Time unknown_deadline) {
  if (unknown_deadline == absl::InfinitePast()) {
    unknown_deadline = options_.clock->Now() + options_.unknown_key_timeout;
  }
  if (wait != nullptr) wait->input.key = key;
  while (true) {
    if (shutdown_) return absl::CancelledError("worker shutting down");
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      Entry& e = it->second;
      if (e.state == Entry::State::kReady) return e.data;
      if (e.state == Entry::State::kFailed) return e.status;
      // Pending: its producer, its sender's death (FailFromSource) or the
      // shutdown ends this wait; no deadline.
      if (wait != nullptr) {
        ListWaitLocked(wait, e.arrival == Arrival::kFromPeer ? e.source_worker
                                                             : int64_t{-1});
      }
      if (on_ready != nullptr) {
        e.callbacks.push_back(*on_ready);
        on_ready = nullptr;  // once: the entry keeps it until it completes
      }
      if (!e.ready) e.ready = std::make_shared<absl::CondVar>();
      std::shared_ptr<absl::CondVar> ready = e.ready;
      ready->Wait(&mu_);
      continue;
    }
    if (absl::Status end = UnknownKeyEndLocked(key, /*read=*/true); !end.ok()) {
      return end;
    }
    // A task's input wakes at the declaration, which names the peer it
    // awaits ("why is it stuck"); a fetch or wait only at the value.
    if (wait != nullptr) ListWaitLocked(wait, -1);
    const bool timed_out = AwaitKeyLocked(
        key, wait != nullptr ? KeyEvent::kDeclared : KeyEvent::kComplete,
        unknown_deadline, wait != nullptr ? nullptr : on_ready);
    if (timed_out && !entries_.contains(key) &&
        UnknownKeyEndLocked(key, /*read=*/true).ok()) {
      return absl::NotFoundError(absl::StrCat(
          KeyString(key),
          " is not on this worker (never declared here; waited ",
          absl::FormatDuration(options_.unknown_key_timeout), ")"));
    }
  }
}

void ObjectStore::OnReady(const BufferKey& key, ReadyCallback callback) {
  absl::StatusOr<std::shared_ptr<const Storage>> result;
  {
    absl::MutexLock lock(&mu_);
    Entry& e = GetOrCreateLocked(key);
    if (e.state == Entry::State::kPending) {
      e.callbacks.push_back(std::move(callback));
      return;
    }
    if (e.state == Entry::State::kReady) {
      result = std::shared_ptr<const Storage>(e.data);
    } else {
      result = e.status;
    }
  }
  callback(result);
}

}  // namespace plexus
