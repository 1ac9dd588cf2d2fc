#include "plexus/python/convert.h"

#include <array>

namespace plexus::python {

DType DTypeOf(const py::dtype& dt) {
  std::string name = py::str(dt).cast<std::string>();
  return Unwrap(ParseDType(name));
}

py::dtype NumpyDType(DType d) {
  // Each made once (a dtype from its name cost ~1,400 instructions, on
  // every fetch) and kept for good: static destructors may run after the
  // interpreter is gone. Read and written under the GIL, as every binding
  // call runs.
  static auto* made = new std::array<PyObject*, kMaxDType + 1>{};
  const int i = static_cast<int>(d);
  const bool cached = i >= 0 && i <= kMaxDType;
  if (cached && (*made)[i] != nullptr) {
    return py::reinterpret_borrow<py::dtype>((*made)[i]);
  }
  const std::string name = DTypeName(d);
  py::dtype dtype =
      d == DType::kBF16 || name.rfind("float8_", 0) == 0
          // numpy has no bfloat16 or 8-bit floats of its own; ml_dtypes (a
          // JAX dependency) does.
          ? py::dtype::from_args(
                py::module_::import("ml_dtypes").attr(name.c_str()))
          : py::dtype(name);
  if (cached) (*made)[i] = dtype.inc_ref().ptr();
  return dtype;
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
  out.reserve(seq.size());
  for (auto x : seq) out.push_back(x.cast<Future>());
  return out;
}

}  // namespace plexus::python
