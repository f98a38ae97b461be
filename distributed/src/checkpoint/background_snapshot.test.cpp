// CheckpointerOptions::background_snapshot (checkpointer.hpp): the writer
// thread copies the snapshot, the caller waits for it with wait_snapshot()
// before it changes the registered objects; what is saved is still the
// state at save_async, and a failure of the background part is reported.
#include <catch2/catch.hpp>

#include <atomic>
#include <set>

#include "checkpoint/test_rig.hpp"

using namespace dopt;
using namespace dopt::checkpoint_test;

namespace {

/// Every file of a checkpoint folder, relative to it.
std::set<std::string> files_in(const fs::path& folder) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(folder))
    if (e.is_regular_file()) out.insert(fs::relative(e.path(), folder).string());
  return out;
}

/// One rank's pair of saves: a Rig stepped twice, two Checkpointers of one
/// run id (so that their files compare byte for byte) over the rig, the
/// first synchronous, the second with background snapshots; step 2 saved
/// synchronously by the first.
struct TwoSaves {
  static CheckpointerOptions options(RankContext& ctx, const std::string& dir, bool background) {
    CheckpointerOptions o = options_for(ctx, dir);
    o.background_snapshot = background;
    o.run = "fixed-run";
    return o;
  }
  TwoSaves(RankContext& ctx, const std::string& sync_dir, const std::string& bg_dir)
      : rig(ctx, 0), sync(options(ctx, sync_dir, false)), bg(options(ctx, bg_dir, true)) {
    for (int t = 0; t < 2; ++t) rig.step(t);
    for (Checkpointer* ck : {&sync, &bg}) rig.add_to(*ck);
    sync.save(2);
  }
  Rig rig;
  Checkpointer sync, bg;
};

/// The files of step 2 in both folders: the same names, byte for byte.
void check_same_files(const std::string& sync_dir, const std::string& bg_dir, std::size_t expected_files) {
  const fs::path a = fs::path(sync_dir) / "step-00000002", b = fs::path(bg_dir) / "step-00000002";
  const std::set<std::string> files = files_in(a);
  REQUIRE(files_in(b) == files);
  if (expected_files) CHECK(files.size() == expected_files);
  for (const std::string& file : files) {
    INFO(file);
    CHECK(bytes_of(a / file) == bytes_of(b / file));
  }
}

}  // namespace

TEST_CASE("Checkpointer: a background snapshot saves the state at save_async bit for bit, with the parameters, "
          "Adam, ZeRO and post-local SGD changed right after it, at 1, 2 and 3 ranks",
          "[checkpointer]") {
  for (const int world : {1, 2, 3}) {
    INFO("world size " << world);
    const std::string tag = std::to_string(world);
    const std::string sync_dir = fresh_dir("bg-sync-" + tag), bg_dir = fresh_dir("bg-" + tag);
    std::mutex m;
    Fingerprints at_save(static_cast<std::size_t>(world));
    simulate(world, [&](RankContext& ctx) {
      TwoSaves two(ctx, sync_dir, bg_dir);
      Rig& rig = two.rig;
      const auto before = rig.fingerprint();
      Future<void> f = two.bg.save_async(2);
      // Numbers and strings are copied before save_async returns: changed at once.
      ++rig.counter;
      rig.extras["last"] = "changed before the snapshot was taken";
      (void)rig.rng();
      two.bg.wait_snapshot();
      // The tensors (parameters, Adam's, ZeRO's and SGD's state) change now,
      // while the files may still be written.
      rig.step(2);
      f.get();
      std::lock_guard<std::mutex> lock(m);
      at_save[static_cast<std::size_t>(ctx.rank())] = before;
    }, short_timeout());
    // Byte for byte what the synchronous save wrote: manifest, replicated, per rank and ZeRO.
    check_same_files(sync_dir, bg_dir, static_cast<std::size_t>(2 + 2 * world));
    CHECK(loaded_fingerprints(world, bg_dir, 2) == at_save);
  }
}

