#pragma once
// The checkpointer tests' training rig (tests only): one rank's model and
// optimizers, a deterministic step, and what the tests compare; the
// options and error capture the tests share.
//   a: replicated parameters stepped by a local Adam (the same gradients on
//      every rank, as after averaging);
//   b: parameters of a ZeroRedundancyOptimizer (Adam; the same gradients on
//      every rank, so its result does not depend on the world size);
//   c: parameters of a PostLocalSGDOptimizer (SGD with momentum, averaged
//      every 2 steps after 1): each rank's own gradients, per-rank state;
//   a generator, a counter pair, a data position and extras.
// Also the files' and fingerprints' helpers the tests compare with.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "sim_timeout.hpp"  // tests/support
#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/averagers.hpp"
#include "dopt/distributed/checkpointer.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/optim/sgd.hpp"
#include "dopt/runtime/distributed_sampler.hpp"
#include "dopt/runtime/error.hpp"

namespace dopt::checkpoint_test {

namespace fs = std::filesystem;

/// The folders fresh_dir made, removed when the test program ends.
struct MadeDirs {
  std::vector<fs::path> dirs;
  ~MadeDirs() {
    std::error_code ec;
    for (const fs::path& d : dirs) fs::remove_all(d, ec);
  }
};
inline MadeDirs made_dirs;

/// A fresh empty folder for one test.
inline std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("dopt-checkpointer-test-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  made_dirs.dirs.push_back(d);
  return d.string();
}

/// A file's bytes.
inline std::string bytes_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

/// Rig::fingerprint() of each rank.
using Fingerprints = std::vector<std::vector<std::uint64_t>>;

inline SimulateOptions short_timeout() { return dopt::testing::with_timeout(std::chrono::milliseconds(60000)); }

inline CheckpointerOptions options_for(RankContext& ctx, const std::string& dir, int keep_last = 0) {
  CheckpointerOptions o;
  o.group = ctx.world();
  o.dir = dir;
  o.keep_last = keep_last;
  return o;
}

/// Every rank's error message of `fn` (empty: none), and the ops.
struct Errors {
  std::mutex m;
  std::vector<std::string> what, op;
  explicit Errors(int world) : what(static_cast<std::size_t>(world)), op(static_cast<std::size_t>(world)) {}
  template <class F>
  void capture(int rank, F&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(m);
      what[static_cast<std::size_t>(rank)] = e.what();
      op[static_cast<std::size_t>(rank)] = e.op();
    }
  }
};

/// n deterministic floats for (seed, k).
inline Tensor values(int n, int seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::uint64_t x = 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(seed + 1) + 12345;
  for (auto& f : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    f = static_cast<float>(static_cast<double>(x >> 11) / 9007199254740992.0 - 0.5);
  }
  return Tensor::from_vector(v);
}

struct RigOptions {
  bool adam = true, zero = true, plsgd = true, extras = true;
};

struct Rig {
  int rank = 0;
  RigOptions opts;
  std::vector<Tensor> a, b, c;
  std::unique_ptr<optim::Adam> adam;
  std::unique_ptr<optim::ZeroRedundancyOptimizer> zero;
  std::unique_ptr<optim::PostLocalSGDOptimizer> plsgd;
  std::mt19937_64 rng;
  std::uint64_t seed = 0, counter = 0;
  std::map<std::string, std::string> extras;
  DistributedSampler sampler;
  std::int64_t offset = 0;

  /// init: the initial values (another init gives other values: what a load
  /// must overwrite).
  Rig(RankContext& ctx, int init, RigOptions o = {})
      : rank(ctx.rank()), opts(o), rng(1000 + 7 * ctx.rank() + init), seed(99 + init),
        sampler(240, ctx.world_size(), ctx.rank()) {
    for (int k = 0; k < 3; ++k) {
      a.push_back(values(5 + 4 * k, 10 * init + k));
      b.push_back(values(7 + 3 * k, 10 * init + 3 + k));
      c.push_back(values(4 + 2 * k, 10 * init + 6 + k));
    }
    if (o.adam) adam = std::make_unique<optim::Adam>(a, optim::AdamOptions().lr(0.01));
    if (o.zero)
      zero = std::make_unique<optim::ZeroRedundancyOptimizer>(b, optim::OptimizerSpec{"Adam", {{"lr", 0.02}}},
                                                             optim::ZeroOptions{ctx.world()});
    if (o.plsgd)
      plsgd = std::make_unique<optim::PostLocalSGDOptimizer>(
          std::make_unique<optim::SGD>(c, optim::SGDOptions(0.05).momentum(0.9)),
          std::make_unique<optim::PeriodicModelAverager>(2, 1, ctx.world()));
    if (o.extras) extras = {{"init", std::to_string(init)}};
  }

