// ProcessGroup::grow and join_group between the ranks of a deterministic
// simulation: newcomers (SimulateOptions::newcomers) wait in join_group()
// until the members grow the group; a loss before or while they meet, two
// newcomers at once, and a newcomer with the wrong secret. Rank functions
// record what they saw; the test thread asserts after simulate() returned.
#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"

using dopt::ProcessGroup;
using dopt::Tensor;

namespace {

struct Gone : std::runtime_error {
  Gone() : std::runtime_error("gone by the test's hand") {}
};

dopt::SimulateOptions grow_options(std::uint64_t seed, int newcomers) {
  dopt::SimulateOptions o;
  o.timeout = std::chrono::milliseconds(30000);
  o.deterministic = true;
  o.seed = seed;
  o.newcomers = newcomers;
  return o;
}

/// Runs fn on n ranks and o.newcomers newcomers and returns what each rank's
/// fn returned, by global rank (ranks that throw Gone are lost: simulate
/// rethrows the first, which is expected, and they return nothing).
std::vector<std::string> record(int n, const dopt::SimulateOptions& o,
                                const std::function<std::string(dopt::RankContext&)>& fn) {
  std::mutex mu;
  std::vector<std::string> seen(static_cast<std::size_t>(n + o.newcomers));
  try {
    dopt::simulate(n, [&](dopt::RankContext& ctx) {
      std::string out = fn(ctx);
      std::lock_guard<std::mutex> lock(mu);
      seen[static_cast<std::size_t>(ctx.rank())] = std::move(out);
    }, o);
  } catch (const dopt::Error& e) {
    if (std::string(e.what()).find("gone by the test's hand") == std::string::npos) throw;
  }
  return seen;
}

std::string csv(const std::vector<int>& r) {
  std::string s;
  for (int x : r) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

/// One step of the job: the sum of (global rank + 1) over the members. Returns it as text.
std::string step(ProcessGroup& g) {
  Tensor t = Tensor::full({1000}, g.global_rank(g.rank()) + 1.0);
  g.all_reduce(t);
  return std::to_string(static_cast<int>(t.at(999)));
}

/// What a rank records of a group: its members and this rank's group rank.
std::string describe(const ProcessGroup& g) {
  return "ranks=" + csv(g.ranks()) + " me=" + std::to_string(g.rank()) + " fresh=" + std::to_string(g.id() >> 63);
}

/// A newcomer joins with `credentials`; a member takes a step on the world
/// (recorded in out) and grows it with grow_it. Returns the rank's group.
ProcessGroup after_growth(dopt::RankContext& ctx, std::string& out,
                          const std::function<ProcessGroup(ProcessGroup&)>& grow_it,
                          const dopt::JoinGroupOptions& credentials = {}) {
  if (ctx.newcomer()) return ctx.world().join_group(credentials).group;
  ProcessGroup g = ctx.world();
  out = step(g) + ";";
  return grow_it(g);
}

}  // namespace

TEST_CASE("grow: a rank is lost, the survivors shrink, a newcomer joins at a later step", "[grow]") {
  const std::uint64_t seed = GENERATE(1, 7, 23);
  INFO("seed " << seed);
  const auto seen = record(5, grow_options(seed, 1), [&](dopt::RankContext& ctx) {
    std::string out;
    ProcessGroup g;
    if (ctx.newcomer()) {
      auto j = ctx.world().join_group();
      g = j.group;
      out = "joined " + csv(j.joined) + " " + describe(g) + ";";
    } else {
      g = ctx.world();
      for (int s = 0; s < 6; ++s) {
        if (s == 2 && ctx.rank() == 3) throw Gone();
        try {
          out += step(g) + ";";
        } catch (const dopt::PeerLostError&) {
          g = g.shrink().group;
          out += "shrunk " + step(g) + ";";
        }
      }
      auto r = g.grow();
      out += "grew " + csv(r.joined) + " map=" + csv(r.new_rank) + " " + describe(r.group) + ";";
      g = r.group;
    }
    return out + step(g);
  });
  // 1+2+3+4+5 = 15 before the loss, 11 after, 11 + 6 with the newcomer (rank 5).
  for (int r : {0, 1, 2, 4}) {
    const int me = r == 4 ? 3 : r;
    CHECK(seen[static_cast<std::size_t>(r)] == "15;15;shrunk 11;11;11;11;grew 5 map=0,1,2,3 ranks=0,1,2,4,5 me=" +
                                                   std::to_string(me) + " fresh=1;17");
  }
  CHECK(seen[5] == "joined 5 ranks=0,1,2,4,5 me=4 fresh=1;17");
}

TEST_CASE("grow: two newcomers join at once", "[grow]") {
  const std::uint64_t seed = GENERATE(2, 5);
  INFO("seed " << seed);
  const auto seen = record(3, grow_options(seed, 2), [&](dopt::RankContext& ctx) {
    std::string out;
    ProcessGroup g = after_growth(ctx, out, [&](ProcessGroup& w) {
      auto r = w.grow({.newcomers = 2});
      out += "grew " + csv(r.joined) + ";";
      return r.group;
    });
    return out + describe(g) + " " + step(g);
  });
  for (int r = 0; r < 3; ++r)
    CHECK(seen[static_cast<std::size_t>(r)] == "6;grew 3,4;ranks=0,1,2,3,4 me=" + std::to_string(r) + " fresh=1 15");
  for (int r : {3, 4})
    CHECK(seen[static_cast<std::size_t>(r)] == "ranks=0,1,2,3,4 me=" + std::to_string(r) + " fresh=1 15");
}

TEST_CASE("grow: a member is lost while the group grows, and the survivors shrink and grow again", "[grow]") {
  const std::uint64_t seed = GENERATE(3, 11, 19);
  INFO("seed " << seed);
  const auto seen = record(4, grow_options(seed, 1), [&](dopt::RankContext& ctx) {
    std::string out;
    ProcessGroup g = after_growth(ctx, out, [&](ProcessGroup& w) {
      if (ctx.rank() == 2) throw Gone();  // instead of growing
      try {
        auto r = w.grow();
        out += "grew;";
        return r.group;
      } catch (const dopt::PeerLostError&) {
        ProcessGroup shrunk = w.shrink().group;
        out += "lost, shrunk, grew;";
        return shrunk.grow().group;
      }
    });
    return out + describe(g) + " " + step(g);
  });
  // 1+2+4+5 with rank 4 the newcomer.
  for (int r : {0, 1, 3})
    CHECK(seen[static_cast<std::size_t>(r)] == "10;lost, shrunk, grew;ranks=0,1,3,4 me=" +
                                                   std::to_string(r == 3 ? 2 : r) + " fresh=1 12");
  CHECK(seen[4] == "ranks=0,1,3,4 me=3 fresh=1 12");
}

TEST_CASE("grow: a newcomer without the job's secret is refused and the job goes on", "[grow]") {
  const std::uint64_t seed = GENERATE(4, 9);
  INFO("seed " << seed);
  auto o = grow_options(seed, 2);
  o.job_id = "job-45";
  o.secret = "s3cret";
  const auto seen = record(3, o, [&](dopt::RankContext& ctx) {
    if (ctx.rank() == 3) {  // the intruder
      try {
        ctx.world().join_group({.job_id = "job-45", .secret = "guess"});
        return std::string("admitted");
      } catch (const dopt::AuthenticationError& e) {
        return std::string("refused: ") + e.what();
      }
    }
    std::string out;
    ProcessGroup g = after_growth(ctx, out, [&](ProcessGroup& w) {
      auto r = w.grow();
      out += "grew " + csv(r.joined) + ";";
      return r.group;
    }, {.job_id = "job-45", .secret = "s3cret"});
    return out + describe(g) + " " + step(g);
  });
  CHECK(seen[3].find("refused") != std::string::npos);
  CHECK(seen[3].find("its secret is not the job's") != std::string::npos);
  CHECK(seen[3].find("s3cret") == std::string::npos);
  CHECK(seen[4] == "ranks=0,1,2,4 me=3 fresh=1 11");
  for (int r = 0; r < 3; ++r)
    CHECK(seen[static_cast<std::size_t>(r)] == "6;grew 4;ranks=0,1,2,4 me=" + std::to_string(r) + " fresh=1 11");
}

TEST_CASE("grow: the members learn together that newcomers wait, and grow then", "[grow]") {
  const std::uint64_t seed = GENERATE(4, 9, 31);
  INFO("seed " << seed);
  const int newcomers = GENERATE(0, 2);
  INFO("newcomers " << newcomers);
  const auto seen = record(5, grow_options(seed, newcomers), [&](dopt::RankContext& ctx) {
    if (ctx.newcomer()) {
      ProcessGroup joined = ctx.world().join_group().group;
      return describe(joined) + " " + step(joined);
    }
    ProcessGroup g = ctx.world();
    std::string out;
    for (int s = 0; s < 40; ++s) {
      step(g);
      const int waiting = g.newcomers_waiting();
      out += std::to_string(waiting) + ",";
      if (waiting == newcomers && waiting > 0) {
        g = g.grow({.newcomers = waiting}).group;
        out += "grew;";
        break;
      }
    }
    return out + describe(g) + " " + step(g);
  });
  // Every member saw the same counts at every step (the lowest member's view).
  const std::string counts = seen[0].substr(0, seen[0].find("ranks="));
  for (int r = 1; r < 5; ++r) CHECK(seen[static_cast<std::size_t>(r)].substr(0, counts.size()) == counts);
  if (newcomers == 0) {
    std::string zeros;
    for (int s = 0; s < 40; ++s) zeros += "0,";
    CHECK(seen[0] == zeros + "ranks=0,1,2,3,4 me=0 fresh=0 15");
  } else {
    CHECK(seen[0].find("2,grew;ranks=0,1,2,3,4,5,6 me=0 fresh=1 28") != std::string::npos);
    for (int r : {5, 6})
      CHECK(seen[static_cast<std::size_t>(r)] == "ranks=0,1,2,3,4,5,6 me=" + std::to_string(r) + " fresh=1 28");
  }
}

TEST_CASE("grow: refused clearly where it is not supported", "[grow]") {
  SECTION("newcomers without deterministic simulation") {
    dopt::SimulateOptions o;
    o.newcomers = 1;
    CHECK_THROWS_AS(dopt::simulate(2, [](dopt::RankContext&) {}, o), dopt::ValueError);
  }
  SECTION("grow between threads") {
    const auto seen = record(2, {}, [](dopt::RankContext& ctx) {
      try {
        ctx.world().grow();
      } catch (const dopt::NotSupportedError& e) {
        return std::string(e.what());
      }
      return std::string();
    });
    for (const auto& s : seen) {
      CHECK(s.find("ProcessGroup.grow") != std::string::npos);
      CHECK(s.find("deterministic simulation") != std::string::npos);
    }
  }
  SECTION("newcomers_waiting between threads, and on a newcomer's handle") {
    const auto seen = record(2, {}, [](dopt::RankContext& ctx) {
      try {
        ctx.world().newcomers_waiting();
      } catch (const dopt::NotSupportedError& e) {
        return std::string(e.what());
      }
      return std::string();
    });
    for (const auto& s : seen) CHECK(s.find("ProcessGroup.newcomers_waiting") != std::string::npos);
    const auto newcomer = record(2, grow_options(3, 1), [](dopt::RankContext& ctx) {
      if (!ctx.newcomer()) {
        ProcessGroup g = ctx.world();
        while (g.newcomers_waiting() < 1) step(g);
        g.grow();
        return std::string();
      }
      std::string out;
      try {
        ctx.world().newcomers_waiting();
      } catch (const dopt::StateError& e) {
        out = e.what();
      }
      ctx.world().join_group();
      return out;
    });
    CHECK(newcomer[2].find("ProcessGroup.newcomers_waiting") != std::string::npos);
    CHECK(newcomer[2].find("a newcomer calls join_group()") != std::string::npos);
  }
  SECTION("join_group on a member's handle, grow with no newcomer") {
    const auto seen = record(2, grow_options(1, 0), [](dopt::RankContext& ctx) {
      std::string out;
      try {
        ctx.world().join_group();
      } catch (const dopt::StateError& e) {
        out += "join: " + std::string(e.what()) + ";";
      }
      try {
        ctx.world().grow({.newcomers = 0});
      } catch (const dopt::ValueError& e) {
        out += "grow: " + std::string(e.what());
      }
      return out;
    });
    for (const auto& s : seen) {
      CHECK(s.find("join: ") != std::string::npos);
      CHECK(s.find("already a member") != std::string::npos);
      CHECK(s.find("newcomers must be >= 1") != std::string::npos);
    }
  }
}
