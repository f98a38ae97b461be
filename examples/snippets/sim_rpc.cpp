// Quoted by docs/testing.md (tests/check_docs.py checks the quotes; CI compiles this file).
// RPC code under the deterministic scheduler; actors/src/rpc/rpc.test.cpp runs the same scenario.
#include <chrono>
#include <stdexcept>
#include <vector>

#include "dopt/actors/rpc.hpp"
#include "dopt/actors/sim.hpp"
#include "dopt/actors/simulate.hpp"

using namespace dopt;

struct Server {
  double total = 0;
};

void register_server() {
  rpc::register_function("ps.make", [] { return Server{}; });
  rpc::register_method<Server>("ps.add", [](Server& s, double x) { return s.total += x; });
  rpc::register_method<Server>("ps.total", [](Server& s) { return s.total; });
}

// Worker 0 sends four updates at once to a server on worker 1; none may be lost.
void check_server(const rpc::SimulateOptions& options) {
  rpc::simulate(3, [](rpc::Agent& agent) {
    if (agent.rank() != 0) return;  // workers 1 and 2 serve
    rpc::RRef<Server> server = agent.remote<Server>("worker1", "ps.make");
    std::vector<Future<double>> adds;
    for (int i = 1; i <= 4; ++i) adds.push_back(server.rpc_async<double>("ps.add", i));
    for (auto& f : adds) f.get();
    if (server.rpc_sync<double>("ps.total") != 10) throw std::runtime_error("an update was lost");
  }, options);
}

void rpc_deterministic_runs() {
  register_server();
  rpc::SimulateOptions o;
  o.deterministic = true;  // workers, their agents and pool threads run one at a time
  o.seed = 42;
  check_server(o);

  o.faults.crash(1, 3);  // worker 1 dies when it starts serving its 3rd call
  try {
    check_server(o);
  } catch (const PeerLostError& e) { /* worker 0's call failed, naming worker1 (rank 1) */ }
}

bool rpc_swarm_passes() {
  register_server();
  SimulateOptions base;
  base.faults.delay_messages(-1, 0.1, std::chrono::milliseconds(20));  // 10% of the messages up to 20 ms late
  sim::SwarmOptions swarm;
  swarm.seeds = 50;
  sim::SwarmResult found = sim::swarm([](const SimulateOptions& s) {
    rpc::SimulateOptions o;
    o.deterministic = true;
    o.seed = s.seed;
    o.faults = s.faults;
    o.report = s.report;  // the determinism check compares the two runs' reports
    o.keep_trace = s.keep_trace;  // ... and, when they differ, where their traces part
    check_server(o);
  }, swarm, base);
  return !found.failing_seed;
}
