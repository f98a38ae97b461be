#pragma once
// Internal to dopt_actors (includes CAF): the rendezvous that
// init_process_group runs, carrying each rank's rank actor and host info.
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "caf/actor.hpp"
#include "dopt/actors/rendezvous.hpp"

namespace dopt::detail {

/// rendezvous() where every rank also registers `payload` (an actor; null:
/// its rendezvous actor) and the text make_info() returns, which every rank
/// receives. make_info runs once rank 0 is reachable (rank 0: once it
/// listens on MASTER_PORT), so ports it opens cannot take MASTER_PORT.
RendezvousResult rendezvous_with(Runtime& runtime, const LaunchEnv& env, std::chrono::milliseconds timeout,
                                 caf::actor payload, const std::function<std::string()>& make_info);
/// Index: rank.
const std::vector<caf::actor>& rendezvous_payloads(const RendezvousResult& r);
const std::vector<std::string>& rendezvous_infos(const RendezvousResult& r);

}  // namespace dopt::detail
