// Muon (torch 2.9's algorithm): against a plain transcription of torch's
// _single_tensor_muon with a textbook matrix product, the options and their
// checks, the functional form, the registry, state dicts, the count of
// orthogonalisations, and the float32 / bfloat16 Newton-Schulz against float64.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "dopt/optim/functional.hpp"
#include "dopt/optim/muon.hpp"
#include "dopt/optim/registry.hpp"
#include "newton_schulz.hpp"
#include "bitwise_checks.hpp"
#include "reference_data.hpp"

using namespace dopt;
using namespace dopt::optim;
using dopt::testing::values;
using Catch::Matchers::Contains;

namespace {

using Mat = std::vector<double>;  // row-major

Mat matmul(const Mat& a, const Mat& b, std::int64_t n, std::int64_t k, std::int64_t m) {
  Mat c(static_cast<std::size_t>(n * m), 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < m; ++j) {
      double s = 0;
      for (std::int64_t l = 0; l < k; ++l) s += a[i * k + l] * b[l * m + j];
      c[i * m + j] = s;
    }
  return c;
}

Mat transpose(const Mat& a, std::int64_t n, std::int64_t m) {
  Mat t(a.size());
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < m; ++j) t[j * n + i] = a[i * m + j];
  return t;
}

// torch's _zeropower_via_newtonschulz in float64, written out.
Mat ref_ns(Mat x, std::int64_t rows, std::int64_t cols, Triple abc, int steps, double eps) {
  const bool tall = rows > cols;
  std::int64_t n = rows, m = cols;
  if (tall) x = transpose(x, rows, cols), std::swap(n, m);
  double ss = 0;
  for (double v : x) ss += v * v;
  const double norm = std::max(std::sqrt(ss), eps);
  for (double& v : x) v /= norm;
  for (int s = 0; s < steps; ++s) {
    const Mat g = matmul(x, transpose(x, n, m), n, m, n);
    const Mat gg = matmul(g, g, n, n, n);
    Mat u(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) u[i] = abc[1] * g[i] + abc[2] * gg[i];
    const Mat ux = matmul(u, x, n, n, m);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = abc[0] * x[i] + ux[i];
  }
  return tall ? transpose(x, n, m) : x;
}

// torch's _single_tensor_muon for one parameter, float64.
struct RefMuon {
  MuonOptions o;
  std::int64_t rows, cols;
  Mat buf;
  void operator()(Mat& p, const Mat& g) {
    if (buf.empty()) buf.assign(p.size(), 0.0);
    auto lerp = [](double s, double e, double w) {
      return std::abs(w) < 0.5 ? std::fma(w, e - s, s) : std::fma(w - 1, e - s, e);
    };
    Mat u(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      buf[i] = lerp(buf[i], g[i], 1 - o.momentum());
      u[i] = o.nesterov() ? lerp(g[i], buf[i], o.momentum()) : buf[i];
    }
    const Mat out = ref_ns(u, rows, cols, o.ns_coefficients(), static_cast<int>(o.ns_steps()), o.eps());
    const double ratio = o.adjust_lr_fn() == "original" ? std::sqrt(std::max(1.0, double(rows) / double(cols)))
                                                        : 0.2 * std::sqrt(double(std::max(rows, cols)));
    for (std::size_t i = 0; i < p.size(); ++i)
      p[i] = std::fma(-o.lr() * ratio, out[i], p[i] * (1 - o.lr() * o.weight_decay()));
  }
};

double max_abs_diff(const Tensor& a, const Mat& b) {
  const auto av = a.to(DType::float64).to_vector<double>();
  double m = 0;
  for (std::size_t i = 0; i < b.size(); ++i) m = std::max(m, std::abs(av[i] - b[i]));
  return m;
}

double max_abs(const Mat& b) {
  double m = 0;
  for (double v : b) m = std::max(m, std::abs(v));
  return m;
}

