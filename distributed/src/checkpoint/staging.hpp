#pragma once
// Staging: the host memory a save's snapshot is copied into, kept from one
// save to the next (why: docs/checkpointing.md, "Asynchronous saves"). The
// snapshot copies each tensor under a key (an entry's name, unique in the
// Checkpointer); the writer hands the tensors of a written file back; the
// next snapshot copies into the buffer kept under the same key when it has
// the same shape and dtype, else into fresh memory.
// Threads: copy() on the caller's thread during a snapshot, or on the
// writer thread when the snapshot is taken in the background (helped by the
// runtime's worker pool); give_back() on the writer thread after its file
// is written; a mutex orders them. Only tensors copy() made are kept: a
// file's other tensors are never reused.
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "dopt/runtime/tensor.hpp"

namespace dopt::checkpoint {

class Staging {
 public:
  /// Replaces every tensor of `tensors` by a CPU copy (contiguous, the same
  /// shape and dtype), in the buffer kept under key prefix + its name when
  /// that fits. CPU tensors are copied on up to hardware_threads() threads
  /// (the calling thread among them), device tensors on the calling thread.
  /// A tensor whose key is issued (copied and not yet given back) is a copy
  /// already and stays; `device_only`: only device tensors are copied (a
  /// background snapshot copies those on the caller's thread, the rest on
  /// the writer's).
  void copy(const std::string& prefix, std::map<std::string, Tensor>& tensors, bool device_only = false);
  /// The tensors of a written file, each under key prefix + its entry name;
  /// those copy() made are kept for the next save, the rest dropped.
  void give_back(const std::string& prefix, std::map<std::string, Tensor>&& tensors);
  /// Bytes kept between saves.
  std::size_t kept_bytes() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, Tensor> kept_;
  std::set<std::string> issued_;  // keys copy() handed out and not yet given back
};

}  // namespace dopt::checkpoint
