// 16-bit parameters in host memory are refused when an optimizer is built
// (the CPU kernels step float32 and float64 only), not at its first step.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "dopt/optim/functional.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/optim/sgd.hpp"
#include "thrown.hpp"

using namespace dopt;
using namespace dopt::optim;

namespace {

const std::vector<std::string> kNames = {"SGD",     "Adam",   "AdamW",    "Adagrad", "RMSprop",
                                         "Adamax",  "Adadelta", "Rprop",  "NAdam",   "RAdam"};

std::string error_of(const std::function<void()>& f) { return dopt::testing::what_thrown<DTypeError>(f); }

}  // namespace

TEST_CASE("16-bit CPU parameters are refused at construction by every optimizer and functional form",
          "[optim][param_checks]") {
  for (DType low : {DType::float16, DType::bfloat16}) {
    for (const std::string& name : kNames) {
      INFO(name << " " << dtype_name(low));
      const OptimizerSpec spec{name, {{"lr", 0.01}}};
      Tensor ok = Tensor::zeros({2});
      Tensor bad = Tensor::zeros({3}, low);
      // Built over it: refused, naming the optimizer, the parameter, the dtype and what to do.
      std::vector<OptimizerParamGroup> groups;
      groups.emplace_back(std::vector<Tensor>{ok, bad});
      const std::string e = error_of([&] { make_optimizer(spec, std::move(groups)); });
      CHECK_THAT(e, Catch::Contains(name) && Catch::Contains("parameter 1 of the group") &&
                        Catch::Contains(std::string(dtype_name(low))) && Catch::Contains("float32"));
      // Added later: refused too, and the optimizer keeps its groups.
      std::vector<OptimizerParamGroup> good;
      good.emplace_back(std::vector<Tensor>{ok});
      auto opt = make_optimizer(spec, std::move(good));
      CHECK_FALSE(error_of([&] { opt->add_param_group(OptimizerParamGroup({bad})); }).empty());
      CHECK(opt->param_groups().size() == 1);
      // The functional form, built over it or stepping it.
      CHECK_THAT(error_of([&] { make_functional(spec, {bad}); }),
                 Catch::Contains("Functional" + name) && Catch::Contains("parameter 0"));
      auto fn = as_functional_optim(name, {{"lr", 0.01}});
      Tensor g = Tensor::zeros({3}, low);
      CHECK_FALSE(error_of([&] { fn->step_param(bad, g); }).empty());
    }
  }
}

TEST_CASE("float32 and float64 CPU parameters are accepted and stepped", "[optim][param_checks]") {
  for (DType dt : {DType::float32, DType::float64}) {
    Tensor p = Tensor::full({2}, 1.0, dt);
    SGD opt({p}, SGDOptions(0.5));
    p.set_grad(Tensor::full({2}, 1.0, dt));
    opt.step();
    CHECK(p.at(0) == 0.5);
  }
}

TEST_CASE("a parameter listed twice in one group is refused where the group is built, naming both places",
          "[optim][params]") {
  // torch 1.13 keeps the duplicate and steps it twice per step(); dopt
  // copies neither that nor a silent single step.
  const Tensor w = Tensor::zeros({3}), b = Tensor::zeros({2});
  const std::string want = "parameter 2 of the group is the same tensor as parameter 0 (Tensor[float32, [3], cpu]): "
                           "a parameter listed twice would be stepped twice per step() by torch; pass each parameter "
                           "once (docs/torch-differences.md)";
  for (const std::string& name : kNames) {
    INFO(name);
    std::vector<OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<Tensor>{w, b, w});
    CHECK_THROWS_WITH(make_optimizer(OptimizerSpec{name, {{"lr", 0.1}}}, std::move(groups)),
                      Catch::EndsWith(want));
  }
  // add_param_group: a duplicate inside the new group, and one already in an earlier group.
  SGD opt(std::vector<Tensor>{w}, SGDOptions(0.1));
  CHECK_THROWS_WITH(opt.add_param_group(OptimizerParamGroup(std::vector<Tensor>{b, b})),
                    Catch::Contains("parameter 1 of the group is the same tensor as parameter 0"));
  CHECK_THROWS_WITH(opt.add_param_group(OptimizerParamGroup(std::vector<Tensor>{b, w})),
                    Catch::EndsWith("some parameters appear in more than one parameter group: parameter 1 of the new "
                                    "group is parameter 0 of group 0"));
  CHECK(opt.param_groups().size() == 1);  // nothing was added
}
