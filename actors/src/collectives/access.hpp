#pragma once
// The library's own access to the private state behind the public handles
// (ProcessGroup, Runtime, RendezvousResult): their constructors from that
// state and their impl() are private; each handle's nested Access reaches
// them (a nested class sees its enclosing class's private members), and
// detail::Access gathers them under one name for the library's sources.
// The states themselves (ProcessGroup::Impl: collectives/group.hpp,
// Runtime::Impl: core/runtime_impl.hpp, RendezvousResult::Impl:
// core/rendezvous.cpp) keep their detail:: names as aliases. Internal: not
// installed.
#include <memory>

#include "dopt/actors/process_group.hpp"
#include "dopt/actors/rendezvous.hpp"
#include "dopt/actors/runtime.hpp"

namespace dopt {

struct ProcessGroup::Access {
  static ProcessGroup make(std::shared_ptr<Impl> impl) { return ProcessGroup(std::move(impl)); }
  static const std::shared_ptr<Impl>& impl(const ProcessGroup& g) { return g.impl_; }
};

struct Runtime::Access {
  static Impl& impl(Runtime& r) { return r.impl(); }
};

struct RendezvousResult::Access {
  static RendezvousResult make(std::shared_ptr<Impl> impl) { return RendezvousResult(std::move(impl)); }
  static Impl& impl(const RendezvousResult& r) { return r.impl(); }
};

namespace detail {

using GroupImpl = ProcessGroup::Impl;
using RuntimeImpl = Runtime::Impl;
using RendezvousImpl = RendezvousResult::Impl;

struct Access {
  static ProcessGroup group(std::shared_ptr<GroupImpl> impl) { return ProcessGroup::Access::make(std::move(impl)); }
  static const std::shared_ptr<GroupImpl>& impl(const ProcessGroup& g) { return ProcessGroup::Access::impl(g); }
  static RuntimeImpl& impl(Runtime& r) { return Runtime::Access::impl(r); }
  static RendezvousResult rendezvous(std::shared_ptr<RendezvousImpl> impl) {
    return RendezvousResult::Access::make(std::move(impl));
  }
  static RendezvousImpl& impl(const RendezvousResult& r) { return RendezvousResult::Access::impl(r); }
};

}  // namespace detail

}  // namespace dopt
