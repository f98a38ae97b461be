#pragma once
// A list of tensors seen as one flat buffer of bytes (a call's data: one
// tensor, or the tensors of a coalesced call), without copying it.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "dopt/runtime/tensor.hpp"

namespace dopt::detail::shm_plane {

class FlatView {
 public:
  FlatView() = default;
  /// tensors[first, first + count).
  FlatView(const std::vector<Tensor>& tensors, std::size_t first, std::size_t count) {
    starts_.push_back(0);
    for (std::size_t i = first; i < first + count && i < tensors.size(); ++i) {
      const Tensor& t = tensors[i];
      if (t.nbytes() == 0) continue;
      ptrs_.push_back(static_cast<char*>(t.data_ptr()));
      index_.push_back(i);
      starts_.push_back(starts_.back() + t.nbytes());
    }
  }
  /// One tensor.
  explicit FlatView(const Tensor& t) : FlatView(std::vector<Tensor>{t}, 0, 1) {}

  std::size_t bytes() const noexcept { return starts_.empty() ? 0 : starts_.back(); }

  /// f(char* p, std::size_t at, std::size_t n) for each contiguous piece of
  /// bytes [lo, hi): p points at byte `at` of the view, n bytes long.
  template <class F>
  void for_each(std::size_t lo, std::size_t hi, F&& f) const {
    walk(lo, hi, [&](std::size_t i, std::size_t offset, std::size_t at, std::size_t n) { f(ptrs_[i] + offset, at, n); });
  }
  /// f(std::size_t tensor, std::size_t offset, std::size_t at, std::size_t n)
  /// for each contiguous piece of bytes [lo, hi): bytes [offset, offset + n)
  /// of tensors[tensor] (of the list the view was made of), which are byte
  /// `at` of the view on. A list of tensors of the same sizes has its pieces
  /// at the same places.
  template <class F>
  void for_each_piece(std::size_t lo, std::size_t hi, F&& f) const {
    walk(lo, hi, [&](std::size_t i, std::size_t offset, std::size_t at, std::size_t n) { f(index_[i], offset, at, n); });
  }
  /// dst <- bytes [lo, hi).
  void gather(std::size_t lo, std::size_t hi, char* dst) const {
    for_each(lo, hi, [&](char* p, std::size_t at, std::size_t n) { std::memcpy(dst + (at - lo), p, n); });
  }
  /// bytes [lo, hi) <- src.
  void scatter(std::size_t lo, std::size_t hi, const char* src) const {
    for_each(lo, hi, [&](char* p, std::size_t at, std::size_t n) {
      if (p != src + (at - lo)) std::memmove(p, src + (at - lo), n);
    });
  }
  /// The address of byte `at` when [at, at + n) is contiguous, else nullptr.
  char* contiguous(std::size_t at, std::size_t n) const {
    char* out = nullptr;
    std::size_t pieces = 0;
    for_each(at, at + n, [&](char* p, std::size_t, std::size_t) {
      if (!pieces++) out = p;
    });
    return pieces == 1 ? out : nullptr;
  }

 private:
  /// f(piece i, offset in it, at, n) for each piece of bytes [lo, hi).
  template <class F>
  void walk(std::size_t lo, std::size_t hi, F&& f) const {
    if (lo >= hi) return;
    auto it = std::upper_bound(starts_.begin(), starts_.end(), lo);
    std::size_t i = static_cast<std::size_t>(it - starts_.begin()) - 1;
    while (lo < hi && i < ptrs_.size()) {
      const std::size_t end = std::min(hi, starts_[i + 1]);
      f(i, lo - starts_[i], lo, end - lo);
      lo = end;
      ++i;
    }
  }

  std::vector<char*> ptrs_;
  std::vector<std::size_t> index_;   // index_[i]: piece i's tensor in the list
  std::vector<std::size_t> starts_;  // prefix sums; starts_[i] = first byte of piece i
};

}  // namespace dopt::detail::shm_plane
