// dopt::Checkpointer over simulated ranks (world sizes 3 and 5): round trips
// bit for bit against runs that never stopped (parameters, a local optimizer,
// ZeRO, post-local SGD, DiLoCo, generators, a data position, extras); ZeRO
// and replicated parameters saved at 3 ranks and loaded at 5; async saves
// byte for byte the sync ones, without the caller waiting for the write;
// keep_last; load_latest past incomplete folders; mixed and swapped files;
// errors that name the call. Rank functions record; Catch assertions run
// after simulate() returned.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>

#include "checkpoint/test_rig.hpp"
#include "dopt/distributed/diloco.hpp"
#include "dopt/runtime/error.hpp"

using namespace dopt;
using namespace dopt::checkpoint_test;

namespace {

/// Trains steps [0, save_at), saves, trains to `end`: the fingerprints at the
/// save and at the end, by rank.
void run_through(int world, const std::string& dir, RigOptions ro, int save_at, int end, Fingerprints* at_save,
                 Fingerprints* at_end) {
  at_save->assign(static_cast<std::size_t>(world), {});
  at_end->assign(static_cast<std::size_t>(world), {});
  std::mutex m;
  simulate(world, [&](RankContext& ctx) {
    Rig rig(ctx, 0, ro);
    Checkpointer ck(options_for(ctx, dir));
    rig.add_to(ck);
    for (int t = 0; t < save_at; ++t) rig.step(t);
    ck.save(save_at);
    const auto s = rig.fingerprint();
    for (int t = save_at; t < end; ++t) rig.step(t);
    std::lock_guard<std::mutex> lock(m);
    (*at_save)[static_cast<std::size_t>(ctx.rank())] = s;
    (*at_end)[static_cast<std::size_t>(ctx.rank())] = rig.fingerprint();
  }, short_timeout());
}

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

/// Saves steps 2 and 4 at world 3 into dir (a rig without DiLoCo).
void save_two(const std::string& dir) {
  simulate(3, [&](RankContext& ctx) {
    Rig rig(ctx, 0);
    Checkpointer ck(options_for(ctx, dir));
    rig.add_to(ck);
    for (int t = 0; t < 4; ++t) {
      rig.step(t);
      if (t == 1 || t == 3) ck.save(t + 1);
    }
  }, short_timeout());
}

/// load(step) at world 3 into a fresh rig, every rank's error captured.
void load_capturing(const std::string& dir, std::int64_t step, Errors& errors) {
  simulate(3, [&](RankContext& ctx) {
    Rig rig(ctx, 1);
    Checkpointer ck(options_for(ctx, dir));
    rig.add_to(ck);
    errors.capture(ctx.rank(), [&] { ck.load(step); });
  }, short_timeout());
}

}  // namespace

TEST_CASE("Checkpointer: params, Adam, ZeRO, post-local SGD, generators, position and extras round trip bit for bit",
          "[checkpointer]") {
  for (int world : {3, 5}) {
    const std::string dir = fresh_dir("roundtrip-" + std::to_string(world));
    Fingerprints at_save, at_end;
    run_through(world, dir, {}, 3, 6, &at_save, &at_end);
    Fingerprints loaded(static_cast<std::size_t>(world)), resumed(static_cast<std::size_t>(world));
    std::vector<std::int64_t> steps(static_cast<std::size_t>(world)), offsets(steps), epochs(steps);
    std::mutex m;
    simulate(world, [&](RankContext& ctx) {
      Rig rig(ctx, 1);  // other initial values, other generator states
      Checkpointer ck(options_for(ctx, dir));
      rig.add_to(ck);
      const auto step = ck.load_latest();
      const auto l = rig.fingerprint();
      const std::int64_t offset = rig.offset, epoch = rig.sampler.epoch();
      for (int t = static_cast<int>(step.value_or(0)); t < 6; ++t) rig.step(t);
      std::lock_guard<std::mutex> lock(m);
      const auto r = static_cast<std::size_t>(ctx.rank());
      steps[r] = step.value_or(-1), loaded[r] = l, resumed[r] = rig.fingerprint(), offsets[r] = offset, epochs[r] = epoch;
    }, short_timeout());
    for (int r = 0; r < world; ++r) {
      INFO("world " << world << " rank " << r);
      const auto k = static_cast<std::size_t>(r);
      CHECK(steps[k] == 3);
      CHECK(loaded[k] == at_save[k]);
      CHECK(resumed[k] == at_end[k]);
      CHECK(offsets[k] == 15);
      CHECK(epochs[k] == 0);
    }
  }
}

