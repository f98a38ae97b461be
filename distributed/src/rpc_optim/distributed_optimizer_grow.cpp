// distributed_optimizer_catch_up (distributed_optimizer.hpp, "growing back"):
// newcomers become owners of the slots of lost owners; the slots' holders
// send them the parameters and optimizer state, and the buddies are rebuilt
// by the constructor's rule (design in docs/growing-back.md, "Growing
// back"). The trainer's side, and the functions the owners, buddies and
// newcomers run.
#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "distributed_optimizer_detail.hpp"
#include "dopt/actors/internal/call_label.hpp"
#include "dopt/actors/rpc_membership.hpp"
#include "dopt/distributed/distributed_optimizer.hpp"
#include "dopt/runtime/safetensors.hpp"
#include "dopt/runtime/state_dict.hpp"
#include "survive/survive_util.hpp"

namespace dopt::optim {

namespace {

constexpr const char* kCatchUp = "distributed_optimizer_catch_up";

/// What a slot's holder sends: its parameters' values, its optimizer's state
/// dict (state tensors and hyperparameters) as safetensors bytes, its step number.
struct Export {
  std::vector<Tensor> values;
  std::string state;
  std::int64_t steps = 0;
};

Export export_state(const FunctionalOptimizer& f, long steps) {
  Export e;
  e.values = f.params();  // sent as copies (rpc_serialize.hpp)
  const SafetensorsFile file = state_dict_to_safetensors(f.state_dict());
  e.state = serialize_safetensors(file.tensors, file.metadata);
  e.steps = steps;
  return e;
}

/// A functional optimizer of spec over `values` (this worker's own tensors)
/// with the state that was sent; RRefs to the tensors in `refs`.
std::unique_ptr<FunctionalOptimizer> import_state(rpc::Agent& a, const std::string& spec_json,
                                                  const std::vector<Tensor>& values, const std::string& state,
                                                  std::vector<rpc::RRef<Tensor>>& refs) {
  for (const auto& v : values) refs.push_back(a.make_rref(v));
  auto f = make_functional(OptimizerSpec::from_json(spec_json), values);
  const std::string what = "the optimizer state sent to " + detail::owner_name(a.worker_info());
  f->load_state_dict(state_dict_from_safetensors(parse_safetensors(state.data(), state.size(), what), what));
  return f;
}

rpc::Fn nested(const char* name, std::int64_t timeout_ms) {
  rpc::Fn fn(name);
  if (timeout_ms > 0) fn.timeout = std::chrono::milliseconds(timeout_ms);
  return fn;
}

using OwnerHandle = std::tuple<rpc::RRef<OwnerOptimizer>, std::vector<rpc::RRef<Tensor>>, std::int64_t>;

std::string workers_str(const std::vector<rpc::WorkerInfo>& v) {
  std::string s;
  for (const auto& w : v) s += (s.empty() ? "" : ", ") + detail::owner_name(w);
  return s;
}

std::string newcomers_str(std::size_t n) { return std::to_string(n) + (n == 1 ? " newcomer" : " newcomers"); }

/// The what() of a failure (for the message that wraps it).
std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an unknown error";
  }
}

}  // namespace

