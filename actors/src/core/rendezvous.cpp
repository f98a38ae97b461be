// Rendezvous of real processes over CAF's middleman (see rendezvous.hpp).
#include "dopt/actors/rendezvous.hpp"
#include "collectives/access.hpp"

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <random>
#include <thread>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/notice.hpp"
#include "core/ranks.hpp"
#include "core/caf_thread.hpp"
#include "core/compatibility.hpp"
#include "core/rendezvous_coordinator.hpp"
#include "core/rendezvous_internal.hpp"
#include "dopt/runtime/internal/torch_store.hpp"
#include "core/secure_link.hpp"


namespace dopt {

/// The rendezvous state (detail::RendezvousImpl in the library's sources).
struct RendezvousResult::Impl {
  std::mutex mutex;
  caf::actor_system* sys = nullptr;
  caf::actor mine;
  caf::actor coord;
  detail::Table table;
  detail::Table payloads;
  std::vector<std::string> infos;
  std::vector<std::string> names;
  int rank = 0;
  int world = 1;
  int port = 0;
  net::BindPlan plan;
  net::Credentials creds;
  std::chrono::milliseconds handshake_timeout{kDefaultHandshakeTimeoutMs};
  mutable std::atomic<std::uint64_t> next_barrier{0};
  bool stopped = false;

  // Rank 0: the rendezvous port (closed by stop() only when the rendezvous
  // failed; otherwise at runtime shutdown).
  std::shared_ptr<detail::SecurePublication> publication;
  bool completed = false;
  std::shared_ptr<detail::Replacements> replacements;  // rank 0

  void stop() noexcept {
    std::lock_guard<std::mutex> lock(mutex);
    if (stopped) return;
    stopped = true;
    if (publication && !completed) publication->close();
    if (mine) caf::anon_send_exit(mine, caf::exit_reason::user_shutdown);
    mine = nullptr;
    coord = nullptr;
    table.clear();
    payloads.clear();
  }
  ~Impl() { stop(); }

  /// One blocking request to the coordinator; returns the table of an ok reply
  /// (and the payloads and infos into the given pointers).
  detail::Table ask_coord(const caf::message& msg, std::chrono::milliseconds wait, const char* what,
                  detail::Table* payloads_out = nullptr, std::vector<std::string>* infos_out = nullptr,
                  std::string* text_out = nullptr) {
    caf::actor c;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (stopped) throw StateError("rendezvous", "the runtime has been shut down", rank);
      c = coord;
    }
    detail::UserThreadCafScope caf_scope;
    caf::scoped_actor self{*sys};
    detail::Table out;
    int kind = detail::k_ok;
    std::string text;
    self->request(c, caf::duration(wait), msg)
        .receive(
            [&](int k, std::string& m, detail::Table& t, detail::Table& p, std::vector<std::string>& i) {
              kind = k;
              text = std::move(m);
              out = std::move(t);
              if (payloads_out) *payloads_out = std::move(p);
              if (infos_out) *infos_out = std::move(i);
            },
            [&](caf::error& e) {
              if (e == caf::sec::request_timeout) {
                kind = detail::k_timeout;
                text = std::string(what) + " timed out after " + std::to_string(wait.count()) +
                       " ms without an answer from rank 0";
              } else {
                throw PeerLostError("rendezvous", std::string(what) + ": rank 0 is gone (" + sys->render(e) + ")",
                                    rank);
              }
            });
    if (kind != detail::k_ok) detail::throw_reply(kind, text, rank);
    if (text_out) *text_out = std::move(text);
    return out;
  }
};

using namespace std::chrono;

int RendezvousResult::rank() const noexcept { return impl_->rank; }
int RendezvousResult::world_size() const noexcept { return impl_->world; }
int RendezvousResult::master_port() const noexcept { return impl_->port; }

std::string RendezvousResult::peer(int r) const {
  if (r < 0 || r >= impl_->world)
    throw ValueError("rendezvous", "peer rank " + std::to_string(r) + " is outside [0, " +
                                       std::to_string(impl_->world) + ")", impl_->rank);
  return impl_->names[static_cast<std::size_t>(r)];
}

