// plexus._core: the Python binding of the C++ client. Thin: the Pythonic
// API (futures like jax.Array, shardings like PartitionSpec) lives in
// python/plexus/. Every call that blocks or waits releases the GIL.
// absl::Status errors become Python exceptions with the message intact.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>

#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"
#include "plexus/client/client.h"
#include "plexus/executors/builtin/catalogue.h"
#include "plexus/executors/xla/lapack/lapack_handlers.h"
#include "plexus/timeline/chrome_trace.h"

namespace py = pybind11;

namespace plexus {
namespace {

PyObject* g_error = nullptr;
PyObject* g_invalid = nullptr;
PyObject* g_not_found = nullptr;
PyObject* g_exhausted = nullptr;
PyObject* g_unavailable = nullptr;
PyObject* g_denied = nullptr;
PyObject* g_deadline = nullptr;
PyObject* g_unimplemented = nullptr;
PyObject* g_device_lost = nullptr;
PyObject* g_server_restarted = nullptr;

[[noreturn]] void Raise(const absl::Status& s) {
  PyObject* type = g_error;
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      type = g_invalid;
      break;
    case absl::StatusCode::kNotFound:
      type = g_not_found;
      break;
    case absl::StatusCode::kResourceExhausted:
      type = g_exhausted;
      break;
    case absl::StatusCode::kDataLoss:
      // Lost with a session that ended (reconnect.h), or with a host.
      type = s.GetPayload(kSessionLostPayload).has_value() ? g_server_restarted
                                                           : g_device_lost;
      break;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
      type = g_unavailable;
      break;
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      type = g_denied;
      break;
    case absl::StatusCode::kDeadlineExceeded:
      type = g_deadline;
      break;
    case absl::StatusCode::kUnimplemented:
      type = g_unimplemented;
      break;
    default:
      break;
  }
  PyErr_SetString(type, std::string(s.message()).c_str());
  throw py::error_already_set();
}

void Check(const absl::Status& s) {
  if (!s.ok()) Raise(s);
}

template <typename T>
T Unwrap(absl::StatusOr<T> s) {
  if (!s.ok()) Raise(s.status());
  return std::move(*s);
}

DType DTypeOf(const py::dtype& dt) {
  std::string name = py::str(dt).cast<std::string>();
  return Unwrap(ParseDType(name));
}

py::dtype NumpyDType(DType d) {
  const std::string name = DTypeName(d);
  if (d == DType::kBF16 || name.rfind("float8_", 0) == 0) {
    // numpy has no bfloat16 or 8-bit floats of its own; ml_dtypes (a JAX
    // dependency) does.
    return py::dtype::from_args(
        py::module_::import("ml_dtypes").attr(name.c_str()));
  }
  return py::dtype(name);
}

// Sharding <-> ("replicated"|"split"|"partial", axis), or for a
// PartitionSpec over a mesh of several axes ("mesh", sizes, axis names,
// per array dimension the indices of the axes splitting it).
Sharding ShardingFrom(const py::tuple& t) {
  std::string kind = t[0].cast<std::string>();
  if (kind == "split") return Sharding::Split(t[1].cast<int>());
  if (kind == "partial") return Sharding::Partial();
  if (kind == "replicated") return Sharding::Replicated();
  if (kind == "mesh" && t.size() == 4) {
    std::vector<std::vector<int32_t>> dims;
    for (auto d : t[3].cast<py::sequence>()) {
      dims.push_back(d.cast<std::vector<int32_t>>());
    }
    Sharding s;
    s.kind = Sharding::Kind::kMesh;
    s.mesh = t[1].cast<std::vector<int32_t>>();
    s.axis_names = t[2].cast<std::vector<std::string>>();
    s.dims = std::move(dims);
    if (absl::Status v = ValidateSharding(s, s.dims.size()); !v.ok()) {
      Raise(v);
    }
    return Sharding::Mesh(std::move(s.mesh), std::move(s.axis_names),
                          std::move(s.dims));
  }
  Raise(absl::InvalidArgumentError("unknown sharding kind '" + kind + "'"));
}

py::tuple ShardingTo(const Sharding& s) {
  if (s.is_mesh()) {
    py::list dims;
    for (const auto& axes : s.dims) dims.append(py::tuple(py::cast(axes)));
    return py::make_tuple("mesh", py::tuple(py::cast(s.mesh)),
                          py::tuple(py::cast(s.axis_names)), py::tuple(dims));
  }
  const char* kind = s.is_split()     ? "split"
                     : s.is_partial() ? "partial"
                                      : "replicated";
  return py::make_tuple(kind, s.axis);
}

ArgSpec ArgFrom(const py::tuple& t) {
  // (dtype, shape, sharding)
  ArgSpec arg;
  arg.global.dtype = DTypeOf(py::dtype::from_args(t[0]));
  for (auto d : t[1].cast<py::sequence>()) {
    arg.global.shape.push_back(d.cast<int64_t>());
  }
  arg.sharding = ShardingFrom(t[2].cast<py::tuple>());
  return arg;
}

py::tuple ArgTo(const ArgSpec& a) {
  return py::make_tuple(NumpyDType(a.global.dtype),
                        py::tuple(py::cast(a.global.shape)),
                        ShardingTo(a.sharding));
}

Attrs AttrsFrom(const py::dict& d) {
  Attrs attrs;
  for (auto [k, v] : d) {
    std::string key = k.cast<std::string>();
    if (py::isinstance<py::bool_>(v)) {
      attrs[key] = static_cast<int64_t>(v.cast<bool>());
    } else if (py::isinstance<py::int_>(v)) {
      attrs[key] = v.cast<int64_t>();
    } else if (py::isinstance<py::float_>(v)) {
      attrs[key] = v.cast<double>();
    } else if (py::isinstance<py::str>(v)) {
      attrs[key] = v.cast<std::string>();
    } else if (py::isinstance<py::sequence>(v)) {
      std::vector<int64_t> ints;
      for (auto x : v.cast<py::sequence>()) ints.push_back(x.cast<int64_t>());
      attrs[key] = ints;
    } else {
      Raise(absl::InvalidArgumentError(
          "attribute '" + key + "' must be an int, float, str or int list"));
    }
  }
  return attrs;
}

py::dict SliceDevices(const Slice& s) {
  py::list devices;
  for (const auto& d : s.info().devices()) {
    py::dict dev;
    dev["worker"] = d.worker_id();
    dev["device"] = d.device();
    dev["host"] = d.host_name();
    dev["memory_bytes"] = d.memory_bytes();
    dev["stablehlo_version"] = d.stablehlo_version();
    devices.append(dev);
  }
  py::dict out;
  out["devices"] = devices;
  out["mesh_shape"] = py::tuple(py::cast(std::vector<int>(
      s.info().mesh_shape().begin(), s.info().mesh_shape().end())));
  out["axis_names"] = py::tuple(py::cast(std::vector<std::string>(
      s.info().axis_names().begin(), s.info().axis_names().end())));
  return out;
}

std::vector<Future> FuturesFrom(const py::sequence& seq) {
  std::vector<Future> out;
  for (auto x : seq) out.push_back(x.cast<Future>());
  return out;
}

// The trace `collect` gathers (without the GIL), as Chrome trace-event
// JSON; its error as the matching exception.
template <typename Collect>
py::bytes TraceJson(Collect collect) {
  std::string json;
  absl::Status s;
  {
    py::gil_scoped_release release;
    absl::StatusOr<proto::TraceReply> r = collect();
    if (r.ok()) {
      json = ChromeTraceJson(*r);
    } else {
      s = r.status();
    }
  }
  Check(s);
  return py::bytes(json);
}

}  // namespace
}  // namespace plexus

