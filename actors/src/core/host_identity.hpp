#pragma once
// Which ranks are on the same host, measured (init_process_group).
//
// Two things decide it, and they are measured separately:
//  * shared memory: ranks share the shared-memory plane when they see the
//    same /dev/shm of the same running kernel (boot id + the device of the
//    /dev/shm file system). Containers with a private /dev/shm, or network
//    namespaces given one, are therefore other hosts even on one machine.
//    Each rank also creates a small probe segment and, after the rendezvous,
//    maps the probe of every rank it takes to be on its host and checks its
//    token: a rank that cannot map it fails init_process_group on every rank
//    with the reason (DOPT_HOST_ID overrides the measurement).
//  * the network: a peer is dialled over loopback only when it is in this
//    rank's network namespace (boot id + the namespace's inode), whatever
//    its host name.
// DOPT_HOST_ID=<id> replaces the shared-memory identity (ranks with equal ids
// are one host; no probe): set-ups the measurement gets wrong, and tests that
// play several hosts on one machine.
#include <string>
#include <vector>

namespace dopt::detail {

/// "<boot id>:<network namespace inode>": equal on two processes exactly
/// when they share a network namespace (loopback reaches one another).
std::string network_namespace_id();

/// "<boot id>:<major>.<minor>" of /dev/shm's file system ("" fields when
/// unreadable); equal on two processes that can share /dev/shm segments.
std::string shared_memory_id();

class HostIdentity {
 public:
  /// Measures, and (without DOPT_HOST_ID) creates the probe segment.
  HostIdentity();
  ~HostIdentity();
  HostIdentity(const HostIdentity&) = delete;
  HostIdentity& operator=(const HostIdentity&) = delete;

  /// "host=<id>": the first field of this rank's rendezvous info; ranks with
  /// equal fields are on one host.
  const std::string& host_field() const noexcept { return host_; }
  /// " probe=<segment>:<token>" (or "" with DOPT_HOST_ID), for the info.
  std::string probe_fields() const;
  /// Maps the probe of every rank whose info starts with this rank's host
  /// field and checks its token. Throws ValueError (op, rank) naming the
  /// first rank whose segment this rank cannot map, and why.
  void verify(const std::vector<std::string>& infos, int rank, const char* op) const;
  /// Removes the probe segment (every peer verified it). Idempotent.
  void release() noexcept;

 private:
  std::string host_;
  std::string probe_name_;  // "/dopt-<pid>-probe-<hex>"
  std::string token_;
  bool overridden_ = false;
};

}  // namespace dopt::detail
