#pragma once
// Internal to dopt_actors (includes CAF): the rendezvous that
// init_process_group runs, carrying each rank's rank actor and host info.
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "caf/actor.hpp"
#include "dopt/actors/rendezvous.hpp"
#include "dopt/runtime/internal/handshake.hpp"

namespace dopt::detail {

/// rendezvous() where every rank also registers `payload` (an actor; null:
/// its rendezvous actor) and the text make_info() returns, which every rank
/// receives. make_info runs once rank 0 is reachable (rank 0: once it
/// listens on MASTER_PORT), so ports it opens cannot take MASTER_PORT.
///
/// *session_key (when not null) is set, before make_info runs, to the key
/// every port the ranks open afterwards must use as their secret
/// (LaunchEnv::secret for publish_control_port, the TCP mesh): the job's
/// secret when it has one (DOPT_SECRET_FILE, DOPT_SECRET, or one drawn by
/// rank 0 and handed out through torchrun's agent store), else 64 hex digits
/// rank 0 draws and hands to every rank that registers. So only the
/// rendezvous port itself admits processes by job id alone (every rank
/// notes that once, naming how to set a secret); a process that was not
/// part of the rendezvous never passes the handshake of a rank's own port.
///
/// incarnation > 0: this process replaces lost rank env.rank of a running
/// job (DOPT_REPLACES): it registers at rank 0's coordinator as that rank's
/// replacement (admitted only when rank 0 sees the rank lost, see
/// rendezvous_admit_replacements) and gets what a starting rank gets (every
/// rank's payload and info; a rank rank 0 sees lost has a null payload and
/// an empty info). No barrier follows: the others are past theirs.
///
/// required in 1..env.world_size (rank 0's counts; DOPT_MIN_WORLD_SIZE of
/// an elastic job): the rendezvous completes once ranks 0..required-1 have
/// joined; the slots of ranks that have not are vacant, with a null payload
/// and an empty info on every rank, and its barriers count the ranks that
/// joined. 0: every rank (env.world_size). ValueError above world_size.
///
/// compatibility (core/compatibility.hpp): rank 0 keeps its own and
/// compares a replacement's with it before it admits it (ValueError on the
/// replacement naming every difference, ending "start it with the job's
/// settings"; rank 0 and the job are not touched). Starting ranks send none.
RendezvousResult rendezvous_with(Runtime& runtime, const LaunchEnv& env, std::chrono::milliseconds timeout,
                                 caf::actor payload, const std::function<std::string()>& make_info,
                                 std::string* session_key, int incarnation = 0, int required = 0,
                                 const std::vector<std::string>& compatibility = {});

/// Rank 0's judgement of a replacement for rank r: "" admits it (rank 0 sees
/// rank r lost), anything else is why not. Called on CAF's and the rendezvous
/// port's threads: it must not block.
using SlotCheck = std::function<std::string(int rank)>;
/// Rank 0 (user thread, once its world is up): from now on its rendezvous
/// port and coordinator admit the replacement of any rank `check` admits, and
/// the coordinator stays until the runtime shuts down (the caller keeps `r`).
/// No-op on the other ranks.
void rendezvous_admit_replacements(const RendezvousResult& r, SlotCheck check);
/// Index: rank.
const std::vector<caf::actor>& rendezvous_payloads(const RendezvousResult& r);
const std::vector<std::string>& rendezvous_infos(const RendezvousResult& r);
/// Where this rank's listeners bind, and what its peers connect to.
const net::BindPlan& rendezvous_bind_plan(const RendezvousResult& r);

/// After the rendezvous, while the ranks connect to each other: tells rank 0
/// that this rank failed (best effort). Every barrier of every rank fails
/// from then on with PeerLostError "rank R failed while the ranks connected
/// to each other: WHAT", so no rank waits out a timeout for it.
/// On rank 0 it then lingers as rendezvous_linger does.
void rendezvous_report_failure(const RendezvousResult& r, const std::string& what) noexcept;
/// Rank 0, once a failure was reported: returns when every other rank has
/// heard of it (it reported one, or a barrier of its failed with it), or
/// after 2 s, so that no rank finds rank 0 gone without the cause. At once
/// on the other ranks.
void rendezvous_linger(const RendezvousResult& r) noexcept;
/// The failure some rank reported ("" when none, or rank 0 did not answer
/// within `wait`): for a rank whose own step timed out because of it.
std::string rendezvous_failure(const RendezvousResult& r, std::chrono::milliseconds wait);

}  // namespace dopt::detail
