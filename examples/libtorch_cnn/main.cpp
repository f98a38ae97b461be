// A libtorch model trained with dopt: a small CNN (torch::nn) on synthetic
// 14x14 images of 10 classes. torch computes the forward and backward
// passes; dopt's Reducer averages the gradients over the ranks and dopt's
// ZeroRedundancyOptimizer(Adam) with bucket views steps each rank's shard,
// updating the torch parameters in place (they become views of dopt's
// buckets through the binding's rebind hook).
//
//   dopt-example-libtorch-cnn                         2 simulated ranks in this process
//   dopt-run --nproc-per-node 2 dopt-example-libtorch-cnn
//   dopt-example-libtorch-cnn --check-torch-optim     1 rank, each step against torch::optim::Adam, bitwise
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include <torch/torch.h>
#undef CHECK  // glog's (through c10); CLI11 and dopt do not need it

#include <CLI/CLI.hpp>

#include "dopt/actors/distributed.hpp"
#include "dopt/libtorch/interop.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/distributed/zero.hpp"

using namespace dopt::optim;

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3)))),
        fc(register_module("fc", torch::nn::Linear(16 * 5 * 5, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(conv1->forward(x));
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);
    return fc->forward(x.flatten(1));
  }
  torch::nn::Conv2d conv1;
  torch::nn::Conv2d conv2;
  torch::nn::Linear fc;
};
TORCH_MODULE(Net);

/// Rank `rank`'s batch at `step`: class c is a fixed pattern plus noise.
std::pair<torch::Tensor, torch::Tensor> batch(int rank, int step, int size) {
  auto patterns = torch::randn({10, 1, 14, 14}, at::detail::createCPUGenerator(7));
  auto gen = at::detail::createCPUGenerator(1000 * static_cast<std::uint64_t>(step) + rank);
  auto labels = torch::randint(0, 10, {size}, gen);
  auto images = patterns.index_select(0, labels) + 1.5 * torch::randn({size, 1, 14, 14}, gen);
  return {images, labels};
}

std::mutex g_torch_init;  // torch's default generator: one simulated rank at a time

struct Options {
  int steps = 60;
  int batch = 32;
  double lr = 1e-2;
  bool bucket_view = true;
  bool check_loss_falls = false;
  bool check_torch_optim = false;
  int simulated = 2;
};

