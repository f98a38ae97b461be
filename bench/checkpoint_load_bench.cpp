// dopt_bench_checkpoint_load: a ZeRO checkpoint's loads (time, peak memory)
// and what an asynchronous save costs the training loop. One mode a launch,
// so that each load runs in a fresh process and its peak RSS is its own:
//
//   dopt-run --nproc-per-node 2 --master-port 0 dopt_bench_checkpoint_load --mode M --dir D [--params N]
//
// Every rank holds a ZeroRedundancyOptimizer(Adam, lr 1e-3) over N float32
// parameters (default 50,000,000) in 100 tensors of the baselines' sizes
// (proportional to 1..10).
//   save          one step, then the consolidated state (consolidate_state_dict
//                 + save_state_dict on rank 0, D/consolidated.safetensors)
//                 and the shards (save_sharded into D/sharded).
//   consolidated  a fresh optimizer loads D/consolidated.safetensors with
//                 load_state_dict(path) (--via-dict: with
//                 load_state_dict(dopt::load_state_dict(path)), the whole file).
//   sharded       a fresh optimizer loads D/sharded with load_sharded.
//   async         a training loop with a Checkpointer (the parameters,
//                 replicated, and the optimizer's shards) into D/ckpt: --reps
//                 synchronous saves, then --reps asynchronous ones, each
//                 followed by steps until the write is committed; then the
//                 same asynchronous saves with background_snapshot (into
//                 D/ckpt-bg). A step is a forward stand-in that reads every
//                 parameter once, wait_snapshot(), and zero.step(); the
//                 stall of a save is save_async's time plus what the next
//                 step's wait_snapshot() waited.
// A load is timed from a barrier to the slowest rank's end, and its CPU
// time (the process's user + system time over the load, the largest over
// the ranks: what the machine's other work cannot inflate); its memory is
// the rise of the process's peak RSS (VmHWM, reset through
// /proc/self/clear_refs just before) over the RSS before, the largest over
// the ranks. One JSON line from rank 0.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dopt/actors/distributed.hpp"
#include "dopt/distributed/checkpointer.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/runtime/state_dict.hpp"

#include "bench_util.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

/// A field of /proc/self/status in bytes ("VmRSS", "VmHWM").
std::int64_t status_bytes(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  return -1;
}

/// Resets VmHWM to the current RSS (Linux >= 4.0).
void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

