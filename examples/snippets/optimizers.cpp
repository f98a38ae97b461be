// Quoted by docs/optimizers.md (tests/check_docs.py checks the quotes; CI compiles this file).
#include "dopt/optim/adam.hpp"
#include "dopt/optim/functional.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/runtime/state_dict.hpp"

void parameter_groups(dopt::Tensor w1, dopt::Tensor w2, dopt::Tensor b1, dopt::Tensor b2, dopt::Tensor head) {
  using namespace dopt::optim;
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<dopt::Tensor>{w1, w2}, AdamOptions(1e-2));  // own options
  groups.emplace_back(std::vector<dopt::Tensor>{b1, b2});                     // takes the defaults
  Adam opt(std::move(groups), AdamOptions(1e-3));
  opt.add_param_group(OptimizerParamGroup({head}));
  opt.param_groups()[0].options->set_lr(5e-3);  // a schedule changes a group's lr
}

void checkpoints(dopt::optim::Optimizer& opt) {
  dopt::save_state_dict(opt.state_dict(), "optim.safetensors");   // atomic: temp file + rename
  opt.load_state_dict(dopt::load_state_dict("optim.safetensors"));
}

void by_name(std::vector<dopt::optim::OptimizerParamGroup> groups, const dopt::Tensor& param, const dopt::Tensor& grad) {
  using namespace dopt::optim;
  auto opt = make_optimizer(OptimizerSpec{"Adam", {{"lr", 1e-3}, {"amsgrad", true}}}, groups);
  auto fn = as_functional_optim("Adam", {{"lr", 1e-3}});  // explicit gradients, state kept apart
  fn->step_param(param, grad);
}