TEST_CASE("Checkpointer: ZeRO and replicated parameters saved at 3 ranks load at 5, bit for bit the run that never "
          "stopped", "[checkpointer]") {
  const std::string dir = fresh_dir("reshard");
  const RigOptions ro{true, true, false, true};
  Fingerprints at_save, at_end;
  run_through(3, dir, ro, 2, 5, &at_save, &at_end);
  Fingerprints resumed(5);
  std::vector<std::int64_t> offsets(5);
  std::mutex m;
  simulate(5, [&](RankContext& ctx) {
    Rig rig(ctx, 1, ro);
    Checkpointer ck(options_for(ctx, dir));
    rig.add_to(ck);
    const auto step = ck.load_latest();
    const std::int64_t offset = rig.offset;
    for (int t = static_cast<int>(step.value_or(0)); t < 5; ++t) rig.step(t);
    std::lock_guard<std::mutex> lock(m);
    resumed[static_cast<std::size_t>(ctx.rank())] = rig.fingerprint();
    offsets[static_cast<std::size_t>(ctx.rank())] = offset;
  }, short_timeout());
  for (int r = 0; r < 5; ++r) {
    INFO("rank " << r);
    CHECK(resumed[static_cast<std::size_t>(r)] == at_end[0]);
    CHECK(offsets[static_cast<std::size_t>(r)] == 6);  // 2 steps of 5 samples at 3 ranks: 30 samples, 6 per rank at 5
  }
}

TEST_CASE("Checkpointer: DiLoCo (sharded) with its post-local SGD round trips bit for bit", "[checkpointer]") {
  const std::string dir = fresh_dir("diloco");
  auto train = [&](bool resume, Fingerprints* out_save, Fingerprints* out_end) {
    std::mutex m;
    simulate(3, [&](RankContext& ctx) {
      std::vector<Tensor> c;
      for (int k = 0; k < 3; ++k) c.push_back(values(6 + k, resume ? 50 + k : 40 + k));
      optim::DiLoCoOptions o;
      o.sync_every = 2;
      o.outer_optimizer = optim::OptimizerSpec{"SGD", {{"lr", 0.7}, {"momentum", 0.9}, {"nesterov", true}}};
      optim::PostLocalSGDOptimizer opt(std::make_unique<optim::SGD>(c, optim::SGDOptions(0.05).momentum(0.9)),
                                       std::make_unique<optim::DiLoCoAverager>(c, o, ctx.world()));
      Checkpointer ck(options_for(ctx, dir));
      std::map<std::string, Tensor> named;
      for (std::size_t k = 0; k < c.size(); ++k) named["c" + std::to_string(k)] = c[k];
      ck.add_tensors("params", named, Placement::per_rank);
      ck.add_optimizer("diloco", opt);
      int first = 0;
      if (resume) first = static_cast<int>(ck.load_latest().value_or(-1));
      auto fp = [&] {
        std::vector<std::uint64_t> v;
        for (const Tensor& p : c)
          for (float f : p.to_vector<float>()) v.push_back(static_cast<std::uint64_t>(std::hash<float>{}(f)));
        return v;
      };
      std::vector<std::uint64_t> s;
      for (int t = first; t < 7; ++t) {
        if (t == 3 && !resume) {
          ck.save(3);
          s = fp();
        }
        for (std::size_t k = 0; k < c.size(); ++k)
          c[k].set_grad(values(static_cast<int>(c[k].numel()), 300 + 50 * ctx.rank() + 7 * t + static_cast<int>(k)));
        opt.step();
      }
      std::lock_guard<std::mutex> lock(m);
      if (out_save) (*out_save)[static_cast<std::size_t>(ctx.rank())] = s;
      (*out_end)[static_cast<std::size_t>(ctx.rank())] = fp();
    }, short_timeout());
  };
  Fingerprints at_save(3), at_end(3), resumed(3);
  train(false, &at_save, &at_end);
  train(true, nullptr, &resumed);
  CHECK(fs::exists(fs::path(dir) / "step-00000003" / "diloco" / "diloco-rank2-of-3.safetensors"));
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK(resumed[static_cast<std::size_t>(r)] == at_end[static_cast<std::size_t>(r)]);
  }
}