/// The process's CPU time so far (user + system), ms.
double cpu_ms() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto ms = [](const timeval& t) { return 1e3 * static_cast<double>(t.tv_sec) + 1e-3 * static_cast<double>(t.tv_usec); };
  return ms(u.ru_utime) + ms(u.ru_stime);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dopt: ZeRO checkpoint loads (time, peak RSS) and the async save's stall"};
  std::string mode;
  std::string dir;
  std::int64_t params = 50'000'000;
  int reps = 3;
  bool via_dict = false;
  app.add_option("--mode", mode, "save, consolidated, sharded or async")
      ->required()
      ->check(CLI::IsMember({"save", "consolidated", "sharded", "async"}));
  app.add_option("--dir", dir, "the checkpoints' folder")->required();
  app.add_option("--params", params, "float32 parameters in all")->check(CLI::Range(std::int64_t{1000}, std::int64_t{1} << 40));
  app.add_option("--reps", reps, "async: saves of each kind")->check(CLI::PositiveNumber);
  app.add_flag("--via-dict", via_dict, "consolidated: read the whole file into a StateDict first");
  CLI11_PARSE(app, argc, argv);
  const auto sizes = dopt::bench::tensor_sizes(params, 100, true);
  const std::string consolidated = (fs::path(dir) / "consolidated.safetensors").string();
  const std::string sharded = (fs::path(dir) / "sharded").string();

  try {
    dopt::run_distributed([&](dopt::RankContext& ctx) {
      dopt::ProcessGroup world = ctx.world();
      std::vector<dopt::Tensor> ps;
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        ps.push_back(dopt::Tensor::full({sizes[k]}, 0.5));
        ps.back().set_grad(dopt::Tensor::full({sizes[k]}, 1e-3 * static_cast<double>((k + ctx.rank()) % 7 + 1)));
      }
      dopt::optim::ZeroOptions zo;
      zo.process_group = world;
      dopt::optim::ZeroRedundancyOptimizer zero(ps, dopt::optim::OptimizerSpec{"Adam", {{"lr", 1e-3}}}, zo);
      auto emit = [&](const std::string& fields) {
        if (ctx.rank() == 0) {
          std::printf("{\"benchmark\": \"checkpoint_load\", \"mode\": \"%s\", \"params\": %lld, \"world_size\": %d, %s}\n",
                      mode.c_str(), static_cast<long long>(params), ctx.world_size(), fields.c_str());
          std::fflush(stdout);
        }
      };

      if (mode == "save") {
        zero.step();
        zero.consolidate_state_dict(0);
        if (ctx.rank() == 0) {
          fs::create_directories(dir);
          dopt::save_state_dict(zero.state_dict(), consolidated);
        }
        zero.save_sharded(sharded);
        world.barrier();
        emit("\"consolidated_bytes\": " + std::to_string(ctx.rank() == 0 ? fs::file_size(consolidated) : 0));
        return;
      }

      if (mode == "consolidated" || mode == "sharded") {
        std::int64_t shard_file = 0;
        if (mode == "sharded")
          shard_file = static_cast<std::int64_t>(fs::file_size(
              fs::path(sharded) / dopt::optim::ZeroRedundancyOptimizer::shard_file_name(ctx.rank(), ctx.world_size())));
        world.barrier();
        reset_peak();
        const std::int64_t rss0 = status_bytes("VmRSS");
        const double cpu0 = cpu_ms();
        const auto t0 = Clock::now();
        if (mode == "sharded") zero.load_sharded(sharded);
        else if (via_dict) zero.load_state_dict(dopt::load_state_dict(consolidated));
        else zero.load_state_dict(consolidated);
        const double ms = ms_since(t0);
        const double cpu = cpu_ms() - cpu0;
        const std::int64_t rise = status_bytes("VmHWM") - rss0;
        const std::int64_t state = zero.local_state_bytes();
        const auto m = dopt::bench::slowest(world, {ms, static_cast<double>(rise), static_cast<double>(state),
                                                    static_cast<double>(shard_file),
                                                    static_cast<double>(rise) / static_cast<double>(state), cpu});
        char buf[512];
        std::snprintf(buf, sizeof buf,
                      "\"via_dict\": %s, \"load_ms\": %.1f, \"peak_rise_bytes\": %.0f, \"state_bytes_per_rank\": %.0f, "
                      "\"shard_file_bytes\": %.0f, \"peak_rise_over_state\": %.3f, \"peak_rise_over_shard_file\": %.3f, "
                      "\"load_cpu_ms\": %.1f",
                      via_dict ? "true" : "false", m[0], m[1], m[2], m[3], m[4], m[3] > 0 ? m[1] / m[3] : 0.0, m[5]);
        emit(buf);
        return;
      }

      // async: the parameters (replicated) and the shards, saved every few steps.
      zero.step();
      std::map<std::string, dopt::Tensor> named;
      for (std::size_t k = 0; k < ps.size(); ++k) named.emplace("p" + std::to_string(k), ps[k]);
      dopt::CheckpointerOptions co;
      co.group = world;
      co.dir = (fs::path(dir) / "ckpt").string();
      co.keep_last = 1;
      dopt::Checkpointer ckpt(co);
      ckpt.add_tensors("model", named, dopt::Placement::replicated);
      ckpt.add_optimizer("optim", zero);
      co.dir = (fs::path(dir) / "ckpt-bg").string();
      co.background_snapshot = true;
      dopt::Checkpointer bg(co);
      bg.add_tensors("model", named, dopt::Placement::replicated);
      bg.add_optimizer("optim", zero);
      std::int64_t step = 1;
      std::vector<double> step_ms, sync_ms, async_ms, busy_step_ms, bg_ms, bg_wait_ms, bg_busy_step_ms;
      volatile float sink = 0;
      double waited_ms = 0;  // the last step's wait_snapshot()
      auto timed_step = [&](dopt::Checkpointer& c) {
        world.barrier();
        const auto t0 = Clock::now();
        float acc = 0;  // the forward pass's stand-in: it reads the parameters
        for (const dopt::Tensor& p : ps)
          for (const float* x = p.data<float>(), *e = x + p.numel(); x < e; ++x) acc += *x;
        sink = acc;
        const auto w0 = Clock::now();
        c.wait_snapshot();
        waited_ms = ms_since(w0);
        zero.step();
        ++step;
        return ms_since(t0);
      };
      // --reps save_async of c, each followed by steps until every rank sees it committed.
      auto async_saves = [&](dopt::Checkpointer& c, std::vector<double>& stall, std::vector<double>* waited,
                             std::vector<double>& busy) {
        for (int r = 0; r < reps; ++r) {
          world.barrier();
          const auto t0 = Clock::now();
          dopt::Future<void> f = c.save_async(step);
          stall.push_back(ms_since(t0));
          for (bool first = true;; first = false) {
            dopt::Tensor done = dopt::Tensor::full({1}, f.is_ready() ? 1.0 : 0.0, dopt::DType::int64);
            world.all_reduce(done, dopt::ReduceOp::min);
            if (done.data<std::int64_t>()[0] == 1) break;
            busy.push_back(timed_step(c));
            if (first && waited) waited->push_back(waited_ms);
          }
          if (waited && waited->size() < stall.size()) waited->push_back(0.0);  // committed before a step
          f.get();
        }
      };
      for (int i = 0; i < 3; ++i) step_ms.push_back(timed_step(ckpt));
      for (int r = 0; r < reps; ++r) {
        world.barrier();
        const auto t0 = Clock::now();
        ckpt.save(step);
        sync_ms.push_back(ms_since(t0));
        step_ms.push_back(timed_step(ckpt));
      }
      async_saves(ckpt, async_ms, nullptr, busy_step_ms);
      async_saves(bg, bg_ms, &bg_wait_ms, bg_busy_step_ms);
      std::vector<double> bg_stall;
      for (std::size_t k = 0; k < bg_ms.size(); ++k) bg_stall.push_back(bg_ms[k] + bg_wait_ms[k]);
      const auto s = dopt::bench::slowest(
          world, {dopt::bench::median(step_ms), dopt::bench::median(sync_ms), dopt::bench::median(async_ms),
                  dopt::bench::median(busy_step_ms), static_cast<double>(busy_step_ms.size()),
                  dopt::bench::median(bg_ms), dopt::bench::median(bg_wait_ms), dopt::bench::median(bg_stall),
                  dopt::bench::median(bg_busy_step_ms)});
      char buf[768];
      std::snprintf(buf, sizeof buf,
                    "\"reps\": %d, \"step_ms\": %.1f, \"sync_save_ms\": %.1f, \"async_stall_ms\": %.1f, "
                    "\"stall_over_sync\": %.4f, \"step_ms_while_writing\": %.1f, \"steps_while_writing\": %.0f, "
                    "\"bg_return_ms\": %.1f, \"bg_wait_snapshot_ms\": %.1f, \"bg_stall_ms\": %.1f, "
                    "\"bg_stall_over_sync\": %.4f, \"bg_step_ms_while_writing\": %.1f",
                    reps, s[0], s[1], s[2], s[2] / s[1], s[3], s[4], s[5], s[6], s[7], s[7] / s[1], s[8]);
      emit(buf);
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt_bench_checkpoint_load: %s\n", e.what());
    return 1;
  }
  return 0;
}