void RendezvousResult::barrier(milliseconds timeout) const {
  if (timeout.count() <= 0) throw ValueError("rendezvous", "barrier timeout must be positive", impl_->rank);
  const std::uint64_t seq = impl_->next_barrier++;
  // Rank 0 answers with the missing ranks at `timeout`; wait a little longer
  // for that answer before giving up on rank 0 itself.
  try {
    impl_->ask_coord(caf::make_message(detail::rdv_bar_atom::value, seq, impl_->rank,
                                       static_cast<std::int64_t>(timeout.count())),
                     timeout + seconds(2), "barrier");
  } catch (const PeerLostError&) {
    detail::rendezvous_linger(*this);  // rank 0: the others hear the cause first
    throw;
  }
}

RendezvousResult rendezvous(Runtime& runtime, const LaunchEnv& env, const RendezvousOptions& options) {
  return detail::rendezvous_with(runtime, env, options.timeout, caf::actor(), {}, nullptr);
}

}  // namespace dopt

namespace dopt::detail {

using namespace std::chrono;

const std::vector<caf::actor>& rendezvous_payloads(const RendezvousResult& r) { return detail::Access::impl(r).payloads; }

void rendezvous_admit_replacements(const RendezvousResult& r, SlotCheck check) {
  auto& impl = detail::Access::impl(r);
  if (!impl.replacements) return;
  std::lock_guard<std::mutex> lock(impl.replacements->mutex);
  impl.replacements->check = std::move(check);
}
const net::BindPlan& rendezvous_bind_plan(const RendezvousResult& r) { return detail::Access::impl(r).plan; }

void rendezvous_report_failure(const RendezvousResult& r, const std::string& what) noexcept {
  try {
    caf::actor c;
    {
      std::lock_guard<std::mutex> lock(detail::Access::impl(r).mutex);
      c = detail::Access::impl(r).coord;
    }
    if (c) caf::anon_send(c, rdv_fail_atom::value, detail::Access::impl(r).rank, what);
  } catch (...) {
  }
  rendezvous_linger(r);
}

void rendezvous_linger(const RendezvousResult& r) noexcept {
  auto& impl = detail::Access::impl(r);
  if (impl.rank != 0) return;
  try {
    caf::actor c;
    {
      std::lock_guard<std::mutex> lock(impl.mutex);
      c = impl.coord;
    }
    if (!c) return;
    UserThreadCafScope caf_scope;
    caf::scoped_actor self{*impl.sys};
    const auto until = steady_clock::now() + seconds(2);
    while (steady_clock::now() < until) {
      bool all = false;
      self->request(c, caf::duration(milliseconds(200)), rdv_told_atom::value)
          .receive([&](bool b) { all = b; }, [](caf::error&) {});
      if (all) return;
      std::this_thread::sleep_for(milliseconds(10));
    }
  } catch (...) {
  }
}

std::string rendezvous_failure(const RendezvousResult& r, std::chrono::milliseconds wait) {
  caf::actor c;
  {
    std::lock_guard<std::mutex> lock(detail::Access::impl(r).mutex);
    c = detail::Access::impl(r).coord;
  }
  if (!c) return {};
  UserThreadCafScope caf_scope;
  caf::scoped_actor self{*detail::Access::impl(r).sys};
  std::string out;
  self->request(c, caf::duration(wait), rdv_why_atom::value)
      .receive([&](std::string& why) { out = std::move(why); }, [](caf::error&) {});
  return out;
}
const std::vector<std::string>& rendezvous_infos(const RendezvousResult& r) { return detail::Access::impl(r).infos; }

namespace {

/// 32 random bytes as 64 hex digits.
std::string random_key(const char* op, int rank) {
  unsigned char raw[32];
  std::random_device rd;
  for (unsigned char& b : raw) b = static_cast<unsigned char>(rd());
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char b : raw) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  if (out.size() != 64) throw StateError(op, "cannot draw a session key", rank);
  return out;
}

}  // namespace

