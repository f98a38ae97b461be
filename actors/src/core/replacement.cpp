// A replacement of a lost rank joins the running job (init_process_group
// with DOPT_REPLACES, set by dopt-run --on-failure replace; issue 45,
// docs/growing-back-processes.md "Between processes"): admission at rank 0's
// rendezvous port, direct connections to the members, which hold it
// waiting and connect their TCP meshes to its own (actor plane); on the
// shm plane it makes its own shared-memory plane, a group of itself until
// it joins; it then waits in ProcessGroup::join_group() for a grow(), which
// revives the slot and makes the grown group's regions.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <thread>

#include "collectives/access.hpp"
#include "collectives/grow.hpp"
#include "core/compatibility.hpp"
#include "core/host_identity.hpp"
#include "core/ranks.hpp"
#include "core/rendezvous_internal.hpp"
#include "core/runtime_impl.hpp"
#include "core/secure_link.hpp"
#include "core/world_setup.hpp"
#include "dopt/actors/distributed.hpp"
#include "dopt/runtime/notice.hpp"
#include "dopt/runtime/settings.hpp"
#include "transport/actor/rank_state.hpp"
#include "transport/shm/shm_plane.hpp"

namespace dopt::detail {

namespace {

/// Rank 0's rendezvous, as the replacement (incarnation) of env.rank. dopt-run
/// starts it as soon as the lost process ended; rank 0 may not have seen the
/// loss yet, or holds it back while another newcomer waits, and turns it
/// away until then: it tries again, for `patience`. Rank 0's port refusing the connection (it listened for
/// the whole job) ends it at once: the job's rank 0 is gone. A newcomer of a
/// vacant slot tries for `patience`, a refused port included (rank 0 admits
/// one newcomer at a time, and the job may not have started yet); its slot
/// alive in rank 0's view is taken by another process: refused at once. So
/// is a newcomer whose `compatibility` items (core/compatibility.hpp) rank 0
/// finds different from the job's: ValueError naming each difference.
RendezvousResult rejoin(Runtime& runtime, LaunchEnv& env, int incarnation, caf::actor a,
                        const std::function<std::string()>& make_info, const std::string& who, const char* op,
                        std::chrono::milliseconds patience, bool vacant_slot,
                        const std::vector<std::string>& compatibility) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto until = start + patience;
  auto next_note = std::chrono::seconds(10);
  bool reached = false;  // rank 0 answered once: its port refusing later means it is gone
  const LaunchEnv launch_env = env;
  const std::string where = "rank 0 at " + launch_env.master_addr + ":" + std::to_string(launch_env.master_port);
  const std::string within = " within " + std::to_string(patience.count()) + " ms (DOPT_TIMEOUT_MS, at least three " +
                             "handshake timeouts)";
  // Waiting for long says so: after 10 s, then every 30 s.
  auto note_waiting = [&](const std::string& why) {
    const auto waited = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start);
    if (waited < next_note) return;
    notice(std::string(op) + " [rank " + std::to_string(env.rank) + "]: " + who + "; still waiting after " +
           std::to_string(waited.count()) + " s for " + where + " (" + why + "), for up to " +
           std::to_string(patience.count() / 1000) + " s in all");
    next_note = waited + std::chrono::seconds(30);
  };
  for (;;) {
    try {
      env = launch_env;
      return rendezvous_with(runtime, launch_env, env.handshake_timeout, a, make_info, &env.secret, incarnation, 0,
                             compatibility);
    } catch (const PeerLostError& e) {
      // A vacant slot's newcomer may come before rank 0 listens (a late
      // node started with the first ones): a refused port is not yet an
      // end, until rank 0 answered once.
      const bool early = vacant_slot && !reached && e.detail().find("refused the connection") != std::string::npos;
      if (!early)
        throw PeerLostError(op, who + ", but rank 0's rendezvous did not take it: " + e.detail(), env.rank);
      if (Clock::now() >= until)
        throw PeerLostError(op, who + ", but " + where + " did not listen" + within +
                                    ": has the job started, and are --master-addr and --master-port those of its "
                                    "node 0? (" + e.detail() + ")",
                            env.rank);
      note_waiting("it does not listen yet: has the job started?");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } catch (const ValueError& e) {
      // Started with other settings than the job (rank 0's coordinator, or
      // its port for another WORLD_SIZE): refused for good.
      if (const std::string& d = e.detail(); d.find("start it with the job's settings") != std::string::npos) {
        const auto at = d.find("it was started with other settings");
        throw ValueError(op, who + ", but rank 0 refused it: " + (at == std::string::npos ? d : d.substr(at)),
                         env.rank);
      }
      if (e.detail().find("the world is already closed") == std::string::npos) throw;
      reached = true;
      if (vacant_slot && e.detail().find("is alive in rank 0's view") != std::string::npos)
        throw ValueError(op, who + ", but another process holds rank " + std::to_string(env.rank) +
                                 "'s slot already (a node started twice with the same --node-rank?): " + e.detail(),
                         env.rank);
      if (Clock::now() >= until)
        throw ValueError(op, who + ", but rank 0 did not admit it" + within + ": " + e.detail(), env.rank);
      note_waiting("it holds this newcomer back for now");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

void post_admission(RankEndpoint& ep, int to, const std::string& text) {
  auto* local = dynamic_cast<LocalEndpoint*>(&ep);
  if (caf::actor a = local ? local->actor() : caf::actor()) caf::anon_send(a, admitsend_atom::value, to, text);
}

std::string wait_admission(RankEndpoint& ep, std::chrono::milliseconds timeout, int me) {
  const char* op = "ProcessGroup.join_group";
  auto* local = dynamic_cast<LocalEndpoint*>(&ep);
  caf::actor a = local ? local->actor() : caf::actor();
  if (!a) throw StateError(op, "the runtime has been shut down", me);
  UserThreadCafScope caf_scope;
  caf::scoped_actor self{a.home_system()};
  std::string text, gone;
  self->request(a, caf::duration(timeout), admitwait_atom::value)
      .receive(
          [&](std::string& t, std::string& why) {
            text = std::move(t);
            gone = std::move(why);
          },
          [&](caf::error& e) {
            if (e != caf::sec::request_timeout)
              throw StateError(op, "the rank actor is gone: " + self->home_system().render(e), me);
          });
  // (The rank actor answers at once when the members it watches are all lost.)
  if (!gone.empty())
    throw PeerLostError(op, "rank " + std::to_string(me) + " waited to join a grown group in vain: " + gone, me);
  return text;
}

std::string revive_waiting(RankEndpoint& ep, int peer, std::chrono::milliseconds timeout) {
  auto* local = dynamic_cast<LocalEndpoint*>(&ep);
  caf::actor a = local ? local->actor() : caf::actor();
  if (!a) return "the runtime has been shut down";
  UserThreadCafScope caf_scope;
  caf::scoped_actor self{a.home_system()};
  std::string why;
  self->request(a, caf::duration(timeout), revivenow_atom::value, peer, static_cast<std::int64_t>(timeout.count()))
      .receive([&](std::string& w) { why = std::move(w); },
               [&](caf::error& e) { why = "the rank actor did not answer (" + self->home_system().render(e) + ")"; });
  return why;
}

/// The endpoint of this process's TCP mesh (its rendezvous info `mine`) as
/// the member whose info is `member` dials it (loopback in one network
/// namespace, the advertised address otherwise), as world setup's
/// data_endpoint does the other way round.
std::string mesh_endpoint_for(const std::string& mine, const std::string& member, const std::string& host) {
  const std::string net = info_field(member, "net");
  const bool same_host = net.empty() ? member.rfind(host + " ", 0) == 0 : net == info_field(mine, "net");
  const std::string addr = info_field(mine, "advx") == "1"
                               ? info_field(mine, "addr")
                               : peer_connect_address(same_host, info_field(mine, "addr"), info_field(mine, "bind"));
  return addr + ":" + info_field(mine, "tcp");
}

}  // namespace

void install_admission_post() {
  admission_post().send.store(&post_admission);
  admission_post().wait.store(&wait_admission);
  admission_post().revive.store(&revive_waiting);
}

ProcessGroup join_running_world(Runtime& runtime, const LaunchEnv& launch_env, const InitOptions& options,
                                long long replaces, const std::string& plane_choice, const char* op) {
  UserThreadCafScope caf_scope;
  LaunchEnv env = launch_env;
  const int incarnation = static_cast<int>(std::max<long long>(1, settings::integer("DOPT_INCARNATION").value_or(1)));
  // A node that arrives after an elastic job started (dopt-run --nnodes
  // MIN:MAX, node K >= MIN) takes a vacant slot as a replacement takes a lost one.
  // Its first start only: a later incarnation of such a rank (dopt-run
  // --on-failure replace on the late node) replaces a lost member.
  const bool vacant_slot =
      incarnation == 1 && replaces >= settings::integer("DOPT_MIN_WORLD_SIZE").value_or(env.world_size);
  const std::string who =
      vacant_slot ? "this process takes rank " + std::to_string(replaces) + "'s vacant slot (incarnation " +
                        std::to_string(incarnation) + ", DOPT_REPLACES set by dopt-run --nnodes MIN:MAX on a node "
                        "that joins the running job)"
                  : "this process replaces lost rank " + std::to_string(replaces) + " (incarnation " +
                        std::to_string(incarnation) + ", DOPT_REPLACES set by dopt-run --on-failure replace)";
  if (replaces == 0 || env.rank == 0)  // its rendezvous port went with it: nobody to present credentials to
    throw NotSupportedError(op, who + ", but rank 0 cannot be replaced (the job's rendezvous went with it)", env.rank);
  if (replaces != env.rank)
    throw ValueError(op, who + ", but its RANK is " + std::to_string(env.rank) + ": a replacement takes the lost "
                                 "rank's number", env.rank);
  install_admission_post();
  auto& rt = Access::impl(runtime);
  auto& sys = rt.system(op);
  caf::actor a;
  auto ep = start_rank_actor(rt, sys, env, &a);
  HostIdentity identity;
  // Its probe segment is measured only: a replacement publishes none (the
  // members do not map it), so it goes now, not at the end of this call: a
  // replacement ended by a signal while it waits for rank 0 leaves nothing
  // in /dev/shm.
  identity.release();
  const std::string& host = identity.host_field();
  // The TCP mesh's listener: the members connect to it once they hold this
  // process waiting (TcpMesh::reconnect_peer), before init_process_group returns.
  std::optional<transport::TcpListener> listener;
  std::string my_info;
  auto make_info = [&] {
    my_info = host + publish_control_port(rt, sys, a, env, op);
    if (plane_choice != "shm" && !listener) {  // (dropped below when the world runs on the shm plane)
      try {
        listener.emplace(transport::TcpMesh::listen(info_field(my_info, "bind"), env.port_range_lo, env.port_range_hi));
      } catch (const IOError& e) {
        throw IOError(op, "the data plane " + e.detail(), env.rank);
      }
    }
    my_info += " tcp=" + std::to_string(listener ? listener->port() : 0) + " pid=" + std::to_string(::getpid());
    return my_info;
  };
  // Rank 0 holds a newcomer back while another one waits to be taken in
  // (up to two handshake timeouts, rendezvous.cpp): both kinds try for the
  // job's timeout, at least that long. A replacement whose rank 0 is gone
  // fails at once all the same (its port refuses).
  RendezvousResult rdv = rejoin(runtime, env, incarnation, a, make_info, who, op,
                                std::max(3 * env.handshake_timeout, rt.options_.collective_timeout), vacant_slot,
                                compatibility_items(env, options, op));
  const auto& payloads = rendezvous_payloads(rdv);
  const auto& infos = rendezvous_infos(rdv);
  std::vector<int> members;
  std::string listed;
  for (int r = 0; r < env.world_size; ++r)
    if (r != env.rank && payloads[static_cast<std::size_t>(r)]) {
      members.push_back(r);
      listed += (listed.empty() ? "" : ", ") + std::to_string(r);
    }
  const std::string admitted = who + ": rank 0 accepted its job id and secret and admitted it to rank " +
                               std::to_string(env.rank) + "'s slot (the members: ranks " + listed + ")";
  // The world's plane, as its ranks chose it (world.cpp): shm when every
  // member is on this host and DOPT_TRANSPORT is not tcp; otherwise the TCP
  // mesh, with the hierarchical plane over it across hosts (a group that
  // lost a rank there runs on the actor plane: hosts with different numbers
  // of members), which this process joins as on the actor plane.
  if (settings::text("DOPT_BACKEND").value_or("dopt") == "mpi")
    throw NotSupportedError(op, admitted + ", but a process cannot join a running job on the mpi plane (an MPI "
                                    "communicator's members are fixed when MPI starts; a replacement joins on "
                                    "dopt's backend: docs/growing-back-processes.md, \"Between processes\")", env.rank);
  bool elsewhere = false;
  for (int r : members) elsewhere = elsewhere || infos[static_cast<std::size_t>(r)].rfind(host + " ", 0) != 0;
  const bool on_shm = plane_choice != "tcp" && !elsewhere;
  if (on_shm) listener.reset();  // no TCP mesh in a world on the shm plane
  if (!on_shm && !listener)
    throw ValueError(op, admitted + ", but transport 'shm' needs every rank on this host and the members are on "
                                    "several hosts; set the same DOPT_TRANSPORT on every rank", env.rank);
  // Its own view: the ranks rank 0 saw lost stay lost (the rank actor does
  // not watch them); its own slot has this incarnation.
  auto peers = std::make_shared<Peers>();
  peers->table = std::make_shared<PeerTable>(env.world_size);
  peers->table->revive(env.rank, incarnation);
  for (int r = 0; r < env.world_size; ++r)
    if (r != env.rank && !payloads[static_cast<std::size_t>(r)])
      peers->table->mark(r, PeerTable::lost, "rank " + std::to_string(r) + " was lost before rank " +
                                                 std::to_string(env.rank) + "'s replacement joined (rank 0's view)");
  peers->actors = payloads;
  peers->actors[static_cast<std::size_t>(env.rank)] = a;
  // Direct connections to every member (rank 0's came with the rendezvous),
  // each bounded by the handshake timeout.
  for (int r : members)
    if (r != 0)
      peers->actors[static_cast<std::size_t>(r)] =
          connect_control_port(sys, env, r, host, infos[static_cast<std::size_t>(r)], op);
  caf::scoped_actor self{sys};
  self->request(a, caf::infinite, initnet_atom::value, PeersPtr(peers),
                static_cast<std::int64_t>(rt.options_.peer_timeout.count()), std::shared_ptr<transport::TcpMesh>())
      .receive([](bool) {},
               [&](caf::error& e) { throw StateError(op, "the rank actor did not start: " + sys.render(e), env.rank); });
  // Every member holds it as waiting (a shrink() there still sees the rank
  // lost) before init_process_group returns; a grow() revives the slot.
  for (int r : members) {
    std::string why;
    self->request(peers->actors[static_cast<std::size_t>(r)], caf::duration(env.handshake_timeout),
                  revive_atom::value, env.rank, incarnation, a,
                  listener ? mesh_endpoint_for(my_info, infos[static_cast<std::size_t>(r)], host) : std::string(),
                  static_cast<std::int64_t>(env.handshake_timeout.count()))
        .receive([&](std::string& w) { why = std::move(w); },
                 [&](caf::error& e) { why = "no answer (" + sys.render(e) + ")"; });
    if (!why.empty())
      throw PeerLostError(op, admitted + ", but member " + std::to_string(r) + " did not take it: " + why, env.rank);
  }
  // The TCP mesh (actor plane): every member connects to it (the ranks lost
  // before stay lost there); the rank actor takes it for buffers over 64 KiB.
  if (listener) {
    transport::TcpMeshOptions mesh_options;
    mesh_options.credentials = net::Credentials::from(env);
    mesh_options.accept_from = members;
    auto mesh = std::make_shared<transport::TcpMesh>(env.rank, env.world_size, std::move(*listener),
                                                     std::vector<std::string>(static_cast<std::size_t>(env.world_size)),
                                                     env.handshake_timeout, mesh_options);
    std::weak_ptr<transport::TcpMesh> weak = mesh;
    runtime_add_stopper(rt, [weak] {
      if (auto m = weak.lock()) m->close();
    });
    self->request(a, caf::infinite, setmesh_atom::value, mesh)
        .receive([](bool) {},
                 [&](caf::error& e) {
                   throw StateError(op, "the rank actor did not take its mesh: " + sys.render(e), env.rank);
                 });
  }
  // The shm plane: this process's own (regions named by every rank's process
  // id and rank 0's job token, as world.cpp names them), a group of itself
  // until join_group() makes the grown group's regions with the members.
  std::shared_ptr<GroupPlane> plane;
  if (on_shm) {
    std::vector<int> pids(static_cast<std::size_t>(env.world_size), 0);
    for (int r : members)
      pids[static_cast<std::size_t>(r)] = std::atoi(info_field(infos[static_cast<std::size_t>(r)], "pid").c_str());
    pids[static_cast<std::size_t>(env.rank)] = static_cast<int>(::getpid());
    auto dir = std::make_shared<shm_plane::ShmDirectory>(std::move(pids), info_field(infos[0], "job"));
    auto shm = std::make_shared<shm_plane::ShmPlane>(
        env.rank, dir, peers->table,
        shm_plane::ShmPlane::Options::from_env(env.local_world_size > 0 ? env.local_world_size : env.world_size,
                                               true));
    const std::uint64_t gid = newcomer_gid(env.rank);
    plane = shm->attach(gid, std::make_shared<const std::vector<int>>(1, env.rank), shm->create_region(gid, 1));
    dir->seal(gid, env.rank);
    runtime_add_stopper(rt, [shm] { shm->shutdown("the runtime shut down"); });  // keeps the plane until then
  }
  // A newcomer's handle: no member of any group until join_group().
  std::vector<int> world;
  for (int r = 0; r < env.world_size; ++r) world.push_back(r);
  auto g = std::make_shared<GroupImpl>();
  g->endpoint = ep;
  g->gid = newcomer_gid(env.rank);
  g->members = std::make_shared<const std::vector<int>>(std::move(world));
  g->plane = std::move(plane);
  g->peers = peers->table;
  g->my_grank = -1;
  g->local_world_size = env.local_world_size;
  g->timeout_ms.store(rt.options_.collective_timeout.count());
  return Access::group(std::move(g));
}

}  // namespace dopt::detail
