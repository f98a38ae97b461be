// Connecting the ranks after the rendezvous (world_setup.hpp).
#include "core/world_setup.hpp"

#include <memory>

#include "core/host_identity.hpp"
#include "core/ranks.hpp"
#include "core/rendezvous_internal.hpp"
#include "core/runtime_impl.hpp"
#include "core/secure_link.hpp"
#include "transport/actor/rank_state.hpp"

namespace dopt::detail {

std::string publish_control_port(RuntimeImpl& rt, caf::actor_system& sys, caf::actor a, const LaunchEnv& env,
                                 const char* op) {
  const net::BindPlan plan = net::choose_bind_address(env);
  net::AuthListener::Options o;
  o.bind_addr = plan.bind;
  o.port = 0;
  o.port_lo = env.port_range_lo;
  o.port_hi = env.port_range_hi;
  o.purpose = net::Purpose::control;
  o.credentials = net::Credentials::from(env);
  o.handshake_timeout = env.handshake_timeout;
  o.what = "rank " + std::to_string(env.rank) + "'s control port";
  const int world = env.world_size;
  o.admit = [world](const net::PeerHello& p) -> std::string {
    if (p.world_size != world || p.rank < 0 || p.rank >= world)
      return "rank " + std::to_string(p.rank) + " of a world of " + std::to_string(p.world_size) +
             " does not belong to this world of " + std::to_string(world);
    return {};
  };
  std::shared_ptr<SecurePublication> pub;
  try {
    pub = std::make_shared<SecurePublication>(sys, std::move(a), std::move(o));
  } catch (const Error& e) {
    throw IOError(op, "the rank cannot listen on " + plan.bind + ": " + e.detail(), env.rank);
  }
  runtime_add_stopper(rt, [pub] { pub->close(); });
  // advx=1: DOPT_ADVERTISE_ADDR was given, so peers use it even on this host.
  // net: this rank's network namespace (peers in it may dial loopback).
  return " addr=" + plan.advertise + " bind=" + plan.bind + (env.advertise_addr.empty() ? "" : " advx=1") +
         " port=" + std::to_string(pub->port()) + " net=" + network_namespace_id();
}

std::string info_field(const std::string& info, const std::string& key) {
  auto p = info.find(" " + key + "=");
  if (p == std::string::npos) return {};
  p += key.size() + 2;
  return info.substr(p, info.find(' ', p) - p);
}

namespace {
std::string connect_address(const std::string& host_prefix, const std::string& peer_info) {
  // Loopback reaches a peer only in this network namespace: a host name (or
  // DOPT_HOST_ID) shared by namespaces on one machine is not enough.
  const std::string net = info_field(peer_info, "net");
  const bool same_host = net.empty() ? !host_prefix.empty() && peer_info.rfind(host_prefix + " ", 0) == 0
                                     : net == network_namespace_id();
  if (info_field(peer_info, "advx") == "1") return info_field(peer_info, "addr");
  return peer_connect_address(same_host, info_field(peer_info, "addr"), info_field(peer_info, "bind"));
}
}  // namespace

caf::actor connect_control_port(caf::actor_system& sys, const LaunchEnv& env, int r, const std::string& host_prefix,
                                const std::string& peer_info, const char* op) {
  const std::string addr = connect_address(host_prefix, peer_info);
  const int port = std::atoi(info_field(peer_info, "port").c_str());
  net::Credentials creds = net::Credentials::from(env);
  return secure_remote_actor(sys, addr, port, net::Purpose::control, creds, env.handshake_timeout,
                             std::chrono::steady_clock::now() + env.handshake_timeout,
                             /*retry_until_deadline=*/false,
                             "rank " + std::to_string(r) + " at " + addr + ":" + std::to_string(port), op);
}

std::string data_endpoint(const std::string& host_prefix, const std::string& peer_info) {
  return connect_address(host_prefix, peer_info) + ":" + info_field(peer_info, "tcp");
}

std::string rendezvous_failure_of(const RendezvousResult& rdv) {
  return rendezvous_failure(rdv, std::chrono::seconds(2));
}

void rendezvous_report(const RendezvousResult& rdv, const std::string& what) noexcept {
  rendezvous_report_failure(rdv, what);
}

std::shared_ptr<LocalEndpoint> start_rank_actor(RuntimeImpl& rt, caf::actor_system& sys, const LaunchEnv& env,
                                                caf::actor* actor) {
  *actor = sys.spawn(rank_actor, env.rank, env.world_size);
  auto ep = std::make_shared<LocalEndpoint>(*actor, env.rank, env.world_size, rt.options_.collective_timeout, nullptr);
  rt.add_endpoint(ep);
  return ep;
}

}  // namespace dopt::detail
