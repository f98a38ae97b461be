#pragma once
// A client of torch's key-value store (c10d's TCPStore, torch 1.13's wire
// protocol), so that a dopt program can meet its ranks where a torch launcher
// already holds MASTER_PORT with such a store: torchrun's default (static)
// rendezvous, whose agent serves one (TORCHELASTIC_USE_AGENT_STORE=True).
//
// Contract: set() and get() block the calling thread; get() waits until the
// key exists (another process set it), bounded by the timeout. Keys and
// values are byte strings. Nothing is authenticated: the store is torch's,
// and dopt keeps only a port number there (dopt's own handshake still guards
// that port). Not thread-safe: one client per thread.
#include <chrono>
#include <memory>
#include <string>

namespace dopt::net {

class TorchStoreClient {
 public:
  /// Connects to host:port, retrying a refused connection until the timeout.
  /// Throws TimeoutError (nothing reached within it), IOError (host does not
  /// resolve).
  TorchStoreClient(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~TorchStoreClient();
  TorchStoreClient(const TorchStoreClient&) = delete;
  TorchStoreClient& operator=(const TorchStoreClient&) = delete;

  void set(const std::string& key, const std::string& value);
  /// Waits until key is set, then returns its value. Throws TimeoutError
  /// naming the key when it is not set within the timeout, IOError when the
  /// store closes the connection.
  std::string get(const std::string& key);

 private:
  int fd_ = -1;
  std::string where_;
  std::chrono::milliseconds timeout_;
};

}  // namespace dopt::net
