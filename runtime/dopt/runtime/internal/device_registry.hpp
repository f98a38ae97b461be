#pragma once
// Internal: one registered implementation per non-CPU device type. It is how
// the layers find what the optional gpu/ leaf provides for CUDA tensors
// without including it: the collective backend (actors), the optimizer
// stepper and the element-wise ops (optim). gpu::init() registers them; a
// lookup is a load of an atomic pointer, so it is cheap on hot paths.
#include <array>
#include <atomic>
#include <cstddef>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::detail {

/// Number of DeviceType values (CPU, CUDA).
inline constexpr std::size_t kDeviceTypeCount = static_cast<std::size_t>(DeviceType::CUDA) + 1;

template <class T>
class DeviceRegistry {
 public:
  /// Registers impl for type (null unregisters). CPU is a ValueError naming
  /// `op`, with `cpu_note` saying what CPU tensors use instead.
  void set(DeviceType type, T* impl, const char* op, const char* cpu_note) {
    if (type == DeviceType::CPU) throw ValueError(op, cpu_note);
    slots_.at(static_cast<std::size_t>(type)).store(impl);
  }
  /// The implementation for t's device; null for CPU and undefined tensors,
  /// and when none is registered.
  T* find(const Tensor& t) const noexcept {
    if (!t.defined()) return nullptr;
    const auto i = static_cast<std::size_t>(t.device().type);
    if (i == 0 || i >= slots_.size()) return nullptr;
    return slots_[i].load();
  }

 private:
  std::array<std::atomic<T*>, kDeviceTypeCount> slots_{};
};

}  // namespace dopt::detail