Tensor mat_tensor(const Mat& v, std::int64_t r, std::int64_t c) { return Tensor::from_vector(v, {r, c}); }

}  // namespace

TEST_CASE("Muon Newton-Schulz equals the textbook iteration (wide, tall, square, tiny norm)", "[muon]") {
  const Triple abc{3.4445, -4.775, 2.0315};
  for (auto [r, c] : std::vector<std::pair<int, int>>{{7, 12}, {12, 7}, {9, 9}, {1, 5}, {5, 1}}) {
    INFO(r << "x" << c);
    const Mat u = values<double>(static_cast<std::size_t>(r * c), 40 + static_cast<std::uint64_t>(r * c), 3.0);
    const Tensor o = muon_newton_schulz(mat_tensor(u, r, c), abc, 5, 1e-7);
    const Mat ref = ref_ns(u, r, c, abc, 5, 1e-7);
    CHECK(max_abs_diff(o, ref) <= 1e-13 * std::max(1.0, max_abs(ref)));
  }
  // Below eps the norm is clamped: X / eps, not X / (||X|| + eps).
  const Mat tiny = values<double>(12, 5, 1e-10);
  const Tensor o = muon_newton_schulz(mat_tensor(tiny, 3, 4), abc, 2, 1e-7);
  CHECK(max_abs_diff(o, ref_ns(tiny, 3, 4, abc, 2, 1e-7)) <= 1e-20);
  // A zero matrix stays zero (0 / eps).
  CHECK(muon_newton_schulz(Tensor::zeros({3, 4}, DType::float64), abc, 5, 1e-7).equal(Tensor::zeros({3, 4}, DType::float64)));
  CHECK_THROWS_AS(muon_newton_schulz(Tensor::zeros({3}, DType::float64), abc, 5, 1e-7), ValueError);
  CHECK_THROWS_AS(muon_newton_schulz(Tensor::zeros({3, 3}, DType::float64), abc, 5, 1e-7, "float16"), ValueError);
}

TEST_CASE("Muon Newton-Schulz of a transposed matrix is the transposed result, bit for bit", "[muon]") {
  const Triple abc{3.4445, -4.775, 2.0315};
  const Mat u = values<double>(6 * 11, 3, 1.0);
  const Tensor wide = muon_newton_schulz(mat_tensor(u, 6, 11), abc, 5, 1e-7);
  const Tensor tall = muon_newton_schulz(mat_tensor(transpose(u, 6, 11), 11, 6), abc, 5, 1e-7);
  CHECK(tall.equal(mat_tensor(transpose(wide.to_vector<double>(), 6, 11), 11, 6)));
}

TEST_CASE("Muon step equals torch's single-tensor algorithm (float64)", "[muon]") {
  struct Case {
    MuonOptions o;
    std::int64_t r, c;
  };
  std::vector<Case> cases{
      {MuonOptions(), 16, 24},
      {MuonOptions(0.02).weight_decay(0.05), 40, 8},
      {MuonOptions(0.01).momentum(0.8).nesterov(false).adjust_lr_fn("match_rms_adamw").weight_decay(0.0), 8, 40},
      {MuonOptions(0.02).ns_coefficients({1.875, -1.25, 0.375}).ns_steps(3).momentum(0.0), 9, 9},
  };
  for (auto& tc : cases) {
    INFO(tc.r << "x" << tc.c << " nesterov " << tc.o.nesterov() << " momentum " << tc.o.momentum());
    Mat ref_p = values<double>(static_cast<std::size_t>(tc.r * tc.c), 77, 1.0);
    Tensor p = mat_tensor(ref_p, tc.r, tc.c);
    Muon opt(std::vector<Tensor>{p}, tc.o);
    RefMuon ref{tc.o, tc.r, tc.c, {}};
    for (int t = 0; t < 6; ++t) {
      const Mat g = values<double>(ref_p.size(), 500 + static_cast<std::uint64_t>(t), 2.0);
      p.set_grad(mat_tensor(g, tc.r, tc.c));
      opt.step();
      ref(ref_p, g);
      INFO("step " << t);
      CHECK(max_abs_diff(p, ref_p) <= 1e-13);
      // The moving average is elementwise: bit for bit.
      DOPT_REQUIRE_BITWISE(opt.state().at(p.key()).at("momentum_buffer"), ref.buf);
    }
    CHECK(opt.state().at(p.key()).size() == 1);  // momentum_buffer only, no step
  }
}

