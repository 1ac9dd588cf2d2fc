// plexus._core's functions: the cluster's (status, traces, shutdown,
// secrets and tokens) and the built-in kernels' (names, documentation,
// shardings, the LAPACK targets workers serve).
#include <string>
#include <vector>

#include "google/protobuf/util/json_util.h"
#include "plexus/common/credentials.h"
#include "plexus/executors/builtin/catalogue.h"
#include "plexus/executors/xla/lapack/lapack_handlers.h"
#include "plexus/python/convert.h"
#include "plexus/python/define.h"
#include "plexus/python/errors.h"

namespace plexus::python {

void DefineClusterFunctions(py::module_& m) {
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
  // A status another process wrote as text ("INVALID_ARGUMENT" and its
  // message: a server that could not start, on its ready pipe) raised as
  // the exception of its code.
  m.def(
      "raise_status",
      [](const std::string& code, const std::string& message) {
        for (int c = 1;
             c <= static_cast<int>(absl::StatusCode::kUnauthenticated); ++c) {
          const auto status_code = static_cast<absl::StatusCode>(c);
          if (absl::StatusCodeToString(status_code) == code) {
            Raise(absl::Status(status_code, message));
          }
        }
        Raise(absl::UnknownError(message));
      },
      py::arg("code"), py::arg("message"));
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
}

void DefineKernelFunctions(py::module_& m) {
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

}  // namespace plexus::python
