#include "dopt/distributed/comm_hooks.hpp"

#include <string>

#include "dopt/distributed/internal/device_ops.hpp"
#include "plsgd_util.hpp"

namespace dopt::optim {

GradBucket::GradBucket(std::size_t index, std::size_t num_buckets, Tensor buffer, std::vector<Tensor> parameters,
                       std::vector<std::int64_t> offsets)
    : index_(index),
      num_buckets_(num_buckets),
      buffer_(std::move(buffer)),
      parameters_(std::move(parameters)),
      offsets_(std::move(offsets)) {
  if (index_ >= num_buckets_)
    throw ValueError("GradBucket", "index " + std::to_string(index_) + " out of range for " +
                                       std::to_string(num_buckets_) + " buckets");
  if (offsets_.size() != parameters_.size())
    throw ValueError("GradBucket", "one offset per parameter is needed");
}

void GradBucket::set_owner_segments(std::vector<Segment> segments) {
  std::int64_t at = 0;
  for (const auto& s : segments) {
    if (s.offset != at || s.numel < 0 || s.owner < 0)
      throw ValueError("GradBucket.set_owner_segments", "segments must cover the buffer in order (a segment at " +
                                                            std::to_string(s.offset) + " where " +
                                                            std::to_string(at) + " was next)");
    at += s.numel;
  }
  if (!segments.empty() && at != buffer_.numel())
    throw ValueError("GradBucket.set_owner_segments", "the segments cover " + std::to_string(at) + " of " +
                                                          std::to_string(buffer_.numel()) + " elements");
  owner_segments_ = std::move(segments);
}

void GradBucket::set_buffer(const Tensor& buffer) {
  check_defined(buffer, "GradBucket.set_buffer", "buffer");
  if (buffer.numel() != buffer_.numel())
    throw ShapeError("GradBucket.set_buffer", "the new buffer has " + std::to_string(buffer.numel()) +
                                                  " elements, the bucket " + std::to_string(buffer_.numel()));
  if (buffer.dtype() != buffer_.dtype())
    throw DTypeError("GradBucket.set_buffer", "the new buffer is " + buffer.str() + ", the bucket " + buffer_.str());
  buffer_ = buffer.dim() == 1 ? buffer : buffer.flatten();
}

std::vector<Tensor> GradBucket::gradients() const {
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < parameters_.size(); ++i)
    out.push_back(buffer_.flat_slice(offsets_[i], parameters_[i].numel()).view(parameters_[i].shape()));
  return out;
}

Future<Tensor> allreduce_fut(ProcessGroup group, const Tensor& tensor) {
  if (!group.valid()) throw ValueError("allreduce_hook", "the process group is invalid");
  check_defined(tensor, "allreduce_hook", "tensor");
  detail::divide_any_(tensor, group.size(), "allreduce_hook");
  return group.all_reduce_async(tensor, ReduceOp::sum).then([tensor](Future<void> f) {
    f.get();
    return tensor;
  });
}

namespace {

/// Sums `t` over `group` (SUM): all_reduce, or with owner segments a reduce
/// of each segment onto its owner (the all_reduce's sums on the owner).
Future<void> sum_to_readers(ProcessGroup& group, const Tensor& t, const GradBucket& bucket) {
  const auto& segs = bucket.owner_segments();
  if (segs.empty()) return group.all_reduce_async(t, ReduceOp::sum);
  std::vector<Future<void>> fs;
  for (const auto& s : segs)
    if (s.numel > 0) fs.push_back(group.reduce_async(t.flat_slice(s.offset, s.numel), s.owner, ReduceOp::sum));
  return when_all(fs);
}

}  // namespace

CommHook allreduce_hook(ProcessGroup process_group) {
  if (!process_group.valid()) throw ValueError("allreduce_hook", "the process group is invalid");
  return [pg = std::move(process_group)](GradBucket& bucket) mutable -> Future<Tensor> {
    if (bucket.owner_segments().empty()) return allreduce_fut(pg, bucket.buffer());
    const Tensor& buffer = bucket.buffer();
    detail::divide_any_(buffer, pg.size(), "allreduce_hook");
    return sum_to_readers(pg, buffer, bucket).then([buffer](Future<void> f) {
      f.get();
      return buffer;
    });
  };
}

namespace {

CommHook compress_hook(ProcessGroup process_group, DType wire, const char* op) {
  if (!process_group.valid()) throw ValueError(op, "the process group is invalid");
  return [pg = std::move(process_group), wire, op](GradBucket& bucket) mutable -> Future<Tensor> {
    Tensor buffer = bucket.buffer();
    // On a device, the cast, the division and the decompression run there
    // (detail::DeviceOps), bitwise the CPU path's conversions and arithmetic.
    Tensor compressed = Tensor::empty(buffer.shape(), wire, buffer.device());
    detail::convert_any_(compressed, buffer);
    detail::divide_any_(compressed, pg.size(), op);
    std::vector<GradBucket::Segment> mine;  // with owner segments: only those this rank reads back
    for (const auto& s : bucket.owner_segments())
      if (s.owner == pg.rank() && s.numel > 0) mine.push_back(s);
    const bool whole = bucket.owner_segments().empty();
    return sum_to_readers(pg, compressed, bucket).then([buffer, compressed, whole, mine](Future<void> f) {
      f.get();
      if (whole) detail::convert_any_(buffer, compressed);  // decompress in place
      for (const auto& s : mine)
        detail::convert_any_(buffer.flat_slice(s.offset, s.numel), compressed.flat_slice(s.offset, s.numel));
      return buffer;
    });
  };
}

}  // namespace

CommHook fp16_compress_hook(ProcessGroup process_group) {
  return compress_hook(std::move(process_group), DType::float16, "fp16_compress_hook");
}

CommHook bf16_compress_hook(ProcessGroup process_group) {
  return compress_hook(std::move(process_group), DType::bfloat16, "bf16_compress_hook");
}

PostLocalSGDState::PostLocalSGDState(ProcessGroup process_group_, ProcessGroup subgroup_,
                                     std::int64_t start_localSGD_iter_, bool post_local_gradient_allreduce_)
    : process_group(std::move(process_group_)),
      subgroup(std::move(subgroup_)),
      start_localSGD_iter(start_localSGD_iter_),
      post_local_gradient_allreduce(post_local_gradient_allreduce_) {
  if (!process_group.valid()) throw ValueError("PostLocalSGDState", "the process group is invalid");
  if (start_localSGD_iter < 0)
    throw ValueError("PostLocalSGDState",
                     "start_localSGD_iter must be >= 0, got " + std::to_string(start_localSGD_iter),
                     process_group.rank());
}

void PostLocalSGDState::maybe_increase_iter(const GradBucket& bucket) {
  if (bucket.is_last()) ++iter;
}

CommHook post_localSGD_hook(std::shared_ptr<PostLocalSGDState> state) {
  if (!state) throw ValueError("post_localSGD_hook", "the state is null");
  return [state = std::move(state)](GradBucket& bucket) -> Future<Tensor> {
    const Tensor& t = bucket.buffer();
    if (state->iter < state->start_localSGD_iter) {
      state->maybe_increase_iter(bucket);
      return allreduce_fut(state->process_group, t);
    }
    if (!state->post_local_gradient_allreduce) return make_ready_future(t);
    if (!state->subgroup.valid()) state->subgroup = state->process_group.new_subgroups().current;
    return allreduce_fut(state->subgroup, t);
  };
}

}  // namespace dopt::optim