TEST_CASE("Checkpointer: a background save's failure is thrown by the next save_async when nobody waited for it, "
          "and by wait(), once",
          "[checkpointer]") {
  const std::string dir = fresh_dir("bg-errors");
  const int world = 3;
  Errors next_save(world), waited(world), after_wait(world);
  std::mutex m;
  std::vector<int> committed(world, -1), wait_snapshot_returned(world, 0);
  simulate(world, [&](RankContext& ctx) {
    Rig rig(ctx, 0, RigOptions{true, true, false, false});
    CheckpointerOptions o = options_for(ctx, dir);
    o.background_snapshot = true;
    std::atomic<int> failures{2};  // rank 1's first two writes fail
    o.before_write = [&, rank = ctx.rank()](const std::string&) {
      if (rank == 1 && failures.fetch_sub(1) > 0) throw IOError("test", "the disk is full");
    };
    Checkpointer ck(o);
    rig.add_to(ck);
    rig.step(0);
    (void)ck.save_async(1);  // fails in the background; its future is dropped
    ck.wait_snapshot();
    rig.step(1);
    next_save.capture(ctx.rank(), [&] { (void)ck.save_async(2); });  // throws step 1's error, saves nothing
    (void)ck.save_async(2);  // fails in the background again
    ck.wait_snapshot();
    waited.capture(ctx.rank(), [&] { ck.wait(); });
    after_wait.capture(ctx.rank(), [&] { ck.save(3); });  // wait() reported it: this one is saved
    std::lock_guard<std::mutex> lock(m);
    const auto r = static_cast<std::size_t>(ctx.rank());
    wait_snapshot_returned[r] = 1;
    committed[r] = fs::exists(fs::path(dir) / "step-00000001") * 1 + fs::exists(fs::path(dir) / "step-00000002") * 2 +
                   fs::exists(fs::path(dir) / "step-00000003") * 4;
  }, short_timeout());
  for (int r = 0; r < world; ++r) {
    const auto k = static_cast<std::size_t>(r);
    INFO("rank " << r << ": " << next_save.what[k] << " | " << waited.what[k] << " | " << after_wait.what[k]);
    CHECK(wait_snapshot_returned[k] == 1);
    CHECK_THAT(next_save.what[k], Catch::Contains(r == 1 ? "the disk is full" : "rank 1 failed"));
    CHECK_THAT(waited.what[k], Catch::Contains(r == 1 ? "the disk is full" : "rank 1 failed"));
    if (r != 1) {  // rank 1 throws the hook's own error
      CHECK(next_save.op[k] == "Checkpointer::save");
      CHECK(waited.op[k] == "Checkpointer::save");
      CHECK_THAT(next_save.what[k], Catch::Contains("the checkpoint of step 1 was not committed"));
      CHECK_THAT(waited.what[k], Catch::Contains("the checkpoint of step 2 was not committed"));
    }
    CHECK(after_wait.what[k].empty());
    CHECK(committed[k] == 4);
  }
}

TEST_CASE("Checkpointer: with a background snapshot, the optimizers' step() waits for its copies by itself "
          "(Adam, ZeRO and post-local SGD stepped right after save_async, no wait_snapshot()), at 2 and 3 ranks",
          "[checkpointer]") {
  for (const int world : {2, 3}) {
    for (const std::uint64_t seed : {1, 2, 3, 4, 5}) {
      INFO("world size " << world << ", seed " << seed);
      const std::string tag = std::to_string(world) + "-" + std::to_string(seed);
      const std::string sync_dir = fresh_dir("fence-sync-" + tag), bg_dir = fresh_dir("fence-" + tag);
      SimulateOptions opts = short_timeout();
      opts.deterministic = true;
      opts.seed = seed;
      simulate(world, [&](RankContext& ctx) {
        TwoSaves two(ctx, sync_dir, bg_dir);
        Future<void> f = two.bg.save_async(2);
        two.rig.step(2);  // every tensor it changes goes through a dopt optimizer or averager
        f.get();
      }, opts);
      check_same_files(sync_dir, bg_dir, 0);
    }
  }
}