namespace detail {

void register_grow_functions() {
  for (const auto& [fn, call] : std::initializer_list<std::pair<const char*, const char*>>{
           {"dopt.optim.hand_over", "distributed_optimizer_catch_up()"},
           {"dopt.optim.adopt_owner", "distributed_optimizer_catch_up()"},
           {"dopt.optim.copy_to_buddy", "distributed_optimizer_catch_up()"},
           {"dopt.optim.adopt_mirror", "distributed_optimizer_catch_up()"},
           {"dopt.optim.set_mirrors", "distributed_optimizer_catch_up()"}})
    dopt::detail::name_rpc_function(fn, call);
  // On a slot's holder, in its strand (so after every step it applied): the
  // slot goes to `dst`, which builds an owner from this one's state. The
  // holder keeps its own until the trainer drops it.
  rpc::register_method<OwnerOptimizer>(
      "dopt.optim.hand_over", [](rpc::Agent& a, OwnerOptimizer& o, std::uint64_t epoch, const std::string& spec_json,
                                 int dst, std::int64_t timeout_ms) {
        check_epoch(a, o.line, epoch, "distributed_optimizer_catch_up (holder)");
        if (owner_probe(a, "hand_over", o.steps)) throw StateError(kCatchUp, "lost by the test", a.rank());
        const Export e = export_state(*o.optimizer, o.steps);
        return a.rpc_sync<OwnerHandle>(dst, nested("dopt.optim.adopt_owner", timeout_ms), spec_json, o.line, epoch,
                                       e.values, e.state, e.steps);
      });
  // On a newcomer: the owner of a slot, from its holder's state.
  rpc::register_function("dopt.optim.adopt_owner",
                         [](rpc::Agent& a, const std::string& spec_json, std::uint64_t line, std::uint64_t epoch,
                            std::vector<Tensor> values, const std::string& state, std::int64_t steps) {
                           check_epoch(a, line, epoch, "distributed_optimizer_catch_up (newcomer)");
                           if (owner_probe(a, "adopt", static_cast<long>(steps)))
                             throw StateError(kCatchUp, "lost by the test", a.rank());
                           OwnerOptimizer o;
                           o.optimizer = import_state(a, spec_json, values, state, o.params);
                           for (const auto& p : o.params) o.ids.push_back(p.id());
                           o.steps = static_cast<long>(steps);
                           o.line = line;
                           auto params = o.params;
                           return OwnerHandle(a.make_rref(std::move(o)), std::move(params), steps);
                         });
  // On a slot's owner, in its strand: a copy of its parameters and state on buddy `dst`.
  rpc::register_method<OwnerOptimizer>(
      "dopt.optim.copy_to_buddy", [](rpc::Agent& a, OwnerOptimizer& o, std::uint64_t epoch,
                                     const std::string& spec_json, int dst, std::int64_t timeout_ms) {
        check_epoch(a, o.line, epoch, "distributed_optimizer_catch_up (owner)");
        const Export e = export_state(*o.optimizer, o.steps);
        return a.rpc_sync<rpc::RRef<OwnerMirror>>(dst, nested("dopt.optim.adopt_mirror", timeout_ms), spec_json, o.line,
                                                  epoch, a.rank(), e.values, e.state, e.steps);
      });
  rpc::register_function("dopt.optim.adopt_mirror",
                         [](rpc::Agent& a, const std::string& spec_json, std::uint64_t line, std::uint64_t epoch,
                            int primary, std::vector<Tensor> values, const std::string& state, std::int64_t steps) {
                           check_epoch(a, line, epoch, "distributed_optimizer_catch_up (buddy)");
                           OwnerMirror m;
                           m.optimizer = import_state(a, spec_json, values, state, m.params);
                           m.line = line;
                           m.primary = primary;
                           m.steps = static_cast<long>(steps);
                           return a.make_rref(std::move(m));
                         });
  // On an owner, in its strand: the buddies it forwards its steps to from now on.
  rpc::register_method<OwnerOptimizer>(
      "dopt.optim.set_mirrors",
      [](rpc::Agent& a, OwnerOptimizer& o, std::uint64_t epoch, std::vector<rpc::RRef<OwnerMirror>> mirrors) {
        check_epoch(a, o.line, epoch, "distributed_optimizer_catch_up (owner)");
        if (owner_probe(a, "set_mirrors", o.steps)) throw StateError(kCatchUp, "refused by the test", a.rank());
        o.mirrors = std::move(mirrors);
      });
}

}  // namespace detail

