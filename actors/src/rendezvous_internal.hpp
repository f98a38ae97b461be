#pragma once
// Internal to dopt_actors (includes CAF): the rendezvous that
// init_process_group runs, carrying each rank's rank actor and host info.
#include <chrono>
#include <string>
#include <vector>

#include "caf/actor.hpp"
#include "dopt/actors/rendezvous.hpp"

namespace dopt::detail {

/// rendezvous() where every rank also registers `payload` (an actor; null:
/// its rendezvous actor) and `info` (free text), which every rank receives.
RendezvousResult rendezvous_with(Runtime& runtime, const LaunchEnv& env, std::chrono::milliseconds timeout,
                                 caf::actor payload, std::string info);
/// Index: rank.
const std::vector<caf::actor>& rendezvous_payloads(const RendezvousResult& r);
const std::vector<std::string>& rendezvous_infos(const RendezvousResult& r);

}  // namespace dopt::detail
