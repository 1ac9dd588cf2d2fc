// Values between Python and the C++ client: dtypes, shardings, argument
// specs, attributes, futures and slices' device lists, and trace replies as
// Chrome trace JSON. Every binding file includes this header (it brings
// pybind11's numpy and STL casters, which must be the same in every file).
// Stateless; called with the GIL held unless it says otherwise.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/client/client.h"
#include "plexus/common/clock.h"
#include "plexus/python/errors.h"
#include "plexus/timeline/chrome_trace.h"

namespace plexus::python {

// The clock of every client the binding connects: ClientOptions::clock's
// default, the real one (Python injects none). Its own deadlines and ages
// read the same clock.
inline Clock& PythonClock() { return *ClientOptions().clock; }

DType DTypeOf(const py::dtype& dt);
py::dtype NumpyDType(DType d);
// Sharding <-> ("replicated"|"split"|"partial", axis), or for a
// PartitionSpec over a mesh of several axes ("mesh", sizes, axis names,
// per array dimension the indices of the axes splitting it).
Sharding ShardingFrom(const py::tuple& t);
py::tuple ShardingTo(const Sharding& s);
// (dtype, shape, sharding)
ArgSpec ArgFrom(const py::tuple& t);
py::tuple ArgTo(const ArgSpec& a);
Attrs AttrsFrom(const py::dict& d);
py::dict SliceDevices(const Slice& s);
std::vector<Future> FuturesFrom(const py::sequence& seq);

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

}  // namespace plexus::python
