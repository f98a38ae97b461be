#pragma once
// The runtime's CAF side: the actor system (Runtime::Impl) and a rank's
// endpoint to its rank actor (LocalEndpoint). Includes CAF.
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "core/caf_thread.hpp"
#include "dopt/actors/runtime.hpp"
#include "dopt/runtime/internal/parallel.hpp"
#include "transport/actor/messages.hpp"
#include "core/ranks.hpp"

namespace dopt::detail {
class LocalEndpoint;
}  // namespace dopt::detail

namespace dopt {

/// The runtime's state (detail::RuntimeImpl in the library's sources).
class Runtime::Impl {
 public:
  explicit Impl(RuntimeOptions opts) : options_(std::move(opts)) {
    options_.validate();
    threads_ = options_.threads > 0 ? options_.threads : hardware_threads();
    cfg_.set("scheduler.max-threads", threads_);
    cfg_.set("scheduler.policy", caf::atom_from_string(options_.policy));
    cfg_.set("work-stealing.moderate-poll-attempts", options_.moderate_poll_attempts);
    cfg_.load<caf::io::middleman>();  // rendezvous of real processes (rendezvous.cpp)
    // Control messages between the rank actors of real processes.
    cfg_.add_message_type<detail::P2PKey>("dopt.P2PKey");
    cfg_.add_message_type<detail::P2PReply>("dopt.P2PReply");
    cfg_.add_message_type<detail::NetArrival>("dopt.NetArrival");
    cfg_.add_message_type<detail::NetP2P>("dopt.NetP2P");
    detail::UserThreadCafScope caf_scope;  // the thread that makes the runtime need not be the one that ends it
    system_ = std::make_unique<caf::actor_system>(cfg_);
  }
  ~Impl() { shutdown(); }

  void shutdown() noexcept;
  bool running() const noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return system_ != nullptr;
  }

  caf::actor_system& system(const char* op) {
    if (!system_) throw StateError(op, "the runtime has been shut down");
    return *system_;
  }

  void add_endpoint(const std::shared_ptr<detail::LocalEndpoint>& ep) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(endpoints_, [](auto& w) { return w.expired(); });
    endpoints_.push_back(ep);
  }

  void add_stopper(std::function<void()> stop) {
    std::lock_guard<std::mutex> lock(mutex_);
    stoppers_.push_back(std::move(stop));
  }

  RuntimeOptions options_;
  int threads_ = 1;

 private:
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> system_;
  mutable std::mutex mutex_;
  std::vector<std::weak_ptr<detail::LocalEndpoint>> endpoints_;
  std::vector<std::function<void()>> stoppers_;
};

}  // namespace dopt

namespace dopt::detail {

class LocalEndpoint final : public RankEndpoint {
 public:
  LocalEndpoint(caf::actor a, int rank, int world, std::chrono::milliseconds timeout,
                std::shared_ptr<PeerTable> table)
      : actor_(std::move(a)), rank_(rank), world_(world), timeout_(timeout), table_(std::move(table)) {}
  ~LocalEndpoint() override { stop(); }

  void post(std::shared_ptr<Op> op) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!actor_) {
      op->promise.set_exception(std::make_exception_ptr(
          StateError(coll_name(op->desc.kind), "the runtime has been shut down", rank_)));
      return;
    }
    caf::anon_send(actor_, call_atom::value, OpPtr(std::move(op)));
  }
  void report_failure(std::string what) override {
    // The data planes' waits on this rank see it at once (threads of this
    // process); other processes learn it from the rank actor.
    if (table_) table_->mark(rank_, PeerTable::failed, what);
    std::lock_guard<std::mutex> lock(mutex_);
    if (actor_) caf::anon_send(actor_, failed_atom::value, std::move(what));
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  /// Makes the rank actor exit (its pending operations fail) and drops the handle.
  void stop() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    if (actor_) {
      caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
      actor_ = nullptr;
    }
  }

  std::chrono::milliseconds default_timeout() const { return timeout_; }
  /// The rank actor (null once stopped). Any thread.
  caf::actor actor() {
    std::lock_guard<std::mutex> lock(mutex_);
    return actor_;
  }

 private:
  std::mutex mutex_;
  caf::actor actor_;
  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<PeerTable> table_;
};

}  // namespace dopt::detail