  void add_to(Checkpointer& ck) {
    std::map<std::string, Tensor> named;
    for (std::size_t k = 0; k < a.size(); ++k) named["layer" + std::to_string(k) + ".weight"] = a[k];
    ck.add_tensors("model", named, Placement::replicated);
    if (adam) ck.add_optimizer("adam", *adam, Placement::replicated);
    if (zero) {
      std::map<std::string, Tensor> nb;
      for (std::size_t k = 0; k < b.size(); ++k) nb["b" + std::to_string(k)] = b[k];
      ck.add_tensors("zero_params", nb, Placement::replicated);
      ck.add_optimizer("zero", *zero);
    }
    if (plsgd) {
      std::map<std::string, Tensor> nc;
      for (std::size_t k = 0; k < c.size(); ++k) nc["c" + std::to_string(k)] = c[k];
      ck.add_tensors("local_params", nc, Placement::per_rank);
      ck.add_optimizer("plsgd", *plsgd);
      ck.add_rng("rng", rng, Placement::per_rank);
    }
    ck.add_rng("counter", seed, counter, Placement::replicated);
    ck.add_data_position("data", sampler, offset);
    if (opts.extras) ck.add_extras("extras", extras, Placement::replicated);
  }

  /// Training step t (collective where the optimizers are).
  void step(int t) {
    for (std::size_t k = 0; k < a.size(); ++k) a[k].set_grad(values(static_cast<int>(a[k].numel()), 500 + 10 * t + static_cast<int>(k)));
    for (std::size_t k = 0; k < b.size(); ++k) b[k].set_grad(values(static_cast<int>(b[k].numel()), 700 + 10 * t + static_cast<int>(k)));
    for (std::size_t k = 0; k < c.size(); ++k)
      c[k].set_grad(values(static_cast<int>(c[k].numel()), 900 + 100 * rank + 10 * t + static_cast<int>(k)));
    if (adam) adam->step();
    if (zero) zero->step();
    if (plsgd) {
      plsgd->step();
      (void)rng();
    }
    ++counter;
    offset += 5;
    if (offset >= sampler.size()) sampler.set_epoch(sampler.epoch() + 1), offset = 0;
    if (opts.extras) extras["last"] = std::to_string(t);
  }

  /// What a load restores but the data position, as numbers (bit patterns
  /// of the floats).
  std::vector<std::uint64_t> fingerprint() {
    std::vector<std::uint64_t> out;
    auto add = [&](const std::vector<Tensor>& ps) {
      for (const Tensor& p : ps)
        for (float f : p.to_vector<float>()) {
          std::uint32_t bits;
          std::memcpy(&bits, &f, 4);
          out.push_back(bits);
        }
    };
    add(a);
    if (zero) add(b);
    if (plsgd) add(c);
    if (plsgd) {
      std::mt19937_64 copy = rng;
      out.push_back(copy());
    }
    out.push_back(seed), out.push_back(counter);
    for (const auto& [k, v] : extras) out.push_back(std::hash<std::string>{}(k + "=" + v));
    return out;
  }
};

/// Each rank's fingerprint after a fresh rig (init 1) loads `step` from dir.
inline Fingerprints loaded_fingerprints(int world, const std::string& dir, std::int64_t step) {
  Fingerprints loaded(static_cast<std::size_t>(world));
  std::mutex m;
  simulate(world, [&](RankContext& ctx) {
    Rig rig(ctx, 1);
    Checkpointer ck(options_for(ctx, dir));
    rig.add_to(ck);
    ck.load(step);
    std::lock_guard<std::mutex> lock(m);
    loaded[static_cast<std::size_t>(ctx.rank())] = rig.fingerprint();
  }, short_timeout());
  return loaded;
}

/// Steps [from, to) of rig, each followed by save_async(t + 1); then waits
/// for the last save.
inline void train_saving_async(Rig& rig, Checkpointer& ck, int from, int to) {
  for (int t = from; t < to; ++t) {
    rig.step(t);
    ck.save_async(t + 1);
  }
  ck.wait();
}

}  // namespace dopt::checkpoint_test
