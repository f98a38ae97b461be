// What the snippets the docs quote have in common: a tiny model and its
// gradients, so that every quoted line is real, compiled code.
#pragma once
#include <cstdint>
#include <vector>

#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/tensor.hpp"

namespace snippets {

/// Two parameters, the same on every rank.
inline std::vector<dopt::Tensor> make_model() {
  return {dopt::Tensor::full({8, 4}, 0.5f), dopt::Tensor::zeros({8})};
}

/// Gradients that differ between ranks (rank r gets r + 1 everywhere).
inline dopt::Tensor local_grad(const dopt::Tensor& p, int rank) {
  return dopt::Tensor::full(p.sizes(), static_cast<float>(rank + 1));
}

}  // namespace snippets
