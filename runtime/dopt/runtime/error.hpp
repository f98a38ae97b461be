#pragma once
// Errors a user can cause. Every dopt::Error names the operation, the rank
// (when there is one) and what was wrong:
//   "Adam: invalid beta parameter at index 0: 1.5 (expected 0 <= beta < 1)"
//   "all_reduce [rank 2]: tensor dtype float64 does not match rank 0's float32"
// Async calls carry these errors inside their future instead of throwing.
#include <optional>
#include <stdexcept>
#include <string>

namespace dopt {

class Error : public std::runtime_error {
 public:
  Error(std::string op, std::string what, std::optional<int> rank = std::nullopt);
  const std::string& op() const noexcept { return op_; }
  const std::string& detail() const noexcept { return detail_; }
  std::optional<int> rank() const noexcept { return rank_; }

 private:
  std::string op_;
  std::string detail_;
  std::optional<int> rank_;
};

/// strerror(e), and for the errors that mean this process ran out of a
/// resource, which one and what to do: "Too many open files (this process
/// has no free file descriptor: its limit, ulimit -n, is 20)", "Cannot
/// allocate memory (this process is out of memory)".
std::string errno_text(int e);

#define DOPT_DEFINE_ERROR(Name, Base)          \
  class Name : public Base {                   \
   public:                                     \
    using Base::Base;                          \
  }

/// A bad argument value (torch: ValueError).
DOPT_DEFINE_ERROR(ValueError, Error);
/// An argument of the wrong kind (torch: TypeError).
DOPT_DEFINE_ERROR(TypeError, Error);
/// A missing key in a name-indexed lookup (torch: KeyError).
DOPT_DEFINE_ERROR(KeyError, Error);
/// Tensor shapes that do not fit together.
DOPT_DEFINE_ERROR(ShapeError, ValueError);
/// Tensor dtypes that do not fit together, or a dtype an op does not support.
DOPT_DEFINE_ERROR(DTypeError, ValueError);
/// A tensor on a device an op does not support, or devices that differ.
DOPT_DEFINE_ERROR(DeviceError, ValueError);
/// A call made in the wrong state (torch: RuntimeError / AssertionError).
DOPT_DEFINE_ERROR(StateError, Error);
/// A state dict or checkpoint that does not match the optimizer.
DOPT_DEFINE_ERROR(StateDictError, ValueError);
/// Reading or writing a file failed, or a file is malformed.
DOPT_DEFINE_ERROR(IOError, Error);
/// A feature that is not available in this build (e.g. CUDA without gpu/).
DOPT_DEFINE_ERROR(NotSupportedError, Error);
/// A distributed operation did not finish in time.
DOPT_DEFINE_ERROR(TimeoutError, Error);
/// Ranks called different collectives, or in a different order.
DOPT_DEFINE_ERROR(CollectiveMismatchError, Error);
/// A peer (rank or worker) died or was cut off.
DOPT_DEFINE_ERROR(PeerLostError, Error);
/// A connection between ranks whose other end could not prove it belongs to
/// the job: the secret is missing on one side, or differs.
DOPT_DEFINE_ERROR(AuthenticationError, Error);

#undef DOPT_DEFINE_ERROR

}  // namespace dopt
