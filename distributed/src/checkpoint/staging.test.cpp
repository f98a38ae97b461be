// The Checkpointer's staging memory (staging.hpp): a save's snapshot copies
// into the buffers the previous save's writer gave back, and what each save
// writes is still its own step's values (parameters and ZeRO shards changed
// between saves, each checkpoint loaded back bit for bit).
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <vector>

#include "checkpoint/staging.hpp"
#include "checkpoint/test_rig.hpp"

using namespace dopt;
using namespace dopt::checkpoint_test;

TEST_CASE("Checkpointer staging: a snapshot copies into the buffer given back under its key, if it fits",
          "[checkpointer]") {
  checkpoint::Staging staging;
  const Tensor a = values(1000, 1), b = values(1000, 2), small = values(10, 3);
  std::map<std::string, Tensor> file{{"w", a}};
  staging.copy("x/", file);
  REQUIRE(file.at("w").data_ptr() != a.data_ptr());
  CHECK(std::memcmp(file.at("w").data_ptr(), a.data_ptr(), a.nbytes()) == 0);
  const void* memory = file.at("w").data_ptr();
  file.emplace("other", values(1000, 4));
  staging.give_back("x/", std::move(file));
  CHECK(staging.kept_bytes() == a.nbytes());  // "other" was not copied by the staging: dropped

  std::map<std::string, Tensor> next{{"w", b}};
  staging.copy("x/", next);  // the same memory, b's values
  CHECK(next.at("w").data_ptr() == memory);
  CHECK(std::memcmp(next.at("w").data_ptr(), b.data_ptr(), b.nbytes()) == 0);
  CHECK(staging.kept_bytes() == 0);
  staging.give_back("x/", std::move(next));

  std::map<std::string, Tensor> resized{{"w", small}};
  staging.copy("x/", resized);  // does not fit: fresh memory, the old buffer dropped
  CHECK(resized.at("w").numel() == 10);
  CHECK(std::memcmp(resized.at("w").data_ptr(), small.data_ptr(), small.nbytes()) == 0);
  CHECK(staging.kept_bytes() == 0);
}

TEST_CASE("Checkpointer staging: saves that reuse the memory still write each step's values", "[checkpointer]") {
  // Saves at steps 10 and 11 (the second into the first one's memory), then
  // a fresh run resumes from each and must end where the saving run ended.
  const std::string dir = fresh_dir("staging");
  const int world = 3;
  const RigOptions ro{false, true, false, false};  // parameters and ZeRO
  std::vector<std::vector<std::uint64_t>> end(world), from10(world), from11(world);
  simulate(world, [&](RankContext& ctx) {
    const auto me = static_cast<std::size_t>(ctx.rank());
    // A rig (parameters of initial values `init`) registered with a Checkpointer, for `body`.
    auto with_rig = [&](int init, const std::function<void(Rig&, Checkpointer&)>& body) {
      Rig rig(ctx, init, ro);
      Checkpointer ck(options_for(ctx, dir));
      rig.add_to(ck);
      body(rig, ck);
    };
    with_rig(0, [&](Rig& rig, Checkpointer& ck) {
      rig.step(0);
      ck.save(10);
      rig.step(1);
      ck.save(11);
      rig.step(2);
      end[me] = rig.fingerprint();
    });
    with_rig(1, [&](Rig& rig, Checkpointer& ck) {
      ck.load(11);
      rig.step(2);
      from11[me] = rig.fingerprint();
      ck.load(10);
      rig.step(1);
      rig.step(2);
      from10[me] = rig.fingerprint();
    });
  }, short_timeout());
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    CHECK(from11[static_cast<std::size_t>(r)] == end[static_cast<std::size_t>(r)]);
    CHECK(from10[static_cast<std::size_t>(r)] == end[static_cast<std::size_t>(r)]);
  }
}
