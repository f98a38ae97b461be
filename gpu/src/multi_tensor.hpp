#pragma once
// Internal to dopt_gpu: multi-tensor apply. Many tensors are updated by one
// kernel launch: the tensors are cut into chunks of kChunk elements, each
// thread block does one chunk, and the launch's metadata (the tensors'
// pointers and sizes, and which block does which chunk of which tensor) is a
// kernel argument (TensorListMeta, about 9 KiB: CUDA 12.1+ takes up to
// 32 764 bytes of kernel arguments on every architecture CUDA 13 supports).
// A launch holds up to 1280 blocks, more than an H100/H200 keeps resident
// (132 SMs x 4 blocks of 512 threads), so a large step is a few launches that
// each fill the device.
//
// plan_multi_tensor() is the host-side plan (no CUDA here, so it is tested
// on every machine): it walks the tensors in order and starts a new launch
// when the launch's tensor slots or block slots are full; a tensor whose
// chunks do not fit continues in the next launch. Every element of every
// tensor is in exactly one block of one launch.
#include <cstdint>
#include <utility>
#include <vector>

namespace dopt::gpu::detail {

constexpr int kMaxDepth = 6;      // pointers per tensor: param, grad, up to 3 states, fp32 master
constexpr int kMaxTensors = 48;   // tensors per launch
constexpr int kMaxBlocks = 1280;  // blocks (chunks) per launch
constexpr std::int64_t kChunk = 32768;  // elements per block
constexpr int kThreads = 512;     // threads per block

struct TensorListMeta {
  void* ptr[kMaxDepth][kMaxTensors];
  long long numel[kMaxTensors];
  int block_chunk[kMaxBlocks];
  unsigned char block_tensor[kMaxBlocks];
};
static_assert(sizeof(TensorListMeta) + 256 <= 32764, "kernel arguments must stay under CUDA's 32 764-byte limit");

struct LaunchPlan {
  /// Indices into the caller's tensor list, in launch-slot order.
  std::vector<int> tensors;
  /// Per block: (slot in `tensors`, chunk index within that tensor).
  std::vector<std::pair<int, int>> blocks;
};

/// Tensors with numel 0 are skipped (not in any launch).
inline std::vector<LaunchPlan> plan_multi_tensor(const std::vector<std::int64_t>& numels,
                                                 int max_tensors = kMaxTensors, int max_blocks = kMaxBlocks,
                                                 std::int64_t chunk = kChunk) {
  std::vector<LaunchPlan> plans;
  LaunchPlan cur;
  auto flush = [&] {
    if (!cur.blocks.empty()) plans.push_back(std::move(cur));
    cur = LaunchPlan{};
  };
  for (int t = 0; t < static_cast<int>(numels.size()); ++t) {
    const std::int64_t n = numels[static_cast<std::size_t>(t)];
    if (n <= 0) continue;
    const std::int64_t chunks = (n + chunk - 1) / chunk;
    if (static_cast<int>(cur.tensors.size()) == max_tensors) flush();
    cur.tensors.push_back(t);
    for (std::int64_t c = 0; c < chunks; ++c) {
      if (static_cast<int>(cur.blocks.size()) == max_blocks) {
        flush();
        cur.tensors.push_back(t);  // the rest of this tensor continues in the next launch
      }
      cur.blocks.emplace_back(static_cast<int>(cur.tensors.size()) - 1, static_cast<int>(c));
    }
  }
  flush();
  return plans;
}

/// The optimizers of the fused kernels (AdamW is Adam with decoupled weight decay).
enum class FusedOp : int { sgd, adam, adagrad, rmsprop, adamax, adadelta, rprop };

/// Scalars of one launch, computed in double on the host exactly as the CPU
/// path computes them; the launcher rounds each to the compute type once
/// (the CPU path's sc<T>). Pointer slots per op (TensorListMeta::ptr):
///   0 param, 1 grad, 5 fp32 master (or null), and
///   sgd: 2 momentum_buffer | adam: 2 exp_avg, 3 exp_avg_sq, 4 max_exp_avg_sq
///   adagrad: 2 sum | rmsprop: 2 square_avg, 3 grad_avg, 4 momentum_buffer
///   adamax: 2 exp_avg, 3 exp_inf | adadelta: 2 square_avg, 3 acc_delta
///   rprop: 2 prev, 3 step_size
struct FusedScalars {
  double neg_lr = 0;  // -lr, -step_size (Adam), -clr (Adagrad, Adamax)
  double wd = 0;
  double decay_mul = 1;  // AdamW: 1 - lr * weight_decay
  double beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0;  // Adam, Adamax; rho (Adadelta), alpha (RMSprop)
  double eps = 0;
  double bc2_sqrt = 1;
  double momentum = 0, one_minus_dampening = 0;
  double etaplus = 0, etaminus = 0, step_min = 0, step_max = 0;
  bool maximize = false, has_wd = false, decoupled = false, amsgrad = false, nesterov = false, centered = false,
       has_momentum = false;
  int mom_mode = 0;  // SGD: 0 none, 1 first step (buffer = d), 2 running buffer
};

/// dtype codes for the launcher (dopt::DType values are passed as int).
/// Enqueues one launch of `nblocks` blocks on `stream` (a cudaStream_t).
/// param_dtype/state_dtype are dopt::DType values: (f32,f32), (f64,f64),
/// (f16|bf16, same) or (f16|bf16, f32).
void launch_fused(FusedOp op, int param_dtype, int state_dtype, const TensorListMeta& meta, int nblocks,
                  const FusedScalars& s, void* stream);

}  // namespace dopt::gpu::detail
