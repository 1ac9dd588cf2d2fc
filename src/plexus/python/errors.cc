// plexus._core's exception classes and the Status -> exception mapping.
#include "plexus/python/errors.h"

#include "plexus/client/reconnect.h"
#include "plexus/python/define.h"

namespace plexus::python {
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

}  // namespace

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

void DefineErrors(py::module_& m) {
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
}

}  // namespace plexus::python
