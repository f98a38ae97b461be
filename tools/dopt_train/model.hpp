#pragma once
// dopt-train's model and data: a small MLP with a hand-written forward and
// backward pass, and a synthetic, learnable classification data set.
//
// Data: `samples` points x ~ N(0, I) in R^input_dim, labelled by a fixed random
// "teacher" network (argmax of W2 tanh(W1 x)), all drawn from --seed. Rank r of
// N owns the samples i with i % N == r (its shard). The order in which a rank
// visits its shard is a pure function of (seed, epoch, rank): every epoch is a
// fresh permutation, and step s reads batch s % batches_per_epoch of epoch
// s / batches_per_epoch. So a run resumed at step s sees exactly the batches an
// uninterrupted run sees, with no RNG state to save.
//
// Model: input -> tanh(fc1) -> ... -> tanh(fc{L}) -> fc{L+1} -> softmax cross-entropy.
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dopt/runtime/tensor.hpp"

namespace dopt_train {

using dopt::Tensor;

/// splitmix64: the seed mixer of every RNG here.
inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline std::uint64_t mix(std::uint64_t a, std::uint64_t b) { return mix(mix(a) ^ (b + 0x632be59bd9b4e019ull)); }

struct DataSpec {
  int input_dim = 32;
  int classes = 10;
  int samples = 16384;
  std::uint64_t seed = 0;
};

/// One rank's shard of the data set.
class Shard {
 public:
  Shard(const DataSpec& spec, int rank, int world_size) : spec_(spec), rank_(rank) {
    const int d = spec.input_dim, c = spec.classes, th = 32;
    // The teacher: the same on every rank (drawn from the seed only).
    std::mt19937_64 trng(mix(spec.seed, 0x7eac4e7));
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> t1(static_cast<std::size_t>(th) * d), t2(static_cast<std::size_t>(c) * th);
    for (float& v : t1) v = nd(trng) * 1.5f / std::sqrt(float(d));
    for (float& v : t2) v = nd(trng) * 2.f / std::sqrt(float(th));
    std::vector<float> x(static_cast<std::size_t>(d)), h(static_cast<std::size_t>(th));
    for (int i = rank; i < spec.samples; i += world_size) {
      std::mt19937_64 srng(mix(spec.seed, 0x5a3f1e00000000ull + static_cast<std::uint64_t>(i)));
      for (float& v : x) v = nd(srng);
      for (int k = 0; k < th; ++k) {
        float a = 0;
        for (int j = 0; j < d; ++j) a += t1[static_cast<std::size_t>(k) * d + j] * x[j];
        h[k] = std::tanh(a);
      }
      int best = 0;
      float best_v = -1e30f;
      for (int o = 0; o < c; ++o) {
        float z = 0;
        for (int k = 0; k < th; ++k) z += t2[static_cast<std::size_t>(o) * th + k] * h[k];
        if (z > best_v) best_v = z, best = o;
      }
      x_.insert(x_.end(), x.begin(), x.end());
      y_.push_back(best);
    }
  }

  int size() const { return static_cast<int>(y_.size()); }
  const float* x(int i) const { return &x_[static_cast<std::size_t>(i) * spec_.input_dim]; }
  int y(int i) const { return y_[static_cast<std::size_t>(i)]; }

  /// The local sample indices of `step`'s batch (pure function of seed, step, rank).
  std::vector<int> batch(std::int64_t step, int batch_size) {
    const std::int64_t per_epoch = size() / batch_size;
    const std::int64_t epoch = step / per_epoch, k = step % per_epoch;
    if (epoch != perm_epoch_) {
      perm_.resize(static_cast<std::size_t>(size()));
      for (int i = 0; i < size(); ++i) perm_[static_cast<std::size_t>(i)] = i;
      std::uint64_t s = mix(mix(spec_.seed, 0xe90c000000ull + static_cast<std::uint64_t>(epoch)),
                            static_cast<std::uint64_t>(rank_));
      for (int i = size() - 1; i > 0; --i) {  // Fisher-Yates with our own generator: portable
        s = mix(s);
        const int j = static_cast<int>(s % static_cast<std::uint64_t>(i + 1));
        std::swap(perm_[static_cast<std::size_t>(i)], perm_[static_cast<std::size_t>(j)]);
      }
      perm_epoch_ = epoch;
    }
    return {perm_.begin() + k * batch_size, perm_.begin() + (k + 1) * batch_size};
  }

