// clip_grad_norm: torch 1.13's reduction orders (against a scalar
// transcription), the non-finite cases, 16-bit gradients. (Sharded over
// ZeRO's ranks: distributed/src/zero/zero_training.test.cpp.)
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include "dopt/optim/clip_grad.hpp"
#include "bitwise_checks.hpp"
#include "reference_data.hpp"

using namespace dopt;
using namespace dopt::optim;
using dopt::testing::tensor_of;
using dopt::testing::values;
using Catch::Matchers::Contains;

namespace {

// torch 1.13's CPU norms, written out element by element.
float ref_l2_f32(const std::vector<float>& x) {
  const std::size_t n = x.size(), full = n - n % 8;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (std::size_t d = 0; d < full; d += 8)
    for (int j = 0; j < 8; ++j) acc[j] = std::fma(x[d + j], x[d + j], acc[j]);
  float b = acc[0];
  for (int j = 1; j < 8; ++j) b = b + acc[j];
  std::size_t d = full;
  if (n - d >= 4)
    for (int k = 0; k < 4; ++k, ++d) {
      const float sq = x[d] * x[d];
      b = b + sq;
    }
  for (; d < n; ++d) b = std::fma(x[d], x[d], b);
  return std::sqrt(b);
}
template <class T>
T ref_l1(const std::vector<T>& x) {
  T b = 0;
  for (T v : x) b = b + std::fabs(v);
  return b;
}
template <class T>
T ref_inf(const std::vector<T>& x) {
  T b = 0;
  for (T v : x) b = std::max(b, std::fabs(v));
  return b;
}
double ref_l2_f64(const std::vector<double>& x) {
  double b = 0;
  for (double v : x) b = std::fma(v, v, b);
  return std::sqrt(b);
}

template <class T>
T ref_norm(const std::vector<T>& x, double p) {
  if (std::isinf(p)) return ref_inf(x);
  if (p == 1.0) return ref_l1(x);
  if constexpr (std::is_same_v<T, float>) return ref_l2_f32(x);
  else return ref_l2_f64(x);
}

/// torch's clip_grad_norm_ over grads (in place), returning the total.
template <class T>
T ref_clip(std::vector<std::vector<T>>& grads, double max_norm, double p) {
  std::vector<T> norms;
  for (const auto& g : grads) norms.push_back(ref_norm(g, p));
  const T total = ref_norm(norms, p);
  T coef = (T(1) / (total + T(1e-6))) * T(max_norm);
  if (coef > T(1)) coef = T(1);
  for (auto& g : grads)
    for (auto& v : g) v = v * coef;
  return total;
}

using dopt::testing::clip_grads;

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEMPLATE_TEST_CASE("clip_grad_norm equals torch's reduction order bit for bit (L2, L1, inf)", "[clip_grad]", float,
                   double) {
  using T = TestType;
  for (double p : {2.0, 1.0, kInfNorm}) {
    for (double max_norm : {0.5, 1e9}) {  // clipping, and a coefficient of 1
      DYNAMIC_SECTION("p=" << p << " max_norm=" << max_norm) {
        auto ref = clip_grads<T>(11, 3.0);
        std::vector<Tensor> params;
        for (const auto& g : ref) {
          Tensor t = Tensor::zeros({static_cast<std::int64_t>(g.size())}, dtype_of_v<T>);
          t.set_grad(tensor_of(g));
          params.push_back(t);
        }
        params.push_back(Tensor::zeros({3}, dtype_of_v<T>));  // no gradient: left out
        const T want = ref_clip(ref, max_norm, p);
        ClipGradNormOptions o;
        o.norm_type = p;
        const double got = clip_grad_norm(params, max_norm, o);
        CHECK(same_bits(got, static_cast<double>(want)));
        for (std::size_t k = 0; k < ref.size(); ++k) DOPT_REQUIRE_BITWISE(params[k].grad(), ref[k]);
        CHECK_FALSE(params.back().grad().defined());
      }
    }
  }
}

TEST_CASE("clip_grad_norm: threads, gradient lists, groups and the per-gradient norm give the same bits", "[clip_grad]") {
  auto ref = clip_grads<float>(5, 2.0);
  std::vector<Tensor> a, b, grads;
  for (const auto& g : ref) {
    a.push_back(Tensor::zeros({static_cast<std::int64_t>(g.size())}));
    a.back().set_grad(tensor_of(g));
    b.push_back(Tensor::zeros({static_cast<std::int64_t>(g.size())}));
    b.back().set_grad(tensor_of(g));
    grads.push_back(tensor_of(g));
  }
  const double one = clip_grad_norm(a, 1.0);
  ClipGradNormOptions o;
  o.num_threads = 3;
  std::vector<OptimizerParamGroup> groups{OptimizerParamGroup(std::vector<Tensor>(b.begin(), b.begin() + 4)),
                                          OptimizerParamGroup(std::vector<Tensor>(b.begin() + 4, b.end()))};
  const double three = clip_grad_norm(groups, 1.0, o);
  const double list = clip_gradients(grads, 1.0, o);
  CHECK(same_bits(one, three));
  CHECK(same_bits(one, list));
  for (std::size_t k = 0; k < a.size(); ++k) {
    CHECK(a[k].grad().equal(b[k].grad()));
    CHECK(a[k].grad().equal(grads[k]));
  }
  CHECK(grad_norm(tensor_of(ref[9])) == static_cast<double>(ref_l2_f32(ref[9])));
}

TEST_CASE("clip_grad_norm: no gradients, bad arguments, non-finite totals", "[clip_grad]") {
  Tensor p = Tensor::zeros({4});
  CHECK(clip_grad_norm(std::vector<Tensor>{p}, 1.0) == 0.0);
  p.set_grad(Tensor::full({4}, 1.0));
  CHECK_THROWS_AS(clip_grad_norm({p}, 1.0, {.norm_type = 0.0}), ValueError);
  CHECK_THROWS_AS(clip_grad_norm({p}, std::nan(""), {}), ValueError);
  CHECK_THROWS_AS(clip_grad_norm({p}, 1.0, {.num_threads = 0}), ValueError);
  Tensor q = Tensor::zeros({3}, DType::int64);
  CHECK_THROWS_AS(clip_gradients({q}, 1.0), DTypeError);

  std::vector<float> g = {1.0f, std::numeric_limits<float>::infinity(), 2.0f};
  p = Tensor::zeros({3});
  p.set_grad(tensor_of(g));
  CHECK_THROWS_AS(clip_grad_norm({p}, 1.0, {.error_if_nonfinite = true}), ValueError);
  CHECK_THROWS_WITH(clip_grad_norm({p}, 1.0, {.error_if_nonfinite = true}), Contains("non-finite"));
  DOPT_REQUIRE_BITWISE(p.grad(), g);  // unchanged when it throws
  // without the check: torch's behaviour, the coefficient 1/(inf) = 0 clips finite values to 0
  CHECK(std::isinf(clip_grad_norm({p}, 1.0)));
  CHECK(p.grad().at(0) == 0.0);
  CHECK(std::isnan(p.grad().at(1)));  // inf * 0
}

TEST_CASE("clip_grad_norm: 16-bit gradients are summed in float32, so a large total does not overflow", "[clip_grad]") {
  // 4 elements of 60000: the float16 total (torch) would be inf (> 65504); float32 gives 120000.
  Tensor p = Tensor::zeros({4}, DType::float16);
  p.set_grad(Tensor::full({4}, 60000.0, DType::float16));
  const double total = clip_grad_norm({p}, 1000.0);
  CHECK(total == static_cast<double>(std::sqrt(4.0f * 60000.0f * 60000.0f)));
  const float coef = (1.0f / (static_cast<float>(total) + static_cast<float>(1e-6))) * 1000.0f;
  CHECK(p.grad().at(0) == static_cast<double>(static_cast<float>(Half(60000.0f * coef))));
  Tensor b = Tensor::zeros({2}, DType::bfloat16);
  b.set_grad(Tensor::full({2}, 3.0, DType::bfloat16));
  CHECK(clip_grad_norm({b}, 1.0, {.norm_type = 1.0}) == 6.0);
}
