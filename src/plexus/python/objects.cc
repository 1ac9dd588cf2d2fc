// plexus._core's Slice, Program, Future, Graph and TransferProgress.
#include "plexus/common/argument_count.h"
#include "plexus/python/convert.h"
#include "plexus/python/define.h"
#include "plexus/python/errors.h"

namespace plexus::python {

void DefineSlice(py::module_& m) {
  py::class_<Slice, std::shared_ptr<Slice>>(m, "Slice")
      .def_property_readonly("id", &Slice::id)
      .def_property_readonly("first_id", &Slice::first_id)
      .def_property_readonly("num_devices", &Slice::num_devices)
      .def_property_readonly("num_hosts", &Slice::num_hosts)
      .def_property_readonly("generation", &Slice::generation)
      .def_property_readonly("resizes", &Slice::resizes)
      .def(
          "resize",
          [](Slice& s, int num_devices, int axis) {
            absl::StatusOr<Slice::Resized> r;
            {
              py::gil_scoped_release release;
              r = s.Resize(num_devices, axis);
            }
            Check(r.status());
            py::dict d;
            d["values_moved"] = r->values_moved;
            d["bytes_moved"] = r->bytes_moved;
            return d;
          },
          py::arg("num_devices"), py::arg("axis"))
      .def_property_readonly("suspended", &Slice::suspended)
      .def_property_readonly("preempted", &Slice::preempted)
      .def(
          "suspend",
          [](Slice& s, bool to_files) {
            absl::StatusOr<Slice::Resized> r;
            {
              py::gil_scoped_release release;
              r = s.Suspend(to_files);
            }
            Check(r.status());
            py::dict d;
            d["values_parked"] = r->values_moved;
            d["bytes_parked"] = r->bytes_moved;
            return d;
          },
          py::arg("to_files") = false)
      .def("resume",
           [](Slice& s) {
             absl::StatusOr<Slice::Resized> r;
             {
               py::gil_scoped_release release;
               r = s.Resume();
             }
             Check(r.status());
             py::dict d;
             d["values_moved"] = r->values_moved;
             d["bytes_moved"] = r->bytes_moved;
             return d;
           })
      .def("describe", [](const Slice& s) { return SliceDevices(s); })
      .def("close", &Slice::Close)
      .def_property_readonly("closed", &Slice::closed);
}

void DefineProgram(py::module_& m) {
  py::class_<Program, std::shared_ptr<Program>>(m, "Program")
      .def_property_readonly("name", &Program::name)
      .def_property_readonly("kernel",
                             [](const Program& p) { return p.def().kernel(); })
      .def_property_readonly("slice", &Program::slice)
      // The server's rule for a call's argument count (argument_count.h),
      // for Python to fail fast before it puts the arguments.
      .def("check_argument_count",
           [](const Program& p, size_t given) {
             Check(CheckArgumentCount(p.name(), p.inputs().size(), given));
           })
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
}

void DefineFuture(py::module_& m) {
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
}

void DefineGraph(py::module_& m) {
  py::class_<Graph>(m, "Graph")
      .def(
          "call",
          [](Graph& g, const Program& p, const py::sequence& inputs,
             uint32_t site) {
            std::vector<Future> in = FuturesFrom(inputs);
            absl::StatusOr<std::vector<Future>> out;
            {
              // As Client.call: it may wait (back-pressure, a reconnect),
              // and other Python threads go on meanwhile.
              py::gil_scoped_release release;
              out = g.Call(p, in, site);
            }
            return Unwrap(std::move(out));
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
}

void DefineTransferProgress(py::module_& m) {
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
}

}  // namespace plexus::python
