// What the user of examples/trainer brings, not dopt: a synthetic regression
// dataset and a two-layer MLP with its hand-written forward and backward
// pass. Everything is a pure function of a seed (sample i's features and
// target, the initial parameters), so every rank builds the same dataset and
// the same model without talking to the others.
//
// Contract: a Dataset is read-only after construction (any thread); an Mlp
// belongs to one rank (the thread that runs that rank's training loop).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dopt/runtime/tensor.hpp"

namespace trainer {

/// A number in [-1, 1), a pure function of (seed, stream, i): splitmix64's
/// finaliser over the three, so that any rank can draw any element.
inline float uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t i) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + stream * 0xD1B54A32D192ED03ull + i * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 40) / double(1ull << 23) - 1.0);
}

/// `size` samples of `features` numbers each in [-1, 1), and their targets
/// y = sin(2 t.x), with a teacher vector t drawn from the seed too.
struct Dataset {
  Dataset(std::int64_t size, int features_per_sample, std::uint64_t seed) : features(features_per_sample) {
    std::vector<float> teacher(features);
    for (int j = 0; j < features; ++j) teacher[j] = uniform(seed, 1, j);
    x.resize(static_cast<std::size_t>(size) * features);
    y.resize(size);
    for (std::int64_t i = 0; i < size; ++i) {
      float dot = 0.f;
      for (int j = 0; j < features; ++j) {
        const float v = uniform(seed, 2, static_cast<std::uint64_t>(i) * features + j);
        x[static_cast<std::size_t>(i) * features + j] = v;
        dot += teacher[j] * v;
      }
      y[i] = std::sin(2.f * dot);
    }
  }
  const float* features_of(std::int64_t i) const { return &x[static_cast<std::size_t>(i) * features]; }

  int features;
  std::vector<float> x, y;
};

/// out = fc2.weight . tanh(fc1.weight x + fc1.bias) + fc2.bias, in float32.
class Mlp {
 public:
  Mlp(int features, int hidden, std::uint64_t seed)
      : d_(features),
        h_(hidden),
        w1_(dopt::Tensor::zeros({hidden, features})),
        b1_(dopt::Tensor::zeros({hidden})),
        w2_(dopt::Tensor::zeros({1, hidden})),
        b2_(dopt::Tensor::zeros({1})) {
    float* w1 = w1_.data<float>();
    for (int k = 0; k < h_ * d_; ++k) w1[k] = uniform(seed, 3, k) / std::sqrt(float(d_));
    float* w2 = w2_.data<float>();
    for (int k = 0; k < h_; ++k) w2[k] = uniform(seed, 4, k) / std::sqrt(float(h_));
  }

  /// The parameters, in a fixed order (the optimizer's and the digest's).
  std::vector<dopt::Tensor> parameters() const { return {w1_, b1_, w2_, b2_}; }
  /// The same tensors by name (what a checkpoint stores).
  std::map<std::string, dopt::Tensor> named_parameters() const {
    return {{"fc1.weight", w1_}, {"fc1.bias", b1_}, {"fc2.weight", w2_}, {"fc2.bias", b2_}};
  }

  /// The mean squared error over the samples `batch` of `data`; sets every
  /// parameter's gradient to the gradient of that mean.
  double forward_backward(const Dataset& data, const std::vector<std::int64_t>& batch) const {
    std::vector<dopt::Tensor> grads;
    for (const auto& p : parameters()) grads.push_back(dopt::Tensor::zeros(p.shape()));
    const float* W1 = w1_.data<float>();
    const float* B1 = b1_.data<float>();
    const float* W2 = w2_.data<float>();
    const float B2 = b2_.data<float>()[0];
    float* gW1 = grads[0].data<float>();
    float* gB1 = grads[1].data<float>();
    float* gW2 = grads[2].data<float>();
    float* gB2 = grads[3].data<float>();
    std::vector<float> hid(h_);
    double loss = 0.0;
    const float scale = 2.f / static_cast<float>(batch.size());
    for (const std::int64_t i : batch) {
      const float* x = data.features_of(i);
      float out = B2;
      for (int k = 0; k < h_; ++k) {
        float a = B1[k];
        for (int j = 0; j < d_; ++j) a += W1[k * d_ + j] * x[j];
        hid[k] = std::tanh(a);
        out += W2[k] * hid[k];
      }
      const float err = out - data.y[i];
      loss += double(err) * err;
      const float dout = scale * err;
      gB2[0] += dout;
      for (int k = 0; k < h_; ++k) {
        gW2[k] += dout * hid[k];
        const float da = dout * W2[k] * (1.f - hid[k] * hid[k]);
        gB1[k] += da;
        for (int j = 0; j < d_; ++j) gW1[k * d_ + j] += da * x[j];
      }
    }
    const auto params = parameters();
    for (std::size_t k = 0; k < params.size(); ++k) params[k].set_grad(grads[k]);
    return loss / static_cast<double>(batch.size());
  }

 private:
  int d_, h_;
  dopt::Tensor w1_, b1_, w2_, b2_;
};

}  // namespace trainer