TEST_CASE("Muon options: defaults, hyperparameters, torch's checks", "[muon]") {
  MuonOptions d;
  CHECK(d.lr() == 1e-3);
  CHECK(d.weight_decay() == 0.1);
  CHECK(d.momentum() == 0.95);
  CHECK(d.nesterov());
  CHECK(d.ns_coefficients() == Triple{3.4445, -4.775, 2.0315});
  CHECK(d.eps() == 1e-7);
  CHECK(d.ns_steps() == 5);
  CHECK(d.adjust_lr_fn() == "original");
  CHECK(d.ns_dtype() == "float64");

  MuonOptions o = MuonOptions(0.02).ns_steps(3).adjust_lr_fn("match_rms_adamw").ns_dtype("bfloat16");
  MuonOptions back;
  back.set_hyperparams(o.to_hyperparams());
  CHECK(back.to_hyperparams() == o.to_hyperparams());
  const auto spec = OptimizerSpec::from_json(OptimizerSpec{"Muon", o.to_hyperparams()}.to_json());
  CHECK(make_options(spec)->to_hyperparams() == o.to_hyperparams());

  CHECK_THROWS_WITH(MuonOptions(-1.0).validate("Muon"), Contains("Learning rate should be >= 0 but is: -1.0"));
  CHECK_THROWS_WITH(MuonOptions().momentum(-0.1).validate("Muon"), Contains("momentum should be >= 0"));
  CHECK_THROWS_WITH(MuonOptions().weight_decay(-0.1).validate("Muon"), Contains("weight decay should be >= 0"));
  CHECK_THROWS_WITH(MuonOptions().adjust_lr_fn("spectral").validate("Muon"),
                    Contains("Adjust learning rate function spectral is not supported"));
  CHECK_THROWS_AS(MuonOptions().ns_dtype("float16").validate("Muon"), ValueError);
  MuonOptions bad;
  CHECK_THROWS_AS(bad.set_hyperparams({{"ns_steps", 2.5}}), ValueError);
  CHECK_THROWS_AS(bad.set_hyperparams({{"ns_coefficients", std::vector<double>{1, 2}}}), TypeError);
  CHECK_THROWS_AS(bad.set_hyperparams({{"foreach", true}}), ValueError);
  CHECK(Muon::lr_ratio("original", 40, 8) == std::sqrt(5.0));
  CHECK(Muon::lr_ratio("original", 8, 40) == 1.0);
  CHECK(Muon::lr_ratio("match_rms_adamw", 8, 40) == 0.2 * std::sqrt(40.0));
}

TEST_CASE("Muon takes matrices only: other tensors are refused before anything changes", "[muon]") {
  Tensor m = Tensor::zeros({3, 4}, DType::float32), v = Tensor::zeros({4}, DType::float32);
  CHECK_THROWS_WITH(Muon(std::vector<Tensor>{m, v}),
                    Contains("Muon only supports 2D parameters whereas we found a parameter with size: torch.Size([4])"));
  Muon opt(std::vector<Tensor>{m});
  CHECK_THROWS_AS(opt.add_param_group(OptimizerParamGroup({Tensor::zeros({2, 2, 2}, DType::float32)})), ValueError);
  CHECK(opt.param_groups().size() == 1);
  CHECK_THROWS_AS(FunctionalMuon(std::vector<Tensor>{v}), ValueError);
  CHECK_THROWS_AS(make_optimizer(OptimizerSpec{"Muon", {}}, {OptimizerParamGroup({v})}), ValueError);
}

