#include <cstdio>

#include "dopt/distributed/quantized_all_reduce.hpp"
#include "dopt/optim/adam.hpp"

int main() {
  dopt::Tensor p = dopt::Tensor::from_vector<float>({1.0f, -2.0f});
  p.set_grad(dopt::Tensor::from_vector<float>({0.5f, 0.5f}));
  dopt::optim::Adam opt({p}, dopt::optim::AdamOptions(0.1));
  opt.step();
  // Adam's first step moves each element by lr against the gradient's sign.
  const bool ok = p.at(0) < 1.0 && p.at(1) < -2.0;
  std::printf("consumer: p = [%g, %g] %s\n", p.at(0), p.at(1), ok ? "ok" : "WRONG");
  // dopt_distributed is linked too (dopt::dopt): a function of its library.
  const bool dist_ok =
      dopt::optim::wire_format_name(dopt::optim::parse_wire_format("bf16")) == "bfloat16";
  std::printf("consumer: distributed %s\n", dist_ok ? "ok" : "WRONG");
  return ok && dist_ok ? 0 : 1;
}
