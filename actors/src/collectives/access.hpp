#pragma once
// The library's own access to the private state behind the public handles
// (ProcessGroup, Runtime, RendezvousResult): their constructors from that
// state and their impl() are private, with this struct as their one friend,
// so users cannot reach them. Internal: not installed.
#include <memory>

#include "dopt/actors/process_group.hpp"
#include "dopt/actors/rendezvous.hpp"
#include "dopt/actors/runtime.hpp"

namespace dopt::detail {

struct Access {
  static ProcessGroup group(std::shared_ptr<GroupImpl> impl) { return ProcessGroup(std::move(impl)); }
  static const std::shared_ptr<GroupImpl>& impl(const ProcessGroup& g) { return g.impl_; }
  static RuntimeImpl& impl(Runtime& r) { return r.impl(); }
  static RendezvousResult rendezvous(std::shared_ptr<RendezvousImpl> impl) { return RendezvousResult(std::move(impl)); }
  static RendezvousImpl& impl(const RendezvousResult& r) { return r.impl(); }
};

}  // namespace dopt::detail
