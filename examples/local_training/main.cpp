// Trains a small MLP (hand-written forward and backward) on a synthetic,
// learnable regression task with any of dopt's local optimizers (or Muon for
// the weight matrix with AdamW for the rest, --optim muon), saves
// the optimizer state to a safetensors checkpoint, and resumes from it.
//
//   dopt-example-local-training --optim adam --lr 1e-2 --steps 500
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "dopt/optim/adamw.hpp"
#include "dopt/optim/muon.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/runtime/state_dict.hpp"

using dopt::Tensor;

namespace {

// y = sin(x0) + 0.5 * x1 * x2 - 0.3 * x3, x ~ N(0, 1)
struct Data {
  std::vector<float> x, y;
  int n, d;
};

Data make_data(int n, int d, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  Data data{std::vector<float>(static_cast<size_t>(n) * d), std::vector<float>(n), n, d};
  for (int i = 0; i < n; ++i) {
    float* xi = &data.x[static_cast<size_t>(i) * d];
    for (int j = 0; j < d; ++j) xi[j] = nd(rng);
    data.y[i] = std::sin(xi[0]) + 0.5f * xi[1] * xi[2] - 0.3f * xi[3];
  }
  return data;
}

// A 2-layer MLP: h = tanh(W1 x + b1), out = w2 . h + b2.
struct Mlp {
  int d, h;
  Tensor w1, b1, w2, b2;
  Mlp(int d_, int h_, unsigned seed) : d(d_), h(h_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> v1(static_cast<size_t>(h) * d), v2(h);
    for (auto& v : v1) v = nd(rng) / std::sqrt(float(d));
    for (auto& v : v2) v = nd(rng) / std::sqrt(float(h));
    w1 = Tensor::from_vector(v1, {h, d});
    b1 = Tensor::zeros({h});
    w2 = Tensor::from_vector(v2, {h});
    b2 = Tensor::zeros({1});
  }
  std::vector<Tensor> params() const { return {w1, b1, w2, b2}; }

  // Mean squared error over the batch; writes the gradients into the params' grad slots.
  double forward_backward(const Data& data) {
    std::vector<Tensor> grads;
    for (auto& p : params()) grads.push_back(Tensor::zeros(p.shape()));
    const float* W1 = w1.data<float>();
    const float* B1 = b1.data<float>();
    const float* W2 = w2.data<float>();
    const float B2 = b2.data<float>()[0];
    float* gW1 = grads[0].data<float>();
    float* gB1 = grads[1].data<float>();
    float* gW2 = grads[2].data<float>();
    float* gB2 = grads[3].data<float>();
    std::vector<float> hid(h);
    double loss = 0;
    const float scale = 2.0f / data.n;
    for (int i = 0; i < data.n; ++i) {
      const float* x = &data.x[static_cast<size_t>(i) * d];
      float out = B2;
      for (int k = 0; k < h; ++k) {
        float a = B1[k];
        for (int j = 0; j < d; ++j) a += W1[k * d + j] * x[j];
        hid[k] = std::tanh(a);
        out += W2[k] * hid[k];
      }
      const float err = out - data.y[i];
      loss += double(err) * err;
      const float dout = scale * err;
      gB2[0] += dout;
      for (int k = 0; k < h; ++k) {
        gW2[k] += dout * hid[k];
        const float da = dout * W2[k] * (1.f - hid[k] * hid[k]);
        gB1[k] += da;
        for (int j = 0; j < d; ++j) gW1[k * d + j] += da * x[j];
      }
    }
    auto ps = params();
    for (size_t k = 0; k < ps.size(); ++k) ps[k].set_grad(grads[k]);
    return loss / data.n;
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dopt example: train an MLP with a local optimizer"};
  std::string optim = "adam";
  double lr = -1;
  int steps = 500, hidden = 32, samples = 256;
  std::string checkpoint = "";
  bool check = false, quiet = false;
  app.add_option("--optim", optim, "sgd|adam|adamw|adagrad|rmsprop|adamax|adadelta|rprop|nadam|radam|muon")->capture_default_str();
  app.add_option("--lr", lr, "learning rate (default: a sensible one per optimizer)");
  app.add_option("--steps", steps, "optimizer steps")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--hidden", hidden, "hidden units")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--samples", samples, "training samples")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--checkpoint", checkpoint, "save the optimizer state here at the end (safetensors)");
  app.add_flag("--check-loss-falls", check, "exit 1 unless the final loss is below a quarter of the first");
  app.add_flag("--quiet", quiet, "print only the summary");
  CLI11_PARSE(app, argc, argv);

  static const std::map<std::string, double> default_lr = {
      {"sgd", 0.1}, {"adam", 1e-2}, {"adamw", 1e-2}, {"adagrad", 0.1},
      {"rmsprop", 3e-3}, {"adamax", 2e-2}, {"adadelta", 1.0}, {"rprop", 1e-3}, {"nadam", 1e-2}, {"radam", 1e-2},
      {"muon", 2e-2}};
  try {
    auto it = default_lr.find(optim);
    dopt::optim::OptimizerSpec spec{optim, {}};
    if (lr > 0) spec.hyperparameters["lr"] = lr;
    else if (it != default_lr.end()) spec.hyperparameters["lr"] = it->second;
    if (optim == "sgd") spec.hyperparameters["momentum"] = 0.9;

    Data data = make_data(samples, 8, 1234);
    Mlp model(8, hidden, 42);
    std::unique_ptr<dopt::optim::Optimizer> opt, aux;
    if (optim == "muon") {
      // Muon takes the weight matrix; the vectors (biases, the output
      // weights) go to AdamW, as one sets Muon up for any model.
      opt = std::make_unique<dopt::optim::Muon>(std::vector<Tensor>{model.w1},
                                                dopt::optim::MuonOptions(hyper_number(spec.hyperparameters, "lr", "example")));
      aux = std::make_unique<dopt::optim::AdamW>(std::vector<Tensor>{model.b1, model.w2, model.b2},
                                                 dopt::optim::AdamWOptions(1e-2));
    } else {
      opt = dopt::optim::make_optimizer(spec, {dopt::optim::OptimizerParamGroup(model.params())});
    }
    double first = 0, last = 0;
    for (int s = 0; s < steps; ++s) {
      opt->zero_grad(true);
      if (aux) aux->zero_grad(true);
      last = model.forward_backward(data);
      if (s == 0) first = last;
      opt->step();
      if (aux) aux->step();
      if (!quiet && (s % std::max(1, steps / 10) == 0 || s == steps - 1))
        std::printf("step %5d  loss %.6f\n", s, last);
    }
    std::printf("%s: loss %.6f -> %.6f after %d steps\n", opt->name().c_str(), first, last, steps);
    if (!checkpoint.empty()) {
      dopt::save_state_dict(opt->state_dict(), checkpoint);
      std::printf("optimizer state saved to %s\n", checkpoint.c_str());
    }
    if (check && !(last < 0.25 * first)) {
      std::fprintf(stderr, "loss did not fall enough: %.6f -> %.6f\n", first, last);
      return 1;
    }
  } catch (const dopt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
