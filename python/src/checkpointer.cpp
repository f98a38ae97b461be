// dopt::Checkpointer for the Python package (dopt.Checkpointer in
// python/dopt/checkpoint.py drives it; docs/python-checkpoints.md, "Checkpoints").
//
// Who calls what: the Python class, on the thread that issues the group's
// collectives. The collectives (the constructor, save, save_async, load,
// load_latest) and wait() and wait_snapshot() run without the GIL: a rank blocks there until the
// others arrive, and a torch tensor dopt lets go of on another thread takes
// the GIL to be released. add_* are local and keep the objects they register
// alive as long as the Checkpointer (pybind11 keep_alive: released after the
// C++ object is destroyed).
//
// The extras maps the C++ items reference are owned here; the Python class
// copies its dict into them before a save and back after a load.
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "convert.hpp"
#include "dopt/distributed/checkpointer.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/distributed/zero_stage3.hpp"
#include "dopt/optim/optimizer.hpp"
#include "dopt/runtime/error.hpp"

namespace dopt::python {
namespace {

Placement placement_of(const std::string& p, const char* op) {
  if (p == "replicated") return Placement::replicated;
  if (p == "per_rank") return Placement::per_rank;
  throw ValueError(op, "placement must be 'replicated' or 'per_rank', got '" + p + "'");
}

/// The C++ Checkpointer and the extras maps its items reference.
class PyCheckpointer {
 public:
  explicit PyCheckpointer(CheckpointerOptions o) : ckpt_(std::make_unique<Checkpointer>(std::move(o))) {}
  PyCheckpointer(const PyCheckpointer&) = delete;
  PyCheckpointer& operator=(const PyCheckpointer&) = delete;
  /// Called with the GIL (pybind11's dealloc): the C++ destructor waits for
  /// the save in flight, so it runs without it.
  ~PyCheckpointer() {
    if (Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release release;
      ckpt_.reset();
    } else {
      ckpt_.reset();
    }
  }

  Checkpointer& get() { return *ckpt_; }

  void add_extras(const std::string& name, const std::string& placement) {
    static constexpr const char* op = "Checkpointer::add_extras";
    const Placement p = placement_of(placement, op);
    auto& map = extras_.emplace_back();
    try {
      ckpt_->add_extras(name, map, p);
    } catch (...) {
      extras_.pop_back();
      throw;
    }
    by_name_[name] = &map;
  }
  std::map<std::string, std::string>& extras(const std::string& name) {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) throw KeyError("Checkpointer.extras", "no extras registered as '" + name + "'");
    return *it->second;
  }

 private:
  std::unique_ptr<Checkpointer> ckpt_;
  std::list<std::map<std::string, std::string>> extras_;  // stable addresses
  std::map<std::string, std::map<std::string, std::string>*> by_name_;
};

}  // namespace

void bind_checkpointer(py::module_& m) {
  py::class_<Future<void>>(m, "CheckpointFuture",
                           "An asynchronous save (or ZeRO's step_async): done() never blocks; wait() blocks until "
                           "the checkpoint is committed on every rank (the step's parameters are in place) and "
                           "raises its error.")
      .def("done", [](const Future<void>& f) { return f.is_ready(); })
      .def("wait", [](const Future<void>& f) { f.get(); }, py::call_guard<py::gil_scoped_release>())
      .def("result", [](const Future<void>& f) { f.get(); }, py::call_guard<py::gil_scoped_release>(),
           "wait() (concurrent.futures' name, as torch's async_save returns).");

  py::class_<PyCheckpointer>(m, "Checkpointer", "dopt::Checkpointer (use dopt.Checkpointer).")
      .def(py::init([](ProcessGroup group, const std::string& dir, int keep_last, std::optional<ProcessGroup> commit,
                       bool background_snapshot) {
             CheckpointerOptions o;
             o.group = std::move(group);
             o.dir = dir;
             o.keep_last = keep_last;
             if (commit) o.commit_group = std::move(*commit);
             o.background_snapshot = background_snapshot;
             py::gil_scoped_release release;  // a collective
             return std::make_unique<PyCheckpointer>(std::move(o));
           }),
           py::arg("group"), py::arg("dir"), py::arg("keep_last"), py::arg("commit_group").none(true),
           py::arg("background_snapshot") = false)
      .def(
          "add_tensors",
          [](PyCheckpointer& c, const std::string& name, std::map<std::string, Tensor> tensors,
             const std::string& placement) {
            c.get().add_tensors(name, std::move(tensors), placement_of(placement, "Checkpointer::add_tensors"));
          },
          py::arg("name"), py::arg("tensors"), py::arg("placement"))
      .def(
          "add_optimizer",
          [](PyCheckpointer& c, const std::string& name, optim::Optimizer& o, const std::string& placement) {
            c.get().add_optimizer(name, o, placement_of(placement, "Checkpointer::add_optimizer"));
          },
          py::arg("name"), py::arg("optimizer"), py::arg("placement"), py::keep_alive<1, 3>())
      .def(
          "add_zero",
          [](PyCheckpointer& c, const std::string& name, optim::ZeroRedundancyOptimizer& z) {
            c.get().add_optimizer(name, z);
          },
          py::arg("name"), py::arg("optimizer"), py::keep_alive<1, 3>())
      .def(
          "add_sharded_units",
          [](PyCheckpointer& c, const std::string& name, optim::ShardedUnits& s) { c.get().add_optimizer(name, s); },
          py::arg("name"), py::arg("units"), py::keep_alive<1, 3>())
      .def("add_extras", &PyCheckpointer::add_extras, py::arg("name"), py::arg("placement"))
      .def("extras", [](PyCheckpointer& c, const std::string& name) { return c.extras(name); })
      .def("set_extras",
           [](PyCheckpointer& c, const std::string& name, std::map<std::string, std::string> values) {
             c.extras(name) = std::move(values);
           })
      .def("save", [](PyCheckpointer& c, std::int64_t step) { c.get().save(step); },
           py::call_guard<py::gil_scoped_release>())
      .def("save_async", [](PyCheckpointer& c, std::int64_t step) { return c.get().save_async(step); },
           py::call_guard<py::gil_scoped_release>())
      .def("wait", [](PyCheckpointer& c) { c.get().wait(); }, py::call_guard<py::gil_scoped_release>())
      .def("wait_snapshot", [](PyCheckpointer& c) { c.get().wait_snapshot(); },
           py::call_guard<py::gil_scoped_release>())
      .def("load", [](PyCheckpointer& c, std::int64_t step) { c.get().load(step); },
           py::call_guard<py::gil_scoped_release>())
      .def("load_latest", [](PyCheckpointer& c) { return c.get().load_latest(); },
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("dir", [](PyCheckpointer& c) { return c.get().dir(); })
      .def_property_readonly("run", [](PyCheckpointer& c) { return c.get().run(); });
}

}  // namespace dopt::python
