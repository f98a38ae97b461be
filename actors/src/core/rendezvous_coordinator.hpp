// The rendezvous coordinator: rank 0's actor that collects every rank's
// registration, answers barriers and admits replacements (rendezvous.cpp
// spawns it; the protocol's messages and reply kinds are shared by both).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "caf/all.hpp"
#include "core/rendezvous_internal.hpp"

namespace dopt::detail {


using rdv_reg_atom = caf::atom_constant<caf::atom("rdvreg")>;
using rdv_bar_atom = caf::atom_constant<caf::atom("rdvbar")>;
using rdv_tmo_atom = caf::atom_constant<caf::atom("rdvtmo")>;
using rdv_btmo_atom = caf::atom_constant<caf::atom("rdvbtmo")>;
using rdv_ping_atom = caf::atom_constant<caf::atom("rdvping")>;
using rdv_fail_atom = caf::atom_constant<caf::atom("rdvfail")>;
using rdv_why_atom = caf::atom_constant<caf::atom("rdvwhy")>;
using rdv_told_atom = caf::atom_constant<caf::atom("rdvtold")>;  // has every rank heard of the setup failure?
using rdv_key_atom = caf::atom_constant<caf::atom("rdvkey")>;
using rdv_note_atom = caf::atom_constant<caf::atom("rdvnote")>;  // (rdvnote, after_ms): say who is missing
// (rdvrejoin, rank, world, incarnation, who, payload, info, compatibility): a replacement of a lost rank registers
using rdv_rejoin_atom = caf::atom_constant<caf::atom("rdvrejoin")>;



// Reply kinds: every reply is (int kind, std::string message, Table table,
// Table payloads, std::vector<std::string> infos): the rendezvous actors, and
// what each rank registered alongside (its rank actor and host info, for
// init_process_group; the rendezvous actor itself and "" for rendezvous()).
enum ReplyKind : int { k_ok = 0, k_timeout = 1, k_value = 2, k_state = 3, k_peer = 4 };

using Table = std::vector<caf::actor>;

struct Replacements {
  std::mutex mutex;
  SlotCheck check;                    // unset until rank 0's world is up
  std::map<int, int> incarnation;     // rank -> the incarnation admitted last
  // rank -> when the coordinator admitted its newcomer last; one that has
  // not announced itself to rank 0 yet (check() still admits its slot)
  // holds the others back for 2 handshake timeouts, or until it ends (the
  // coordinator watches its rendezvous actor): one joins at a time.
  std::map<int, std::chrono::steady_clock::time_point> admitted_at;
  std::chrono::milliseconds settle{20000};

  /// "" when rank r's replacement may come in.
  std::string judge(int r) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!check) return "rank " + std::to_string(r) + " is already taken";
    return check(r);
  }
};

/// Rank 0: spawns the coordinator of a world of `world` slots whose ranks
/// 0..required-1 must join; `closed` is set once the world is complete.
caf::actor spawn_rendezvous_coordinator(caf::actor_system& sys, int world, int required, std::int64_t timeout_ms,
                                        std::shared_ptr<std::atomic<bool>> closed, std::string session_key,
                                        std::shared_ptr<Replacements> replacements,
                                        std::vector<std::string> compatibility);
/// The other ranks: an actor that only answers pings.
caf::actor spawn_rendezvous_member(caf::actor_system& sys);
/// Throws the dopt::Error of a coordinator's reply kind (not k_ok).
[[noreturn]] void throw_reply(int kind, const std::string& msg, int rank);
/// A table entry for messages: "vacant", or the actor's id@node.
std::string describe(const caf::actor& a);

}  // namespace dopt::detail
