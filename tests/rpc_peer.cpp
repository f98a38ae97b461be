// One worker of the real-process RPC / DistributedOptimizer tests
// (tests/rpc_multiprocess.test.cpp). Started by dopt-run or by hand; joins
// with dopt::rpc::init (names: rank 0 "trainer", others "ownerR"; in
// "concurrent" ranks 0-1 are "psR" and the rest "trainerR") and runs one
// scenario:
//
//   dopt_rpc_peer parity       rank 0 trains over parameters on every other
//                              rank with DistributedOptimizer of every
//                              registered class (SGD twice), some gradients
//                              missing; after every step every parameter
//                              equals a local optimizer's bit for bit
//   dopt_rpc_peer concurrent   ranks 0, 1 own three parameters; every other
//                              rank trains on them at once (SGD lr 1, gradient
//                              1, 10 steps each); the last to finish checks
//                              that no update was lost
//   dopt_rpc_peer kill         rank 0 trains over every other rank; the last
//                              rank SIGKILLs itself at the start of its second
//                              step; rank 0's step fails with PeerLostError
//                              naming it (and not the others)
//   dopt_rpc_peer errors       deadlines, unknown functions, remote exception
//                              types, a duplicated request
//   dopt_rpc_peer lifetime     an RRef handed from rank 0 to rank 2, owned by
//                              rank 1: freed when the last holder lets go
//   dopt_rpc_peer survive P    DistributedOptimizer with redundancy 1: rank 0
//                              trains over every other rank; owner 2 (3
//                              processes) or 3 (more) SIGKILLs itself at point
//                              P ("begin", "mirrored") of step 2; its buddy
//                              takes over and rank 0's parameters end bitwise
//                              a local optimizer's (optim/src/
//                              distributed_optimizer_survive_scenarios.hpp)
//   dopt_rpc_peer grow         the same with one standby worker (the last
//                              rank): owner 2 (4 processes) or 3 (more)
//                              SIGKILLs itself at the beginning of step 2,
//                              the standby takes its slot at step 4
//                              (distributed_optimizer_catch_up), the worker
//                              that held the slot is SIGKILLed before step 5;
//                              rank 0's parameters end bitwise the reference
//                              (distributed_optimizer_grow_scenarios.hpp)
//
// stdout: "ok R <checks>" on success (after the graceful shutdown), otherwise
// "error KIND: MESSAGE" and exit status 1. The killed rank prints nothing.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <mutex>
#include <optional>

#include "dopt/actors/rpc.hpp"
#include "live_count.hpp"
#include "rpc/testing.hpp"
#include "dopt/distributed/distributed_optimizer.hpp"
#include "dopt/runtime/launch_env.hpp"
#include "rpc_optim/distributed_optimizer_grow_scenarios.hpp"
#include "rpc_optim/distributed_optimizer_survive_scenarios.hpp"
#include "peer_main.hpp"
#include "rpc_errors.hpp"
#include "rpc_optim/distributed_optimizer_testing.hpp"

using namespace dopt;
using dopt::rpc::Agent;
using dopt::rpc::GradContext;
using dopt::rpc::RRef;
using dopt::testing::Checker;

namespace {

using dopt::testing::error_of;

std::vector<float> vals(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  std::vector<float> out(n);
  for (auto& v : out) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = static_cast<float>((2.0 * static_cast<double>(x >> 11) / 9007199254740992.0 - 1.0) * scale);
  }
  return out;
}

bool has(const std::string& s, const std::string& x) { return s.find(x) != std::string::npos; }

struct Tracked : dopt::testing::LiveCounted<Tracked> {
  using LiveCounted::LiveCounted;
};
void dopt_encode(rpc::Encoder& e, const Tracked& t) { rpc::write(e, t.value); }
void dopt_decode(rpc::Decoder& d, Tracked& t) { rpc::read(d, t.value); }

std::promise<std::vector<RRef<Tensor>>> g_params;
std::atomic<int> g_finished{0};
std::atomic<int> g_count{0};
std::mutex g_mutex;
std::optional<RRef<Tracked>> g_kept;
std::promise<void> g_gate;
std::shared_future<void> g_gate_f = g_gate.get_future().share();