TEST_CASE("Checkpointer: save_async writes byte for byte what save writes, and returns before the write",
          "[checkpointer]") {
  const std::string sync_dir = fresh_dir("sync"), async_dir = fresh_dir("async");
  std::mutex m;
  std::vector<int> released_by_caller(3), ready_at_return(3, -1), file_at_return(3, -1);
  Fingerprints at_save(3);
  simulate(3, [&](RankContext& ctx) {
    Rig rig(ctx, 0);
    for (int t = 0; t < 2; ++t) rig.step(t);
    // The writer waits for the caller: a save_async that waited for its write
    // would never return (the hook gives up after 30 s and says so).
    Promise<void> release;
    std::atomic<bool> timed_out{false};
    CheckpointerOptions so = options_for(ctx, sync_dir), ao = options_for(ctx, async_dir);
    so.run = ao.run = "fixed-run";
    ao.before_write = [&](const std::string&) {
      if (!release.get_future().wait_for(std::chrono::seconds(30))) timed_out = true;
    };
    Checkpointer sync(so), async(ao);
    rig.add_to(sync);
    rig.add_to(async);
    sync.save(2);
    const auto before = rig.fingerprint();
    Future<void> f = async.save_async(2);
    const bool ready = f.is_ready();
    const bool file = fs::exists(fs::path(async_dir) / "step-00000002.tmp" /
                                 ("rank" + std::to_string(ctx.rank()) + "-of-3.safetensors"));
    rig.step(2);  // the parameters and the optimizers' state change while the write waits
    release.set_value();
    f.get();
    std::lock_guard<std::mutex> lock(m);
    const auto r = static_cast<std::size_t>(ctx.rank());
    released_by_caller[r] = !timed_out, ready_at_return[r] = ready, file_at_return[r] = file, at_save[r] = before;
  }, short_timeout());
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK(released_by_caller[static_cast<std::size_t>(r)] == 1);
    CHECK(ready_at_return[static_cast<std::size_t>(r)] == 0);
    CHECK(file_at_return[static_cast<std::size_t>(r)] == 0);
  }
  // Byte for byte, every file.
  const fs::path a = fs::path(sync_dir) / "step-00000002", b = fs::path(async_dir) / "step-00000002";
  std::set<std::string> files_a, files_b;
  for (const auto& e : fs::recursive_directory_iterator(a))
    if (e.is_regular_file()) files_a.insert(fs::relative(e.path(), a).string());
  for (const auto& e : fs::recursive_directory_iterator(b))
    if (e.is_regular_file()) files_b.insert(fs::relative(e.path(), b).string());
  CHECK(files_a == files_b);
  CHECK(files_a.size() == 8);  // the manifest, the replicated file, 3 rank files, 3 ZeRO shards
  for (const std::string& f : files_a) {
    INFO(f);
    CHECK(bytes_of(a / f) == bytes_of(b / f));
  }
  // The async checkpoint holds the state at save_async, not the step after.
  CHECK(loaded_fingerprints(3, async_dir, 2) == at_save);
}

TEST_CASE("Checkpointer: keep_last keeps the newest checkpoints and removes older leftovers", "[checkpointer]") {
  const std::string dir = fresh_dir("keep");
  fs::create_directories(fs::path(dir) / "step-00000000.tmp");  // a save that never completed
  simulate(3, [&](RankContext& ctx) {
    Rig rig(ctx, 0, RigOptions{true, false, false, false});
    Checkpointer ck(options_for(ctx, dir, 2));
    rig.add_to(ck);
    train_saving_async(rig, ck, 0, 5);
  }, short_timeout());
  CHECK(names_in(dir) == std::set<std::string>{"step-00000004", "step-00000005"});
}

