// TicketTable: records by ticket, for tickets handed out in increasing
// order that mostly end in about that order (admission's calls in flight).
//
// The recent tickets sit in a ring indexed by ticket: a lookup is an index,
// not a hash (admission looks a call up once per host that reports it, so a
// call over 2,048 hosts is looked up 2,048 times). A ticket more than
// `span` behind the newest (a call still running long after thousands of
// later ones ended) moves to a hash map, so the ring never holds more than
// `span` slots, whatever one straggler does.
//
// Pure data, not thread-safe. Pointers returned stay valid until that
// ticket is erased or a later Add (which may move a straggler).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace plexus {

template <typename T>
class TicketTable {
 public:
  explicit TicketTable(size_t span = size_t{1} << 16)
      : span_(span > 0 ? span : 1) {}

  // A new record for `ticket`, which is above every ticket added before
  // (the tickets between, never added, read as absent).
  T& Add(uint64_t ticket) {
    if (len_ == 0) base_ = ticket;
    while (ticket - base_ >= span_) {  // the oldest slot leaves the ring
      if (len_ == 0) {
        base_ = ticket;
        break;
      }
      std::optional<T>& front = At(0);
      if (front.has_value()) {
        overflow_.emplace(base_, std::move(*front));
        front.reset();
      }
      PopFront();
    }
    const size_t need = static_cast<size_t>(ticket - base_) + 1;
    if (need > slots_.size()) Grow(need);
    len_ = need;
    std::optional<T>& slot = At(need - 1);
    slot.emplace();
    ++size_;
    return *slot;
  }

  // The record of `ticket`, or null.
  T* Find(uint64_t ticket) {
    if (ticket - base_ < len_) {  // (wraps for a ticket below base_)
      std::optional<T>& slot = At(static_cast<size_t>(ticket - base_));
      return slot.has_value() ? &*slot : nullptr;
    }
    if (overflow_.empty()) return nullptr;
    auto it = overflow_.find(ticket);
    return it == overflow_.end() ? nullptr : &it->second;
  }

  void Erase(uint64_t ticket) {
    if (ticket - base_ < len_) {
      std::optional<T>& slot = At(static_cast<size_t>(ticket - base_));
      if (!slot.has_value()) return;
      slot.reset();
      --size_;
      while (len_ > 0 && !At(0).has_value()) PopFront();
      return;
    }
    size_ -= overflow_.erase(ticket);
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Calls fn(ticket, record) for every record, stragglers first (in the
  // map's order), then in ticket order. fn must not add or erase.
  template <typename Fn>
  void ForEach(Fn fn) {
    for (auto& [ticket, value] : overflow_) fn(ticket, value);
    for (size_t i = 0; i < len_; ++i) {
      std::optional<T>& slot = At(i);
      if (slot.has_value()) fn(base_ + i, *slot);
    }
  }
  template <typename Fn>
  void ForEach(Fn fn) const {
    const_cast<TicketTable*>(this)->ForEach(
        [&](uint64_t ticket, T& value) { fn(ticket, std::as_const(value)); });
  }

 private:
  // The i-th slot from base_ (i < len_ or, while adding, < slots_.size()).
  std::optional<T>& At(size_t i) {
    return slots_[(head_ + i) & (slots_.size() - 1)];
  }
  void PopFront() {
    head_ = (head_ + 1) & (slots_.size() - 1);
    ++base_;
    --len_;
  }
  // Room for `need` slots from base_ (a power of two: At masks), in order.
  void Grow(size_t need) {
    size_t capacity = slots_.empty() ? 64 : slots_.size();
    while (capacity < need) capacity *= 2;
    std::vector<std::optional<T>> slots(capacity);
    for (size_t i = 0; i < len_; ++i) slots[i] = std::move(At(i));
    slots_.swap(slots);
    head_ = 0;
  }

  const size_t span_;
  uint64_t base_ = 0;  // the ticket of the ring's first slot
  size_t head_ = 0;    // where that slot is in slots_
  size_t len_ = 0;     // slots from base_ to the newest ticket
  std::vector<std::optional<T>> slots_;  // the ring; empty slots are reset
  absl::flat_hash_map<uint64_t, T> overflow_;  // stragglers
  size_t size_ = 0;
};

}  // namespace plexus