void register_functions() {
  rpc::register_function("mp.make_param", [](std::vector<float> v, std::vector<std::int64_t> shape) {
    return Tensor::from_vector(v, shape);
  });
  rpc::register_function("mp.take_params", [](std::vector<RRef<Tensor>> ps) { g_params.set_value(std::move(ps)); });
  rpc::register_function("mp.finished", [] { return ++g_finished; });
  rpc::register_function("mp.count", [] { return ++g_count; });
  rpc::register_function("mp.read_count", [] { return g_count.load(); });
  rpc::register_function("mp.wait_gate", [] {
    g_gate_f.wait();
    return 1;
  });
  rpc::register_function("mp.open_gate", [] { g_gate.set_value(); });
  rpc::register_function("mp.throw_value", [](std::string s) -> int { throw ValueError("mp.throw_value", s); });
  rpc::register_function("mp.make_tracked", [](int v) { return Tracked(v); });
  rpc::register_function("mp.keep", [](RRef<Tracked> r) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_kept = std::move(r);
  });
  rpc::register_function("mp.kept_value", [] {
    std::lock_guard<std::mutex> lock(g_mutex);
    return g_kept->to_here().value;
  });
  rpc::register_function("mp.drop_kept_then_owned", [](Agent& a, int owner) {
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_kept.reset();
    }
    return a.rpc_sync<std::int64_t>(owner, "mp.owned");
  });
  rpc::register_function("mp.owned", [](Agent& a) { return static_cast<std::int64_t>(rpc::testing::num_owned(a)); });
  rpc::register_function("mp.live", [] { return Tracked::live.load(); });
}

void parity(Agent& a, Checker& c) {
  if (a.rank() != 0) return;
  const int n = a.world_size();
  const std::vector<optim::OptimizerSpec> specs{
      {"SGD", {{"lr", 0.05}, {"momentum", 0.9}, {"nesterov", true}}},
      {"SGD", {{"lr", 0.1}}},
      {"Adam", {{"lr", 0.01}, {"amsgrad", true}}},
      {"AdamW", {{"lr", 0.01}}},
      {"Adagrad", {{"lr", 0.1}}},
      {"RMSprop", {{"lr", 0.01}, {"centered", true}}},
      {"Adamax", {{"lr", 0.01}}},
      {"Adadelta", {{"lr", 0.5}}},
      {"Rprop", {{"lr", 0.02}}}};
  const std::vector<Shape> shapes{{37}, {4, 3}, {5}, {1000}};
  for (const auto& spec : specs) {
    std::vector<Tensor> local;
    std::vector<RRef<Tensor>> remote;
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      const auto v = vals(static_cast<std::size_t>(shape_numel(shapes[k])), 7 + k);
      remote.push_back(a.remote<Tensor>(1 + static_cast<int>(k) % (n - 1), "mp.make_param", v, shapes[k]));
      local.push_back(Tensor::from_vector(v, shapes[k]));
    }
    optim::DistributedOptimizer dist(a, spec, remote);
    auto lopt = optim::make_optimizer(spec, {optim::OptimizerParamGroup(local)});
    for (int t = 0; t < 4; ++t) {
      GradContext ctx = a.new_context();
      std::vector<std::pair<RRef<Tensor>, Tensor>> deps;
      for (std::size_t k = 0; k < shapes.size(); ++k) {
        if (t > 0 && (k + static_cast<std::size_t>(t)) % 3 == 0) {
          local[k].set_grad(Tensor());
          continue;
        }
        Tensor g = Tensor::from_vector(vals(static_cast<std::size_t>(shape_numel(shapes[k])), 50 * t + k, 2.0),
                                       shapes[k]);
        local[k].set_grad(g.clone());
        deps.emplace_back(remote[k], g);
      }
      (void)ctx.deposit_all(deps);
      dist.step(ctx);
      lopt->step();
      for (std::size_t k = 0; k < shapes.size(); ++k)
        c.bitwise(remote[k].to_here(), local[k], spec.name + " step " + std::to_string(t) + " param " + std::to_string(k));
    }
  }
}

void concurrent(Agent& a, Checker& c) {
  if (a.rank() < 2) return;
  const int trainers = a.world_size() - 2;
  constexpr int kSteps = 10;
  std::vector<RRef<Tensor>> ps;
  if (a.rank() == 2) {
    for (int k = 0; k < 3; ++k)
      ps.push_back(a.remote<Tensor>(k % 2, "mp.make_param", std::vector<float>(64, 100.f), std::vector<std::int64_t>{64}));
    for (int r = 3; r < a.world_size(); ++r) a.rpc_sync(r, "mp.take_params", ps);
  } else {
    ps = g_params.get_future().get();
  }
  optim::DistributedOptimizer dist(a, {"SGD", {{"lr", 1.0}}}, ps);
  for (int t = 0; t < kSteps; ++t) {
    GradContext ctx = a.new_context();
    std::vector<std::pair<RRef<Tensor>, Tensor>> deps;
    for (auto& p : ps) deps.emplace_back(p, Tensor::full({64}, 1.0));
    (void)ctx.deposit_all(deps);
    dist.step(ctx);
    ++c.checks;
  }
  if (a.rpc_sync<int>(0, "mp.finished") == trainers)
    for (auto& p : ps) c.bitwise(p.to_here(), Tensor::full({64}, 100.0 - trainers * kSteps), "after every trainer's steps");
}

