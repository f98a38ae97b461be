// Optimizer::set_num_threads: step() spread over threads gives the same bits
// as one thread (each parameter's update is independent and runs whole on
// one thread).
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "dopt/optim/adam.hpp"
#include "dopt/optim/sgd.hpp"
#include "dopt/runtime/error.hpp"

using namespace dopt;
using namespace dopt::optim;

namespace {

std::vector<Tensor> make_params(int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<Tensor> ps;
  for (int i = 0; i < n; ++i) {
    std::vector<float> v(static_cast<std::size_t>(17 + 13 * i));
    for (auto& x : v) x = nd(rng);
    ps.push_back(Tensor::from_vector(v));
  }
  return ps;
}

void set_grads(std::vector<Tensor>& ps, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (std::size_t i = 0; i < ps.size(); ++i) {
    if (i % 7 == 3) continue;  // some parameters without a gradient
    std::vector<float> g(static_cast<std::size_t>(ps[i].numel()));
    for (auto& x : g) x = nd(rng);
    ps[i].set_grad(Tensor::from_vector(g));
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data<float>(), b.data<float>(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("set_num_threads: step() over several threads equals one thread bit for bit", "[optimizer][threads]") {
  for (int threads : {2, 3, 8}) {
    CAPTURE(threads);
    auto one = make_params(40, 1), many = make_params(40, 1);
    Adam a1(one, AdamOptions(1e-2).weight_decay(0.01).amsgrad(true));
    Adam an(many, AdamOptions(1e-2).weight_decay(0.01).amsgrad(true));
    an.set_num_threads(threads);
    CHECK(an.num_threads() == threads);
    CHECK(a1.num_threads() == 1);
    for (int t = 0; t < 5; ++t) {
      set_grads(one, 10 + t);
      set_grads(many, 10 + t);
      a1.step();
      an.step();
    }
    bool equal = true;
    for (std::size_t i = 0; i < one.size(); ++i) equal = equal && same_bits(one[i], many[i]);
    CHECK(equal);
    CHECK(a1.state().size() == an.state().size());
  }
}

TEST_CASE("set_num_threads refuses fewer than one thread, naming the optimizer", "[optimizer][threads]") {
  auto ps = make_params(2, 3);
  SGD opt(ps, SGDOptions(0.1));
  CHECK_THROWS_AS(opt.set_num_threads(0), ValueError);
  CHECK_THROWS_WITH(opt.set_num_threads(-2), Catch::Contains("SGD") && Catch::Contains("-2"));
  CHECK(opt.num_threads() == 1);
}