TEST_CASE("Muon: functional form and registry give the class's bits, one orthogonalisation per matrix per step",
          "[muon]") {
  const MuonOptions o = MuonOptions(0.05).weight_decay(0.01);
  auto make = [] {
    return std::vector<Tensor>{Tensor::from_vector(values<float>(6 * 10, 1), {6, 10}),
                               Tensor::from_vector(values<float>(12 * 5, 2), {12, 5}),
                               Tensor::from_vector(values<float>(4 * 4, 3), {4, 4})};
  };
  auto a = make(), b = make(), c = make();
  Muon cls(a, o);
  FunctionalMuon fn(b, o);
  auto reg = make_optimizer(OptimizerSpec{"muon", o.to_hyperparams()}, {OptimizerParamGroup(c)});
  CHECK(reg->name() == "Muon");
  const std::int64_t before = muon_orthogonalizations();
  for (int t = 0; t < 4; ++t) {
    std::vector<Tensor> grads;
    for (std::size_t i = 0; i < a.size(); ++i) {
      // Parameter 2 has no gradient at steps 1 and 2: skipped, no orthogonalisation.
      Tensor g = (i == 2 && (t == 1 || t == 2))
                     ? Tensor()
                     : Tensor::from_vector(values<float>(static_cast<std::size_t>(a[i].numel()), 90 + 10 * t + i),
                                           a[i].shape());
      a[i].set_grad(g.defined() ? g.clone() : Tensor());
      c[i].set_grad(g.defined() ? g.clone() : Tensor());
      grads.push_back(g);
    }
    cls.step();
    fn.step(grads);
    reg->step();
  }
  CHECK(muon_orthogonalizations() - before == 3 * (3 * 4 - 2));
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].equal(b[i]));
    CHECK(a[i].equal(c[i]));
  }
}

TEST_CASE("Muon state_dict round trip continues bit for bit", "[muon]") {
  auto make_params = [] {
    return std::vector<Tensor>{Tensor::from_vector(values<double>(5 * 7, 4), {5, 7}),
                               Tensor::from_vector(values<double>(9 * 3, 5), {9, 3})};
  };
  auto grad = [](const Tensor& p, int t, std::size_t i) {
    return Tensor::from_vector(values<double>(static_cast<std::size_t>(p.numel()), 300 + 7 * t + i), p.shape());
  };
  const MuonOptions o = MuonOptions(0.03).nesterov(false);
  auto full = make_params();
  Muon whole({OptimizerParamGroup({full[0]}), OptimizerParamGroup({full[1]}, MuonOptions(0.01))}, o);
  auto first = make_params();
  Muon before({OptimizerParamGroup({first[0]}), OptimizerParamGroup({first[1]}, MuonOptions(0.01))}, o);
  for (int t = 0; t < 6; ++t) {
    for (std::size_t i = 0; i < 2; ++i) full[i].set_grad(grad(full[i], t, i));
    whole.step();
    if (t < 3) {
      for (std::size_t i = 0; i < 2; ++i) first[i].set_grad(grad(first[i], t, i));
      before.step();
    }
  }
  const StateDict sd = before.state_dict();
  auto resumed = std::vector<Tensor>{first[0].clone(), first[1].clone()};
  // Fresh optimizer with other hyperparameters: they come from the dict.
  Muon after({OptimizerParamGroup({resumed[0]}), OptimizerParamGroup({resumed[1]})}, MuonOptions(0.5));
  after.load_state_dict(sd);
  CHECK(after.param_groups()[1].options_as<MuonOptions>().lr() == 0.01);
  for (int t = 3; t < 6; ++t) {
    for (std::size_t i = 0; i < 2; ++i) resumed[i].set_grad(grad(resumed[i], t, i));
    after.step();
  }
  CHECK(resumed[0].equal(full[0]));
  CHECK(resumed[1].equal(full[1]));
}

