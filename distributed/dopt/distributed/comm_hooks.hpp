#pragma once
// DDP communication hooks: what replaces the all-reduce of one gradient
// bucket in dopt::optim::Reducer (reducer.hpp). torch 1.13's
// torch.distributed.algorithms.ddp_comm_hooks default_hooks.allreduce_hook,
// fp16_compress_hook, bf16_compress_hook and post_localSGD_hook.post_localSGD_hook
// with PostLocalSGDState.
//
//   auto state = std::make_shared<PostLocalSGDState>(ctx.world(), ProcessGroup{}, /*start_localSGD_iter=*/100);
//   reducer.register_comm_hook(post_localSGD_hook(state));
//
// A hook is called on the rank's thread (the one calling Reducer::mark_ready
// or finalize), once per bucket per synchronised iteration, buckets in index
// order. It returns a Future<Tensor> whose value is the reduced bucket: a
// tensor with the bucket's numel (any floating dtype; the reducer converts it
// into the gradients). Every rank of the reducer's group calls its hook for
// the same buckets in the same order, so hooks that run collectives must make
// the same collectives on every rank. A hook may modify bucket.buffer() in
// place (the built-in ones do) and may return it.
//
// Arithmetic (bitwise torch's): every built-in averaging hook divides first,
// then all-reduces with SUM (sum_r g_r / n, not (sum_r g_r) / n).
//
// Owner segments (ZeRO stages 2 and 3): when bucket.owner_segments() is not
// empty, the caller reads back only the segments this rank owns, so a hook
// need not return the other segments' sums. allreduce_hook and the compress
// hooks then reduce each segment onto its owner (ProcessGroup::reduce, which
// sums in the all_reduce's group-rank order: the owner's values are the
// all_reduce's bits) and write back only the owned segments; the other
// segments of the returned tensor are unspecified. A hook that all-reduces
// the whole bucket (a user's, post_localSGD_hook) stays correct.
//
// Devices: on a device bucket (CUDA after gpu::init()) the built-in hooks
// divide and cast on the device (the device ops gpu/ registers: bitwise
// the CPU path's arithmetic and conversions; without registered ops they
// stage through host memory) and all-reduce through the device backend.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::optim {

/// One bucket of gradients handed to a comm hook (torch's dist.GradBucket).
class GradBucket {
 public:
  /// A run of the buffer whose reduced values only `owner` (a group rank)
  /// reads back.
  struct Segment {
    std::int64_t offset = 0;
    std::int64_t numel = 0;
    int owner = 0;
  };

  GradBucket(std::size_t index, std::size_t num_buckets, Tensor buffer, std::vector<Tensor> parameters,
             std::vector<std::int64_t> offsets);

  /// Position of the bucket; buckets are reduced in index order.
  std::size_t index() const noexcept { return index_; }
  /// Whether this is the last bucket of the iteration (index == count - 1).
  bool is_last() const noexcept { return index_ + 1 == num_buckets_; }
  /// The flat 1-D buffer: the bucket's gradients, concatenated in parameters() order.
  const Tensor& buffer() const noexcept { return buffer_; }
  /// Replaces the buffer (same numel and dtype, else ShapeError/DTypeError).
  void set_buffer(const Tensor& buffer);
  /// The bucket's parameters, in buffer order.
  const std::vector<Tensor>& parameters() const noexcept { return parameters_; }
  /// Views of buffer() shaped like each parameter.
  std::vector<Tensor> gradients() const;
  /// Element offset of parameters()[i] in buffer().
  const std::vector<std::int64_t>& offsets() const noexcept { return offsets_; }
  /// Empty (every rank reads the whole bucket back), or the segments that
  /// cover the buffer in order, each read back by its owner only (see the
  /// header: ZeRO stages 2 and 3).
  const std::vector<Segment>& owner_segments() const noexcept { return owner_segments_; }
  /// Set by the reducer before the hook runs (ValueError unless they cover
  /// the buffer in order).
  void set_owner_segments(std::vector<Segment> segments);

 private:
  std::size_t index_;
  std::size_t num_buckets_;
  Tensor buffer_;
  std::vector<Tensor> parameters_;
  std::vector<std::int64_t> offsets_;
  std::vector<Segment> owner_segments_;
};

/// A comm hook (torch: hook(state, bucket) -> Future[Tensor]; the state is
/// whatever the function captures).
using CommHook = std::function<Future<Tensor>(GradBucket&)>;

/// Divides `tensor` in place by group.size(), then all_reduce_async(SUM) on
/// group; the future yields `tensor` (torch's _allreduce_fut).
Future<Tensor> allreduce_fut(ProcessGroup group, const Tensor& tensor);

/// The default: average the bucket over process_group (torch's allreduce_hook;
/// with owner segments, a reduce of each onto its owner).
CommHook allreduce_hook(ProcessGroup process_group);
/// Casts the bucket to float16, divides it by the group size in float16
/// arithmetic, all-reduces it (SUM), and writes it back into the bucket's
/// dtype (torch's fp16_compress_hook).
CommHook fp16_compress_hook(ProcessGroup process_group);
/// Same with bfloat16 (torch's bf16_compress_hook).
CommHook bf16_compress_hook(ProcessGroup process_group);

/// State of post_localSGD_hook (torch's PostLocalSGDState; public fields like
/// torch's slots). Shared by the hook and whoever inspects it.
struct PostLocalSGDState {
  /// process_group: the global group (must be valid). subgroup: the group
  /// gradients are averaged on after start_localSGD_iter; an invalid handle
  /// means one subgroup per node, created lazily by the first post-warm-up
  /// bucket with process_group.new_subgroups() (a world collective, so
  /// process_group must then be the world group). ValueError for an invalid
  /// process_group or a negative start_localSGD_iter.
  PostLocalSGDState(ProcessGroup process_group, ProcessGroup subgroup, std::int64_t start_localSGD_iter,
                    bool post_local_gradient_allreduce = true);

  ProcessGroup process_group;
  ProcessGroup subgroup;
  std::int64_t start_localSGD_iter;
  bool post_local_gradient_allreduce;
  /// Warm-up iterations seen so far; stops at start_localSGD_iter.
  std::int64_t iter = 0;

  /// iter += 1 when bucket is the last of its iteration (torch's maybe_increase_iter).
  void maybe_increase_iter(const GradBucket& bucket);
};

/// torch's post_localSGD_hook: while state->iter < start_localSGD_iter,
/// average over process_group (and count the iteration); afterwards average
/// over state->subgroup, or, with post_local_gradient_allreduce = false,
/// return the local gradient unchanged (a ready future, no communication).
CommHook post_localSGD_hook(std::shared_ptr<PostLocalSGDState> state);

}  // namespace dopt::optim