TEST_CASE("Checkpointer: load_latest skips incomplete checkpoints and refuses a folder named for another step",
          "[checkpointer]") {
  const std::string dir = fresh_dir("latest");
  const fs::path d(dir);
  save_two(dir);
  // A newer save that did not finish (.tmp), and a folder without its manifest.
  fs::copy(d / "step-00000004", d / "step-00000006.tmp", fs::copy_options::recursive);
  fs::copy(d / "step-00000004", d / "step-00000008", fs::copy_options::recursive);
  fs::remove(d / "step-00000008" / "checkpoint.json");
  const std::string empty = fresh_dir("latest-empty"), absent = empty + "/absent";
  std::mutex m;
  std::vector<std::int64_t> got(3), none(3), gone(3);
  simulate(3, [&](RankContext& ctx) {
    Rig rig(ctx, 1);
    Checkpointer ck(options_for(ctx, dir)), ck_empty(options_for(ctx, empty)), ck_absent(options_for(ctx, absent));
    rig.add_to(ck);
    const auto s = ck.load_latest();
    const auto n = ck_empty.load_latest(), a = ck_absent.load_latest();
    std::lock_guard<std::mutex> lock(m);
    const auto r = static_cast<std::size_t>(ctx.rank());
    got[r] = s.value_or(-1), none[r] = n.value_or(-1), gone[r] = a.value_or(-1);
  }, short_timeout());
  CHECK(got == std::vector<std::int64_t>{4, 4, 4});
  CHECK(none == std::vector<std::int64_t>{-1, -1, -1});
  CHECK(gone == std::vector<std::int64_t>{-1, -1, -1});

  fs::rename(d / "step-00000004", d / "step-00000007");
  Errors errors(3);
  simulate(3, [&](RankContext& ctx) {
    Rig rig(ctx, 1);
    Checkpointer ck(options_for(ctx, dir));
    rig.add_to(ck);
    errors.capture(ctx.rank(), [&] { (void)ck.load_latest(); });
  }, short_timeout());
  for (int r = 0; r < 3; ++r) {
    INFO(errors.what[static_cast<std::size_t>(r)]);
    CHECK(errors.op[static_cast<std::size_t>(r)] == "Checkpointer::load_latest");
    CHECK_THAT(errors.what[static_cast<std::size_t>(r)], Catch::Contains("step-00000007 holds step 4"));
  }
}

TEST_CASE("Checkpointer: a folder that mixes files of two checkpoints is refused, naming the file", "[checkpointer]") {
  const std::string dir = fresh_dir("mixed");
  const fs::path d(dir);
  save_two(dir);
  fs::copy_file(d / "step-00000002" / "rank1-of-3.safetensors", d / "step-00000004" / "rank1-of-3.safetensors",
                fs::copy_options::overwrite_existing);
  Errors errors(3);
  load_capturing(dir, 4, errors);
  for (int r = 0; r < 3; ++r) {
    const std::string& what = errors.what[static_cast<std::size_t>(r)];
    INFO(what);
    CHECK(errors.op[static_cast<std::size_t>(r)] == "Checkpointer::load");
    CHECK_THAT(what, Catch::Contains((d / "step-00000004" / "rank1-of-3.safetensors").string() + " holds step 2"));
    CHECK_THAT(what, Catch::Contains("mixes files of different checkpoints"));
  }
}

TEST_CASE("Checkpointer: swapped rank files are refused, naming the file", "[checkpointer]") {
  const std::string dir = fresh_dir("swapped");
  const fs::path s = fs::path(dir) / "step-00000004";
  save_two(dir);
  fs::rename(s / "rank1-of-3.safetensors", s / "tmp");
  fs::rename(s / "rank2-of-3.safetensors", s / "rank1-of-3.safetensors");
  fs::rename(s / "tmp", s / "rank2-of-3.safetensors");
  Errors errors(3);
  load_capturing(dir, 4, errors);
  for (int r = 0; r < 3; ++r) {
    const std::string& what = errors.what[static_cast<std::size_t>(r)];
    INFO(what);
    CHECK_THAT(what, Catch::Contains((s / "rank1-of-3.safetensors").string() + " was written by rank 2"));
    CHECK_THAT(what, Catch::Contains("swapped"));
  }
}

