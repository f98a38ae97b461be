// dopt-train --optim remote (see remote.hpp).
#include "remote.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <numeric>
#include <tuple>
#include <unistd.h>

#include "dopt/actors/rpc.hpp"
#include "dopt/distributed/distributed_optimizer.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/safetensors.hpp"
#include "report.hpp"

namespace dopt_train {

namespace rpc = dopt::rpc;
using dopt::Tensor;

namespace {

/// What the workers send each other besides the DistributedOptimizer's own
/// messages: per receiving worker (simulated workers share the process),
/// messages keyed by (kind, step, sender).
struct Message {
  std::vector<Tensor> tensors;
  std::vector<rpc::RRef<Tensor>> refs;
  std::vector<std::int64_t> ints;
  std::vector<double> numbers;
};

enum Kind : std::int64_t { kParams = 0, kGrads = 1, kStepped = 2 };

class Mailboxes {
 public:
  static Mailboxes& get() {
    static Mailboxes m;
    return m;
  }
  void put(int to, std::int64_t kind, std::int64_t step, std::int64_t from, Message msg) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      box_[to][{kind, step, from}] = std::move(msg);
    }
    cv_.notify_all();
  }
  /// Waits for (kind, step, from) addressed to `to`, at most `timeout`.
  Message take(int to, std::int64_t kind, std::int64_t step, std::int64_t from, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    const std::tuple<std::int64_t, std::int64_t, std::int64_t> key{kind, step, from};
    if (!cv_.wait_for(lock, timeout, [&] { return box_[to].count(key) != 0; }))
      throw dopt::TimeoutError("dopt-train", "worker " + std::to_string(to) + " waited " +
                                                 std::to_string(timeout.count()) + " ms for worker " +
                                                 std::to_string(from) + " at step " + std::to_string(step),
                               to);
    Message m = std::move(box_[to][key]);
    box_[to].erase(key);
    return m;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<int, std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, Message>> box_;
};

void register_functions() {
  static const bool once = [] {
    rpc::register_function("dopt_train.params", [](rpc::Agent& a, std::int64_t from, std::vector<std::int64_t> idx,
                                                  std::vector<rpc::RRef<Tensor>> refs) {
      Message m;
      m.ints = std::move(idx);
      m.refs = std::move(refs);
      Mailboxes::get().put(a.rank(), kParams, 0, from, std::move(m));
    });
    rpc::register_function("dopt_train.grads", [](rpc::Agent& a, std::int64_t step, std::int64_t from,
                                                 std::vector<Tensor> grads, std::vector<double> stats) {
      Message m;
      m.tensors = std::move(grads);
      m.numbers = std::move(stats);
      Mailboxes::get().put(a.rank(), kGrads, step, from, std::move(m));
    });
    rpc::register_function("dopt_train.stepped", [](rpc::Agent& a, std::int64_t step) {
      Mailboxes::get().put(a.rank(), kStepped, step, 0, Message{});
    });
    return true;
  }();
  (void)once;
}

/// ZeRO's partition: parameters by numel descending (stable), each to the
/// least loaded worker (lowest rank on ties).
std::vector<int> owners_of(const Mlp& model, int n) {
  const auto& ps = model.params();
  std::vector<std::size_t> order(ps.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return ps[a].numel() > ps[b].numel(); });
  std::vector<std::int64_t> load(static_cast<std::size_t>(n), 0);
  std::vector<int> owner(ps.size(), 0);
  for (std::size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = r;
    load[static_cast<std::size_t>(r)] += ps[i].numel();
  }
  return owner;
}

