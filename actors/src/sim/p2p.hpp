#pragma once
// Internal to dopt_actors: send and recv of a simulated rank under the fault
// plan. ProcessGroup::send_async / recv_async call these (on the rank's
// thread, or a helper thread of its rank) when sim::active(); outside a
// deterministic simulation they are never called.
#include <functional>
#include <memory>

#include "dopt/actors/future.hpp"
#include "dopt/actors/internal/op.hpp"

namespace dopt::detail::sim {

/// A send op (numbered, not yet handed to its plane): asks the fault plan,
/// then hands it over with post(op), at once or from a helper task after
/// the virtual delay; a lost send is never posted and fails with
/// PeerLostError (naming op's call) after op's timeout. Returns op's future.
Future<void> faulty_send(std::shared_ptr<Op> op, std::function<Future<void>(std::shared_ptr<Op>)> post);

/// A recv op's future from its plane: a TimeoutError there becomes
/// PeerLostError (naming op's call) when the fault plan lost the link from
/// op's sender to this rank.
Future<void> faulty_recv(const Op& op, Future<void> posted);

}  // namespace dopt::detail::sim
