// Quoted by docs/libtorch.md (tests/check_docs.py checks the quotes; CI compiles this
// file when the libtorch interop is built).
#include <torch/torch.h>

#include "dopt/libtorch/interop.hpp"

void api(const at::Tensor& t, torch::nn::Module& module_ref) {
  auto* module = &module_ref;
  dopt::Tensor d = dopt::libtorch::to_dopt(t);      // over t's memory; keeps it alive
  at::Tensor t2 = dopt::libtorch::to_torch(d);      // over d's memory; keeps d's storage alive

  dopt::libtorch::ParameterBinding bind(module->parameters());
  bind.params();          // std::vector<dopt::Tensor>, one per parameter, for any dopt optimizer
  bind.sync();            // after backward: gradients (re-)bound, moved parameters re-bound, requires_grad
  bind.rebind_hook();     // for ZeroOptions::rebind_parameter
}