 private:
  DataSpec spec_;
  int rank_;
  std::vector<float> x_;
  std::vector<int> y_;
  std::vector<int> perm_;
  std::int64_t perm_epoch_ = -1;
};

/// Where layer l's weight and bias come from when the model does not hold
/// them (ZeRO stage 3: strategy_stage3.cpp gathers them). Called on the
/// rank's thread, layer by layer: acquire(l) before layer l's forward (l
/// rising) or backward (l falling), done(l) right after it; in the backward
/// gradients(l) once the input's gradient is computed, before the weight's
/// and the bias's (which need no parameters), which are written there; with
/// undefined ones they are w.grad() and b.grad() when done(l) runs.
struct LayerSource {
  virtual ~LayerSource() = default;
  virtual std::pair<Tensor, Tensor> acquire(int layer, bool backward) = 0;
  /// Where the weight's and the bias's gradients go, zeros in their shapes
  /// (stage 3: the memory of the layer's gathered parameters, which are not
  /// read after it; ready() is not called for them); undefined tensors: the
  /// model allocates them, sets them as w's and b's grad and calls ready().
  virtual std::pair<Tensor, Tensor> gradients(int /*layer*/) { return {}; }
  virtual void done(int layer, bool backward, const Tensor& w, const Tensor& b) = 0;
};

/// What one forward + backward pass measured on this rank's batch.
struct BatchResult {
  double loss = 0;  // mean cross-entropy over the batch
  int correct = 0;  // argmax == label
};

class Mlp {
 public:
  /// `layers` hidden layers of `hidden` units. Same seed -> same initial
  /// parameters on every rank.
  Mlp(int input_dim, int hidden, int layers, int classes, std::uint64_t seed)
      : d_(input_dim), h_(hidden), layers_(layers), c_(classes) {
    std::mt19937_64 rng(mix(seed, 0x1417));
    std::normal_distribution<float> nd(0.f, 1.f);
    auto add = [&](int out, int in) {
      std::vector<float> w(static_cast<std::size_t>(out) * in);
      for (float& v : w) v = nd(rng) / std::sqrt(float(in));
      const std::string name = "fc" + std::to_string(params_.size() / 2 + 1);
      params_.push_back(Tensor::from_vector(w, {out, in}));
      params_.push_back(Tensor::zeros({out}));
      numel_ += static_cast<std::int64_t>(out) * in + out;
      names_.push_back(name + ".weight");
      names_.push_back(name + ".bias");
    };
    add(h_, d_);
    for (int l = 1; l < layers_; ++l) add(h_, h_);
    add(c_, h_);
  }

  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  /// The parameters by name ("fc1.weight", ...), sharing their storage.
  std::map<std::string, Tensor> named_params() const {
    std::map<std::string, Tensor> out;
    for (std::size_t i = 0; i < params_.size(); ++i) out.emplace(names_[i], params_[i]);
    return out;
  }
  std::int64_t numel() const { return numel_; }
  /// The layers: hidden ones and the output layer (weight and bias each).
  int num_layers() const { return layers_ + 1; }
  /// Drops the parameters' memory (a LayerSource supplies them from now
  /// on); params() then holds undefined tensors.
  void release_params() {
    for (Tensor& p : params_) p = Tensor();
  }
  std::string describe() const {
    std::string s = std::to_string(d_);
    for (int l = 0; l < layers_; ++l) s += "-" + std::to_string(h_);
    return s + "-" + std::to_string(c_);
  }

  /// Forward and backward over `idx` of `data`: sets every parameter's grad to
  /// the gradient of the batch's mean loss and calls ready(p) for each, in the
  /// order a backward pass produces them (last layer first), so a gradient
  /// reducer can start averaging the last layers while the first ones are
  /// still being computed.
  /// With `source`, each layer's weight and bias come from it.
  BatchResult forward_backward(const Shard& data, const std::vector<int>& idx,
                               const std::function<void(const Tensor&)>& ready, LayerSource* source = nullptr) {
    auto layer = [&](int l, bool backward) {
      return source ? source->acquire(l, backward)
                    : std::pair<Tensor, Tensor>(params_[2 * static_cast<std::size_t>(l)],
                                                params_[2 * static_cast<std::size_t>(l) + 1]);
    };
    const int B = static_cast<int>(idx.size());
    // acts[0] = input, acts[l] = tanh output of hidden layer l.
    std::vector<std::vector<float>> acts(static_cast<std::size_t>(layers_) + 1);
    acts[0].resize(static_cast<std::size_t>(B) * d_);
    for (int b = 0; b < B; ++b) std::copy_n(data.x(idx[b]), d_, &acts[0][static_cast<std::size_t>(b) * d_]);
    for (int l = 0; l < layers_; ++l) {
      const auto [w, b] = layer(l, false);
      acts[l + 1] = linear(acts[l], B, l == 0 ? d_ : h_, w, b);
      if (source) source->done(l, false, w, b);
      for (float& v : acts[l + 1]) v = std::tanh(v);
    }
    std::vector<float> z;
    {
      const auto [w, b] = layer(layers_, false);
      z = linear(acts[layers_], B, h_, w, b);
      if (source) source->done(layers_, false, w, b);
    }

    // Softmax cross-entropy; dz = (softmax - onehot) / B.
    BatchResult r;
    for (int b = 0; b < B; ++b) {
      float* zb = &z[static_cast<std::size_t>(b) * c_];
      const int y = data.y(idx[b]);
      float m = zb[0];
      int arg = 0;
      for (int o = 1; o < c_; ++o)
        if (zb[o] > m) m = zb[o], arg = o;
      float sum = 0;
      for (int o = 0; o < c_; ++o) sum += std::exp(zb[o] - m);
      r.loss += double(std::log(sum) + m - zb[y]);
      r.correct += arg == y;
      for (int o = 0; o < c_; ++o) zb[o] = (std::exp(zb[o] - m) / sum - (o == y ? 1.f : 0.f)) / float(B);
    }
    r.loss /= B;

    std::vector<float> d = std::move(z);
    for (int l = layers_; l >= 0; --l) {
      const int n_in = l == 0 ? d_ : h_, n_out = l == layers_ ? c_ : h_;
      const auto [w, b] = layer(l, true);
      std::vector<float> dx = l > 0 ? linear_backward_input(d, B, n_in, n_out, w) : std::vector<float>();
      auto [gw, gb] = source ? source->gradients(l) : std::pair<Tensor, Tensor>();
      if (gw.defined()) {
        linear_backward_params(d, acts[l], B, n_in, n_out, gw, gb);  // the source's (w's memory: no set_grad)
      } else {
        gw = Tensor::zeros(w.shape());
        gb = Tensor::zeros(b.shape());
        linear_backward_params(d, acts[l], B, n_in, n_out, gw, gb);
        w.set_grad(gw);
        b.set_grad(gb);
        if (ready) {
          ready(b);
          ready(w);
        }
      }
      if (source) source->done(l, true, w, b);
      if (l > 0) {
        const std::vector<float>& a = acts[l];
        for (std::size_t i = 0; i < dx.size(); ++i) dx[i] *= 1.f - a[i] * a[i];  // tanh'
      }
      d = std::move(dx);
    }
    return r;
  }

