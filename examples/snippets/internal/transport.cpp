// Quoted by docs/transport.md (tests/check_docs.py checks the quotes; CI compiles this file).
#include <chrono>
#include <string>
#include <vector>

#include "dopt/runtime/launch_env.hpp"
#include "dopt/runtime/internal/tcp_transport.hpp"

// Swaps "host:port" with every rank over the control plane (the rendezvous, in dopt).
std::vector<std::string> exchange_over_control_plane(const std::string& me);

void set_up_a_mesh(int rank, int world_size, const std::string& my_host, const dopt::LaunchEnv& env) {
  using dopt::transport::TcpMesh;
  auto listener = TcpMesh::listen("10.0.0.5");                // this rank's interface, ephemeral port
  std::string me = my_host + ":" + std::to_string(listener.port());
  std::vector<std::string> endpoints = exchange_over_control_plane(me);   // "host:port" per rank
  dopt::transport::TcpMeshOptions opts;
  opts.credentials = dopt::net::Credentials::from(env);       // job id and secret
  TcpMesh mesh(rank, world_size, std::move(listener), endpoints, std::chrono::seconds(60), opts);
}
