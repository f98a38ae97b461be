#pragma once
// Internal to dopt_actors: what the runtime (core/runtime.cpp, world.cpp)
// offers the rest of the library without CAF types: its actor system, the
// stoppers that Runtime::shutdown runs, spawning rank actors, and the world
// group of init_process_group. Any thread.
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "collectives/group.hpp"

namespace caf {
class actor_system;
class actor;
}

namespace dopt {
struct LaunchEnv;
struct InitOptions;
class Runtime;
}  // namespace dopt

namespace dopt::detail {

/// The runtime's actor system (StateError naming op once shut down).
caf::actor_system& runtime_system(RuntimeImpl& rt, const char* op);
/// stop() runs in Runtime::shutdown, before CAF's threads are joined: it must
/// make the actors it stands for exit and drop their handles.
void runtime_add_stopper(RuntimeImpl& rt, std::function<void()> stop);

/// Spawns world_size connected rank actors (in-process transport) in any
/// actor system, e.g. the deterministic one of CAF's test coordinator
/// fixture (transport/actor/protocol.test.cpp). actors (if not null) receives
/// their handles. Each endpoint stops its actor when destroyed.
std::vector<std::shared_ptr<RankEndpoint>> spawn_rank_actors(caf::actor_system& sys, int world_size,
                                                              std::chrono::milliseconds timeout,
                                                              std::vector<caf::actor>* actors,
                                                              std::shared_ptr<PeerTable> table = nullptr);

/// Spawns world_size connected rank actors in rt (in-process transport),
/// sharing one PeerTable. Each endpoint stops its actor when destroyed.
struct LocalWorld {
  std::vector<std::shared_ptr<RankEndpoint>> endpoints;
  std::shared_ptr<PeerTable> table;
};
LocalWorld spawn_local_world(RuntimeImpl& rt, int world_size);

/// distributed.hpp's init_process_group (runtime.cpp: it spawns the rank actor).
ProcessGroup init_world_group(Runtime& runtime, const LaunchEnv& env, const InitOptions& options);
}  // namespace dopt::detail
