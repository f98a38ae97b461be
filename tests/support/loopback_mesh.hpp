#pragma once
// A TcpMesh of n ranks on loopback, all in this process, for tests of the TCP
// transport and of the algorithms over it.
#include <chrono>
#include <future>
#include <memory>
#include <cstddef>
#include <string>
#include <vector>

#include "dopt/runtime/internal/tcp_transport.hpp"


namespace dopt::testing {

using Meshes = std::vector<std::unique_ptr<dopt::transport::TcpMesh>>;

/// n meshes (rank r at index r) connected on 127.0.0.1 within `timeout`;
/// opts[r] (if given) is rank r's options. The meshes connect concurrently,
/// as ranks do.
inline Meshes loopback_meshes(int n, std::vector<dopt::transport::TcpMeshOptions> opts = {},
                              std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  using dopt::transport::TcpListener;
  using dopt::transport::TcpMesh;
  std::vector<TcpListener> ls;
  std::vector<std::string> eps;
  for (int r = 0; r < n; ++r) {
    ls.push_back(TcpMesh::listen("127.0.0.1"));
    eps.push_back("127.0.0.1:" + std::to_string(ls.back().port()));
  }
  opts.resize(static_cast<std::size_t>(n));
  std::vector<std::future<std::unique_ptr<TcpMesh>>> fs;
  for (int r = 0; r < n; ++r)
    fs.push_back(std::async(std::launch::async, [&, r] {
      const auto i = static_cast<std::size_t>(r);
      return std::make_unique<TcpMesh>(r, n, std::move(ls[i]), eps, timeout, opts[i]);
    }));
  Meshes out;
  for (auto& f : fs) out.push_back(f.get());
  return out;
}

/// n bytes of a pattern that differs with seed, for the payloads of test
/// messages.
inline std::vector<unsigned char> pattern(std::size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 131 + seed * 7919) >> 3);
  return v;
}

}  // namespace dopt::testing
