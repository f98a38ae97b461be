// Local optimizers (through the registry), their functional forms and the
// model averagers.
#include "convert.hpp"
#include "gil_free_delete.hpp"
#include "dopt/distributed/averagers.hpp"
#include "dopt/optim/functional.hpp"
#include "dopt/optim/registry.hpp"
#include "optim_groups.hpp"

namespace dopt::python {

std::vector<optim::OptimizerParamGroup> make_groups(const std::string& name, const Hyperparams& defaults,
                                                    const PyGroups& groups, const char* op) {
  std::vector<optim::OptimizerParamGroup> out;
  for (const auto& [params, hp] : groups) {
    if (hp.is_none()) {
      out.emplace_back(params);
      continue;
    }
    Hyperparams h = defaults;
    for (auto& [k, v] : hyper_from_py(hp.cast<py::dict>(), op)) h[k] = v;
    out.emplace_back(params, optim::make_options(optim::OptimizerSpec{name, h}));
  }
  return out;
}

void set_group_hyperparams(optim::OptimizerParamGroup& g, const py::dict& d, const char* op) {
  std::unique_ptr<optim::OptimizerOptions> o = g.options->clone();
  o->set_hyperparams(hyper_from_py(d, op));
  o->validate(op);
  g.options = std::move(o);
}

py::dict param_state_to_py(const ParamState* st) {
  py::dict d;
  if (st)
    for (const auto& [k, t] : *st)
      if (t.defined()) d[py::str(k)] = py::cast(t);
  return d;
}

void bind_optim(py::module_& m) {
  using namespace dopt::optim;
  m.def("registered_optimizers", &registered_optimizers);
  m.def(
      "optimizer_hyperparams",
      [](const std::string& name, const py::dict& given) {
        return hyper_to_py(make_options(OptimizerSpec{name, hyper_from_py(given, name.c_str())})->to_hyperparams());
      },
      "Every hyperparameter of the registered optimizer `name`, given ones included (validated).");

  py::class_<Optimizer, std::unique_ptr<Optimizer>>(m, "Optimizer", "A dopt local optimizer.")
      .def_property_readonly("name", &Optimizer::name)
      .def("step", [](Optimizer& o) { o.step(); }, py::call_guard<py::gil_scoped_release>())
      .def("group_count", [](const Optimizer& o) { return o.param_groups().size(); })
      .def("group_hyperparams",
           [](const Optimizer& o, std::size_t g) { return hyper_to_py(o.param_groups().at(g).options->to_hyperparams()); })
      .def("set_group_hyperparams",
           [](Optimizer& o, std::size_t g, const py::dict& d) {
             set_group_hyperparams(o.param_groups().at(g), d, o.name().c_str());
           })
      .def("add_param_group",
           [](Optimizer& o, const std::vector<Tensor>& params, const py::object& hp) {
             PyGroups one{{params, hp}};
             auto gs = make_groups(o.name(), o.defaults().to_hyperparams(), one, o.name().c_str());
             o.add_param_group(std::move(gs.front()));
           })
      .def("state_dict", [](const Optimizer& o) { return state_dict_to_py(o.state_dict()); })
      .def("load_state_dict",
           [](Optimizer& o, const py::dict& d) { o.load_state_dict(state_dict_from_py(d, o.name().c_str())); })
      .def("state_of",
           [](const Optimizer& o, const Tensor& p) {
             auto it = o.state().find(p.key());
             return param_state_to_py(it == o.state().end() ? nullptr : &it->second);
           })
      .def("set_num_threads", &Optimizer::set_num_threads);
  m.def(
      "make_optimizer",
      [](const std::string& name, const PyGroups& groups, const py::dict& defaults) {
        const Hyperparams d = hyper_from_py(defaults, name.c_str());
        return make_optimizer(OptimizerSpec{name, d}, make_groups(name, d, groups, name.c_str()));
      },
      py::arg("name"), py::arg("groups"), py::arg("defaults"));

  py::class_<FunctionalOptimizer, std::unique_ptr<FunctionalOptimizer>>(m, "FunctionalOptimizer")
      .def_property_readonly("name", &FunctionalOptimizer::name)
      .def_property_readonly("optimizer_name", &FunctionalOptimizer::optimizer_name)
      .def_property_readonly("params", &FunctionalOptimizer::params)
      .def(
          "step",
          [](FunctionalOptimizer& f, const std::vector<std::optional<Tensor>>& grads) {
            std::vector<Tensor> g;
            for (const auto& x : grads) g.push_back(x ? *x : Tensor());
            py::gil_scoped_release release;
            f.step(g);
          })
      .def(
          "step_param",
          [](FunctionalOptimizer& f, const Tensor& p, const std::optional<Tensor>& g) {
            py::gil_scoped_release release;
            f.step_param(p, g ? *g : Tensor());
          },
          py::arg("param"), py::arg("grad").none(true))
      .def("state_of", [](const FunctionalOptimizer& f, const Tensor& p) { return param_state_to_py(f.state_of(p)); });
  m.def(
      "as_functional_optim",
      [](const std::string& name, const py::dict& hp) { return as_functional_optim(name, hyper_from_py(hp, name.c_str())); },
      py::arg("name"), py::arg("hyperparameters"));
  m.def(
      "make_functional",
      [](const std::string& name, const std::vector<Tensor>& params, const py::dict& hp, bool allow_empty) {
        return make_functional(OptimizerSpec{name, hyper_from_py(hp, name.c_str())}, params, allow_empty);
      },
      py::arg("name"), py::arg("params"), py::arg("hyperparameters"), py::arg("allow_empty_param_list") = false);

  py::class_<ModelAverager, GilFreeHolder<ModelAverager>>(m, "ModelAverager")
      .def_property("step", &ModelAverager::step, &ModelAverager::set_step)
      .def_property_readonly("warmup_steps", &ModelAverager::warmup_steps)
      .def_property_readonly("process_group", &ModelAverager::process_group)
      .def("will_average", &ModelAverager::will_average)
      .def(
          "average",
          [](ModelAverager& a, const std::vector<Tensor>& params) {
            // The parameters are the ones with gradients (filtered by the caller, on the torch side).
            if (auto g = a.group_for_step(a.step())) average_parameters(params, *g);
            a.set_step(a.step() + 1);
          },
          py::call_guard<py::gil_scoped_release>(),
          "Averages params if the schedule says so at this step, then advances the step.");
  py::class_<PeriodicModelAverager, ModelAverager, GilFreeHolder<PeriodicModelAverager>>(m, "PeriodicModelAverager")
      .def(py::init<std::int64_t, std::int64_t, ProcessGroup>(), py::arg("period"), py::arg("warmup_steps"),
           py::arg("process_group"))
      .def_property_readonly("period", &PeriodicModelAverager::period);
  py::class_<HierarchicalModelAverager, ModelAverager, GilFreeHolder<HierarchicalModelAverager>>(m, "HierarchicalModelAverager")
      .def(py::init<std::map<std::int64_t, int>, std::int64_t, ProcessGroup>(), py::arg("period_group_size_dict"),
           py::arg("warmup_steps"), py::arg("process_group"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("period_process_groups", &HierarchicalModelAverager::period_process_groups);
  m.def(
      "average_parameters",
      [](const std::vector<Tensor>& params, ProcessGroup group) { average_parameters(params, std::move(group)); },
      py::call_guard<py::gil_scoped_release>());
}

}  // namespace dopt::python
