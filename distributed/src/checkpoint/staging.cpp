#include "checkpoint/staging.hpp"

#include <vector>

#include "dopt/runtime/internal/parallel.hpp"

namespace dopt::checkpoint {

void Staging::copy(const std::string& prefix, std::map<std::string, Tensor>& tensors, bool device_only) {
  struct Work {
    Tensor* slot;
    Tensor buffer;  // undefined: fresh memory
  };
  std::vector<Work> cpu, device;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [name, t] : tensors) {
      if (issued_.count(prefix + name) || (device_only && t.device().is_cpu())) continue;
      Work w{&t, {}};
      auto it = kept_.find(prefix + name);
      if (it != kept_.end()) {
        if (it->second.shape() == t.shape() && it->second.dtype() == t.dtype()) w.buffer = std::move(it->second);
        kept_.erase(it);
      }
      issued_.insert(prefix + name);
      (t.device().is_cpu() ? cpu : device).push_back(std::move(w));
    }
  }
  auto run = [](Work& w) {
    if (w.buffer.defined()) w.buffer.copy_(*w.slot);
    else w.buffer = w.slot->to(Device::cpu());
    *w.slot = std::move(w.buffer);
  };
  parallel_for(static_cast<std::int64_t>(cpu.size()), hardware_threads(),
               [&](std::int64_t i) { run(cpu[static_cast<std::size_t>(i)]); });
  for (Work& w : device) run(w);
}

void Staging::give_back(const std::string& prefix, std::map<std::string, Tensor>&& tensors) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [name, t] : tensors) {
    auto it = issued_.find(prefix + name);
    if (it == issued_.end() || !t.defined()) continue;
    issued_.erase(it);
    kept_[prefix + name] = std::move(t);
  }
  tensors.clear();
}

std::size_t Staging::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t n = 0;
  for (const auto& [k, t] : kept_) n += t.nbytes();
  return n;
}

}  // namespace dopt::checkpoint
