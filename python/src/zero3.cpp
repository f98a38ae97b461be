// ShardedUnits (ZeRO stage 3) for the Python package; dopt.fully_shard
// (python/dopt/fully_shard.py) drives it from torch's module and autograd
// hooks. Tensors cross as dopt tensors (the Python side converts them with
// DLPack, no copy). Every method is called by the rank's Python thread, the
// one that runs the forward and the backward; the collectives and the waits
// (constructor, gather, release of a unit in flight, reduce_gradients,
// step, state_dict, full_parameters, load_parameters, release_for_gradients
// and the in-place reduction, which wait for the one in flight) run without the GIL.
#include "convert.hpp"
#include "gil_free_delete.hpp"
#include "dopt/distributed/zero_stage3.hpp"
#include "optim_groups.hpp"

namespace dopt::python {
namespace {

/// A unit's gradients from Python: dopt tensors, None for a parameter that
/// has none (it counts as zeros).
std::vector<Tensor> grads_from(const py::list& grads) {
  std::vector<Tensor> out;
  out.reserve(grads.size());
  for (const auto& g : grads) out.push_back(g.is_none() ? Tensor() : g.cast<Tensor>());
  return out;
}

}  // namespace

void bind_zero3(py::module_& m) {
  using namespace dopt::optim;
  using Units = std::vector<std::vector<Tensor>>;
  py::class_<ShardedUnits, GilFreeHolder<ShardedUnits>>(m, "ShardedUnits")
      .def(py::init([](Units units, const std::string& name, const py::dict& defaults, ProcessGroup group,
                       bool broadcast_parameters) {
             OptimizerSpec spec{name, hyper_from_py(defaults, "ShardedUnits")};
             ShardedUnitsOptions o{std::move(group), broadcast_parameters};
             py::gil_scoped_release release;  // a collective
             return GilFreeHolder<ShardedUnits>(new ShardedUnits(std::move(units), std::move(spec), std::move(o)));
           }),
           py::arg("units"), py::arg("name"), py::arg("defaults"), py::arg("process_group"),
           py::arg("broadcast_parameters") = true)
      .def("gather", &ShardedUnits::gather, py::call_guard<py::gil_scoped_release>())
      .def("prefetch", [](ShardedUnits& s, std::size_t u) { return s.prefetch(u); },
           py::call_guard<py::gil_scoped_release>())
      .def("release", &ShardedUnits::release, py::call_guard<py::gil_scoped_release>())
      .def("reduce_gradients",
           [](ShardedUnits& s, std::size_t u, const py::list& grads) {
             std::vector<Tensor> gs = grads_from(grads);
             py::gil_scoped_release release;
             s.reduce_gradients(u, gs);
           })
      // The Future<void> class is bound by bind_checkpointer (done(), wait() without the GIL).
      .def("reduce_gradients_async",
           [](ShardedUnits& s, std::size_t u, const py::list& grads) {
             std::vector<Tensor> gs = grads_from(grads);
             py::gil_scoped_release release;
             return s.reduce_gradients_async(u, gs);
           })
      // The gathered memory turned into the unit's gradients (zeroed views), then reduced in place.
      .def("release_for_gradients", &ShardedUnits::release_for_gradients, py::call_guard<py::gil_scoped_release>())
      .def("reduce_gradients_in_place_async",
           [](ShardedUnits& s, std::size_t u) { return s.reduce_gradients_async(u); },
           py::call_guard<py::gil_scoped_release>())
      .def("step", &ShardedUnits::step, py::call_guard<py::gil_scoped_release>())
      .def("state_dict",
           [](ShardedUnits& s) {
             StateDict sd;
             {
               py::gil_scoped_release release;
               sd = s.state_dict();
             }
             return state_dict_to_py(sd);
           })
      .def("load_state_dict",
           [](ShardedUnits& s, const py::dict& d) {
             s.load_state_dict(state_dict_from_py(d, "ShardedUnits.load_state_dict"));
           })
      .def("save_sharded",
           [](ShardedUnits& s, const std::string& dir) { s.save_sharded(dir); },
           py::call_guard<py::gil_scoped_release>())
      .def("load_sharded",
           [](ShardedUnits& s, const std::string& dir) { return s.load_sharded(dir).saved_world_size; },
           py::call_guard<py::gil_scoped_release>())
      .def("full_parameters", &ShardedUnits::full_parameters, py::call_guard<py::gil_scoped_release>())
      .def("load_parameters", &ShardedUnits::load_parameters, py::call_guard<py::gil_scoped_release>())
      // One group (index 0): the names GroupedOptimizer uses for ZeRO's groups.
      .def("group_hyperparams",
           [](ShardedUnits& s, std::size_t g) {
             return hyper_to_py(s.optim().param_groups().at(g).options->to_hyperparams());
           })
      .def("set_group_hyperparams",
           [](ShardedUnits& s, std::size_t g, const py::dict& d) {
             set_group_hyperparams(s.optim().param_groups().at(g), d, "ShardedUnits");
           })
      .def("unit_numel", &ShardedUnits::unit_numel)
      .def("shard_numel", &ShardedUnits::shard_numel)
      .def_property_readonly("bytes", &ShardedUnits::bytes)
      .def_property_readonly("gathered_bytes", &ShardedUnits::gathered_bytes)
      .def_property_readonly("buffer_bytes", &ShardedUnits::buffer_bytes)
      .def_property_readonly("rank", &ShardedUnits::rank)
      .def_property_readonly("world_size", &ShardedUnits::world_size);
}

}  // namespace dopt::python
