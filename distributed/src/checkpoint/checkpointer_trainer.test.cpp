// dopt::Checkpointer, what a trainer needs around its saves and loads
// (simulated ranks, world size 3): check_dir before the first save, the
// on_commit report (with what keep_last removed and kept), load_from a
// folder anywhere and folder(step), tensors that take finite values only,
// and an extras check that refuses a checkpoint before anything is loaded.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <mutex>

#include "checkpoint/test_rig.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/safetensors.hpp"

using namespace dopt;
using namespace dopt::checkpoint_test;

TEST_CASE("Checkpointer: check_dir refuses a folder that cannot take checkpoints on every rank, and creates one "
          "that can",
          "[checkpointer]") {
  const std::string base = fresh_dir("check-dir");
  const std::string file = base + "/a-file", good = base + "/new/ck";
  std::ofstream(file) << "x";
  Errors bad(3), under_file(3), fine(3);
  simulate(3, [&](RankContext& ctx) {
    Checkpointer a(options_for(ctx, file)), b(options_for(ctx, file + "/sub")), c(options_for(ctx, good));
    bad.capture(ctx.rank(), [&] { a.check_dir(); });
    under_file.capture(ctx.rank(), [&] { b.check_dir(); });
    fine.capture(ctx.rank(), [&] { c.check_dir(); });
  }, short_timeout());
  for (int r = 0; r < 3; ++r) {
    const auto k = static_cast<std::size_t>(r);
    INFO(bad.what[k] << " | " << under_file.what[k]);
    CHECK(bad.op[k] == "Checkpointer::check_dir");
    CHECK_THAT(bad.what[k], Catch::Contains("[rank " + std::to_string(r) + "]: " + file + " exists but is not a folder"));
    CHECK_THAT(under_file.what[k], Catch::Contains("cannot create " + file + "/sub: Not a directory"));
    CHECK(fine.what[k].empty());
  }
  CHECK(fs::is_directory(good));
  CHECK(fs::is_empty(good));  // the probe files are gone
}

TEST_CASE("Checkpointer: on_commit reports every committed save on rank 0, with what keep_last removed and kept",
          "[checkpointer]") {
  const std::string dir = fresh_dir("on-commit");
  // A checkpoint renamed by hand (its manifest holds step 4): keep_last
  // neither removes nor counts it.
  fs::create_directories(fs::path(dir) / "step-00000001");
  std::ofstream((fs::path(dir) / "step-00000001" / "checkpoint.json").string()) << "{\"step\": 4}\n";
  std::mutex m;
  std::vector<std::pair<int, CheckpointCommit>> reports;
  simulate(3, [&](RankContext& ctx) {
    Rig rig(ctx, 0, RigOptions{true, false, false, false});
    CheckpointerOptions o = options_for(ctx, dir, 2);
    o.on_commit = [&, rank = ctx.rank()](const CheckpointCommit& c) {
      std::lock_guard<std::mutex> lock(m);
      reports.emplace_back(rank, c);
    };
    Checkpointer ck(o);
    rig.add_to(ck);
    train_saving_async(rig, ck, 10, 13);
  }, short_timeout());
  REQUIRE(reports.size() == 3);
  const std::string odd = (fs::path(dir) / "step-00000001").string() + " holds step 4 (its checkpoint.json), not the "
                          "step its name says";
  for (std::size_t k = 0; k < 3; ++k) {
    INFO("save " << k);
    CHECK(reports[k].first == 0);
    CHECK(reports[k].second.step == static_cast<std::int64_t>(11 + k));
    CHECK(reports[k].second.folder == (fs::path(dir) / ("step-000000" + std::to_string(11 + k))).string());
    CHECK(reports[k].second.kept == std::vector<std::string>{odd});
  }
  CHECK(reports[0].second.removed.empty());
  CHECK(reports[1].second.removed.empty());
  CHECK(reports[2].second.removed == std::vector<std::string>{(fs::path(dir) / "step-00000011").string()});
  CHECK(fs::exists(fs::path(dir) / "step-00000001" / "checkpoint.json"));
}

