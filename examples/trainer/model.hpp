// What the user of examples/trainer brings, not dopt: a synthetic regression
// dataset and a two-layer MLP with its hand-written forward and backward
// pass. Everything is a pure function of a seed (sample i's features and
// target, the initial parameters), so every rank builds the same dataset and
// the same model without talking to the others.
//
// Contract: a Dataset is read-only after construction (any thread); an Mlp
// belongs to one rank (the thread that runs that rank's training loop).
#pragma once
#include <algorithm>
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

/// A fully connected layer's forward pass: out = w in + b, w [rows, cols].
inline void dense(const float* w, const float* b, const float* in, float* out, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    float sum = b[r];
    for (int c = 0; c < cols; ++c) sum += w[r * cols + c] * in[c];
    out[r] = sum;
  }
}

/// Its backward pass for one sample: adds the sample's share to the
/// gradients of w and b, and (when d_in is given) the gradient of its input.
inline void dense_backward(const float* w, const float* in, const float* d_out, float* d_w, float* d_b, float* d_in,
                           int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    d_b[r] += d_out[r];
    for (int c = 0; c < cols; ++c) {
      d_w[r * cols + c] += d_out[r] * in[c];
      if (d_in) d_in[c] += w[r * cols + c] * d_out[r];
    }
  }
}

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
    const std::vector<dopt::Tensor> params = parameters();
    std::vector<dopt::Tensor> grads;
    for (const auto& p : params) grads.push_back(dopt::Tensor::zeros(p.shape()));
    std::vector<float*> g;
    for (const auto& t : grads) g.push_back(t.data<float>());
    std::vector<float> hidden(h_), d_hidden(h_);
    double loss = 0.0;
    for (const std::int64_t i : batch) {
      const float* x = data.features_of(i);
      dense(w1_.data<float>(), b1_.data<float>(), x, hidden.data(), h_, d_);
      for (float& v : hidden) v = std::tanh(v);
      float out = 0.f;
      dense(w2_.data<float>(), b2_.data<float>(), hidden.data(), &out, 1, h_);
      const float err = out - data.y[i];
      loss += double(err) * err;
      const float d_out = 2.f * err / static_cast<float>(batch.size());  // of the batch's mean
      std::fill(d_hidden.begin(), d_hidden.end(), 0.f);
      dense_backward(w2_.data<float>(), hidden.data(), &d_out, g[2], g[3], d_hidden.data(), 1, h_);
      for (int k = 0; k < h_; ++k) d_hidden[k] *= 1.f - hidden[k] * hidden[k];  // through tanh
      dense_backward(w1_.data<float>(), x, d_hidden.data(), g[0], g[1], nullptr, h_, d_);
    }
    for (std::size_t k = 0; k < params.size(); ++k) params[k].set_grad(grads[k]);
    return loss / static_cast<double>(batch.size());
  }

 private:
  int d_, h_;
  dopt::Tensor w1_, b1_, w2_, b2_;
};

}  // namespace trainer