int train(dopt::RankContext& ctx, const Options& o) {
  Net net;
  {
    std::lock_guard<std::mutex> lock(g_torch_init);
    torch::manual_seed(0);
    net = Net();
  }
  // dopt tensors over the torch parameters' memory.
  dopt::libtorch::ParameterBinding bind(net->parameters());
  ZeroOptions zo{ctx.world(), o.bucket_view};
  zo.rebind_parameter = bind.rebind_hook();  // the torch parameters follow into ZeRO's buckets
  ZeroRedundancyOptimizer zero(bind.params(), OptimizerSpec{"Adam", {{"lr", o.lr}}}, zo);
  Reducer reducer(bind.params(), ctx.world());  // DDP's gradient averaging (and rank 0's initial parameters)

  // --check-torch-optim: the same model and batches stepped by torch::optim::Adam.
  Net ref;
  std::unique_ptr<torch::optim::Adam> ref_opt;
  if (o.check_torch_optim) {
    torch::NoGradGuard g;
    ref = Net();
    auto a = net->parameters();
    auto b = ref->parameters();
    for (std::size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
    ref_opt = std::make_unique<torch::optim::Adam>(ref->parameters(), torch::optim::AdamOptions(o.lr));
  }

  if (o.check_torch_optim && ctx.world_size() != 1) {
    std::fprintf(stderr, "libtorch_cnn: --check-torch-optim compares one rank with torch::optim (got %d ranks)\n",
                 ctx.world_size());
    return 2;
  }
  double first = 0, last = 0;
  for (int step = 0; step < o.steps; ++step) {
    auto [x, y] = batch(ctx.rank(), step, o.batch);
    net->zero_grad(/*set_to_none=*/step % 2 == 0);  // torch re-allocates the gradients: sync() re-binds them
    auto loss = torch::nn::functional::cross_entropy(net->forward(x), y);
    loss.backward();
    bind.sync();
    const auto& ps = bind.params();
    for (std::size_t i = ps.size(); i-- > 0;) reducer.mark_ready(ps[i]);  // the order backward produces them
    reducer.finalize();  // every gradient = the average over the ranks
    zero.step();         // Adam on this rank's shard, then every shard from its owner

    const double l = loss.item<double>();
    if (step < 5) first += l / 5;
    if (step >= o.steps - 5) last += l / 5;
    if (ctx.rank() == 0 && (step % 20 == 0 || step == o.steps - 1))
      std::printf("step %3d  loss %.4f\n", step, l), std::fflush(stdout);

    if (ref_opt) {
      ref_opt->zero_grad();
      torch::nn::functional::cross_entropy(ref->forward(x), y).backward();
      ref_opt->step();
      auto a = net->parameters();
      auto b = ref->parameters();
      for (std::size_t i = 0; i < a.size(); ++i)
        if (!torch::equal(a[i], b[i])) {
          std::fprintf(stderr, "libtorch_cnn: parameter %zu differs from torch::optim::Adam after step %d\n", i, step);
          return 1;
        }
    }
  }
  int status = 0;
  // The torch parameters are views of dopt's buckets (bucket view) and hold the trained values.
  if (o.bucket_view)
    for (std::size_t i = 0; i < bind.params().size(); ++i)
      if (bind.torch_params()[i].data_ptr() != bind.params()[i].data_ptr()) {
        std::fprintf(stderr, "libtorch_cnn: torch parameter %zu is not a view of dopt's bucket\n", i);
        status = 1;
      }
  if (ctx.rank() == 0) {
    std::printf("mean loss: first 5 steps %.4f, last 5 steps %.4f (%d ranks, bucket view %s)\n", first, last,
                ctx.world_size(), o.bucket_view ? "on" : "off");
    if (o.check_torch_optim)
      std::printf("parameters equal torch::optim::Adam bitwise after each of %d steps\n", o.steps);
  }
  if (o.check_loss_falls && !(last < 0.5 * first)) {
    std::fprintf(stderr, "libtorch_cnn: the loss did not fall to half (%.4f -> %.4f)\n", first, last);
    status = 1;
  }
  ctx.world().barrier();  // every rank leaves together
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"A libtorch CNN trained with dopt's ZeRO(Adam) and Reducer"};
  app.add_option("--steps", o.steps, "training steps");
  app.add_option("--batch", o.batch, "images per rank and step");
  app.add_option("--lr", o.lr, "Adam's learning rate");
  app.add_option("--simulated-ranks", o.simulated, "ranks to simulate when not launched by dopt-run/torchrun");
  bool no_bucket_view = false;
  app.add_flag("--no-bucket-view", no_bucket_view, "keep the parameters in torch's memory");
  app.add_flag("--check-loss-falls", o.check_loss_falls, "fail unless the loss falls to half");
  app.add_flag("--check-torch-optim", o.check_torch_optim,
               "one rank: compare every step with torch::optim::Adam, bitwise");
  CLI11_PARSE(app, argc, argv);
  o.bucket_view = !no_bucket_view;
  if (o.check_torch_optim) o.simulated = 1;
  torch::set_num_threads(1);
  std::mutex m;
  int status = 0;
  dopt::RunOptions ro;
  ro.simulated_ranks = o.simulated;
  dopt::run_distributed(
      [&](dopt::RankContext& ctx) {
        const int s = train(ctx, o);
        std::lock_guard<std::mutex> lock(m);
        status = status ? status : s;
      },
      ro);
  return status;
}