TEST_CASE("Checkpointer: load_from loads a checkpoint folder anywhere and returns its step, folder(step) names where "
          "save puts it",
          "[checkpointer]") {
  const std::string dir = fresh_dir("load-from"), elsewhere = fresh_dir("load-from-elsewhere") + "/best";
  const std::string unused = fresh_dir("load-from-unused");
  std::mutex m;
  std::vector<std::vector<std::uint64_t>> saved(3), loaded(3);
  std::vector<std::string> folders(3);
  std::vector<std::int64_t> steps(3);
  simulate(3, [&](RankContext& ctx) {
    Rig rig(ctx, 0);
    Checkpointer ck(options_for(ctx, dir));
    rig.add_to(ck);
    for (int t = 0; t < 3; ++t) rig.step(t);
    ck.save(3);
    std::lock_guard<std::mutex> lock(m);
    saved[static_cast<std::size_t>(ctx.rank())] = rig.fingerprint();
    folders[static_cast<std::size_t>(ctx.rank())] = ck.folder(3);
  }, short_timeout());
  fs::copy(fs::path(dir) / "step-00000003", elsewhere, fs::copy_options::recursive);
  Errors renamed(3);
  simulate(3, [&](RankContext& ctx) {
    Rig rig(ctx, 1);
    Checkpointer ck(options_for(ctx, unused));
    rig.add_to(ck);
    const std::int64_t s = ck.load_from(elsewhere);
    renamed.capture(ctx.rank(), [&] { ck.load_from(dir + "/step-00000007"); });
    std::lock_guard<std::mutex> lock(m);
    loaded[static_cast<std::size_t>(ctx.rank())] = rig.fingerprint();
    steps[static_cast<std::size_t>(ctx.rank())] = s;
  }, short_timeout());
  CHECK(loaded == saved);
  CHECK(steps == std::vector<std::int64_t>{3, 3, 3});
  CHECK(folders == std::vector<std::string>(3, (fs::path(dir) / "step-00000003").string()));
  for (int r = 0; r < 3; ++r) {
    CHECK(renamed.op[static_cast<std::size_t>(r)] == "Checkpointer::load_from");
    CHECK_THAT(renamed.what[static_cast<std::size_t>(r)], Catch::Contains("step-00000007 does not exist"));
  }
}

TEST_CASE("Checkpointer: tensors that take finite values only refuse a NaN at load on every rank, naming the file "
          "and the tensor, and nothing is loaded",
          "[checkpointer]") {
  const std::string dir = fresh_dir("finite");
  simulate(3, [&](RankContext& ctx) {
    Tensor w = Tensor::full({4}, 1.0), v = Tensor::full({2}, 2.0);
    Checkpointer ck(options_for(ctx, dir));
    ck.add_tensors("model", {{"w", w}}, Placement::replicated, TensorValues::finite);
    ck.add_tensors("other", {{"v", v}}, Placement::replicated);
    ck.save(1);
  }, short_timeout());
  const std::string file = (fs::path(dir) / "step-00000001" / "replicated.safetensors").string();
  SafetensorsFile f = read_safetensors(file);
  Tensor bad = f.tensors.at("model/w").clone();
  bad.flatten().flat_slice(2, 1).fill_(std::nan(""));
  f.tensors["model/w"] = bad;
  Tensor inf = f.tensors.at("other/v").clone();
  inf.fill_(INFINITY);
  f.tensors["other/v"] = inf;  // "any" values: loads as it is
  write_safetensors(file, f.tensors, f.metadata);
  Errors errors(3);
  std::mutex m;
  std::vector<float> after(3);
  simulate(3, [&](RankContext& ctx) {
    Tensor w = Tensor::full({4}, 5.0), v = Tensor::full({2}, 6.0);
    Checkpointer ck(options_for(ctx, dir));
    ck.add_tensors("other", {{"v", v}}, Placement::replicated);
    ck.add_tensors("model", {{"w", w}}, Placement::replicated, TensorValues::finite);
    errors.capture(ctx.rank(), [&] { ck.load(1); });
    std::lock_guard<std::mutex> lock(m);
    after[static_cast<std::size_t>(ctx.rank())] = v.to_vector<float>()[0];
  }, short_timeout());
  for (int r = 0; r < 3; ++r) {
    const auto k = static_cast<std::size_t>(r);
    INFO(errors.what[k]);
    CHECK(errors.op[k] == "Checkpointer::load");
    CHECK_THAT(errors.what[k], Catch::Contains(file + ": tensor 'model/w' holds NaN at element 2 of 4"));
    CHECK(after[k] == 6.0f);  // not even the item before it was loaded
  }
}

