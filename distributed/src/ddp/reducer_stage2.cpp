// The Reducer's ZeRO stage 2 part (reducer.hpp, "ZeRO stage 2"): the rules of
// ReducerOptions::gradient_owners and the bucket buffers (the reduce of each
// owner's segment onto it is the hook's, given the bucket's owner segments): taken from the spares, reused from a bucket
// whose reduction is done, or allocated; given back when written; one kept
// between iterations. Rank thread only, as the rest of the Reducer.
#include <algorithm>
#include <string>

#include "dopt/distributed/reducer.hpp"

namespace dopt::optim {

namespace {
constexpr const char* kOp = "Reducer";
/// Buffers in use before mark_ready waits for a launched bucket instead of
/// allocating (two: one filling while the other reduces).
constexpr std::size_t kBuffersBeforeReuse = 2;
}  // namespace

void Reducer::check_gradient_owners() const {
  const auto& owners = options_.gradient_owners;
  if (owners.size() != params_.size())
    throw ValueError(kOp, "ReducerOptions::gradient_owners has " + std::to_string(owners.size()) + " entries for " +
                              std::to_string(params_.size()) + " parameters (one owner per parameter)", group_.rank());
  for (std::size_t i = 0; i < owners.size(); ++i)
    if (owners[i] < 0 || owners[i] >= group_.size())
      throw ValueError(kOp, "ReducerOptions::gradient_owners[" + std::to_string(i) + "] = " +
                                std::to_string(owners[i]) + " is not a rank of a group of size " +
                                std::to_string(group_.size()), group_.rank());
  if (options_.survive)
    throw NotSupportedError(kOp, "ReducerOptions::gradient_owners (ZeRO stage 2) with survive: a recovery would need "
                                 "every rank's averaged gradients, which stage 2 does not keep", group_.rank());
}

void Reducer::ensure_buffer(Bucket& bucket) {
  if (bucket.buffer.defined()) return;
  const DType dtype = params_[bucket.params.front()].dtype();
  const Device device = params_.front().device();
  auto take_spare = [&]() -> Tensor {
    for (std::size_t k = 0; k < spares_.size(); ++k)
      if (spares_[k].numel() >= bucket.numel && spares_[k].dtype() == dtype) {
        Tensor t = std::move(spares_[k]);
        spares_.erase(spares_.begin() + static_cast<std::ptrdiff_t>(k));
        return t;
      }
    return Tensor();
  };
  // Buckets whose reduction is already done give their buffers back first.
  for (std::size_t b = 0; b < next_launch_; ++b)
    if (buckets_[b].buffer.defined() && buckets_[b].result.valid() && buckets_[b].result.is_ready())
      harvest(buckets_[b]);
  Tensor storage = take_spare();
  // Enough buffers in use: wait for the oldest launched bucket (its
  // collectives are posted, so every rank gets there) and reuse its buffer.
  for (std::size_t b = 0; !storage.defined() && buffers_in_use_ >= kBuffersBeforeReuse && b < next_launch_; ++b)
    if (buckets_[b].buffer.defined() && harvest(buckets_[b])) storage = take_spare();
  if (!storage.defined()) storage = Tensor::empty({bucket.numel}, dtype, device);
  bucket.buffer = storage.numel() == bucket.numel ? storage : storage.flat_slice(0, bucket.numel);
  bucket.storage = std::move(storage);
  ++buffers_in_use_;
}

bool Reducer::harvest(Bucket& bucket) {
  if (bucket.written || !bucket.result.valid()) return false;
  bucket.result.wait();
  if (bucket.result.exception()) return false;  // finalize() reports it
  try {
    if (!shadowing_) write_bucket(bucket, bucket.result.get(), "Reducer.mark_ready");
  } catch (...) {
    return false;  // finalize() writes it again and reports the error
  }
  bucket.written = true;
  release_buffer(bucket);
  return true;
}

void Reducer::release_buffer(Bucket& bucket) {
  if (!bucket.buffer.defined()) return;
  spares_.push_back(bucket.storage.defined() ? std::move(bucket.storage) : std::move(bucket.buffer));
  bucket.storage = Tensor();
  bucket.buffer = Tensor();
  --buffers_in_use_;
}

void Reducer::trim_spares() {
  if (spares_.size() <= 1) return;
  auto largest = std::max_element(spares_.begin(), spares_.end(),
                                  [](const Tensor& a, const Tensor& b) { return a.nbytes() < b.nbytes(); });
  Tensor keep = std::move(*largest);
  spares_.clear();
  spares_.push_back(std::move(keep));
}

}  // namespace dopt::optim