PYBIND11_MODULE(_core, m) {
  using namespace plexus;
  m.doc() = "Plexus C++ client (internal; use the plexus package)";

  static py::exception<std::runtime_error> base(m, "PlexusError",
                                                PyExc_RuntimeError);
  g_error = base.ptr();
  auto make = [&](const char* name, PyObject* extra) {
    py::tuple bases = py::make_tuple(py::handle(g_error), py::handle(extra));
    py::object type = py::reinterpret_steal<py::object>(PyErr_NewException(
        (std::string("plexus._core.") + name).c_str(), bases.ptr(), nullptr));
    m.attr(name) = type;
    return type.release().ptr();
  };
  g_invalid = make("InvalidArgumentError", PyExc_ValueError);
  g_not_found = make("NotFoundError", PyExc_LookupError);
  g_exhausted = make("ResourceExhaustedError", PyExc_MemoryError);
  g_unavailable = make("UnavailableError", PyExc_ConnectionError);
  g_denied = make("PermissionDeniedError", PyExc_PermissionError);
  g_deadline = make("DeadlineExceededError", PyExc_TimeoutError);
  g_unimplemented = make("UnimplementedError", PyExc_NotImplementedError);
  // A value lost with a host (DATA_LOSS): no spare took the host's place,
  // or the value could not be recomputed. A kind of UnavailableError.
  {
    py::tuple bases = py::make_tuple(py::handle(g_unavailable));
    py::object type = py::reinterpret_steal<py::object>(PyErr_NewException(
        "plexus._core.DeviceLostError", bases.ptr(), nullptr));
    m.attr("DeviceLostError") = type;
    g_device_lost = type.release().ptr();
  }
  // A value lost with the client's session: the server restarted (or the
  // session broke), and it freed the session's buffers. A kind of
  // DeviceLostError.
  {
    py::tuple bases = py::make_tuple(py::handle(g_device_lost));
    py::object type = py::reinterpret_steal<py::object>(PyErr_NewException(
        "plexus._core.ServerRestartedError", bases.ptr(), nullptr));
    m.attr("ServerRestartedError") = type;
    g_server_restarted = type.release().ptr();
  }

  py::class_<Slice, std::shared_ptr<Slice>>(m, "Slice")
      .def_property_readonly("id", &Slice::id)
      .def_property_readonly("first_id", &Slice::first_id)
      .def_property_readonly("num_devices", &Slice::num_devices)
      .def_property_readonly("num_hosts", &Slice::num_hosts)
      .def_property_readonly("generation", &Slice::generation)
      .def("describe", [](const Slice& s) { return SliceDevices(s); })
      .def("close", &Slice::Close)
      .def_property_readonly("closed", &Slice::closed);

  py::class_<Program, std::shared_ptr<Program>>(m, "Program")
      .def_property_readonly("name", &Program::name)
      .def_property_readonly("kernel",
                             [](const Program& p) { return p.def().kernel(); })
      .def_property_readonly("slice", &Program::slice)
      .def_property_readonly("inputs",
                             [](const Program& p) {
                               py::list l;
                               for (const auto& a : p.inputs())
                                 l.append(ArgTo(a));
                               return l;
                             })
      .def_property_readonly("outputs", [](const Program& p) {
        py::list l;
        for (const auto& a : p.outputs()) l.append(ArgTo(a));
        return l;
      });

  py::class_<Future>(m, "Future")
      .def_property_readonly("buffer_id", &Future::buffer_id)
      .def_property_readonly(
          "shape",
          [](const Future& f) { return py::tuple(py::cast(f.spec().shape)); })
      .def_property_readonly(
          "dtype", [](const Future& f) { return NumpyDType(f.spec().dtype); })
      .def_property_readonly(
          "sharding", [](const Future& f) { return ShardingTo(f.sharding()); })
      .def_property_readonly("slice", &Future::slice);

  py::class_<Graph>(m, "Graph")
      .def(
          "call",
          [](Graph& g, const Program& p, const py::sequence& inputs,
             uint32_t site) {
            return Unwrap(g.Call(p, FuturesFrom(inputs), site));
          },
          py::arg("program"), py::arg("inputs"), py::arg("site") = 0)
      .def("submit",
           [](Graph& g) {
             absl::Status s;
             {
               py::gil_scoped_release release;
               s = g.Submit();
             }
             Check(s);
           })
      .def("__len__", &Graph::size);

  // What a put or fetch has moved so far, read while it runs (the progress
  // line, python/plexus/_progress.py): two atomics, read without a lock.
  py::class_<TransferProgress, std::shared_ptr<TransferProgress>>(
      m, "TransferProgress")
      .def(py::init<>())
      .def_property_readonly(
          "total_bytes",
          [](const TransferProgress& p) { return p.total_bytes.load(); })
      .def_property_readonly("done_bytes", [](const TransferProgress& p) {
        return p.done_bytes.load();
      });

  py::class_<Client>(m, "Client")
      .def_static(
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
      // The sessions that ended (reconnect.h, SessionEnd), oldest first.
      .def("session_ends",
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
      .def(
          "slice",
          [](Client& c, int n, std::vector<int32_t> mesh,
             std::vector<std::string> axes, const std::string& placement,
             std::vector<std::string> hosts, std::vector<uint64_t> avoid,
             double timeout) {
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
          py::arg("avoid") = std::vector<uint64_t>{}, py::arg("timeout") = 30.0)
      .def("compile",
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
          py::arg("outputs"), py::arg("donated") = py::tuple())
      .def(
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
      // This client's events (Client::Trace) as Chrome trace-event JSON.
      .def(
          "trace",
          [](Client& c, int64_t since_ns, double timeout_s) {
            return TraceJson(
                [&] { return c.Trace(since_ns, absl::Seconds(timeout_s)); });
          },
          py::arg("since_ns") = 0, py::arg("timeout") = 10.0)
      .def("graph", &Client::NewGraph)
      .def(
          "put",
          [](Client& c, std::shared_ptr<Slice> slice, py::array array,
             const py::tuple& sharding,
             std::shared_ptr<TransferProgress> progress) {
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
          py::arg("progress") = nullptr)
      .def(
          "fetch",
          [](Client& c, const Future& f,
             std::shared_ptr<TransferProgress> progress) {
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
          py::arg("future"), py::arg("progress") = nullptr)
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
                    ? absl::Now() + absl::Seconds(std::max(*timeout_s, 0.0))
                    : absl::InfiniteFuture();
            absl::Status s;
            {
              py::gil_scoped_release release;
              s = c.WaitMany(futures, deadline);
            }
            Check(s);
          },
          py::arg("futures"), py::arg("timeout") = py::none())
      .def("flush",
           [](Client& c) {
             py::gil_scoped_release release;
             c.Flush();
           })
      .def("snapshot",
           [](Client& c, const std::vector<Future>& futures) {
             Check(c.Snapshot(futures));
           })
      .def("counters",
           [](const Client& c) {
             ClientCounters k = c.counters();
             py::dict d;
             d["bytes_put"] = k.bytes_put;
             d["bytes_fetched"] = k.bytes_fetched;
             d["wait_round_trips"] = k.wait_round_trips;
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
             d["seconds_ago"] = absl::ToDoubleSeconds(absl::Now() - r->when);
             d["lost_host"] = r->lost_host;
             d["remapped_onto"] = r->remapped_onto;
             d["calls_recomputed"] = r->calls_recomputed;
             d["values_lost"] = r->values_lost;
             d["slices_broken"] = r->slices_broken;
             return d;
           })
      .def("close", [](Client& c) {
        py::gil_scoped_release release;
        c.Close();
      });

  m.def(
      "cluster_status",
      [](const std::string& address, bool fresh) {
        absl::StatusOr<proto::ClusterStatus> s;
        {
          py::gil_scoped_release release;
          s = GetClusterStatus(address, fresh);
        }
        proto::ClusterStatus st = Unwrap(std::move(s));
        std::string json;
        google::protobuf::util::JsonPrintOptions opts;
        opts.always_print_primitive_fields = true;
        opts.preserve_proto_field_names = true;
        (void)google::protobuf::util::MessageToJsonString(st, &json, opts);
        return json;
      },
      py::arg("address"), py::arg("fresh") = false);
  // The timeline (timeline/timeline.h): the server's clock now, in ns.
  m.def(
      "trace_now",
      [](const std::string& address) {
        absl::StatusOr<proto::TraceReply> r;
        {
          py::gil_scoped_release release;
          r = CollectTrace(address, 0, /*events=*/false);
        }
        return Unwrap(std::move(r)).server_now_ns();
      },
      py::arg("address"));
  // Every process's events that end at or after `since_ns` (server clock;
  // 0: all the rings hold), as Chrome trace-event JSON; the operator's
  // (the admin credential of `secret_hex`, else $PLEXUS_CLUSTER_SECRET's).
  m.def(
      "trace",
      [](const std::string& address, int64_t since_ns, double timeout_s,
         std::optional<std::string> secret_hex) {
        ClusterSecret secret =
            Unwrap(secret_hex.has_value() ? ClusterSecret::FromHex(*secret_hex)
                                          : ClusterSecret::Load(""));
        return TraceJson([&] {
          return CollectTrace(address, since_ns, /*events=*/true,
                              absl::Seconds(timeout_s),
                              {0, secret.Derive(CredentialRole::kAdmin)});
        });
      },
      py::arg("address"), py::arg("since_ns") = 0, py::arg("timeout") = 10.0,
      py::arg("secret_hex") = py::none());
  // The secret stays in C++: Python sees it as hex only, to hand it to the
  // processes of a cluster it starts (by environment) and to keep it in a
  // file of mode 0600; credentials are derived here.
  m.def("new_cluster_secret",
        [] { return Unwrap(ClusterSecret::Generate()).ToHex(); });
  m.def(
      "shutdown_server",
      [](const std::string& address, std::optional<std::string> secret_hex) {
        // No secret given: $PLEXUS_CLUSTER_SECRET's.
        ClusterSecret secret =
            Unwrap(secret_hex.has_value() ? ClusterSecret::FromHex(*secret_hex)
                                          : ClusterSecret::Load(""));
        absl::Status s;
        {
          py::gil_scoped_release release;
          s = ShutdownServer(address, secret);
        }
        Check(s);
      },
      py::arg("address"), py::arg("secret_hex") = py::none());
  // The tenant token (credentials.h) of `tenant`: what the operator hands
  // to that tenant's users. No secret given: $PLEXUS_CLUSTER_SECRET's.
  m.def(
      "tenant_token",
      [](const std::string& tenant, std::optional<std::string> secret_hex) {
        Check(CheckTenantName(tenant));
        ClusterSecret secret =
            Unwrap(secret_hex.has_value() ? ClusterSecret::FromHex(*secret_hex)
                                          : ClusterSecret::Load(""));
        return TenantTokenHex(secret.Derive(CredentialRole::kTenant, tenant));
      },
      py::arg("tenant"), py::arg("secret_hex") = py::none());
  // The operator's token of the live page and /metrics (credentials.h).
  // No secret given: $PLEXUS_CLUSTER_SECRET's.
  m.def(
      "operator_token",
      [](std::optional<std::string> secret_hex) {
        ClusterSecret secret =
            Unwrap(secret_hex.has_value() ? ClusterSecret::FromHex(*secret_hex)
                                          : ClusterSecret::Load(""));
        return OperatorTokenHex(secret);
      },
      py::arg("secret_hex") = py::none());
  m.def("kernels", [] { return builtin::KernelCatalogue::Global().Names(); });
  // The LAPACK custom call targets (jnp.linalg on CPU) that workers serve
  // with handlers of their own (executors/xla/lapack/lapack_handlers.h):
  // plexus.jit refuses a program calling any other.
  m.def("lapack_targets", [] {
    std::vector<std::string> names;
    for (std::string_view t : plexus::xla::lapack::kLapackTargets) {
      names.emplace_back(t);
    }
    return names;
  });
  // Every built-in program's documentation (builtin::KernelDoc), sorted by
  // name: what plexus.builtins and docs/PROGRAMS.md show.
  // The one form of a sharding (a PartitionSpec that is a 1-D split or
  // replicated becomes that), and its description.
  m.def("canonical_sharding",
        [](const py::tuple& t) { return ShardingTo(ShardingFrom(t)); });
  m.def("sharding_str",
        [](const py::tuple& t) { return ShardingFrom(t).ToString(); });
  m.def("kernel_docs", [] {
    const auto& registry = builtin::KernelCatalogue::Global();
    py::list out;
    for (const std::string& name : registry.Names()) {
      const builtin::KernelDoc& doc = *registry.FindDoc(name);
      py::list attrs;
      for (const auto& a : doc.attrs) {
        attrs.append(py::make_tuple(a.name, a.kind, a.fallback, a.meaning));
      }
      py::dict d;
      d["name"] = name;
      d["summary"] = doc.summary;
      d["attrs"] = attrs;
      d["inputs"] = doc.inputs;
      d["outputs"] = doc.outputs;
      d["example"] = doc.example;
      d["collective"] = registry.Find(name)->is_collective();
      d["mesh_shardings"] = registry.Find(name)->TakesMeshShardings();
      out.append(d);
    }
    return out;
  });
}