void kill(Agent& a, Checker& c) {
  const int victim = a.world_size() - 1;
  if (a.rank() == victim)
    optim::detail::set_owner_step_hook([](Agent&, long step) {
      if (step == 1) ::raise(SIGKILL);
    });
  if (a.rank() != 0) return;
  std::vector<RRef<Tensor>> ps;
  for (int r = 1; r < a.world_size(); ++r)
    ps.push_back(a.remote<Tensor>(r, "mp.make_param", std::vector<float>{1, 2, 3}, std::vector<std::int64_t>{3}));
  optim::DistributedOptimizerOptions o;
  o.timeout = std::chrono::seconds(20);
  optim::DistributedOptimizer dist(a, {"Adam", {{"lr", 0.1}}}, ps, o);
  auto step_once = [&] {
    GradContext ctx = a.new_context();
    std::vector<std::pair<RRef<Tensor>, Tensor>> deps;
    for (auto& p : ps) deps.emplace_back(p, Tensor::full({3}, 1.0));
    (void)ctx.deposit_all(deps);
    dist.step(ctx);
  };
  step_once();
  ++c.checks;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of(step_once);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  const std::string name = "'owner" + std::to_string(victim) + "' (rank " + std::to_string(victim) + ")";
  c.expect(has(e, "PeerLostError") && has(e, name) && has(e, "1 of " + std::to_string(a.world_size() - 1)),
           "step after the kill: " + e);
  c.expect(!has(e, "'owner1' (rank 1):") || victim == 1, "names only the dead owner: " + e);
  c.expect(ms < o.timeout.value(), "failed within the deadline (" + std::to_string(ms.count()) + " ms)");
  std::printf("kill_failure %s\n", e.c_str());
}

void errors(Agent& a, Checker& c) {
  if (a.rank() != 0) return;
  const int last = a.world_size() - 1;
  std::string e = error_of([&] { a.rpc_sync<int>(1, rpc::Fn("mp.wait_gate", {.timeout = std::chrono::milliseconds(300)})); });
  c.expect(has(e, "TimeoutError") && has(e, "mp.wait_gate") && has(e, "'owner1'") && has(e, "'trainer'") &&
               has(e, "300 ms"),
           "timeout: " + e);
  a.rpc_sync(1, "mp.open_gate");
  e = error_of([&] { a.rpc_sync<int>(last, "mp.nope"); });
  c.expect(has(e, "KeyError") && has(e, "mp.nope") && has(e, "'owner" + std::to_string(last) + "'"), "unknown: " + e);
  e = error_of([&] { a.rpc_sync<int>(last, "mp.throw_value", std::string("bad thing")); });
  c.expect(has(e, "ValueError") && has(e, "bad thing"), "remote ValueError: " + e);
  e = error_of([&] { a.rpc_sync<int>(last, "mp.throw_value", 3); });
  c.expect(has(e, "TypeError"), "argument type: " + e);
  c.expect(rpc::testing::rpc_sync_duplicated<int>(a, 1, "mp.count", 4) == 1, "duplicated request ran once");
  c.expect(a.rpc_sync<int>(1, "mp.read_count") == 1, "duplicated request ran once (read back)");
}

void lifetime(Agent& a, Checker& c) {
  if (a.rank() != 0) return;
  RRef<Tracked> r = a.remote<Tracked>(1, "mp.make_tracked", 5);
  c.expect(r.to_here().value == 5, "to_here");
  a.rpc_sync(2, "mp.keep", r);
  c.expect(a.rpc_sync<int>(2, "mp.kept_value") == 5, "to_here from the third worker");
  r = RRef<Tracked>();
  c.expect(a.rpc_sync<std::int64_t>(1, "mp.owned") == 1, "still held by rank 2");
  c.expect(a.rpc_sync<int>(1, "mp.live") == 1, "value alive on the owner");
  c.expect(a.rpc_sync<std::int64_t>(2, "mp.drop_kept_then_owned", 1) == 0, "freed after the last holder");
  c.expect(a.rpc_sync<int>(1, "mp.live") == 0, "value destroyed on the owner");
}

do_survive_test::Scenario survive_scenario(int world_size, const std::string& point) {
  do_survive_test::Scenario sc;
  sc.n = world_size;
  sc.losses = {do_survive_test::Loss{world_size == 3 ? 2 : 3, 2, point}};
  return sc;
}