 private:
  // out[b, o] = bias[o] + sum_i w[o, i] in[b, i], accumulated in i order
  // (through w transposed, so the inner loop runs over o and vectorises
  // without reassociating any sum).
  static std::vector<float> linear(const std::vector<float>& in, int B, int n_in, const Tensor& w, const Tensor& bias) {
    const int n_out = static_cast<int>(w.shape()[0]);
    const float* W = w.data<float>();
    const float* bb = bias.data<float>();
    std::vector<float> wt(static_cast<std::size_t>(n_in) * n_out);
    for (int o = 0; o < n_out; ++o)
      for (int i = 0; i < n_in; ++i) wt[static_cast<std::size_t>(i) * n_out + o] = W[static_cast<std::size_t>(o) * n_in + i];
    std::vector<float> out(static_cast<std::size_t>(B) * n_out);
    for (int b = 0; b < B; ++b) {
      float* ob = &out[static_cast<std::size_t>(b) * n_out];
      std::copy_n(bb, n_out, ob);
      const float* ib = &in[static_cast<std::size_t>(b) * n_in];
      for (int i = 0; i < n_in; ++i) {
        const float xi = ib[i];
        const float* wr = &wt[static_cast<std::size_t>(i) * n_out];
        for (int o = 0; o < n_out; ++o) ob[o] += wr[o] * xi;
      }
    }
    return out;
  }

  // The gradient of the layer's input [B, n_in] from dout [B, n_out]: each
  // element summed over o in order (the weight's gradient apart, so that the
  // weight's memory may take the gradients after this).
  static std::vector<float> linear_backward_input(const std::vector<float>& dout, int B, int n_in, int n_out,
                                                  const Tensor& w) {
    const float* W = w.data<float>();
    std::vector<float> dx(static_cast<std::size_t>(B) * n_in);
    for (int b = 0; b < B; ++b) {
      const float* db = &dout[static_cast<std::size_t>(b) * n_out];
      float* dxb = &dx[static_cast<std::size_t>(b) * n_in];
      for (int o = 0; o < n_out; ++o) {
        const float g = db[o];
        const float* wr = &W[static_cast<std::size_t>(o) * n_in];
        for (int i = 0; i < n_in; ++i) dxb[i] += g * wr[i];
      }
    }
    return dx;
  }

  // The weight's and the bias's gradients from dout [B, n_out] and the
  // layer's input [B, n_in], accumulated over b in order into gw and gb (zeros).
  static void linear_backward_params(const std::vector<float>& dout, const std::vector<float>& in, int B, int n_in,
                                     int n_out, const Tensor& gw, const Tensor& gb) {
    float* GW = gw.data<float>();
    float* GB = gb.data<float>();
    for (int b = 0; b < B; ++b) {
      const float* db = &dout[static_cast<std::size_t>(b) * n_out];
      const float* ib = &in[static_cast<std::size_t>(b) * n_in];
      for (int o = 0; o < n_out; ++o) {
        const float g = db[o];
        GB[o] += g;
        float* gr = &GW[static_cast<std::size_t>(o) * n_in];
        for (int i = 0; i < n_in; ++i) gr[i] += g * ib[i];
      }
    }
  }

  int d_, h_, layers_, c_;
  std::int64_t numel_ = 0;
  std::vector<Tensor> params_;
  std::vector<std::string> names_;
};

}  // namespace dopt_train
