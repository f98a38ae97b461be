// One rank of the real-process DiLoCo tests (tests/diloco_multiprocess.test.cpp).
// Started by dopt-run or by hand; joins the world with dopt::init_process_group:
//
//   dopt_diloco_peer diloco DIR
//     1. Streaming DiLoCo (2 fragments, delay 1, alpha 0.5, outer Nesterov SGD)
//        on float64 parameters against the float64 reference
//        (distributed/src/local_sgd/diloco_reference.hpp), every step, |error| <= 1e-12;
//     2. quantized_all_reduce in every wire format against the float64
//        reference of the same quantization (diloco_reference.hpp), the
//        result bitwise equal on every rank, the bytes sent as computed;
//     3. every wire format (float32, bfloat16, float16, int8 and int4 with
//        error feedback): the anchors are bitwise equal on every rank
//        (all_gather) after 12 steps;
//     4. resume from a checkpoint written to DIR (safetensors) between a
//        prepare and its sync (an average in flight), int8 with error
//        feedback: the rest of the run is bitwise the uninterrupted one.
//
// stdout: "ok R <checks>" on success, otherwise "error KIND: MESSAGE" and exit status 1.
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "local_sgd/diloco_case.hpp"
#include "local_sgd/diloco_reference.hpp"
#include "dopt/distributed/diloco.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/optim/sgd.hpp"
#include "dopt/runtime/state_dict.hpp"
#include "peer_main.hpp"

