// ZeroRedundancyOptimizer for the Python package. The rebind hook is a
// Python callable (the package's, which sets `p.data` of the torch
// parameter to a view of dopt's bucket), called with the GIL taken.
#include "convert.hpp"
#include "gil_free_delete.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/distributed/zero.hpp"
#include "optim_groups.hpp"

namespace dopt::python {

void bind_zero(py::module_& m) {
  using namespace dopt::optim;
  py::class_<ZeroRedundancyOptimizer, GilFreeHolder<ZeroRedundancyOptimizer>>(m, "ZeroRedundancyOptimizer")
      .def(py::init([](const PyGroups& groups, const std::string& name, const py::dict& defaults, ProcessGroup group,
                       bool bucket_view, const py::object& rebind) {
             const Hyperparams d = hyper_from_py(defaults, "ZeroRedundancyOptimizer");
             auto gs = make_groups(name, d, groups, "ZeroRedundancyOptimizer");
             ZeroOptions o{std::move(group), bucket_view};
             if (!rebind.is_none()) {
               PyCallback cb(rebind);
               o.rebind_parameter = [cb](const Tensor& p) { cb(p); };
             }
             py::gil_scoped_release release;  // the constructor is a collective
             return GilFreeHolder<ZeroRedundancyOptimizer>(new ZeroRedundancyOptimizer(std::move(gs), OptimizerSpec{name, d}, std::move(o)));
           }),
           py::arg("groups"), py::arg("name"), py::arg("defaults"), py::arg("process_group"),
           py::arg("parameters_as_bucket_view"), py::arg("rebind").none(true))
      .def("step", [](ZeroRedundancyOptimizer& z) { z.step(); }, py::call_guard<py::gil_scoped_release>())
      // The Future<void> class is bound by bind_checkpointer (CheckpointFuture:
      // done(), wait() without the GIL).
      .def("step_async", [](ZeroRedundancyOptimizer& z) { return z.step_async(); },
           py::call_guard<py::gil_scoped_release>())
      .def(
          "add_param_group",
          [](ZeroRedundancyOptimizer& z, const std::vector<Tensor>& params, const py::object& hp) {
            PyGroups one{{params, hp}};
            auto gs = make_groups(z.spec().name, z.spec().hyperparameters, one, "ZeroRedundancyOptimizer.add_param_group");
            py::gil_scoped_release release;
            z.add_param_group(std::move(gs.front()));
          })
      .def("consolidate_state_dict", &ZeroRedundancyOptimizer::consolidate_state_dict, py::arg("to") = 0,
           py::call_guard<py::gil_scoped_release>())
      .def("state_dict", [](const ZeroRedundancyOptimizer& z) { return state_dict_to_py(z.state_dict()); })
      .def("load_state_dict",
           [](ZeroRedundancyOptimizer& z, const py::dict& d) {
             z.load_state_dict(state_dict_from_py(d, "ZeroRedundancyOptimizer.load_state_dict"));
           })
      .def("save_sharded", &ZeroRedundancyOptimizer::save_sharded, py::call_guard<py::gil_scoped_release>())
      .def("load_sharded",
           [](ZeroRedundancyOptimizer& z, const std::string& dir) {
             ShardLoadReport r;
             {
               py::gil_scoped_release release;
               r = z.load_sharded(dir);
             }
             py::dict d;
             d["saved_world_size"] = r.saved_world_size;
             d["shards_read"] = r.shards_read;
             d["tensors_read"] = r.tensors_read;
             return d;
           })
      .def("group_count", [](const ZeroRedundancyOptimizer& z) { return z.param_groups().size(); })
      .def("group_hyperparams",
           [](const ZeroRedundancyOptimizer& z, std::size_t g) {
             return hyper_to_py(z.param_groups().at(g).options->to_hyperparams());
           })
      .def("set_group_hyperparams",
           [](ZeroRedundancyOptimizer& z, std::size_t g, const py::dict& d) {
             set_group_hyperparams(z.param_groups().at(g), d, "ZeroRedundancyOptimizer");
           })
      .def("local_state_of",
           [](const ZeroRedundancyOptimizer& z, const Tensor& p) {
             auto it = z.optim().state().find(p.key());
             return param_state_to_py(it == z.optim().state().end() ? nullptr : &it->second);
           })
      .def_property_readonly("rank", &ZeroRedundancyOptimizer::rank)
      .def_property_readonly("world_size", &ZeroRedundancyOptimizer::world_size)
      .def_property_readonly("process_group", &ZeroRedundancyOptimizer::process_group)
      .def_property_readonly("optimizer_name", [](const ZeroRedundancyOptimizer& z) { return z.spec().name; })
      .def("param_owners", &ZeroRedundancyOptimizer::param_owners)
      .def("global_index", &ZeroRedundancyOptimizer::global_index)
      .def_property_readonly("buckets", &ZeroRedundancyOptimizer::buckets)
      .def_property_readonly("local_state_bytes", &ZeroRedundancyOptimizer::local_state_bytes)
      .def_property_readonly("step_count", &ZeroRedundancyOptimizer::step_count);
}

}  // namespace dopt::python
