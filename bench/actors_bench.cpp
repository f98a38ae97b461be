// dopt_bench_actors: what the actor runtime costs per message, configured as
// dopt::Runtime configures CAF (work-stealing, moderate-poll-attempts = 0).
//
//   ActorRoundTrip               an actor sends to another and waits for the reply
//   ForeignThreadRoundTrip       a plain thread (a user's rank thread) asks an actor
//                                and blocks for the answer
//   FanOut/16                    one request to each of 16 actors, all at once,
//                                then all 16 replies (a DistributedOptimizer step's shape)
//   CollectiveBarrier/<ranks>    ProcessGroup::barrier between simulated ranks
//
// JSON: dopt_bench_actors --benchmark_format=json
#include <benchmark/benchmark.h>

#include <thread>
#include <vector>

#include "caf/all.hpp"
#include "dopt/actors/simulate.hpp"

namespace {

using ping_atom = caf::atom_constant<caf::atom("ping")>;

caf::actor_system_config& config() {
  static caf::actor_system_config cfg = [] {
    caf::actor_system_config c;
    c.set("scheduler.max-threads", 2);
    c.set("work-stealing.moderate-poll-attempts", 0);
    return c;
  }();
  return cfg;
}

caf::actor_system& sys() {
  static caf::actor_system s{config()};
  return s;
}

caf::behavior echo(caf::event_based_actor*) {
  return {[](ping_atom, int x) { return x; }};
}

// An actor that runs `rounds` round trips to `peer` and then replies to its starter.
caf::behavior pinger(caf::event_based_actor* self, caf::actor peer) {
  return {[=](ping_atom, int rounds) {
    auto rp = std::make_shared<caf::response_promise>(self->make_response_promise());
    auto left = std::make_shared<int>(rounds);
    auto step = std::make_shared<std::function<void()>>();
    *step = [=] {
      if ((*left)-- == 0) {
        rp->deliver(0);
        return;
      }
      self->request(peer, caf::infinite, ping_atom::value, 1).then([=](int) { (*step)(); });
    };
    (*step)();
    return *rp;
  }};
}

void ActorRoundTrip(benchmark::State& state) {
  auto e = sys().spawn(echo);
  auto p = sys().spawn(pinger, e);
  caf::scoped_actor self{sys()};
  const int rounds = 1000;
  for (auto _ : state) {
    self->request(p, caf::infinite, ping_atom::value, rounds).receive([](int) {}, [](caf::error&) {});
  }
  state.SetItemsProcessed(state.iterations() * rounds);
  state.counters["seconds_per_round_trip"] =
      benchmark::Counter(static_cast<double>(state.iterations() * rounds), benchmark::Counter::kIsRate |
                                                                             benchmark::Counter::kInvert);
  self->send_exit(p, caf::exit_reason::user_shutdown);
  self->send_exit(e, caf::exit_reason::user_shutdown);
}
BENCHMARK(ActorRoundTrip)->Unit(benchmark::kMicrosecond)->UseRealTime();

void ForeignThreadRoundTrip(benchmark::State& state) {
  auto e = sys().spawn(echo);
  caf::scoped_actor self{sys()};
  for (auto _ : state) self->request(e, caf::infinite, ping_atom::value, 1).receive([](int) {}, [](caf::error&) {});
  self->send_exit(e, caf::exit_reason::user_shutdown);
}
BENCHMARK(ForeignThreadRoundTrip)->Unit(benchmark::kMicrosecond)->UseRealTime();

void FanOut(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  std::vector<caf::actor> owners;
  for (int i = 0; i < n; ++i) owners.push_back(sys().spawn(echo));
  caf::scoped_actor self{sys()};
  for (auto _ : state) {
    for (auto& o : owners) self->send(o, ping_atom::value, 1);
    for (int i = 0; i < n; ++i) self->receive([](int) {});
  }
  for (auto& o : owners) self->send_exit(o, caf::exit_reason::user_shutdown);
}
BENCHMARK(FanOut)->Arg(16)->Unit(benchmark::kMicrosecond)->UseRealTime();

void CollectiveBarrier(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  dopt::RuntimeOptions ro;
  ro.threads = 2;
  dopt::Runtime rt(ro);
  dopt::SimulateOptions so;
  so.runtime = &rt;
  // 100 barriers per simulate() call: the rank threads' start-up is spread over them.
  for (auto _ : state) {
    dopt::simulate(ranks, [&](dopt::RankContext& ctx) {
      for (int i = 0; i < 100; ++i) ctx.world().barrier();
    }, so);
  }
  state.SetItemsProcessed(state.iterations() * 100);
  state.counters["seconds_per_barrier"] = benchmark::Counter(static_cast<double>(state.iterations() * 100),
                                                        benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(CollectiveBarrier)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