TEST_CASE("Muon Newton-Schulz precisions: float32 and bfloat16 against float64", "[muon]") {
  const Triple abc{3.4445, -4.775, 2.0315};
  // Tolerances stated in docs/optimizers.md: the largest elementwise
  // difference from the float64 result, relative to its largest element.
  for (auto [r, c] : std::vector<std::pair<int, int>>{{64, 96}, {96, 64}, {128, 128}, {32, 512}}) {
    INFO(r << "x" << c);
    const Mat u = values<double>(static_cast<std::size_t>(r * c), 11 + static_cast<std::uint64_t>(r), 1.0);
    const Tensor ref = muon_newton_schulz(mat_tensor(u, r, c), abc, 5, 1e-7, "float64");
    const Mat refv = ref.to_vector<double>();
    const double scale = max_abs(refv);
    const Tensor u32 = mat_tensor(u, r, c).to(DType::float32);
    const double e32 = max_abs_diff(muon_newton_schulz(u32, abc, 5, 1e-7, "float32"), refv) / scale;
    const double e16 = max_abs_diff(muon_newton_schulz(u32, abc, 5, 1e-7, "bfloat16"), refv) / scale;
    const double e64from32 = max_abs_diff(muon_newton_schulz(u32, abc, 5, 1e-7, "float64"), refv) / scale;
    CAPTURE(e32, e16, e64from32);
    CHECK(e32 <= 1e-5);
    CHECK(e16 <= 0.06);
    CHECK(e16 > 1e-4);  // it really ran in bfloat16
    CHECK(e64from32 <= 1e-5);
  }
  // bfloat16 keeps 7 fraction bits: next to 1 the spacing is 1/128.
  CHECK(detail::round_to_bfloat16(1.0f + 1.0f / 256) == 1.0f);              // tie: to even (down)
  CHECK(detail::round_to_bfloat16(1.0f + 3.0f / 256) == 1.0f + 1.0f / 64);  // tie: to even (up)
  CHECK(detail::round_to_bfloat16(1.0f + 3.0f / 512) == 1.0f + 1.0f / 128);
  CHECK(detail::round_to_bfloat16(3.14159f) == 3.140625f);
}

TEST_CASE("Muon with ns_dtype bfloat16 trains like float64 within the stated tolerance", "[muon]") {
  auto run = [](const std::string& dtype) {
    Tensor p = Tensor::from_vector(values<float>(48 * 80, 8), {48, 80});
    Muon opt(std::vector<Tensor>{p}, MuonOptions(0.02).ns_dtype(dtype));
    for (int t = 0; t < 5; ++t) {
      p.set_grad(Tensor::from_vector(values<float>(48 * 80, 900 + t), {48, 80}));
      opt.step();
    }
    return p.to(DType::float64).to_vector<double>();
  };
  const Mat a = run("float64"), b = run("bfloat16");
  double diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(a[i] - b[i]));
  // 5 steps of lr 0.02: bfloat16's O is within 0.06 * max|O| of float64's at each step.
  CAPTURE(diff);
  CHECK(diff <= 1e-3);
  CHECK(diff > 0.0);
}

TEST_CASE("Muon refuses parameters off the CPU and non-float dtypes", "[muon]") {
  Tensor p = Tensor::zeros({2, 3}, DType::float64);
  ParamState st;
  Muon::init_param_state(MuonOptions(), p, st);
  ParamState empty;
  CHECK_THROWS_AS(Muon::update_param(MuonOptions(), p, p, empty), StateError);
  ParamState wrong{{"momentum_buffer", Tensor::zeros({3, 2}, DType::float64)}};
  CHECK_THROWS_AS(Muon::update_param(MuonOptions(), p, p, wrong), StateError);
}