OwnerRecovery distributed_optimizer_catch_up(DistributedOptimizer& opt, const std::vector<rpc::To>& newcomers) {
  const rpc::Agent& a = opt.agent_;
  const int me = a.rank();
  const int k = opt.options_.redundancy;
  if (k <= 0)
    throw NotSupportedError(
        kCatchUp,
        "this DistributedOptimizer has no redundancy (DistributedOptimizerOptions::redundancy = 0): "
        "a lost owner's parameters and state are gone, there is nothing to catch a newcomer up "
        "from; build a new DistributedOptimizer over the new owners' parameters",
        me);
  if (newcomers.empty()) throw ValueError(kCatchUp, "got no newcomers", me);

  // --- the newcomers: live workers that are not members yet ---
  std::set<int> members{me};
  for (const auto& o : opt.owners_) {
    members.insert(o.rank);
    for (const auto& m : o.mirrors) members.insert(m.rank);
  }
  std::vector<int> ranks;
  for (const auto& to : newcomers) {
    rpc::WorkerInfo w;
    try {
      w = to.rank >= 0 || to.name.empty() ? a.worker_info(to.rank) : a.worker_info(to.name);
    } catch (const Error& e) {
      throw ValueError(kCatchUp, std::string("a newcomer is not a worker of this RPC world: ") + e.what(), me);
    }
    if (w.rank == me) throw ValueError(kCatchUp, "the newcomer " + detail::owner_name(w) + " is the trainer", me);
    if (std::find(ranks.begin(), ranks.end(), w.rank) != ranks.end())
      throw ValueError(kCatchUp, "the newcomer " + detail::owner_name(w) + " is named twice", me);
    const bool lost = std::find(opt.lost_.begin(), opt.lost_.end(), w.rank) != opt.lost_.end() ||
                      a.wait_until_lost(w.rank, std::chrono::milliseconds(0));
    if (lost)
      throw PeerLostError(kCatchUp,
                          "the newcomer " + detail::owner_name(w) +
                              " is lost (a worker of the RPC world "
                              "that was lost cannot come back into it: name a live standby worker)",
                          me);
    if (members.count(w.rank))
      throw ValueError(kCatchUp,
                       "the newcomer " + detail::owner_name(w) +
                           " is already an owner or a buddy of this "
                           "DistributedOptimizer",
                       me);
    ranks.push_back(w.rank);
  }
  std::sort(ranks.begin(), ranks.end());
  auto vacant_slots = [&](const std::set<int>& gone) {
    std::vector<std::size_t> v;
    for (std::size_t i = 0; i < opt.owners_.size(); ++i)
      if (gone.count(opt.owners_[i].home)) v.push_back(i);
    return v;
  };
  {
    std::set<int> gone(opt.lost_.begin(), opt.lost_.end());
    for (int r : rpc::lost_workers(a)) gone.insert(r);
    const auto vacant = vacant_slots(gone);
    if (ranks.size() > vacant.size())
      throw NotSupportedError(kCatchUp,
                              newcomers_str(ranks.size()) + ", but " + std::to_string(vacant.size()) +
                                  " vacant slots (the parameters of an "
                                  "owner that was lost): a DistributedOptimizer's parameters stay where "
                                  "they were placed, it does not grow beyond its first owners",
                              me);
  }

  // --- 1. the membership, the newcomers in it; owners lost meanwhile are taken over ---
  OwnerRecovery rec = opt.recover_owners(false, 0, ranks);
  auto is_newcomer = [&](int r) { return std::find(ranks.begin(), ranks.end(), r) != ranks.end(); };
  // A failure from here on: the owners lost before or during the call were
  // taken over by their buddies all the same. The callback hears of those
  // takeovers once (joined empty), then the error is thrown.
  auto fail = [&](const std::exception_ptr& e) {
    if (opt.options_.on_membership_change) {
      OwnerRecovery r;
      for (const auto& w : rec.lost)
        if (!is_newcomer(w.rank)) r.lost.push_back(w);
      if (!r.lost.empty()) {
        r.moved = rec.moved;
        std::sort(r.moved.begin(), r.moved.end());
        r.moved.erase(std::unique(r.moved.begin(), r.moved.end()), r.moved.end());
        r.epoch = opt.epoch_;
        r.step = opt.steps_;
        opt.options_.on_membership_change(r);
      }
    }
    std::rethrow_exception(e);
  };
  for (int r : ranks)
    if (std::find(opt.lost_.begin(), opt.lost_.end(), r) != opt.lost_.end()) {
      std::vector<rpc::WorkerInfo> owners;  // rec.lost holds the lost newcomers too
      for (const auto& w : rec.lost)
        if (!is_newcomer(w.rank)) owners.push_back(w);
      fail(std::make_exception_ptr(
          PeerLostError(kCatchUp,
                        "the newcomer " + detail::owner_name(a.worker_info(r)) +
                            " was lost while the members agreed on the membership; no slot moved" +
                            (rec.moved.empty() || owners.empty()
                                 ? std::string()
                                 : " (the lost owners " + workers_str(owners) + " were taken over by their buddies)"),
                        me)));
    }
  const std::set<int> gone(opt.lost_.begin(), opt.lost_.end());
  const auto vacant = vacant_slots(gone);
  if (ranks.size() > vacant.size())
    fail(std::make_exception_ptr(NotSupportedError(
        kCatchUp, newcomers_str(ranks.size()) + ", but " + std::to_string(vacant.size()) + " vacant slots", me)));

  const std::string json = opt.spec_.to_json();
  const std::int64_t timeout_ms = opt.options_.timeout ? opt.options_.timeout->count() : 0;
  auto fn = [&](const char* name) {
    rpc::Fn f(name);
    f.timeout = opt.options_.timeout;
    return f;
  };
  // A loss before anything is committed: no slot went to a newcomer. Owners
  // lost before (taken over in step 1) did move: the message names them.
  auto nothing_changed = [&](const std::exception_ptr& e) {
    if (!detail::is_peer_lost(e)) fail(e);
    const std::string what = rec.lost.empty()
                                 ? std::string("nothing changed: the slots are where they were")
                                 : "no slot went to a newcomer, but the owners " + workers_str(rec.lost) +
                                       ", lost before, were taken over by their buddies (parameters() has their RRefs)";
    fail(std::make_exception_ptr(
        PeerLostError(kCatchUp,
                      "a worker was lost while the state moved to the newcomers (" + what_of(e) + "); " + what +
                          "; the next call recovers a lost owner; call distributed_optimizer_catch_up again",
                      me)));
  };

  // --- 2. each vacant slot's holder sends it to its newcomer ---
  std::map<std::size_t, int> assigned;  // slot -> newcomer
  for (std::size_t j = 0; j < ranks.size(); ++j) assigned[vacant[j]] = ranks[j];
  std::map<std::size_t, Future<OwnerHandle>> handing;
  for (const auto& [i, n] : assigned)
    handing.emplace(
        i, opt.owners_[i].local.rpc_async<OwnerHandle>(fn("dopt.optim.hand_over"), opt.epoch_, json, n, timeout_ms));
  std::map<std::size_t, OwnerHandle> taken;
  std::exception_ptr failed;
  for (auto& [i, f] : handing) {
    try {
      taken[i] = f.get();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) nothing_changed(failed);
  for (const auto& [i, h] : taken)
    if (std::get<1>(h).size() != opt.owners_[i].params.size() || std::get<2>(h) != opt.steps_)
      fail(std::make_exception_ptr(StateError(
          kCatchUp,
          "the newcomer " + detail::owner_name(a.worker_info(assigned[i])) + " got " +
              std::to_string(std::get<1>(h).size()) + " parameters at step " + std::to_string(std::get<2>(h)) +
              ", expected " + std::to_string(opt.owners_[i].params.size()) + " at step " + std::to_string(opt.steps_),
          me)));

  // --- 3. the buddies, by the constructor's rule over the grown set of owners ---
  const std::size_t slots = opt.owners_.size();
  std::vector<int> owner_of(slots);
  std::vector<rpc::RRef<OwnerOptimizer>> local_of(slots);
  for (std::size_t i = 0; i < slots; ++i) {
    const auto t = taken.find(i);
    owner_of[i] = t != taken.end() ? assigned[i] : opt.owners_[i].rank;
    local_of[i] = t != taken.end() ? std::get<0>(t->second) : opt.owners_[i].local;
  }
  std::vector<int> ring(owner_of.begin(), owner_of.end());
  std::sort(ring.begin(), ring.end());
  ring.erase(std::unique(ring.begin(), ring.end()), ring.end());
  const std::size_t kk = std::min(static_cast<std::size_t>(k), ring.size() - 1);
  std::vector<std::vector<DistributedOptimizer::Mirror>> mirrors(slots);
  std::vector<std::vector<std::pair<int, Future<rpc::RRef<OwnerMirror>>>>> copying(slots);
  std::vector<std::pair<int, Future<std::int64_t>>> checks;  // the kept copies' steps
  for (std::size_t i = 0; i < slots; ++i) {
    const auto at = static_cast<std::size_t>(std::find(ring.begin(), ring.end(), owner_of[i]) - ring.begin());
    for (std::size_t j = 1; j <= kk; ++j) {
      const int b = ring[(at + j) % ring.size()];
      const auto& old = opt.owners_[i].mirrors;
      const auto kept = std::find_if(old.begin(), old.end(), [&](const auto& m) { return m.rank == b; });
      if (kept != old.end()) {
        mirrors[i].push_back(*kept);
        checks.emplace_back(b, kept->ref.rpc_async<std::int64_t>(fn("dopt.optim.mirror_steps")));
      } else {
        copying[i].emplace_back(b, local_of[i].rpc_async<rpc::RRef<OwnerMirror>>(fn("dopt.optim.copy_to_buddy"),
                                                                                 opt.epoch_, json, b, timeout_ms));
      }
    }
  }
  for (auto& [b, f] : checks) {
    try {
      const std::int64_t at = f.get();
      if (at != opt.steps_ && !failed)
        failed = std::make_exception_ptr(
            StateError(kCatchUp,
                       "the copy on " + detail::owner_name(a.worker_info(b)) + " has applied " + std::to_string(at) +
                           " steps; this optimizer has completed " + std::to_string(opt.steps_),
                       me));
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  for (std::size_t i = 0; i < slots; ++i)
    for (auto& [b, f] : copying[i]) {
      try {
        mirrors[i].push_back(DistributedOptimizer::Mirror{b, f.get()});
      } catch (...) {
        if (!failed) failed = std::current_exception();
      }
    }
  if (failed) nothing_changed(failed);

  // --- 4. commit: the trainer's view, then every owner's buddies ---
  // Kept for a roll-back: the old record holds the old buddies' copies (at this step).
  const auto owners_before = opt.owners_;
  const auto params_before = opt.params_;
  const auto moved_before = rec.moved;
  for (std::size_t i = 0; i < slots; ++i) {
    auto& o = opt.owners_[i];
    const auto t = taken.find(i);
    if (t != taken.end()) {
      o.rank = o.home = assigned[i];
      o.local = std::get<0>(t->second);
      const auto& ps = std::get<1>(t->second);
      for (std::size_t q = 0; q < ps.size(); ++q) {
        opt.params_[o.params[q]] = ps[q];
        rec.moved.push_back(o.params[q]);
      }
    }
    o.mirrors = std::move(mirrors[i]);
  }
  for (int r : ranks) rec.joined.push_back(a.worker_info(r));
  // Every owner of the trainer's record gets its buddies; an owner lost now
  // is recovered at once from them (they hold its slot at this step) and the
  // round is sent again. Returns the failure that is not a loss, or null;
  // `kind`: the kind of the first owner's failure that is not a loss.
  std::string kind = "PeerLostError";
  auto set_mirrors = [&]() -> std::exception_ptr {
    for (std::size_t attempt = 0;; ++attempt) {
      std::vector<Future<void>> fs;
      for (const auto& o : opt.owners_) {
        std::vector<rpc::RRef<OwnerMirror>> refs;
        for (const auto& m : o.mirrors) refs.push_back(m.ref);
        fs.push_back(o.local.rpc_async<void>(fn("dopt.optim.set_mirrors"), opt.epoch_, refs));
      }
      std::vector<std::exception_ptr> errors;
      bool lost = false, other = false;
      for (auto& f : fs) {
        f.wait();
        errors.push_back(f.exception());
        if (errors.back()) (detail::is_peer_lost(errors.back()) ? lost : other) = true;
      }
      if (!lost && !other) return nullptr;
      if (other || attempt > slots + 1) {
        std::vector<rpc::WorkerInfo> who;
        for (const auto& o : opt.owners_) who.push_back(a.worker_info(o.rank));
        for (const auto& e : errors)
          if (e && !detail::is_peer_lost(e)) {
            try {
              std::rethrow_exception(e);
            } catch (const Error& x) {
              kind = rpc::error_kind(x);
            } catch (...) {
              kind = "Error";
            }
            break;
          }
        return detail::joined_error(errors, who, kCatchUp, me, true);
      }
      const OwnerRecovery r = opt.recover_owners(false, 0);
      rec.lost.insert(rec.lost.end(), r.lost.begin(), r.lost.end());
      rec.moved.insert(rec.moved.end(), r.moved.begin(), r.moved.end());
    }
  };
  if (const std::exception_ptr e = set_mirrors()) {
    // An owner refused its buddies (not lost): roll back. The newcomers do
    // not become members; every owner of the old record gets the buddies it
    // had before the call again (an owner lost meanwhile is taken over from
    // them), so the next step runs as if the call had not been made.
    opt.owners_ = owners_before;
    opt.params_ = params_before;
    rec.joined.clear();
    rec.moved = moved_before;
    if (const std::exception_ptr e2 = set_mirrors())
      throw StateError(kCatchUp,
                       "setting the rebuilt buddies on the owners failed (" + what_of(e) +
                           "), and so did giving the owners back the buddies they had before the call (" + what_of(e2) +
                           "): an owner may forward its steps to copies this optimizer does not count on; build a "
                           "new DistributedOptimizer from a checkpoint",
                       me);
    std::vector<rpc::WorkerInfo> joining, owners;
    for (int r : ranks) joining.push_back(a.worker_info(r));
    for (const auto& w : rec.lost)
      if (!is_newcomer(w.rank)) owners.push_back(w);
    fail(rpc::make_error(kind, kCatchUp,
                         "setting the rebuilt buddies on the owners failed (" + what_of(e) + "); rolled back: " +
                             workers_str(joining) + (ranks.size() == 1 ? " is not a member" : " are not members") +
                             ", no slot went to a newcomer, the owners keep the slots and buddies they had before "
                             "the call" +
                             (owners.empty() ? std::string()
                                             : "; the owners " + workers_str(owners) +
                                                   ", lost before or during the call, were taken over by their "
                                                   "buddies (parameters() has their RRefs)") +
                             "; call distributed_optimizer_catch_up again",
                         me));
  }
  std::sort(rec.moved.begin(), rec.moved.end());
  rec.moved.erase(std::unique(rec.moved.begin(), rec.moved.end()), rec.moved.end());
  rec.epoch = opt.epoch_;
  rec.step = opt.steps_;
  rec.step_completed = false;
  rec.needs_gradient.clear();
  rec.context = 0;
  if (opt.options_.on_membership_change) opt.options_.on_membership_change(rec);
  return rec;
}

}  // namespace dopt::optim