void survive(Agent& a, Checker& c, const do_survive_test::Scenario& sc) {
  if (a.rank() != 0) return;
  const auto got = do_survive_test::trainer(a, sc);
  c.expect(got.done, "the run finished: " + got.error);
  const auto ref = do_survive_test::reference(sc);
  c.expect(got.params.size() == ref.size(), "every parameter read back");
  for (std::size_t i = 0; i < ref.size() && i < got.params.size(); ++i)
    c.expect(got.params[i] == ref[i], "parameter " + std::to_string(i) + " bitwise the reference");
  for (int o : got.owners) c.expect(o != sc.losses[0].victim, "the victim owns nothing");
  std::printf("survive_log %s\n", got.log.c_str());
}

do_grow_test::Plan grow_plan(int world_size) {
  do_grow_test::Plan p;
  p.n = world_size - 1;  // the last rank is the standby worker
  const int victim = p.n == 3 ? 2 : 3;
  const int holder = p.n == 3 ? 1 : 4;
  p.losses = {do_survive_test::Loss{victim, 2, "begin"}, do_survive_test::Loss{holder, 5, "before"}};
  p.newcomers = {p.n};
  return p;
}

void grow(Agent& a, Checker& c, const do_grow_test::Plan& p) {
  if (a.rank() != 0) return;
  const auto got = do_grow_test::trainer(a, p);
  c.expect(got.done, "the run finished: " + got.error);
  const auto ref = do_grow_test::reference(p);
  c.expect(got.params.size() == ref.size(), "every parameter read back");
  for (std::size_t i = 0; i < ref.size() && i < got.params.size(); ++i)
    c.expect(got.params[i] == ref[i], "parameter " + std::to_string(i) + " bitwise the reference");
  for (int o : got.owners)
    for (const auto& l : p.losses) c.expect(o != l.victim, "a victim owns nothing");
  std::string owners;
  for (int o : got.owners_joined) owners += (owners.empty() ? "" : ",") + std::to_string(o);
  std::printf("grow_log %s owners_joined %s\n", got.log.c_str(), owners.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "parity";
  const auto t0 = std::chrono::steady_clock::now();
  int rank = -1;
  try {
    register_functions();
    auto env = launch_env_from_environment();
    if (!env) throw Error("rpc_peer", "not launched (no RANK / WORLD_SIZE)");
    rank = env->rank;
    do_survive_test::Scenario sc;
    do_grow_test::Plan gp;
    if (mode == "grow") {
      gp = grow_plan(env->world_size);
      do_survive_test::die_fn() = [](Agent&) { ::raise(SIGKILL); };
      do_grow_test::install(gp);
    }
    if (mode == "survive") {
      sc = survive_scenario(env->world_size, argc > 2 ? argv[2] : "begin");
      do_survive_test::die_fn() = [](Agent&) { ::raise(SIGKILL); };
      do_survive_test::install(sc);
    }
    RuntimeOptions ro = RuntimeOptions::from_env();
    ro.threads = 2;
    Runtime rt(ro);
    rpc::RpcOptions opts;
    opts.rpc_timeout = std::chrono::seconds(30);
    opts.init_timeout = std::chrono::seconds(20);
    opts.shutdown_timeout = std::chrono::seconds(40);
    std::string name;
    if (mode == "concurrent")
      name = (rank < 2 ? "ps" : "trainer") + std::to_string(rank);
    else
      name = rank == 0 ? "trainer" : "owner" + std::to_string(rank);
    Agent agent = rpc::init(rt, *env, name, opts);
    Checker c{rank};
    if (mode == "parity") parity(agent, c);
    else if (mode == "concurrent") concurrent(agent, c);
    else if (mode == "kill") kill(agent, c);
    else if (mode == "errors") errors(agent, c);
    else if (mode == "lifetime") lifetime(agent, c);
    else if (mode == "survive") survive(agent, c, sc);
    else if (mode == "grow") grow(agent, c, gp);
    else throw Error("rpc_peer", "unknown scenario '" + mode + "'");
    agent.shutdown();
    std::printf("ok %d %ld\n", rank, c.checks + 1);
    std::fflush(stdout);
    return 0;
  } catch (const Error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    std::printf("error %s: %s\nelapsed_ms %lld\n", dopt::testing::kind_of(e), e.what(), static_cast<long long>(ms.count()));
  } catch (const std::exception& e) {
    std::printf("error std::exception: %s\n", e.what());
  }
  std::fflush(stdout);
  return 1;
}
