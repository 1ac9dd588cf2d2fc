// plexus._core.Client: the C++ Client, its blocking methods without the GIL.
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

#include "plexus/python/convert.h"
#include "plexus/python/define.h"
#include "plexus/python/errors.h"

namespace plexus::python {
namespace {

// Connecting, the session's state, closing.
void DefineClientSession(py::class_<Client>& cls) {
  cls.def_static(
         "connect",
         [](const std::string& address, const std::string& name,
            bool shared_memory, bool sequential_dispatch,
            const std::string& tenant, const std::string& tenant_token,
            std::optional<std::string> secret_hex, const std::string& tls_ca,
            double reconnect_timeout) {
           ClientOptions options;
           if (!(reconnect_timeout >= 0)) {  // NaN too
             Raise(absl::InvalidArgumentError(
                 "reconnect_timeout must be a number of seconds >= 0, not " +
                 std::to_string(reconnect_timeout)));
           }
           options.reconnect_timeout = absl::Seconds(reconnect_timeout);
           options.name = name;
           options.shared_memory = shared_memory;
           options.sequential_dispatch = sequential_dispatch;
           // An A/B switch for benchmarks and tests (ClientOptions).
           if (const char* relay = std::getenv("PLEXUS_RELAY_ANSWERS")) {
             options.relay_answers = std::string(relay) != "0";
           }
           // Who the session opens as: ClientOptions says how each is
           // found when not given.
           options.tenant = tenant;
           options.tenant_token = tenant_token;
           if (secret_hex.has_value()) {
             options.secret = Unwrap(ClusterSecret::FromHex(*secret_hex));
           }
           options.tls_ca = tls_ca;
           absl::StatusOr<std::unique_ptr<Client>> c;
           {
             py::gil_scoped_release release;
             c = Client::Connect(address, options);
           }
           return Unwrap(std::move(c));
         },
         py::arg("address"), py::arg("name") = "python",
         py::arg("shared_memory") = true,
         py::arg("sequential_dispatch") = false, py::arg("tenant") = "",
         py::arg("tenant_token") = "", py::arg("secret_hex") = py::none(),
         py::arg("tls_ca") = "",
         // No reconnect unless asked (plexus.connect asks): the embedded
         // cluster's and plexus.ray's servers do not come back.
         py::arg("reconnect_timeout") = 0.0)
      .def_property_readonly("client_id", &Client::client_id)
      .def_property_readonly("state",
                             [](const Client& c) {
                               switch (c.state()) {
                                 case SessionState::kOpen:
                                   return "open";
                                 case SessionState::kReconnecting:
                                   return "reconnecting";
                                 case SessionState::kGaveUp:
                                   return "gave_up";
                                 case SessionState::kClosed:
                                   return "closed";
                               }
                               return "unknown";
                             })
      .def("close", [](Client& c) {
        py::gil_scoped_release release;
        c.Close();
      });
}

// What the client records: ended sessions, counters, the last recovery; and
// Flush.
void DefineClientRecords(py::class_<Client>& cls) {
  // The sessions that ended (reconnect.h, SessionEnd), oldest first.
  cls.def("session_ends",
          [](const Client& c) {
            py::list out;
            for (const SessionEnd& e : c.SessionEnds()) {
              py::dict d;
              d["client_id"] = e.client_id;
              d["address"] = e.address;
              d["ended"] = absl::ToUnixMicros(e.ended) / 1e6;
              d["reason"] = e.reason;
              d["lost_futures"] = e.lost_futures;
              d["reconnected"] = e.reconnected;
              d["resumed"] = e.resumed;
              d["new_client_id"] = e.reconnected
                                       ? py::object(py::int_(e.new_client_id))
                                       : py::object(py::none());
              d["down_s"] = e.reconnected
                                ? py::object(py::float_(absl::ToDoubleSeconds(
                                      e.reconnected_at - e.ended)))
                                : py::object(py::none());
              d["attempts"] = e.attempts;
              d["slices_restored"] = e.slices_restored;
              d["slices_lost"] = e.slices_lost;
              d["programs_restored"] = e.programs_restored;
              d["programs_lost"] = e.programs_lost;
              d["gave_up"] = e.gave_up;
              d["summary"] = DescribeSessionEnd(e);
              out.append(d);
            }
            return out;
          })
      .def("counters",
           [](const Client& c) {
             ClientCounters k = c.counters();
             py::dict d;
             d["bytes_put"] = k.bytes_put;
             d["bytes_fetched"] = k.bytes_fetched;
             d["wait_round_trips"] = k.wait_round_trips;
             d["messages_sent"] = k.messages_sent;
             d["messages_sent_inline"] = k.messages_sent_inline;
             d["messages_sent_as_frames"] = k.messages_sent_as_frames;
             d["relay_links_opened"] = k.relay_links_opened;
             d["answers_relayed"] = k.answers_relayed;
             d["calls"] = k.calls;
             d["live_futures"] = k.live_futures;
             return d;
           })
      // The last recovery that touched this client, in words, or None:
      // {"seconds_ago", "lost_host", "remapped_onto", "calls_recomputed",
      // "values_lost", "slices_broken"} (the progress line's).
      .def("last_recovery",
           [](const Client& c) -> py::object {
             std::optional<RecoverySummary> r;
             {
               py::gil_scoped_release release;
               r = c.LastRecovery();
             }
             if (!r.has_value()) return py::none();
             py::dict d;
             d["seconds_ago"] =
                 absl::ToDoubleSeconds(PythonClock().Now() - r->when);
             d["lost_host"] = r->lost_host;
             d["remapped_onto"] = r->remapped_onto;
             d["calls_recomputed"] = r->calls_recomputed;
             d["values_lost"] = r->values_lost;
             d["slices_broken"] = r->slices_broken;
             return d;
           })
      .def("flush", [](Client& c) {
        py::gil_scoped_release release;
        c.Flush();
      });
}

// Slices.
void DefineClientSlices(py::class_<Client>& cls) {
  cls.def(
      "slice",
      [](Client& c, int n, std::vector<int32_t> mesh,
         std::vector<std::string> axes, const std::string& placement,
         std::vector<std::string> hosts, std::vector<uint64_t> avoid,
         double timeout, const std::string& on_loss, int min_devices, bool grow,
         int elastic_axis, const std::string& on_preempt) {
        SliceOptions o;
        o.num_devices = n;
        o.mesh_shape = mesh;
        o.axis_names = axes;
        o.hosts = std::move(hosts);
        o.avoid_slices = std::move(avoid);
        if (!(timeout >= 0)) {  // NaN too
          Raise(absl::InvalidArgumentError(
              "a slice's timeout must be a number of seconds >= 0, not " +
              std::to_string(timeout)));
        }
        o.timeout = absl::Seconds(timeout);
        if (placement == "one_host") {
          o.placement = Placement::kOneHost;
        } else if (placement == "spread") {
          o.placement = Placement::kSpread;
        } else if (placement != "any") {
          Raise(absl::InvalidArgumentError(
              "placement must be 'any', 'one_host' or 'spread', not '" +
              placement + "'"));
        }
        if (on_loss == "wait") {
          o.on_loss = proto::LOSS_WAIT;
        } else if (on_loss == "break") {
          o.on_loss = proto::LOSS_BREAK;
        } else if (on_loss == "shrink") {
          o.on_loss = proto::LOSS_SHRINK;
        } else {
          Raise(absl::InvalidArgumentError(
              "on_loss must be 'wait', 'break' or 'shrink', not '" + on_loss +
              "'"));
        }
        if (on_preempt.empty()) {
          o.on_preempt = proto::PREEMPT_DEFAULT;
        } else if (on_preempt == "share") {
          o.on_preempt = proto::PREEMPT_SHARE;
        } else if (on_preempt == "shrink") {
          o.on_preempt = proto::PREEMPT_SHRINK;
        } else if (on_preempt == "suspend") {
          o.on_preempt = proto::PREEMPT_SUSPEND;
        } else if (on_preempt == "park") {
          o.on_preempt = proto::PREEMPT_PARK;
        } else {
          Raise(absl::InvalidArgumentError(
              "on_preempt must be 'share', 'shrink', 'suspend' or 'park', "
              "not '" +
              on_preempt + "'"));
        }
        o.min_devices = min_devices;
        o.grow = grow;
        o.elastic_axis = elastic_axis;
        absl::StatusOr<std::shared_ptr<Slice>> s;
        {
          py::gil_scoped_release release;
          s = c.CreateSlice(o);
        }
        return Unwrap(std::move(s));
      },
      py::arg("n"), py::arg("mesh_shape") = std::vector<int32_t>{},
      py::arg("axis_names") = std::vector<std::string>{},
      py::arg("placement") = "any",
      py::arg("hosts") = std::vector<std::string>{},
      py::arg("avoid") = std::vector<uint64_t>{}, py::arg("timeout") = 30.0,
      py::arg("on_loss") = "wait", py::arg("min_devices") = 0,
      py::arg("grow") = false, py::arg("elastic_axis") = 0,
      py::arg("on_preempt") = "");
}

// Programs: built-in kernels and XLA modules.
void DefineClientPrograms(py::class_<Client>& cls) {
  cls.def("compile",
          [](Client& c, std::shared_ptr<Slice> slice, const std::string& name,
             const std::string& kernel, const py::dict& attrs,
             const py::sequence& inputs) {
            std::vector<ArgSpec> args;
            for (auto t : inputs) args.push_back(ArgFrom(t.cast<py::tuple>()));
            Attrs a = AttrsFrom(attrs);
            absl::StatusOr<std::shared_ptr<Program>> p;
            {
              py::gil_scoped_release release;
              p = c.Compile(slice, name, kernel, a, args);
            }
            return Unwrap(std::move(p));
          })
      .def(
          "compile_xla",
          [](Client& c, std::shared_ptr<Slice> slice, const std::string& name,
             const py::bytes& module, const std::string& platform,
             const py::list& islands, const py::sequence& inputs,
             const py::sequence& outputs, const py::sequence& donated) {
            proto::XlaProgram xla;
            xla.set_module(module.cast<std::string>());
            xla.set_platform(platform);
            // (input, output) pairs: the output is written over the input.
            for (auto pair : donated) {
              auto t = pair.cast<std::pair<int, int>>();
              xla.add_donated_inputs(t.first);
              xla.add_donated_outputs(t.second);
            }
            for (auto item : islands) {
              auto t = item.cast<py::tuple>();
              proto::XlaIsland* island = xla.add_islands();
              for (int d : t[0].cast<std::vector<int>>()) {
                island->add_devices(d);
              }
              island->set_compile_options(t[1].cast<std::string>());
              if (t.size() > 2) {
                for (int64_t w : t[2].cast<std::vector<int64_t>>()) {
                  island->add_workers(w);
                }
              }
              if (t.size() > 3) {
                island->set_module(t[3].cast<std::string>());
              }
            }
            std::vector<ArgSpec> in, out;
            for (auto t : inputs) in.push_back(ArgFrom(t.cast<py::tuple>()));
            for (auto t : outputs) out.push_back(ArgFrom(t.cast<py::tuple>()));
            absl::StatusOr<std::shared_ptr<Program>> p;
            {
              py::gil_scoped_release release;
              p = c.CompileXla(slice, name, std::move(xla), in, std::move(out));
            }
            return Unwrap(std::move(p));
          },
          py::arg("slice"), py::arg("name"), py::arg("module"),
          py::arg("platform"), py::arg("islands"), py::arg("inputs"),
          py::arg("outputs"), py::arg("donated") = py::tuple());
}

// Calls, call sites, graphs and the client's trace.
void DefineClientCalls(py::class_<Client>& cls) {
  cls.def(
         "call",
         [](Client& c, const Program& p, const py::sequence& inputs,
            uint32_t site) {
           std::vector<Future> in = FuturesFrom(inputs);
           absl::StatusOr<std::vector<Future>> out;
           {
             py::gil_scoped_release release;  // may wait on back-pressure
             out = c.Call(p, in, site);
           }
           return Unwrap(std::move(out));
         },
         py::arg("program"), py::arg("inputs"), py::arg("site") = 0)
      .def("call_site", &Client::CallSite)
      .def("graph", &Client::NewGraph)
      // This client's events (Client::Trace) as Chrome trace-event JSON.
      .def(
          "trace",
          [](Client& c, int64_t since_ns, double timeout_s) {
            return TraceJson(
                [&] { return c.Trace(since_ns, absl::Seconds(timeout_s)); });
          },
          py::arg("since_ns") = 0, py::arg("timeout") = 10.0);
}

// A put's or fetch's `progress` argument: None, or a TransferProgress.
// (Taken as an object: pybind11 tries None against a holder argument only
// after a failed attribute lookup on None's type, an exception made and
// dropped, ~5,000 instructions on every fetch of a round trip.)
std::shared_ptr<TransferProgress> ProgressFrom(const py::object& progress) {
  if (progress.is_none()) return nullptr;
  return progress.cast<std::shared_ptr<TransferProgress>>();
}

// The data path: put, fetch, waits, snapshots.
void DefineClientData(py::class_<Client>& cls) {
  cls.def(
         "put",
         [](Client& c, std::shared_ptr<Slice> slice, py::array array,
            const py::tuple& sharding, const py::object& progress_arg) {
           std::shared_ptr<TransferProgress> progress =
               ProgressFrom(progress_arg);
           py::array a = py::array::ensure(
               array, py::array::c_style | py::array::forcecast);
           ArgSpec arg;
           arg.global.dtype = DTypeOf(a.dtype());
           for (py::ssize_t i = 0; i < a.ndim(); ++i) {
             arg.global.shape.push_back(a.shape(i));
           }
           arg.sharding = ShardingFrom(sharding);
           const void* data = a.data();
           absl::StatusOr<Future> f;
           {
             py::gil_scoped_release release;
             f = c.Put(slice, data, arg, progress.get());
           }
           return Unwrap(std::move(f));
         },
         py::arg("slice"), py::arg("array"), py::arg("sharding"),
         py::arg("progress") = py::none())
      .def(
          "fetch",
          [](Client& c, const Future& f, const py::object& progress_arg) {
            std::shared_ptr<TransferProgress> progress =
                ProgressFrom(progress_arg);
            std::vector<py::ssize_t> shape(f.spec().shape.begin(),
                                           f.spec().shape.end());
            py::array out(NumpyDType(f.spec().dtype), shape);
            void* dst = out.mutable_data();
            absl::Status s;
            {
              py::gil_scoped_release release;
              s = c.Fetch(f, dst, progress.get());
            }
            Check(s);
            return out;
          },
          py::arg("future"), py::arg("progress") = py::none())
      .def("wait",
           [](Client& c, const Future& f) {
             absl::Status s;
             {
               py::gil_scoped_release release;
               s = c.Wait(f);
             }
             Check(s);
           })
      // Futures of this client; timeout in seconds, None: no deadline.
      .def(
          "wait_many",
          [](Client& c, const std::vector<Future>& futures,
             std::optional<double> timeout_s) {
            const absl::Time deadline =
                timeout_s.has_value()
                    ? PythonClock().Now() +
                          absl::Seconds(std::max(*timeout_s, 0.0))
                    : absl::InfiniteFuture();
            absl::Status s;
            {
              py::gil_scoped_release release;
              s = c.WaitMany(futures, deadline);
            }
            Check(s);
          },
          py::arg("futures"), py::arg("timeout") = py::none())
      .def("snapshot", [](Client& c, const std::vector<Future>& futures) {
        Check(c.Snapshot(futures));
      });
}

}  // namespace

void DefineClient(py::module_& m) {
  py::class_<Client> cls(m, "Client");
  DefineClientSession(cls);
  DefineClientRecords(cls);
  DefineClientSlices(cls);
  DefineClientPrograms(cls);
  DefineClientCalls(cls);
  DefineClientData(cls);
}

}  // namespace plexus::python
