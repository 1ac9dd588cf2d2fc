#include "plexus/server/scheduling/admission.h"

#include <algorithm>

#include "plexus/common/status_proto.h"

namespace plexus {
namespace {

// Weight of a new report in a program's moving average.
constexpr double kCostSmoothing = 0.2;

}  // namespace

Admission::Admission(Options options) : options_(options) {}

void Admission::AddClient(uint64_t client, double weight,
                          int32_t max_calls_in_flight) {
  Client& c = clients_[client];
  c.view.weight = weight > 0 ? weight : 1;
  c.view.max_calls_in_flight = std::max(1, max_calls_in_flight);
  c.pass = virtual_pass_;
}

int64_t Admission::RemoveClient(uint64_t client) {
  auto it = clients_.find(client);
  if (it == clients_.end()) return 0;
  Unbacklog(client, it->second);
  const int64_t dropped =
      static_cast<int64_t>(it->second.pending.size() + it->second.held.size());
  // Frees the windows now: the workers drop its work on ClientGone.
  std::vector<uint64_t> tickets;
  in_flight_.ForEach([&](uint64_t ticket, const InFlight& f) {
    if (f.client == client) tickets.push_back(ticket);
  });
  for (uint64_t ticket : tickets) EndEverywhere(ticket);
  clients_.erase(it);
  return dropped;
}

void Admission::AddWorker(int64_t worker, int devices) {
  if (worker < 0) return;  // (the server's ids are positive)
  const size_t at = static_cast<size_t>(worker);
  if (at >= windows_.size()) windows_.resize(at + 1);
  if (windows_[at] == nullptr) windows_[at] = std::make_unique<Window>();
  windows_[at]->devices = std::max(1, devices);
}

void Admission::RemoveWorker(int64_t worker) {
  std::vector<uint64_t> tickets;
  in_flight_.ForEach([&](uint64_t ticket, const InFlight& f) {
    if (std::binary_search(f.workers->begin(), f.workers->end(), worker)) {
      tickets.push_back(ticket);
    }
  });
  for (uint64_t ticket : tickets) {
    InFlight* f = in_flight_.Find(ticket);
    f->cut_short = true;
    EndOn(ticket, *f, worker);
  }
  if (const Window* window = FindWindow(worker)) {
    if (PastHalf(*window)) windows_past_half_--;
    windows_[worker].reset();
  }
}

int64_t Admission::FailCallsOn(int64_t worker, const absl::Status& status) {
  int64_t failed = 0;
  const proto::Status lost = StatusToProto(status);
  for (auto& [id, c] : clients_) {
    for (AdmissionUnit& unit : c.pending) {
      const auto& ws = unit.exec_workers;
      if (std::find(ws.begin(), ws.end(), worker) == ws.end()) continue;
      unit.ops.erase(worker);
      if (unit.executes != nullptr) {
        // Each other host fails the outputs where its Execute would
        // have run (after its ops).
        for (int h = 0; h < unit.executes->hosts(); ++h) {
          const int64_t w = unit.executes->worker(h);
          if (w == worker) continue;
          proto::WorkerOp fail;
          for (uint64_t id : unit.executes->output_ids()) {
            fail.mutable_fail()->add_buffer_ids(id);
          }
          *fail.mutable_fail()->mutable_status() = lost;
          fail.mutable_fail()->set_relay(unit.executes->relay());
          unit.ops[w].push_back(std::move(fail));
        }
        unit.executes.reset();
      }
      for (auto& [w, list] : unit.ops) {
        for (proto::WorkerOp& op : list) {
          if (!op.has_execute()) continue;  // loads, transfers, expects stay
          proto::WorkerOp fail;
          *fail.mutable_fail()->mutable_buffer_ids() =
              op.execute().output_ids();
          *fail.mutable_fail()->mutable_status() = lost;
          fail.mutable_fail()->set_relay(op.execute().relay());
          op = std::move(fail);
        }
      }
      unit.exec_workers.clear();
      c.view.pending_calls--;
      failed++;
    }
  }
  return failed;
}

void Admission::EndEverywhere(uint64_t ticket) {
  InFlight* f = in_flight_.Find(ticket);
  if (f == nullptr) return;
  f->cut_short = true;
  // The last EndOn erases the entry: the workers left are counted first.
  for (size_t i = 0, left = f->remaining; left > 0; ++i) {
    if (f->Ended(i)) continue;
    --left;
    EndOn(ticket, *f, (*f->workers)[i]);
  }
}

void Admission::Backlog(uint64_t id, Client& c) {
  // Idleness earns no credit: a client that comes back starts at the pass
  // the others have reached.
  c.pass = std::max(c.pass, VirtualTime());
  c.arrival = next_arrival_++;
  order_.emplace(c.pass, c.arrival, id);
}

void Admission::Unbacklog(uint64_t id, Client& c) {
  if (!c.pending.empty()) order_.erase({c.pass, c.arrival, id});
}

void Admission::Hold(uint64_t client) {
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  Client& c = it->second;
  Unbacklog(client, c);
  for (AdmissionUnit& unit : c.pending) c.held.push_back(std::move(unit));
  c.pending.clear();
  c.view.pending_units = 0;
  c.view.pending_calls = 0;
  c.view.held_units = static_cast<int64_t>(c.held.size());
}

std::vector<AdmissionUnit> Admission::TakeHeld(uint64_t client) {
  auto it = clients_.find(client);
  if (it == clients_.end()) return {};
  it->second.view.held_units = 0;
  return std::move(it->second.held);
}

std::vector<uint64_t> Admission::PendingCallSeqs(uint64_t client) const {
  std::vector<uint64_t> seqs;
  auto it = clients_.find(client);
  if (it == clients_.end()) return seqs;
  for (const AdmissionUnit& unit : it->second.pending) {
    if (unit.is_call() && unit.call_seq != 0) seqs.push_back(unit.call_seq);
  }
  return seqs;
}

AdmissionUnit MakeAdmissionUnit(WorkerOps ops, uint64_t call_seq,
                                std::shared_ptr<CallExecutes> executes) {
  AdmissionUnit unit;
  if (executes != nullptr) {
    unit.exec_workers.reserve(static_cast<size_t>(executes->hosts()));
    for (int h = 0; h < executes->hosts(); ++h) {
      unit.exec_workers.push_back(executes->worker(h));
    }
    unit.program_id = executes->program_id();
    unit.executes = std::move(executes);
  }
  for (const auto& [w, list] : ops) {
    for (const proto::WorkerOp& op : list) {
      if (op.has_execute()) {
        unit.exec_workers.push_back(w);
        unit.program_id = op.execute().program_id();
        break;
      }
    }
  }
  if (unit.is_call()) unit.call_seq = call_seq;
  unit.ops = std::move(ops);
  return unit;
}

void Admission::Enqueue(uint64_t client, AdmissionUnit unit) {
  auto it = clients_.find(client);
  if (it == clients_.end()) return;  // it left: nothing of it goes
  Client& c = it->second;
  if (c.pending.empty()) Backlog(client, c);
  if (unit.is_call()) c.view.pending_calls++;
  c.view.pending_units++;
  c.pending.push_back(std::move(unit));
}

double Admission::Estimate(const Client& c, uint64_t program_id) const {
  auto it = c.cost.find(program_id);
  return it == c.cost.end() ? static_cast<double>(options_.default_cost_micros)
                            : it->second;
}

Admission::Room Admission::RoomFor(const Window* window, uint64_t client,
                                   double cost) const {
  if (window == nullptr) return Room::kYes;  // gone: its ops are dropped
  const Window& w = *window;
  auto fits = [&](const Load& load, int windows) {
    return load.calls < int64_t{options_.min_window_calls} * w.devices ||
           load.micros + cost <= static_cast<double>(options_.window_micros) *
                                     w.devices * windows;
  };
  if (!fits(w.total, 2)) return Room::kWorkerFull;
  auto own = w.Own(client);
  if (own != w.clients.end() && !fits(own->second, 1)) {
    return Room::kClientFull;
  }
  return Room::kYes;
}

bool Admission::Next(uint64_t* client_out, AdmissionUnit* unit_out) {
  std::vector<int64_t> reserved;
  for (auto entry = order_.begin(); entry != order_.end(); ++entry) {
    const uint64_t id = std::get<2>(*entry);
    Client& c = clients_.at(id);
    AdmissionUnit& unit = c.pending.front();
    double cost = 0;
    if (unit.is_call()) {
      if (c.view.in_flight >= c.view.max_calls_in_flight) continue;
      cost = Estimate(c, unit.program_id);
      // Blocked by a full worker: it reserves its workers. Blocked by its
      // own window only: it reserves nothing (others may use the room).
      Room room = Room::kYes;
      unit_windows_.clear();
      if (reserved.empty() && windows_past_half_ == 0 &&
          cost <= static_cast<double>(options_.window_micros) / 4) {
        // Every window has room for it (windows_past_half_).
        for (int64_t w : unit.exec_workers) {
          unit_windows_.push_back(FindWindow(w));
        }
      } else {
        for (int64_t w : unit.exec_workers) {
          unit_windows_.push_back(FindWindow(w));
          const Room r =
              std::find(reserved.begin(), reserved.end(), w) != reserved.end()
                  ? Room::kWorkerFull
                  : RoomFor(unit_windows_.back(), id, cost);
          if (r == Room::kWorkerFull) {
            room = r;
            break;
          }
          if (r == Room::kClientFull) room = r;
        }
      }
      if (room == Room::kWorkerFull) {
        reserved.insert(reserved.end(), unit.exec_workers.begin(),
                        unit.exec_workers.end());
      }
      if (room != Room::kYes) continue;
    }

    // Admit it. Its entry in the fair order is reused (no allocation).
    auto node = order_.extract(entry);
    virtual_pass_ = std::max(virtual_pass_, c.pass);
    *unit_out = std::move(unit);
    c.pending.pop_front();
    c.view.pending_units--;
    if (unit_out->is_call()) {
      c.view.pending_calls--;
      c.view.in_flight++;
      c.view.admitted++;
      const uint64_t ticket = next_ticket_++;
      InFlight& f = in_flight_.Add(ticket);
      f.client = id;
      f.program_id = unit_out->program_id;
      f.call_seq = unit_out->call_seq;
      f.cost = cost;
      f.start_tag = c.pass;
      if (unit_out->executes != nullptr) {
        unit_out->executes->Stamp(ticket, c.pass);  // once for every host
      }
      unit_workers_.clear();
      for (size_t k = 0; k < unit_out->exec_workers.size(); ++k) {
        const int64_t w = unit_out->exec_workers[k];
        Window* window = unit_windows_[k];
        if (window == nullptr) continue;  // gone: never reports
        auto own = window->Own(id);
        if (own == window->clients.end()) {
          own = &window->clients.emplace_back(id, Load{});
        }
        const bool was_past_half = PastHalf(*window);
        for (Load* load : {&window->total, &own->second}) {
          load->calls++;
          load->micros += cost;
        }
        if (!was_past_half && PastHalf(*window)) windows_past_half_++;
        unit_workers_.push_back(w);
        if (unit_out->executes != nullptr) continue;
        for (proto::WorkerOp& op : unit_out->ops[w]) {
          if (op.has_execute()) {
            op.mutable_execute()->set_ticket(ticket);
            op.mutable_execute()->set_start_tag(c.pass);
          }
        }
      }
      // (A slice lists its hosts in order, most often already sorted.)
      if (!std::is_sorted(unit_workers_.begin(), unit_workers_.end())) {
        std::sort(unit_workers_.begin(), unit_workers_.end());
      }
      f.workers = worker_lists_.Share(unit_workers_);
      f.ended.assign((unit_workers_.size() + 63) / 64, 0);
      f.remaining = static_cast<int>(unit_workers_.size());
      if (unit_workers_.empty()) {
        in_flight_.Erase(ticket);
        c.view.in_flight--;
      } else {
        in_flight_tags_.insert(c.pass);
      }
      const double charged =
          cost * static_cast<double>(unit_out->exec_workers.size());
      unit_out->charged_micros = static_cast<int64_t>(charged);
      c.pass += charged / c.view.weight;
    }
    if (!c.pending.empty()) {
      c.arrival = next_arrival_++;
      node.value() = {c.pass, c.arrival, id};
      order_.insert(std::move(node));
    }
    *client_out = id;
    return true;
  }
  return false;
}

void Admission::EndOn(uint64_t ticket, InFlight& f, int64_t worker) {
  EndOn(ticket, f, worker, FindWindow(worker));
}

void Admission::EndOn(uint64_t ticket, InFlight& f, int64_t worker,
                      Window* window) {
  // (Once per host per call: the vectors' storage is read once.)
  const int64_t* workers = f.workers->data();
  const size_t n = f.workers->size();
  size_t i = window != nullptr ? window->last_index : n;
  if (i >= n || workers[i] != worker) {
    const int64_t* w = std::lower_bound(workers, workers + n, worker);
    if (w == workers + n || *w != worker) return;
    i = static_cast<size_t>(w - workers);
    if (window != nullptr) window->last_index = i;
  }
  uint64_t& ended = f.ended.data()[i / 64];
  const uint64_t bit = uint64_t{1} << (i % 64);
  if ((ended & bit) != 0) return;
  ended |= bit;
  f.remaining--;
  if (window != nullptr) {
    Load& total = window->total;
    const bool was_past_half = PastHalf(*window);
    total.calls--;
    total.micros = std::max(0.0, total.micros - f.cost);
    if (was_past_half && !PastHalf(*window)) windows_past_half_--;
    Window::ClientLoads& loads = window->clients;
    auto own = window->Own(f.client);
    if (own != loads.end() && --own->second.calls == 0) {
      *own = loads.back();  // the last entry takes its place
      loads.pop_back();
    } else if (own != loads.end()) {
      own->second.micros = std::max(0.0, own->second.micros - f.cost);
    }
  }
  if (f.remaining == 0) {
    if (!f.cut_short && f.call_seq != 0) {
      done_calls_.emplace_back(f.call_seq, f.failed);
    }
    auto c = clients_.find(f.client);
    if (c != clients_.end()) c->second.view.in_flight--;
    in_flight_tags_.erase(in_flight_tags_.find(f.start_tag));
    in_flight_.Erase(ticket);  // `f` with it
  }
}

void Admission::Completed(int64_t worker, const proto::CallsDone& done) {
  for (uint64_t ticket : done.failed_tickets()) {
    if (InFlight* f = in_flight_.Find(ticket)) f->failed = true;
  }
  const int n = std::min(done.tickets_size(), done.busy_micros_size());
  // One worker's reports: its window is found once, and a run of reports
  // of one client's program (the usual batch) finds its estimate once.
  Window* window = FindWindow(worker);
  Client* client = nullptr;
  uint64_t client_id = 0;
  double* cost = nullptr;
  uint64_t cost_program = 0;
  for (int i = 0; i < n; ++i) {
    const uint64_t ticket = done.tickets(i);
    InFlight* found = in_flight_.Find(ticket);
    if (found == nullptr) continue;
    const int64_t busy = done.busy_micros(i);
    InFlight& f = *found;
    if (client == nullptr || client_id != f.client) {
      auto c = clients_.find(f.client);
      client = c == clients_.end() ? nullptr : &c->second;
      client_id = f.client;
      cost = nullptr;
    }
    if (client != nullptr && busy >= 0) {
      client->view.device_micros += busy;
      if (cost != nullptr && cost_program == f.program_id) {
        *cost += kCostSmoothing * (static_cast<double>(busy) - *cost);
      } else {
        auto [estimate, fresh] = client->cost.try_emplace(f.program_id, busy);
        if (!fresh) {
          estimate->second +=
              kCostSmoothing * (static_cast<double>(busy) - estimate->second);
        }
        cost = &estimate->second;
        cost_program = f.program_id;
      }
    }
    EndOn(ticket, f, worker, window);
  }
}

double Admission::VirtualTime() const {
  return in_flight_tags_.empty() ? virtual_pass_ : *in_flight_tags_.begin();
}

const Admission::ClientView* Admission::Find(uint64_t client) const {
  auto it = clients_.find(client);
  return it == clients_.end() ? nullptr : &it->second.view;
}

std::pair<int64_t, int64_t> Admission::WorkerLoad(int64_t worker) const {
  const Window* window = FindWindow(worker);
  if (window == nullptr) return {0, 0};
  return {window->total.calls, static_cast<int64_t>(window->total.micros)};
}

absl::flat_hash_map<uint64_t, absl::InlinedVector<int64_t, 4>>
Admission::WorkersNotDone() const {
  absl::flat_hash_map<uint64_t, absl::InlinedVector<int64_t, 4>> out;
  in_flight_.ForEach([&](uint64_t, const InFlight& f) {
    if (f.call_seq == 0) return;
    absl::InlinedVector<int64_t, 4>& left = out[f.call_seq];
    for (size_t i = 0; i < f.workers->size(); ++i) {
      if (!f.Ended(i)) left.push_back((*f.workers)[i]);
    }
  });
  return out;
}

int64_t Admission::CostOf(uint64_t client, uint64_t program_id) const {
  auto it = clients_.find(client);
  if (it == clients_.end()) return options_.default_cost_micros;
  return static_cast<int64_t>(Estimate(it->second, program_id));
}

}  // namespace plexus
