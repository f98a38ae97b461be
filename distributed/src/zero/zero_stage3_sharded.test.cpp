// ZeRO stage 3's sharded checkpoints (ShardedUnits::save_sharded and
// load_sharded, and the Checkpointer's add_optimizer(ShardedUnits&)) over
// simulated ranks: a checkpoint written at one world size loads at another
// with the consolidated parameters and state unchanged, bit for bit, and
// training goes on as it does from the consolidated state dict; a load that
// does not fit is refused and changes nothing. Rank functions only record;
// the test thread asserts after simulate() returned.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/checkpointer.hpp"
#include "dopt/distributed/zero_stage3.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/optim/sgd.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/state_dict.hpp"
#include "zero_stage3_run.hpp"

using namespace dopt;
using namespace dopt::optim;
namespace fs = std::filesystem;

namespace {

using dopt::testing::Stage3Run;

std::string bytes_of(const Tensor& t) {
  return std::string(static_cast<const char*>(t.data_ptr()), static_cast<std::size_t>(t.nbytes()));
}

// Every parameter in full and the consolidated state, as bytes.
struct Snapshot {
  std::vector<std::string> params, state;
  bool operator==(const Snapshot& o) const { return params == o.params && state == o.state; }
};

Snapshot snapshot_of(ShardedUnits& model) {
  Snapshot s;
  for (const auto& p : model.full_parameters()) s.params.push_back(bytes_of(p));
  for (const auto& [name, t] : dopt::testing::named_state(model.state_dict())) s.state.push_back(name + bytes_of(t));
  return s;
}

Stage3Run run_of(const OptimizerSpec& spec) { return dopt::testing::small_stage3_run(spec); }

fs::path temp_dir(const std::string& name) {
  const auto d = fs::temp_directory_path() / ("dopt-zero3-sharded-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(d);
  return d;
}

// How a leg starts: from the run's initial parameters, from a folder written
// by save_sharded, from a Checkpointer's folder, or from a consolidated
// state dict plus parameters (the reference).
enum class From { init, sharded, checkpointer, consolidated };

struct Leg {
  int world = 1;
  From from = From::init;
  std::string in;                          // the folder (sharded, checkpointer) or file (consolidated)
  std::vector<Tensor> params;              // consolidated: the parameters
  int t0 = 0, t1 = 0;                      // the steps it trains
  std::string save_sharded, checkpointer;  // where it saves at its end ("" none)
};

struct LegResult {
  Snapshot loaded, end;  // rank 0's, after the load and at the end
  std::vector<Tensor> end_params;
  std::string end_state_file;  // consolidated state at the end (saved by rank 0)
};

LegResult leg(const Stage3Run& run, const Leg& l) {
  LegResult res;
  res.end_state_file = (temp_dir("state-" + std::to_string(l.world) + "-" + std::to_string(l.t1)) += ".st").string();
  simulate(l.world, [&](RankContext& ctx) {
    std::vector<std::vector<Tensor>> units = dopt::testing::stage3_units(run);
    if (l.from != From::init)
      for (auto& u : units)
        for (auto& p : u) p = Tensor::zeros(p.shape());  // nothing of the run's start may leak into a load
    ShardedUnits model(units, run.spec, ShardedUnitsOptions{ctx.world()});
    std::optional<Checkpointer> ck;
    if (l.from == From::checkpointer || !l.checkpointer.empty()) {
      CheckpointerOptions co{ctx.world(), l.checkpointer.empty() ? temp_dir("unused").string() : l.checkpointer};
      ck.emplace(co);
      ck->add_optimizer("model", model);
    }
    switch (l.from) {
      case From::init: break;
      case From::sharded: model.load_sharded(l.in); break;
      case From::checkpointer: ck->load_from(l.in); break;
      case From::consolidated:
        model.load_parameters(l.params);
        model.load_state_dict(load_state_dict(l.in));
        break;
    }
    const Snapshot loaded = snapshot_of(model);
    std::int64_t peak = 0;
    for (int t = l.t0; t < l.t1; ++t) dopt::testing::stage3_iteration(model, run, t, peak);
    if (!l.save_sharded.empty()) model.save_sharded(l.save_sharded);
    if (!l.checkpointer.empty()) ck->save(l.t1);
    const Snapshot end = snapshot_of(model);
    const auto full = model.full_parameters();
    const StateDict sd = model.state_dict();
    if (ctx.rank() == 0) {
      res.loaded = loaded;
      res.end = end;
      res.end_params = full;
      save_state_dict(sd, res.end_state_file);
    }
  });
  return res;
}

}  // namespace

TEST_CASE("ZeRO stage 3 sharded checkpoints reshard from 3 to 5 to 2 ranks bit for bit (save_sharded and the "
          "Checkpointer)",
          "[zero][zero3][checkpoint]") {
  for (const auto& spec : {spec_of(AdamOptions(0.01)), spec_of(SGDOptions(0.1).momentum(0.9))}) {
    DYNAMIC_SECTION(spec.name) {
      const Stage3Run run = run_of(spec);
      const fs::path a = temp_dir("a"), b = temp_dir("b"), ck3 = temp_dir("ck3");
      // 3 ranks train steps 0, 1 and save both ways.
      const LegResult three = leg(run, Leg{3, From::init, "", {}, 0, 2, a.string(), ck3.string()});
      REQUIRE(fs::exists(a / ShardedUnits::shard_file_name(2, 3)));
      // 5 ranks load the sharded files: the consolidated values are the 3 ranks' ...
      const LegResult five = leg(run, Leg{5, From::sharded, a.string(), {}, 2, 4, b.string(), ""});
      CHECK(five.loaded == three.end);
      // ... and training goes on as from the consolidated state dict.
      const LegResult five_ref =
          leg(run, Leg{5, From::consolidated, three.end_state_file, three.end_params, 2, 4, "", ""});
      CHECK(five_ref.loaded == three.end);
      CHECK(five.end == five_ref.end);
      CHECK(five.end.params != three.end.params);  // it trained
      // 2 ranks load the 5 ranks' files; and, through the Checkpointer, the 3 ranks' checkpoint.
      const LegResult two = leg(run, Leg{2, From::sharded, b.string(), {}, 4, 5, "", ""});
      CHECK(two.loaded == five.end);
      const LegResult two_ck =
          leg(run, Leg{2, From::checkpointer, (ck3 / "step-00000002").string(), {}, 2, 3, "", ""});
      CHECK(two_ck.loaded == three.end);
      for (const auto& d : {a, b, ck3}) fs::remove_all(d);
      for (const auto* r : {&three, &five, &five_ref, &two, &two_ck}) fs::remove(r->end_state_file);
    }
  }
}

TEST_CASE("ZeRO stage 3 load_sharded refuses another optimizer, other units and a folder with a missing shard, "
          "and changes nothing",
          "[zero][zero3][checkpoint]") {
  const Stage3Run run = run_of(spec_of(AdamOptions(0.01)));
  const fs::path a = temp_dir("errors");
  leg(run, Leg{3, From::init, "", {}, 0, 1, a.string(), ""});
  std::vector<std::string> errors(3);
  std::vector<bool> unchanged(3, false);
  simulate(2, [&](RankContext& ctx) {
    auto attempt = [&](ShardedUnits& model, const std::string& dir) {
      const Snapshot before = snapshot_of(model);
      std::string what;
      try {
        model.load_sharded(dir);
      } catch (const Error& e) {
        what = e.what();
      }
      return std::make_pair(what, snapshot_of(model) == before);
    };
    // Another optimizer (SGD) over the same units.
    Stage3Run sgd = run;
    sgd.spec = spec_of(SGDOptions(0.1).momentum(0.9));
    ShardedUnits other(dopt::testing::stage3_units(sgd), sgd.spec, ShardedUnitsOptions{ctx.world()});
    const auto e0 = attempt(other, a.string());
    // Other units: the same parameters cut into two units.
    Stage3Run cut = run;
    cut.unit_sizes = {4, 4};
    ShardedUnits recut(dopt::testing::stage3_units(cut), run.spec, ShardedUnitsOptions{ctx.world()});
    const auto e1 = attempt(recut, a.string());
    ctx.world().barrier();
    if (ctx.rank() == 0) fs::remove(a / ShardedUnits::shard_file_name(1, 3));
    ctx.world().barrier();
    ShardedUnits same(dopt::testing::stage3_units(run), run.spec, ShardedUnitsOptions{ctx.world()});
    const auto e2 = attempt(same, a.string());
    if (ctx.rank() == 1) {
      errors = {e0.first, e1.first, e2.first};
      unchanged = {e0.second, e1.second, e2.second};
    }
  });
  CHECK_THAT(errors[0], Catch::Contains("ShardedUnits.load_sharded") && Catch::Contains("optimizer Adam") &&
                            Catch::Contains("this is SGD") && Catch::Contains("rank 1"));
  CHECK_THAT(errors[1], Catch::Contains("its units are") && Catch::Contains("rank 1"));
  CHECK_THAT(errors[2], Catch::Contains("missing shard units-rank1-of-3.safetensors"));
  CHECK(unchanged == std::vector<bool>{true, true, true});
  fs::remove_all(a);
}