namespace {

using dopt::DType;
using dopt::ProcessGroup;
using dopt::Tensor;
namespace optim = dopt::optim;
namespace ref = dopt::diloco_ref;
namespace fs = std::filesystem;
using dopt::testing::Checker;

struct Run {
  std::vector<Tensor> params;
  optim::DiLoCoAverager* diloco = nullptr;
  std::unique_ptr<optim::PostLocalSGDOptimizer> opt;
};

using ref::options_of;

Run make_run(const ref::Config& c, const optim::DiLoCoOptions& o, ProcessGroup& g, DType dt) {
  Run run;
  run.params = ref::init_params(c, dt);
  auto inner = std::make_unique<optim::SGD>(run.params, optim::SGDOptions(c.inner_lr).momentum(c.inner_momentum));
  auto avg = std::make_unique<optim::DiLoCoAverager>(run.params, o, g);
  run.diloco = avg.get();
  run.opt = std::make_unique<optim::PostLocalSGDOptimizer>(std::move(inner), std::move(avg));
  return run;
}

void step(const ref::Config& c, Run& run, int rank, int t) {
  ref::set_grads(c, rank, t, run.params);
  run.opt->step();
}

ref::Config streaming(int world) {
  return {.world = world, .sync_every = 4, .fragments = {{0, 2}, {3, 1}}, .delay = 1, .alpha = 0.5, .steps = 13};
}

void against_reference(ProcessGroup& world, int rank, Checker& ck) {
  const ref::Config c = streaming(world.size());
  const ref::Trace tr = ref::run(c);
  Run run = make_run(c, options_of(c), world, DType::float64);
  for (int t = 0; t < c.steps; ++t) {
    step(c, run, rank, t);
    for (std::size_t i = 0; i < run.params.size(); ++i) {
      double err = 0;
      for (std::int64_t e = 0; e < run.params[i].numel(); ++e) {
        err = std::max(err, std::fabs(run.params[i].data<double>()[e] -
                                      tr.params[static_cast<std::size_t>(t)][static_cast<std::size_t>(rank)][i]
                                              [static_cast<std::size_t>(e)]));
        err = std::max(err, std::fabs(run.diloco->anchors()[i].data<double>()[e] -
                                      tr.anchors[static_cast<std::size_t>(t)][i][static_cast<std::size_t>(e)]));
      }
      ck.expect(err <= 1e-12, "step " + std::to_string(t) + ", parameter " + std::to_string(i) +
                                  ": |error| against the float64 reference " + std::to_string(err));
    }
  }
}

void wire_formats(ProcessGroup& world, int rank, Checker& ck) {
  ref::Config c = streaming(world.size());
  c.steps = 12;
  for (auto f : {optim::WireFormat::float32, optim::WireFormat::bfloat16, optim::WireFormat::float16,
                 optim::WireFormat::int8, optim::WireFormat::int4}) {
    optim::DiLoCoOptions o = options_of(c);
    o.wire_format = f;
    o.error_feedback = f == optim::WireFormat::int8 || f == optim::WireFormat::int4;
    o.row_size = 8;
    Run run = make_run(c, o, world, DType::float32);
    for (int t = 0; t < c.steps; ++t) step(c, run, rank, t);
    for (std::size_t i = 0; i < run.params.size(); ++i) {
      const Tensor& a = run.diloco->anchors()[i];
      std::vector<Tensor> all;
      for (int r = 0; r < world.size(); ++r) all.push_back(Tensor::empty(a.shape()));
      world.all_gather(all, a);
      for (int r = 0; r < world.size(); ++r)
        ck.bitwise(all[static_cast<std::size_t>(r)], a,
                   std::string(optim::wire_format_name(f)) + ": anchor " + std::to_string(i) + " of rank " +
                       std::to_string(r));
    }
    ck.expect(run.diloco->stats().syncs == 6 && run.diloco->stats().bytes_sent > 0,
              std::string(optim::wire_format_name(f)) + ": 6 syncs with bytes sent");
  }
}

void wire_reference(ProcessGroup& world, int rank, Checker& ck) {
  const std::int64_t N = 1000;
  const int n = world.size();
  for (auto f : {optim::WireFormat::float32, optim::WireFormat::bfloat16, optim::WireFormat::float16,
                 optim::WireFormat::int8, optim::WireFormat::int4}) {
    optim::QuantizedAllReduceOptions o;
    o.format = f;
    o.row_size = 64;
    std::vector<std::vector<float>> inputs(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r)
      for (std::int64_t e = 0; e < N; ++e) inputs[static_cast<std::size_t>(r)].push_back(ref::wire_input(r, e));
    const ref::WireReference want = ref::wire_reference(inputs, f, o.row_size);
    Tensor t = Tensor::from_vector(inputs[static_cast<std::size_t>(rank)]);
    const std::uint64_t sent = optim::quantized_all_reduce(world, t, o);
    const std::string what = std::string(optim::wire_format_name(f));
    ck.expect(sent == optim::quantized_all_reduce_bytes(N, n, rank, o), what + ": bytes sent");
    double worst = 0;
    bool within = true;
    for (std::int64_t e = 0; e < N; ++e) {
      const auto k = static_cast<std::size_t>(e);
      const double d = std::fabs(t.data<float>()[e] - want.mean[k]);
      worst = std::max(worst, d);
      if (d > want.tol1[k] + want.tol2[k] + 1e-6 * (1 + std::fabs(want.mean[k]))) within = false;
    }
    ck.expect(within, what + ": against the float64 reference of the same quantization, max error " +
                          std::to_string(worst));
    std::vector<Tensor> all;
    for (int r = 0; r < n; ++r) all.push_back(Tensor::empty({N}));
    world.all_gather(all, t);
    for (int r = 0; r < n; ++r) ck.bitwise(all[static_cast<std::size_t>(r)], t, what + ": rank " + std::to_string(r) + "'s result");
  }
}

void resume(ProcessGroup& world, int rank, Checker& ck, const fs::path& dir) {
  const ref::Config c = streaming(world.size());
  optim::DiLoCoOptions o = options_of(c);
  o.wire_format = optim::WireFormat::int8;
  o.error_feedback = true;
  o.row_size = 8;
  const int cut = 4;  // prepare of fragment 0 after step 4, its sync after step 5
  const std::string file = (dir / ("diloco_rank" + std::to_string(rank) + ".safetensors")).string();
  std::vector<Tensor> saved;
  {
    Run first = make_run(c, o, world, DType::float32);
    for (int t = 0; t <= cut; ++t) step(c, first, rank, t);
    ck.expect(first.diloco->pending_fragment().has_value(), "an average is in flight at the checkpoint");
    dopt::save_state_dict(first.opt->state_dict(), file);
    for (const auto& p : first.params) saved.push_back(p.clone());
  }
  Run full = make_run(c, o, world, DType::float32);
  optim::DiLoCoOptions o2 = o;
  o2.wire_tag = o.wire_tag + 16;  // runs beside `full`
  Run resumed = make_run(c, o2, world, DType::float32);
  for (std::size_t i = 0; i < saved.size(); ++i) resumed.params[i].copy_(saved[i]);
  resumed.opt->load_state_dict(dopt::load_state_dict(file));
  for (int t = 0; t < c.steps; ++t) {
    step(c, full, rank, t);
    if (t <= cut) continue;
    step(c, resumed, rank, t);
    ck.params(resumed.params, full.params, "resumed run, step " + std::to_string(t));
    ck.params(resumed.diloco->anchors(), full.diloco->anchors(), "resumed anchors, step " + std::to_string(t));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "diloco";
  const fs::path dir = argc > 2 ? fs::path(argv[2]) : fs::temp_directory_path();
  return dopt::testing::run_peer([&](ProcessGroup& world, int rank) {
    Checker ck{rank};
    if (mode != "diloco") throw dopt::testing::Usage{"dopt_diloco_peer diloco [DIR]"};
    against_reference(world, rank, ck);
    wire_reference(world, rank, ck);
    wire_formats(world, rank, ck);
    resume(world, rank, ck, dir);
    return ck.checks;
  });
}