TEST_CASE("Checkpointer: errors name the call, the rank and what was wrong", "[checkpointer]") {
  const std::string dir = fresh_dir("errors");
  save_two(dir);
  // A step that is not there; per-rank state at another world size.
  Errors missing(3), other_world(5);
  load_capturing(dir, 7, missing);
  simulate(5, [&](RankContext& ctx) {
    Rig rig(ctx, 1);
    Checkpointer ck(options_for(ctx, dir));
    rig.add_to(ck);
    other_world.capture(ctx.rank(), [&] { ck.load(4); });
  }, short_timeout());
  for (int r = 0; r < 3; ++r) {
    INFO(missing.what[static_cast<std::size_t>(r)]);
    CHECK(missing.op[static_cast<std::size_t>(r)] == "Checkpointer::load");
    CHECK_THAT(missing.what[static_cast<std::size_t>(r)], Catch::Contains("[rank " + std::to_string(r) + "]"));
    CHECK_THAT(missing.what[static_cast<std::size_t>(r)], Catch::Contains("step-00000007 does not exist"));
  }
  for (int r = 0; r < 5; ++r) {
    INFO(other_world.what[static_cast<std::size_t>(r)]);
    CHECK_THAT(other_world.what[static_cast<std::size_t>(r)],
               Catch::Contains("'local_params' (tensors) is per-rank state saved at 3 ranks, which cannot be loaded "
                               "at 5 ranks"));
  }

  // Bad arguments; a rank with another item; a rank whose write fails.
  Errors names(3), step(3), registered(3), write(3);
  std::vector<int> committed(3, -1);
  std::mutex m;
  const std::string save_dir = fresh_dir("errors-save");
  simulate(3, [&](RankContext& ctx) {
    Rig rig(ctx, 0, RigOptions{true, false, false, false});
    CheckpointerOptions o = options_for(ctx, save_dir);
    o.before_write = [&, rank = ctx.rank()](const std::string&) {
      if (rank == 0) throw IOError("test", "the disk is full");  // rank 0 writes the replicated file
    };
    Checkpointer ck(o);
    rig.add_to(ck);
    names.capture(ctx.rank(), [&] { ck.add_tensors("a/b", {}, Placement::replicated); });
    step.capture(ctx.rank(), [&] { ck.save(-1); });
    write.capture(ctx.rank(), [&] { ck.save(2); });
    std::map<std::string, std::string> extra;
    if (ctx.rank() == 2) ck.add_extras("only-on-rank-2", extra, Placement::per_rank);
    registered.capture(ctx.rank(), [&] { ck.save(3); });
    std::lock_guard<std::mutex> lock(m);
    committed[static_cast<std::size_t>(ctx.rank())] = fs::exists(fs::path(o.dir) / "step-00000002");
  }, short_timeout());
  for (int r = 0; r < 3; ++r) {
    const auto k = static_cast<std::size_t>(r);
    INFO("rank " << r << ": " << names.what[k] << " | " << step.what[k] << " | " << registered.what[k] << " | "
                  << write.what[k]);
    CHECK(names.op[k] == "Checkpointer::add_tensors");
    CHECK_THAT(names.what[k], Catch::Contains("'a/b'"));
    CHECK(step.op[k] == "Checkpointer::save");
    CHECK_THAT(step.what[k], Catch::Contains("the step is -1"));
    CHECK(registered.op[k] == "Checkpointer::save");
    CHECK_THAT(registered.what[k], Catch::Contains("rank 2 saves another step or other items than rank 0"));
    CHECK_THAT(write.what[k], Catch::Contains("the disk is full"));
    if (r != 0) {
      CHECK(write.op[k] == "Checkpointer::save");
      CHECK_THAT(write.what[k], Catch::Contains("rank 0 failed"));
      CHECK_THAT(write.what[k], Catch::Contains("the checkpoint of step 2 was not committed"));
    }
    CHECK(committed[k] == 0);
  }
}
