#pragma once
// The groups a plane made, as the planes keep them: every live group (to stop
// it at shutdown) and the groups new_group made that the caller has not taken
// yet. Thread-safe.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace dopt::detail {

/// G: the plane's group type (has stop(why)); Fresh: what take() hands out.
template <class G, class Fresh = G>
class GroupRegistry {
 public:
  /// Keeps a weak reference to g; a group added after shutdown is stopped at once.
  void add(std::uint64_t gid, const std::shared_ptr<G>& g) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (down_) g->stop("the runtime shut down");
    live_[gid] = g;
  }
  /// Holds g until take(gid).
  void add_fresh(std::uint64_t gid, std::shared_ptr<Fresh> g) {
    std::lock_guard<std::mutex> lock(mutex_);
    fresh_[gid] = std::move(g);
  }
  /// The fresh group gid (null when unknown); the caller keeps it.
  std::shared_ptr<Fresh> take(std::uint64_t gid) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = fresh_.find(gid);
    if (it == fresh_.end()) return nullptr;
    auto g = std::move(it->second);
    fresh_.erase(it);
    return g;
  }
  /// Marks the plane down, drops the fresh groups, runs `before` and then
  /// stops every live group with `why` (outside the lock).
  void shutdown(const std::string& why, const std::function<void()>& before) {
    std::map<std::uint64_t, std::weak_ptr<G>> live;
    std::map<std::uint64_t, std::shared_ptr<Fresh>> fresh;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      down_ = true;
      live.swap(live_);
      fresh.swap(fresh_);
    }
    if (before) before();
    for (auto& [gid, w] : live)
      if (auto g = w.lock()) g->stop(why);
  }

 private:
  std::mutex mutex_;
  std::map<std::uint64_t, std::weak_ptr<G>> live_;
  std::map<std::uint64_t, std::shared_ptr<Fresh>> fresh_;
  bool down_ = false;
};

}  // namespace dopt::detail
