// dopt <-> libtorch: zero-copy tensors both ways, gradients torch re-allocates
// re-bound by sync(), a dopt optimizer over a torch module bitwise
// torch::optim's, ZeRO's bucket views re-pointing the torch parameters
// through the rebind hook, and the refusal without it.
#include <mutex>
#include <string>
#include <vector>

#include <torch/torch.h>
// glog (through c10) defines CHECK; the tests use Catch's.
#undef CHECK
#include <catch2/catch.hpp>

#include "dopt/actors/simulate.hpp"
#include "dopt/libtorch/interop.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/distributed/zero.hpp"

using namespace dopt;

namespace {

torch::nn::Sequential make_net() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(6, 5), torch::nn::Tanh(), torch::nn::Linear(5, 3));
}

void copy_params(torch::nn::Sequential from, torch::nn::Sequential to) {
  torch::NoGradGuard g;
  auto a = from->parameters();
  auto b = to->parameters();
  for (std::size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
}

bool same_params(torch::nn::Sequential a, torch::nn::Sequential b) {
  auto x = a->parameters();
  auto y = b->parameters();
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!torch::equal(x[i], y[i])) return false;
  return true;
}

void backward(torch::nn::Sequential net, int step) {
  auto gen = at::detail::createCPUGenerator(100 + step);
  auto x = torch::randn({8, 6}, gen);
  net->forward(x).square().sum().backward();
}

}  // namespace

TEST_CASE("libtorch: tensors cross without copies, both ways", "[libtorch]") {
  auto t = torch::arange(6, torch::kFloat).reshape({2, 3});
  Tensor d = libtorch::to_dopt(t);
  CHECK(d.shape() == Shape{2, 3});
  CHECK(d.dtype() == DType::float32);
  CHECK(d.data_ptr() == t.data_ptr());
  d.data<float>()[4] = 40.0f;
  CHECK(t[1][1].item<float>() == 40.0f);
  at::Tensor back = libtorch::to_torch(d);
  CHECK(back.data_ptr() == t.data_ptr());
  back.fill_(1.0f);
  CHECK(d.at(0) == 1.0);
  // dopt keeps the memory it points at, even when the torch tensor is given other memory.
  auto p = torch::ones({4}, torch::kDouble);
  Tensor dp = libtorch::to_dopt(p);
  p.set_data(torch::zeros({4}, torch::kDouble));
  CHECK(dp.at(3) == 1.0);
  // A dopt-owned tensor outlives its dopt handles inside torch.
  at::Tensor kept;
  {
    Tensor own = Tensor::full({3}, 2.5, DType::float64);
    kept = libtorch::to_torch(own);
  }
  CHECK(kept.sum().item<double>() == 7.5);
  for (auto st : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16, torch::kInt, torch::kLong})
    CHECK(libtorch::to_torch(libtorch::to_dopt(torch::zeros({2}, st))).scalar_type() == st);
  CHECK_THROWS_AS(libtorch::to_dopt(torch::zeros({3, 4}).t()), ValueError);
  CHECK_THROWS_AS(libtorch::to_dopt(torch::zeros({2}, torch::kBool)), DTypeError);
}

TEST_CASE("libtorch: a dopt optimizer over a torch module equals torch::optim::Adam bitwise, grads re-bound",
          "[libtorch]") {
  auto net = make_net();
  auto ref = make_net();
  copy_params(net, ref);
  libtorch::ParameterBinding bind(net->parameters());
  REQUIRE(bind.params().size() == 4);
  optim::Adam opt(bind.params(), optim::AdamOptions(0.01).weight_decay(0.1));
  torch::optim::Adam topt(ref->parameters(), torch::optim::AdamOptions(0.01).weight_decay(0.1));
  std::vector<const void*> grad_memory;
  for (int step = 0; step < 6; ++step) {
    const bool set_to_none = step % 2 == 1;  // torch re-allocates the gradients after this
    net->zero_grad(set_to_none);
    ref->zero_grad(set_to_none);
    backward(net, step);
    backward(ref, step);
    bind.sync();
    for (std::size_t i = 0; i < bind.params().size(); ++i) {
      REQUIRE(bind.params()[i].grad().defined());
      CHECK(bind.params()[i].grad().data_ptr() == bind.torch_params()[i].grad().data_ptr());
    }
    grad_memory.push_back(bind.torch_params()[0].grad().data_ptr());
    opt.step();
    topt.step();
    INFO("step " << step);
    REQUIRE(same_params(net, ref));
  }
  // A parameter without a gradient is skipped, as torch does.
  net->zero_grad(true);
  bind.sync();
  CHECK_FALSE(bind.params()[0].grad().defined());
}

TEST_CASE("libtorch: ZeRO bucket views re-point the torch parameters through the rebind hook, refused without it",
          "[libtorch][zero]") {
  std::mutex m;
  std::vector<std::string> problems;
  simulate(3, [&](RankContext& ctx) {
    std::vector<std::string> bad;
    torch::nn::Sequential net, ref;
    {
      std::lock_guard<std::mutex> lock(m);  // torch's default generator, one rank at a time
      net = make_net();
      ref = make_net();
    }
    copy_params(net, ref);
    libtorch::ParameterBinding bind(net->parameters());
    const optim::OptimizerSpec spec{"Adam", {{"lr", 0.01}}};
    try {
      optim::ZeroRedundancyOptimizer refused(bind.params(), spec, optim::ZeroOptions{ctx.world(), true});
      bad.push_back("ZeRO accepted torch memory with bucket view and no rebind hook");
    } catch (const ValueError& e) {
      if (std::string(e.what()).find("rebind_parameter") == std::string::npos) bad.push_back(e.what());
    }
    optim::ZeroOptions zo{ctx.world(), true};
    zo.rebind_parameter = bind.rebind_hook();
    optim::ZeroRedundancyOptimizer zero(bind.params(), spec, zo);
    for (std::size_t i = 0; i < bind.params().size(); ++i)
      if (bind.torch_params()[i].data_ptr() != bind.params()[i].data_ptr())
        bad.push_back("torch parameter " + std::to_string(i) + " is not a view of its bucket slice");
    torch::optim::Adam topt(ref->parameters(), torch::optim::AdamOptions(0.01));
    for (int step = 0; step < 4; ++step) {
      net->zero_grad(true);
      ref->zero_grad(true);
      backward(net, step);  // the same batch on every rank: the averaged gradient is this one
      backward(ref, step);
      bind.sync();
      zero.step();
      topt.step();
      if (!same_params(net, ref)) bad.push_back("step " + std::to_string(step) + ": differs from torch::optim::Adam");
    }
    std::lock_guard<std::mutex> lock(m);
    problems.insert(problems.end(), bad.begin(), bad.end());
  });
  for (const auto& p : problems) FAIL_CHECK(p);
}