void train_worker(rpc::Agent& agent, const Plan& plan) {
  const Options& o = plan.opt;
  const int rank = agent.rank(), n = agent.world_size();
  const bool lead = rank == 0;
  const auto timeout = agent.options().rpc_timeout;
  Mailboxes& mail = Mailboxes::get();

  Shard shard(o.data, rank, n);
  Mlp model(o.data.input_dim, o.hidden, o.layers, o.data.classes, o.data.seed);  // same start everywhere
  const std::size_t np = model.params().size();
  const std::vector<int> owner = owners_of(model, n);

  // Owners publish their parameters; every worker learns every RRef.
  std::vector<rpc::RRef<Tensor>> refs(np);
  {
    std::vector<std::int64_t> idx;
    std::vector<rpc::RRef<Tensor>> mine;
    for (std::size_t i = 0; i < np; ++i)
      if (owner[i] == rank) {
        refs[i] = agent.make_rref<Tensor>(model.params()[i].clone());
        idx.push_back(static_cast<std::int64_t>(i));
        mine.push_back(refs[i]);
      }
    std::vector<dopt::Future<void>> sent;
    for (int r = 0; r < n; ++r)
      if (r != rank)
        sent.push_back(agent.rpc_async(rpc::To(r), rpc::Fn("dopt_train.params"), std::int64_t{rank}, idx, mine));
    for (auto& f : sent) f.get();
    for (int r = 0; r < n; ++r) {
      if (r == rank) continue;
      Message m = mail.take(rank, kParams, 0, r, timeout);
      for (std::size_t k = 0; k < m.ints.size(); ++k) refs[static_cast<std::size_t>(m.ints[k])] = m.refs[k];
    }
  }

  // Worker 0 steps the DistributedOptimizer; its local optimizers live on the owners.
  std::optional<dopt::optim::DistributedOptimizer> opt;
  if (lead) opt.emplace(agent, plan.strategy.inner, refs);

  const bool tty = ::isatty(1) != 0;
  std::optional<MetricsWriter> metrics;
  if (lead) {
    if (!o.metrics.empty()) metrics.emplace(o.metrics, 0);
    if (!o.quiet) {
      std::printf("dopt-train: MLP %s (%s parameters), %d %s, DistributedOptimizer(%s) with parameter owners, "
                  "lr %g, batch %d per rank\n",
                  model.describe().c_str(), thousands(model.numel()).c_str(), n,
                  plan.launched ? (n == 1 ? "process" : "processes") : "simulated workers",
                  plan.strategy.inner.name.c_str(),
                  dopt::hyper_number(plan.strategy.inner.hyperparameters, "lr", "dopt-train"), o.batch);
      std::printf("data: %s synthetic samples (teacher network, seed %llu), about %s per rank\n",
                  thousands(o.data.samples).c_str(), static_cast<unsigned long long>(o.data.seed),
                  thousands(shard.size()).c_str());
      std::printf("parameter owners (each keeps the optimizer state of what it owns):\n");
      for (int r = 0; r < n; ++r) {
        std::int64_t numel = 0;
        std::string names;
        for (std::size_t i = 0; i < np; ++i)
          if (owner[i] == r) numel += model.params()[i].numel(), names += " " + model.names()[i];
        std::printf("  rank %d: %s of %s parameters:%s\n", r, thousands(numel).c_str(),
                    thousands(model.numel()).c_str(), names.empty() ? " (none)" : names.c_str());
      }
      std::fflush(stdout);
    }
  }
  Progress progress(0, o.steps, tty, o.quiet || !lead,
                    o.log_every > 0 ? o.log_every : std::max<std::int64_t>(1, o.steps / 20));

  auto fetch = [&] {
    std::vector<dopt::Future<Tensor>> fs;
    for (const auto& r : refs) fs.push_back(r.to_here_async());
    for (std::size_t i = 0; i < np; ++i) model.params()[i].copy_(fs[i].get());
  };

  const auto t0 = std::chrono::steady_clock::now();
  double first_loss = NAN, last_loss = NAN, first_acc = NAN, last_acc = NAN;
  std::vector<std::pair<std::int64_t, double>> history;
  std::vector<std::pair<double, double>> bytes_history;  // (mean bytes sent per worker, loss)
  double last_bytes = 0;
  for (std::int64_t s = 0; s < o.steps; ++s) {
    fetch();
    const BatchResult r = model.forward_backward(shard, shard.batch(s, o.batch), nullptr);
    std::vector<Tensor> grads;
    for (const Tensor& p : model.params()) grads.push_back(p.grad());
    // The bytes this worker sent so far go with its gradients (the lead reports the mean per worker).
    const std::vector<double> stats{r.loss, double(r.correct) / o.batch, double(agent.bytes_sent())};
    if (!lead) {
      agent.rpc_sync(rpc::To(0), rpc::Fn("dopt_train.grads"), s, std::int64_t{rank}, grads, stats);
      mail.take(rank, kStepped, s, 0, timeout);
      continue;
    }
    // Worker 0: the average over the workers, in rank order, divided first
    // (sum_r g_r / n, as the DDP reducer's allreduce_hook).
    std::vector<Tensor> avg;
    double loss = 0, acc = 0, bytes = 0;
    for (int w = 0; w < n; ++w) {
      Message m;
      if (w == 0) m.tensors = grads, m.numbers = stats;
      else m = mail.take(0, kGrads, s, w, timeout);
      loss += m.numbers.at(0);
      acc += m.numbers.at(1);
      bytes += m.numbers.at(2);
      for (std::size_t i = 0; i < np; ++i) {
        const Tensor& g = m.tensors.at(i);
        const float* gs = g.data<float>();
        if (w == 0) avg.push_back(Tensor::zeros(g.shape()));
        float* a = avg[i].data<float>();
        for (std::int64_t k = 0; k < g.numel(); ++k) a[k] = w == 0 ? gs[k] / float(n) : a[k] + gs[k] / float(n);
      }
    }
    rpc::GradContext ctx = agent.new_context();
    std::vector<std::pair<rpc::RRef<Tensor>, Tensor>> deposits;
    for (std::size_t i = 0; i < np; ++i) deposits.emplace_back(refs[i], avg[i]);
    ctx.deposit_all(deposits).get();
    opt->step(ctx);  // every owner steps its parameters
    ctx.release();
    std::vector<dopt::Future<void>> told;
    for (int w = 1; w < n; ++w) told.push_back(agent.rpc_async(rpc::To(w), rpc::Fn("dopt_train.stepped"), s));
    for (auto& f : told) f.get();

    StepRecord rec;
    rec.step = s + 1;
    rec.loss = loss / n;
    rec.accuracy = acc / n;
    rec.lr = opt->lrs().at(0);
    rec.bytes_sent = bytes / n;
    rec.bytes_step = rec.bytes_sent - last_bytes;
    last_bytes = rec.bytes_sent;
    bytes_history.emplace_back(rec.bytes_sent, rec.loss);
    rec.time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rec.steps_per_s = rec.time_s > 0 ? double(s + 1) / rec.time_s : 0;
    if (s == 0) first_loss = rec.loss, first_acc = rec.accuracy;
    last_loss = rec.loss, last_acc = rec.accuracy;
    history.emplace_back(rec.step, rec.loss);
    if (metrics) metrics->write(rec);
    progress.update(rec);
  }
  progress.finish();
  if (!lead) return;
  fetch();  // the final parameters
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!o.dump_params.empty()) {
    std::map<std::string, Tensor> tensors;
    for (int w = 0; w < n; ++w)  // every trainer holds the owners' parameters
      for (std::size_t i = 0; i < np; ++i) tensors["rank" + std::to_string(w) + "." + model.names()[i]] = model.params()[i];
    dopt::write_safetensors(o.dump_params, tensors, {{"step", std::to_string(o.steps)}});
  }
  if (metrics) metrics->flush();
  if (!o.svg.empty())
    write_loss_svg(o.svg, history,
                   "dopt-train: DistributedOptimizer(" + plan.strategy.inner.name + "), " + std::to_string(n) +
                       " workers, MLP " + model.describe());
  if (!o.svg_bytes.empty()) {
    for (auto& [b, l] : bytes_history) b /= 1e6;
    write_curve_svg(o.svg_bytes, bytes_history,
                    "dopt-train: DistributedOptimizer(" + plan.strategy.inner.name + "), " + std::to_string(n) +
                        " workers",
                    "MB sent per worker");
  }
  std::printf("dopt-train: %lld steps in %.1f s (%.1f steps/s); loss %.4f -> %.4f, accuracy %.3f -> %.3f\n",
              static_cast<long long>(o.steps), secs, double(o.steps) / secs, first_loss, last_loss, first_acc,
              last_acc);
  if (!o.metrics.empty()) std::printf("metrics: %s\n", o.metrics.c_str());
  if (!o.svg.empty()) std::printf("loss curve: %s\n", o.svg.c_str());
  if (!o.svg_bytes.empty()) std::printf("loss against bytes sent: %s\n", o.svg_bytes.c_str());
  std::printf("bytes sent per worker: %s in %lld steps (%s per step; arguments and results of its RPCs)\n",
              format_bytes(last_bytes).c_str(), static_cast<long long>(o.steps),
              format_bytes(last_bytes / double(std::max<std::int64_t>(1, o.steps))).c_str());
  if (!o.dump_params.empty()) std::printf("parameters: %s\n", o.dump_params.c_str());
  std::fflush(stdout);
}

}  // namespace

void run_remote(const Plan& plan) {
  register_functions();
  dopt::optim::DistributedOptimizer::register_functions();
  rpc::run([&](rpc::Agent& agent) { train_worker(agent, plan); }, plan.opt.ranks);
}

}  // namespace dopt_train