RendezvousResult rendezvous_with(Runtime& runtime, const LaunchEnv& launch_env, milliseconds timeout,
                                 caf::actor payload, const std::function<std::string()>& make_info,
                                 std::string* session_key, int incarnation, int required,
                                 const std::vector<std::string>& compatibility) {
  detail::UserThreadCafScope caf_scope;
  LaunchEnv env = launch_env;
  const int rank = env.rank;
  if (timeout.count() <= 0) throw ValueError("rendezvous", "timeout must be positive", rank);
  if (env.world_size < 1 || rank < 0 || rank >= env.world_size)
    throw ValueError("rendezvous", "rank " + std::to_string(rank) + " is outside [0, " +
                                       std::to_string(env.world_size) + ")", rank);
  if (env.master_port < 1 || env.master_port > 65535)
    throw ValueError("rendezvous", "MASTER_PORT must be in 1..65535, got " + std::to_string(env.master_port), rank);
  if (required <= 0) required = env.world_size;
  if (required > env.world_size)
    throw ValueError("init_process_group", "DOPT_MIN_WORLD_SIZE " + std::to_string(required) +
                                               " is larger than WORLD_SIZE " + std::to_string(env.world_size), rank);
  const auto deadline = steady_clock::now() + timeout;
  auto& sys = detail::runtime_system(detail::Access::impl(runtime), "rendezvous");
  auto impl = std::make_shared<RendezvousResult::Impl>();
  impl->sys = &sys;
  impl->rank = rank;
  impl->world = env.world_size;
  impl->port = env.master_port;
  std::weak_ptr<RendezvousResult::Impl> weak = impl;
  detail::runtime_add_stopper(detail::Access::impl(runtime), [weak] {
    if (auto p = weak.lock()) p->stop();
  });

  impl->plan = net::choose_bind_address(env);
  impl->creds = net::Credentials::from(env);
  impl->handshake_timeout = env.handshake_timeout;
  // torchrun's static rendezvous: its agent's store holds MASTER_PORT. Rank 0
  // listens on a port of its own and publishes it there; the others read it.
  std::unique_ptr<net::TorchStoreClient> store;
  std::string store_key;
  if (env.agent_store) {
    static std::atomic<int> calls{0};
    store_key = "dopt/cpp/attempt_" + std::to_string(env.restart_count) + "/" + std::to_string(++calls) + "/port";
    try {
      store = std::make_unique<net::TorchStoreClient>(env.master_addr, env.master_port, timeout);
      if (env.secret.empty()) {
        // No secret of its own: one drawn by rank 0 for this job, handed
        // to the others through the agent's store (docs/launching.md).
        const std::string secret_key = store_key.substr(0, store_key.size() - 4) + "secret";
        if (rank == 0) store->set(secret_key, random_key("rendezvous", rank));
        env.secret = store->get(secret_key);
        env.secret_source = "torchrun's agent store";
      }
      if (rank != 0) env.master_port = std::stoi(store->get(store_key));
    } catch (const std::exception& e) {
      throw IOError("rendezvous", "torchrun's agent store at " + env.master_addr + ":" +
                                      std::to_string(launch_env.master_port) + " (TORCHELASTIC_USE_AGENT_STORE=True) " +
                                      "did not give rank 0's port: " + e.what(), rank);
    }
    impl->port = env.master_port;
    impl->creds = net::Credentials::from(env);
  }
  if (env.secret.empty())
    notice_once("rendezvous [rank " + std::to_string(rank) + "]: this job has no secret, so its rendezvous on " +
                env.master_addr + ":" + std::to_string(env.master_port) + " admits any process that presents " +
                env.describe_job() +
                " until every rank has joined (the ranks' own ports then take a key handed out there). Set "
                "DOPT_SECRET_FILE (a file of at least 16 random bytes, mode 0600) to the same file on every rank, or "
                "start the ranks with dopt-run (docs/launching.md, \"Who may join\")");
  // The key of the ranks' own ports: the job's secret, else one rank 0
  // draws and hands out in the rendezvous.
  std::string key = env.secret;
  if (rank == 0) {
    auto closed = std::make_shared<std::atomic<bool>>(false);
    auto replacements = std::make_shared<detail::Replacements>();
    replacements->settle = 2 * env.handshake_timeout;
    impl->replacements = replacements;
    if (key.empty()) key = random_key("rendezvous", rank);
    impl->mine = detail::spawn_rendezvous_coordinator(sys, env.world_size, required,
                                                      static_cast<std::int64_t>(timeout.count()), closed,
                                                      env.secret.empty() ? key : std::string(), replacements,
                                                      compatibility);
    impl->coord = impl->mine;
    // MASTER_PORT: dopt's handshake first (job id, secret), then CAF. It keeps
    // listening until the runtime shuts down, to turn latecomers away.
    net::AuthListener::Options o;
    o.bind_addr = impl->plan.bind;
    o.port = store ? 0 : env.master_port;
    if (store) {
      o.port_lo = env.port_range_lo;
      o.port_hi = env.port_range_hi;
    }
    o.purpose = net::Purpose::rendezvous;
    o.credentials = impl->creds;
    o.handshake_timeout = env.handshake_timeout;
    o.what = "rank 0's rendezvous port";
    const int world = env.world_size;
    const std::string job = env.describe_job();
    // (A differing world size is left to the coordinator: it fails every rank.)
    // Without a secret, the job id alone admits: a process that knows it
    // could open connections until rank 0 runs out of descriptors. The
    // ranks need world - 1 of them (and a few more for retries), so past
    // 4 * world + 32 admissions the rendezvous refuses, naming why.
    const int max_admitted = env.secret.empty() ? 4 * world + 32 : -1;
    auto admitted = std::make_shared<std::atomic<int>>(0);
    o.admit = [closed, world, required, job, max_admitted, admitted,
               replacements](const net::PeerHello& p) -> std::string {
      // Once the world is up, only the replacement of a rank rank 0 sees lost
      // comes in (its coordinator checks the rest); it presents Purpose::rejoin,
      // so a starting rank is never taken for one.
      if (p.purpose == net::Purpose::rejoin) {
        // Another world size cannot be admitted later either: refused for good
        // (short: the verdict has room for 300 bytes; the coordinator compares
        // the other launch facts and the program's items).
        if (p.world_size != world)
          return "it was started with other settings than the running job (WORLD_SIZE: the job has " +
                 std::to_string(world) + ", this process " + std::to_string(p.world_size) +
                 "); start it with the job's settings";
        if (closed->load() && p.rank > 0 && p.rank < world && p.world_size == world &&
            replacements->judge(p.rank).empty())
          return {};
        // (The replacement tries again on "the world is already closed": rank 0 may not have seen the loss yet.)
        return "the world is already closed to a replacement of rank " + std::to_string(p.rank) + " now: " +
               (closed->load() ? replacements->judge(p.rank) : std::string("rank 0's world is not up yet"));
      }
      if (closed->load() && required < world && p.rank >= required && p.rank < world)
        return "the world is already closed: " + job + " started with ranks 0.." + std::to_string(required - 1) +
               " of " + std::to_string(world) + " (DOPT_MIN_WORLD_SIZE); rank " + std::to_string(p.rank) +
               "'s slot is vacant and a rank that comes later joins as a newcomer (DOPT_REPLACES=" +
               std::to_string(p.rank) + ", which dopt-run --nnodes MIN:MAX sets on a node K >= MIN)";
      if (closed->load())
        return "the world is already closed: all " + std::to_string(world) + " ranks of " + job +
               " have joined, so rank " + std::to_string(p.rank) + " is already taken";
      if (max_admitted >= 0 && admitted->fetch_add(1) >= max_admitted)
        return "rank 0's rendezvous has admitted " + std::to_string(max_admitted) +
               " connections presenting this job's id without a secret, more than its " + std::to_string(world) +
               " ranks need: it refuses further ones (a process connecting again and again? set DOPT_SECRET_FILE "
               "on every rank, or start them with dopt-run)";
      return {};
    };
    std::shared_ptr<detail::SecurePublication> publication;
    try {
      publication = std::make_shared<detail::SecurePublication>(sys, impl->coord, std::move(o));
    } catch (const Error& e) {
      impl->stop();
      const std::string& d = e.detail();  // "cannot listen on ADDR:PORT: REASON", or why the listener could not start
      const auto colon = d.rfind(": ");
      if (d.rfind("cannot listen on ", 0) != 0 || colon == std::string::npos)
        throw IOError("rendezvous", "rank 0 cannot open its rendezvous port " + std::to_string(env.master_port) +
                                        " on " + impl->plan.bind + ": " + d, rank);
      const std::string reason = d.substr(colon + 2);
      throw IOError("rendezvous", "rank 0 cannot listen on port " + std::to_string(env.master_port) + " of " +
                                      impl->plan.bind + ": " + reason +
                                      (reason.find("EADDRINUSE") != std::string::npos ||
                                               reason.find("in use") != std::string::npos
                                           ? " (is the port already in use?)"
                                           : ""),
                    rank);
    }
    impl->publication = publication;
    if (store) {
      env.master_port = publication->port();
      impl->port = env.master_port;
      store->set(store_key, std::to_string(env.master_port));
    }
    detail::runtime_add_stopper(detail::Access::impl(runtime), [publication] { publication->close(); });
  } else {
    impl->mine = detail::spawn_rendezvous_member(sys);
    try {
      impl->coord = detail::secure_remote_actor(
          sys, env.master_addr, env.master_port, incarnation > 0 ? net::Purpose::rejoin : net::Purpose::rendezvous,
          impl->creds, env.handshake_timeout, deadline, /*retry_until_deadline=*/true,
          "rank 0 at " + env.master_addr + ":" + std::to_string(env.master_port), "rendezvous",
          incarnation > 0 ? "the job's rank 0 is gone (the job ended, or rank 0 was lost)" : "");
    } catch (...) {
      impl->stop();
      throw;
    }
  }

  auto remaining = [&] {
    return std::max(milliseconds(1), duration_cast<milliseconds>(deadline - steady_clock::now()));
  };
  try {
    // Rank 0's coordinator answers at the deadline with the missing ranks; the
    // extra 2 s wait is for that answer, not for the ranks.
    if (!payload) payload = impl->mine;
    if (key.empty()) {
      std::string got;
      impl->ask_coord(caf::make_message(detail::rdv_key_atom::value), remaining() + seconds(2), "the session key",
                      nullptr, nullptr, &got);
      if (got.size() != 64 || got.find_first_not_of("0123456789abcdef") != std::string::npos)
        throw StateError("rendezvous", "rank 0 sent a session key that is not 64 hex digits", rank);
      key = std::move(got);
    }
    if (session_key) *session_key = key;
    // Only now (rank 0 listens on MASTER_PORT already) may the caller open
    // ephemeral ports: earlier, one could take MASTER_PORT from rank 0.
    const std::string info = make_info ? make_info() : std::string();
    const caf::message reg =
        incarnation > 0 ? caf::make_message(detail::rdv_rejoin_atom::value, rank, env.world_size, incarnation,
                                            impl->mine, payload, info, compatibility)
                        : caf::make_message(detail::rdv_reg_atom::value, rank, env.world_size, impl->mine, payload, info);
    impl->table = impl->ask_coord(reg, remaining() + seconds(2), "registration", &impl->payloads, &impl->infos);
    if (static_cast<int>(impl->table.size()) != env.world_size)
      throw StateError("rendezvous", "rank 0 sent a table of " + std::to_string(impl->table.size()) +
                                         " ranks, expected " + std::to_string(env.world_size), rank);
    for (auto& a : impl->table) impl->names.push_back(detail::describe(a));
    RendezvousResult result = detail::Access::rendezvous(impl);
    if (incarnation == 0) result.barrier(remaining());  // a replacement's peers are past theirs
    impl->completed = true;
    return result;
  } catch (...) {
    impl->stop();
    throw;
  }
}

}  // namespace dopt::detail
