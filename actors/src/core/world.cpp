// A process's rank joins the world (init_process_group): rendezvous, the
// rank actors' direct connections, the data plane (shared memory when every
// rank is on this host, else the TCP mesh), liveness.
#include "dopt/runtime/notice.hpp"
#include "dopt/runtime/settings.hpp"
#include "collectives/access.hpp"
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>

#include "dopt/actors/distributed.hpp"
#include "dopt/runtime/internal/shm.hpp"
#include "core/compatibility.hpp"
#include "core/host_identity.hpp"
#include "transport/actor/rank_state.hpp"
#include "core/runtime_impl.hpp"
#include "transport/hier/hier_plane.hpp"
#include "transport/mpi/mpi_plane.hpp"
#include "transport/shm/shm_plane.hpp"
#include "core/rendezvous_internal.hpp"
#include "core/world_setup.hpp"

namespace dopt::detail {

namespace {

/// A token of this job on this host, the same on every rank (rank 0's is
/// taken): names of the shared-memory regions carry it.
std::string job_token() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return buf;
}

}  // namespace

ProcessGroup init_world_group(Runtime& runtime, const LaunchEnv& launch_env, const InitOptions& options) {
  UserThreadCafScope caf_scope;
  // env.secret becomes the session key in the rendezvous (before make_info
  // runs): every port opened from then on is keyed (rendezvous_internal.hpp).
  LaunchEnv env = launch_env;
  const char* op = "init_process_group";
  std::string plane_choice = options.transport;
  plane_choice = settings::text("DOPT_TRANSPORT").value_or(plane_choice);
  if (plane_choice != "auto" && plane_choice != "shm" && plane_choice != "tcp")
    throw ValueError(op, "transport must be 'auto', 'shm' or 'tcp', got '" + plane_choice + "'", env.rank);
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size)
    throw ValueError(op, "rank " + std::to_string(env.rank) + " is outside [0, " + std::to_string(env.world_size) + ")",
                     env.rank);
  // A replacement of a lost rank (dopt-run --on-failure replace) joins the
  // running job instead (core/replacement.cpp).
  if (const auto replaces = settings::integer("DOPT_REPLACES"))
    return join_running_world(runtime, env, options, *replaces, plane_choice, op);
  // DOPT_BACKEND=mpi: the collectives go through MPI (transport/mpi); the rank
  // actors still connect (liveness, send/recv, subgroups' bookkeeping).
  const std::string backend = settings::text("DOPT_BACKEND").value_or("dopt");
  if (backend != "dopt" && backend != "mpi")
    throw ValueError(op, "DOPT_BACKEND must be 'dopt' or 'mpi', got '" + backend + "'", env.rank);
  const bool use_mpi = backend == "mpi";
  if (use_mpi && !mpi::available()) (void)mpi::make_world_plane(env, nullptr, {});  // throws: not built
  // The TCP mesh still carries send/recv (the actor plane's); the MPI plane
  // replaces the shm/hier planes below for the collectives.
  if (use_mpi) plane_choice = "tcp";
  install_admission_post();  // grow() between processes (collectives/grow.hpp)
  auto& rt = detail::Access::impl(runtime);
  auto& sys = rt.system(op);
  if (env.local_rank == 0) shm::remove_stale_segments();
  caf::actor a;
  auto ep = start_rank_actor(rt, sys, env, &a);
  // Every rank actor listens on a port of its own, so that every pair of
  // ranks gets a direct connection: a peer's death is then seen by all
  // (BASP would otherwise route through rank 0, and lose sight of the dead
  // peer when rank 0 goes). The TCP data plane listens too. Both ports are
  // opened inside the rendezvous, once rank 0 holds MASTER_PORT.
  // Which ranks share this host's /dev/shm: measured (core/host_identity.hpp).
  HostIdentity identity;
  const std::string& host = identity.host_field();
  std::optional<transport::TcpListener> listener;
  auto make_info = [&] {
    // Ports behind dopt's handshake (job id, secret), on the chosen interface.
    std::string info = host + publish_control_port(rt, sys, a, env, op);
    if (plane_choice != "shm") {
      try {
        listener.emplace(transport::TcpMesh::listen(info_field(info, "bind"), env.port_range_lo, env.port_range_hi));
      } catch (const IOError& e) {
        throw IOError(op, "the data plane " + e.detail(), env.rank);  // names the rank that hit it
      }
    }
    return info + " tcp=" + std::to_string(listener ? listener->port() : 0) + " pid=" + std::to_string(::getpid()) +
           " job=" + job_token() + identity.probe_fields();
  };
  // An elastic job (dopt-run --nnodes MIN:MAX): ranks 0..required-1 start
  // it; the slots of the ranks that did not join are vacant (lost from the
  // start) until newcomers take them (core/replacement.cpp, grow()).
  const int required = static_cast<int>(settings::integer("DOPT_MIN_WORLD_SIZE").value_or(env.world_size));
  if (required < 1 || required > env.world_size)
    throw ValueError(op, "DOPT_MIN_WORLD_SIZE " + std::to_string(required) + " must be in 1.." +
                             std::to_string(env.world_size) + " (WORLD_SIZE)", env.rank);
  if (required < env.world_size && use_mpi)
    throw NotSupportedError(op, "DOPT_MIN_WORLD_SIZE " + std::to_string(required) + " of " +
                                    std::to_string(env.world_size) + " (an elastic job) needs dopt's backend: an MPI "
                                    "communicator's members are fixed when MPI starts", env.rank);
  // Rank 0 compares a newcomer's items with these when it admits it.
  RendezvousResult rdv = rendezvous_with(runtime, launch_env, options.timeout, a, make_info, &env.secret, 0, required,
                                         compatibility_items(env, options, op));
  const auto& infos = rendezvous_infos(rdv);
  // The ranks present (the others' slots are vacant: a null payload).
  std::vector<int> present;
  for (int r = 0; r < env.world_size; ++r)
    if (r == env.rank || rendezvous_payloads(rdv)[static_cast<std::size_t>(r)]) present.push_back(r);
  const bool vacant = static_cast<int>(present.size()) < env.world_size;
  auto absent = [&](int r) { return !std::binary_search(present.begin(), present.end(), r); };
  std::vector<int> elsewhere;
  auto field = [](const std::string& text, const std::string& key) {
    auto p = text.find(" " + key + "=");
    if (p == std::string::npos) return std::string();
    p += key.size() + 2;
    return text.substr(p, text.find(' ', p) - p);
  };
  for (int r : present)
    if (infos[static_cast<std::size_t>(r)].rfind(host + " ", 0) != 0) elsewhere.push_back(r);
  // With vacant slots the newcomers may come from other hosts, so an auto
  // choice takes the TCP mesh even when the ranks present share this host
  // (DOPT_TRANSPORT=shm keeps the job on this host's shared memory).
  const bool use_tcp = plane_choice == "tcp" || !elsewhere.empty() || (vacant && plane_choice == "auto");
  if (use_tcp && plane_choice == "shm") {
    std::string who;
    for (int r : elsewhere) who += (who.empty() ? "" : ", ") + std::to_string(r);
    throw ValueError(op, "transport 'shm' needs every rank on this host, but ranks " + who + " are on another host",
                     env.rank);
  }
  for (int r = 0; use_tcp && r < env.world_size; ++r)
    if (!absent(r) && field(infos[static_cast<std::size_t>(r)], "tcp") == "0")
      throw ValueError(op, "rank " + std::to_string(r) + " has no TCP data plane (DOPT_TRANSPORT=shm there?) but " +
                               "this world needs one; set the same DOPT_TRANSPORT on every rank", env.rank);
  auto peers = std::make_shared<Peers>();
  peers->table = std::make_shared<PeerTable>(env.world_size);
  peers->actors = rendezvous_payloads(rdv);
  peers->actors[static_cast<std::size_t>(env.rank)] = a;
  // Vacant slots are lost from the start (the rank actor does not watch
  // them; grow() takes a newcomer into one as into a lost rank's).
  for (int r = 0; r < env.world_size; ++r)
    if (absent(r))
      peers->table->mark(r, PeerTable::lost, "rank " + std::to_string(r) + "'s slot is vacant: the job started with " +
                                                 std::to_string(present.size()) + " of " +
                                                 std::to_string(env.world_size) + " ranks (DOPT_MIN_WORLD_SIZE)");
  // Every rank first checks the probes of the ranks it takes for its host;
  // nobody goes on (and may fail and remove its probe) before all did.
  setup_step(rdv, env.rank, op, [&] { identity.verify(infos, env.rank, op); });
  rdv.barrier(options.timeout);
  identity.release();
  // Direct connections: rank i (> 0) connects to every rank above it; rank 0
  // has one to everybody from the rendezvous. Each is bounded by the
  // handshake timeout; a rank that fails tells the others (setup_step), so
  // every rank stops at the barrier below naming it.
  setup_step(rdv, env.rank, op, [&] {
    for (int r = std::max(1, env.rank + 1); env.rank > 0 && r < env.world_size; ++r)
      if (!absent(r))
        peers->actors[static_cast<std::size_t>(r)] =
          connect_control_port(sys, env, r, host, infos[static_cast<std::size_t>(r)], op);
  });
  rdv.barrier(options.timeout);
  std::shared_ptr<transport::TcpMesh> mesh;
  if (use_tcp) {
    std::vector<std::string> endpoints;
    for (int r = 0; r < env.world_size; ++r)
      endpoints.push_back(absent(r) ? std::string() : data_endpoint(host, infos[static_cast<std::size_t>(r)]));
    // A connection of the mesh that ends is not taken as the peer's loss: a
    // peer that finished and exited closes it before its last control
    // messages (on CAF's connection) may have arrived. Collectives that still
    // need its bytes fail by themselves; the loss itself is CAF's down_msg.
    // Every rank is here now: connecting is bounded by the handshake timeout.
    transport::TcpMeshOptions mesh_options;
    mesh_options.credentials = net::Credentials::from(env);
    mesh_options.ranks_on_host = static_cast<int>(present.size() - elsewhere.size());
    for (int r = 0; r < env.world_size; ++r)
      if (absent(r)) mesh_options.absent.push_back(r);
    mesh = setup_step(rdv, env.rank, op, [&] {
      return std::make_shared<transport::TcpMesh>(env.rank, env.world_size, std::move(*listener), endpoints,
                                                  env.handshake_timeout, mesh_options);
    });
    // The rank actor owns it; the runtime closes it at shutdown (after the actor is gone).
    std::weak_ptr<transport::TcpMesh> weak = mesh;
    runtime_add_stopper(rt, [weak] {
      if (auto m = weak.lock()) m->close();
    });
  }
  {
    caf::scoped_actor self{sys};
    bool ok = false;
    self->request(a, caf::infinite, initnet_atom::value, PeersPtr(peers),
                  static_cast<std::int64_t>(rt.options_.peer_timeout.count()), mesh)
        .receive([&](bool) { ok = true; },
                 [&](caf::error& e) {
                   throw StateError(op, "the rank actor did not start: " + sys.render(e), env.rank);
                 });
    (void)ok;
  }
  // The shared-memory plane (every rank on this host): this rank's region of
  // the world group exists before the barrier, the peers' are mapped after
  // it, and once everybody mapped every region their names go (a crash
  // leaves nothing in /dev/shm).
  std::shared_ptr<shm_plane::ShmPlane> shm;
  shm_plane::Mapped mine;
  auto members = std::make_shared<std::vector<int>>(present);
  const int my_index = static_cast<int>(std::find(present.begin(), present.end(), env.rank) - present.begin());
  if (!use_tcp && !use_mpi) {
    std::vector<int> pids;
    for (int r = 0; r < env.world_size; ++r)  // (0 for a vacant slot)
      pids.push_back(std::atoi(field(infos[static_cast<std::size_t>(r)], "pid").c_str()));
    auto dir = std::make_shared<shm_plane::ShmDirectory>(std::move(pids), field(infos[0], "job"));
    shm = std::make_shared<shm_plane::ShmPlane>(env.rank, dir, peers->table,
                                                shm_plane::ShmPlane::Options::from_env(
                                                    env.local_world_size > 0 ? env.local_world_size : env.world_size,
                                                    true));
    mine = shm->create_region(0, static_cast<int>(present.size()));
    runtime_add_stopper(rt, [shm] { shm->shutdown("the runtime shut down"); });  // keeps the plane until then
  }
  // Several hosts with the same number of ranks each (and no forced flat
  // TCP): the hierarchical plane, shared memory within each host and the
  // TCP mesh between hosts. Not with vacant slots: a group that grows runs
  // on the actor plane there (as a group shrink() made).
  std::shared_ptr<hier::HierPlane> hierarchical;
  if (use_tcp && plane_choice == "auto" && !vacant) {
    std::vector<std::string> host_ids;
    std::vector<int> pids;
    for (int r = 0; r < env.world_size; ++r) {
      const std::string& info = infos[static_cast<std::size_t>(r)];
      host_ids.push_back(info.substr(0, info.find(" addr=")));
      pids.push_back(std::atoi(field(info, "pid").c_str()));
    }
    const int here = static_cast<int>(
        std::count(host_ids.begin(), host_ids.end(), host_ids[static_cast<std::size_t>(env.rank)]));
    auto dir = std::make_shared<shm_plane::ShmDirectory>(std::move(pids), field(infos[0], "job"));
    auto local = std::make_shared<shm_plane::ShmPlane>(env.rank, dir, peers->table,
                                                       shm_plane::ShmPlane::Options::from_env(here, true));
    auto h = std::make_shared<hier::HierPlane>(env.rank, std::move(host_ids), local, mesh, peers->table);
    if (h->spans_hosts_evenly(*members)) {
      hierarchical = h;
      mine = hierarchical->create_region(0, *members);
      runtime_add_stopper(rt, [h] { h->shutdown("the runtime shut down"); });
    }
  }
  // Nobody sends collective messages before every rank actor knows its peers
  // (and every rank's region exists).
  rdv.barrier(options.timeout);
  std::shared_ptr<GroupPlane> world_plane;
  if (use_mpi) {
    std::vector<std::string> host_ids;
    for (const auto& info : infos) host_ids.push_back(info.substr(0, info.find(" addr=")));
    world_plane = setup_step(rdv, env.rank, op, [&] { return mpi::make_world_plane(env, peers->table, host_ids); });
  }
  if (shm || hierarchical) {
    world_plane = shm ? std::static_pointer_cast<GroupPlane>(shm->attach(0, members, mine))
                      : hierarchical->attach(0, *members, mine);
    rdv.barrier(options.timeout);  // every rank mapped its host's regions
    if (shm) shm->directory().seal(0, env.rank);
    else hierarchical->seal(0);
  }
  if (settings::flag("DOPT_DEBUG").value_or(false))
    notice("[rank " + std::to_string(env.rank) + "]: the world group runs on the " +
           (world_plane ? std::string(world_plane->name()) : std::string(use_tcp ? "tcp" : "actor")) + " plane");
  // Rank 0: from now on its rendezvous admits the replacement of a rank it
  // sees lost (DOPT_REPLACES); its coordinator stays until the runtime shuts
  // down. The other ranks' rendezvous actors can go when rdv does: the rank
  // actors hold the peer handles now.
  if (env.rank == 0) {
    std::weak_ptr<PeerTable> weak_table = peers->table;
    rendezvous_admit_replacements(rdv, [weak_table](int r) -> std::string {
      auto table = weak_table.lock();
      if (!table || table->shutting_down()) return "rank 0 is shutting down";
      if (table->state(r) != PeerTable::lost)
        return "rank " + std::to_string(r) + " is alive in rank 0's view";
      // One newcomer at a time: a newcomer learns the members when it is
      // admitted, so one admitted while another waits for its grow() would
      // not know that one (it tries again, core/replacement.cpp).
      for (int q = 0; q < table->world_size(); ++q)
        if (q != r && table->state(q) == PeerTable::lost && table->waiting(q) > 0)
          return "rank " + std::to_string(q) + "'s newcomer waits for the members' grow(): the world is already "
                 "closed to other newcomers until then (one joins at a time)";
      return {};
    });
    runtime_add_stopper(rt, [keep = rdv] { (void)keep; });
  }
  auto g = std::make_shared<GroupImpl>();
  g->endpoint = ep;
  g->gid = 0;
  g->members = std::move(members);
  g->plane = std::move(world_plane);
  g->peers = peers->table;
  g->my_grank = my_index;
  g->is_world = true;
  g->local_world_size = env.local_world_size;
  g->timeout_ms.store(rt.options_.collective_timeout.count());
  return detail::Access::group(std::move(g));
}

}  // namespace dopt::detail