TEST_CASE("Checkpointer: an extras check sees what was saved before any item is checked, and its error refuses the "
          "checkpoint on every rank",
          "[checkpointer]") {
  const std::string dir = fresh_dir("extras-check");
  simulate(3, [&](RankContext& ctx) {
    std::map<std::string, std::string> run{{"hidden", "4"}};
    Tensor w = Tensor::full({4}, 1.0);
    Checkpointer ck(options_for(ctx, dir));
    ck.add_extras("run", run, Placement::replicated);
    ck.add_tensors("model", {{"w", w}}, Placement::replicated);
    ck.save(1);
  }, short_timeout());
  Errors refused(3), accepted(3);
  std::mutex m;
  std::vector<std::string> seen_folder(3);
  std::vector<std::map<std::string, std::string>> after(3);
  simulate(3, [&](RankContext& ctx) {
    // Another model size: without the check, the tensor's shape would be the error.
    std::map<std::string, std::string> run{{"hidden", "8"}};
    Tensor w8 = Tensor::full({8}, 5.0);
    Checkpointer ck(options_for(ctx, dir));
    ck.add_extras("run", run, Placement::replicated,
                  [&, rank = ctx.rank()](const std::map<std::string, std::string>& saved, const std::string& folder) {
                    {
                      std::lock_guard<std::mutex> lock(m);
                      seen_folder[static_cast<std::size_t>(rank)] = folder;
                    }
                    if (saved.at("hidden") != run.at("hidden"))
                      throw ValueError("resume", "the checkpoint's hidden is " + saved.at("hidden") + ", this run's " +
                                                     run.at("hidden"));
                  });
    ck.add_tensors("model", {{"w", w8}}, Placement::replicated);
    refused.capture(ctx.rank(), [&] { ck.load(1); });
    std::lock_guard<std::mutex> lock(m);
    after[static_cast<std::size_t>(ctx.rank())] = run;
  }, short_timeout());
  simulate(3, [&](RankContext& ctx) {
    std::map<std::string, std::string> run{{"hidden", "4"}};
    Tensor w = Tensor::full({4}, 5.0);
    Checkpointer ck(options_for(ctx, dir));
    ck.add_extras("run", run, Placement::replicated, [](const auto& saved, const std::string&) {
      if (saved.at("hidden") != "4") throw ValueError("resume", "another run");
    });
    ck.add_tensors("model", {{"w", w}}, Placement::replicated);
    accepted.capture(ctx.rank(), [&] { ck.load(1); });
  }, short_timeout());
  for (int r = 0; r < 3; ++r) {
    const auto k = static_cast<std::size_t>(r);
    INFO(refused.what[k]);
    CHECK(refused.op[k] == "resume");
    CHECK_THAT(refused.what[k], Catch::Contains("the checkpoint's hidden is 4, this run's 8"));
    CHECK(seen_folder[k] == (fs::path(dir) / "step-00000001").string());
    CHECK(after[k] == std::map<std::string, std::string>{{"hidden", "8"}});  // nothing loaded
    CHECK(accepted.what[k].empty());
  }
}
