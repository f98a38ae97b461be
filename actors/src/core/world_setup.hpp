#pragma once
// Internal to dopt_actors: how init_process_group (and rpc::init) connect the
// ranks after the rendezvous, through dopt's handshake (secure_link.hpp):
// where to listen, what to advertise, how to reach a peer, and how a failure
// of one rank reaches all of them at once.
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "caf/actor.hpp"
#include "caf/actor_system.hpp"
#include "collectives/access.hpp"
#include "dopt/actors/distributed.hpp"
#include "dopt/actors/rendezvous.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/internal/handshake.hpp"
#include "dopt/runtime/launch_env.hpp"

namespace dopt::detail {

/// Publishes `a` on an authenticated control port of this rank (bound as
/// choose_bind_address(env) says; open until the runtime shuts down; only
/// ranks of this job and world get through). Returns the info fields its
/// peers need: " addr=ADVERTISED bind=BIND [advx=1] port=PORT net=NETNS" (advx:
/// the address was given by DOPT_ADVERTISE_ADDR and is used even on one host;
/// net: this rank's network namespace, network_namespace_id()).
/// Throws IOError.
std::string publish_control_port(RuntimeImpl& rt, caf::actor_system& sys, caf::actor a, const LaunchEnv& env,
                                 const char* op);

class LocalEndpoint;

/// Spawns this process's rank actor (env.rank of env.world_size) and adds
/// its endpoint to the runtime, which then routes this rank's calls to it.
/// User thread, once per init_process_group (a starting rank's or a
/// replacement's); *actor gets the rank actor.
std::shared_ptr<LocalEndpoint> start_rank_actor(RuntimeImpl& rt, caf::actor_system& sys, const LaunchEnv& env,
                                                caf::actor* actor);

/// The value of " key=value" in an info text ("" when absent).
std::string info_field(const std::string& info, const std::string& key);

/// Connects to the control port rank `r` advertised in `peer_info` (this
/// rank's own info starts with `host_prefix`). Loopback is dialled only for a
/// peer in this rank's network namespace (its "net" field) that listens on
/// loopback or every interface; otherwise its advertised address. Bounded by env.handshake_timeout; throws PeerLostError /
/// TimeoutError / the handshake's errors, naming rank r and its address.
caf::actor connect_control_port(caf::actor_system& sys, const LaunchEnv& env, int r, const std::string& host_prefix,
                                const std::string& peer_info, const char* op);

/// "addr:port" of rank r's data port (info field "tcp"), by the same rule.
std::string data_endpoint(const std::string& host_prefix, const std::string& peer_info);

/// Runs one step of connecting the ranks. When it throws, the other ranks
/// are told (their next barrier fails naming this rank and the reason) and
/// the error is rethrown; when it throws a TimeoutError and another rank has
/// reported a failure already, that failure (the cause) is thrown instead,
/// as PeerLostError naming it.
template <class F>
auto setup_step(const RendezvousResult& rdv, int rank, const char* op, F&& step) -> decltype(step());

/// Lets grow() and join_group() between processes reach the rank actors
/// (collectives/grow.hpp, AdmissionPost). Idempotent; user thread.
void install_admission_post();

/// init_process_group on a replacement of lost rank `replaces` (DOPT_REPLACES;
/// core/replacement.cpp), user thread: admitted at rank 0's rendezvous to
/// the lost rank's slot, it connects to the members, and each revives the
/// slot before this returns (bounded by the handshake timeout). Returns the
/// newcomer's handle (member of no group: it calls ProcessGroup::join_group).
/// On the shm plane (every member on this host, plane_choice not "tcp"):
/// the handle carries this process's shared-memory plane, a group of itself
/// until it joins. Otherwise (the actor plane, or members on other hosts:
/// the hierarchical plane's shrunk groups run on the actor plane) the
/// members connect their TCP meshes to its own. NotSupportedError with
/// DOPT_BACKEND=mpi, after the admission (so a process without the job's
/// secret is refused as any other, AuthenticationError).
ProcessGroup join_running_world(Runtime& runtime, const LaunchEnv& launch_env, const InitOptions& options,
                                long long replaces, const std::string& plane_choice, const char* op);

std::string rendezvous_failure_of(const RendezvousResult& rdv);
void rendezvous_report(const RendezvousResult& rdv, const std::string& what) noexcept;

template <class F>
auto setup_step(const RendezvousResult& rdv, int rank, const char* op, F&& step) -> decltype(step()) {
  try {
    return step();
  } catch (const TimeoutError& e) {
    const std::string cause = rendezvous_failure_of(rdv);
    rendezvous_report(rdv, e.what());
    if (!cause.empty()) throw PeerLostError(op, cause + " (here: " + e.detail() + ")", rank);
    throw;
  } catch (const Error& e) {
    rendezvous_report(rdv, e.detail());
    throw;
  } catch (const std::exception& e) {
    rendezvous_report(rdv, e.what());
    throw;
  }
}

}  // namespace dopt::detail
