#pragma once
// Internal helpers of the model averagers, comm hooks and reducer.
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <algorithm>

#include "dopt/actors/future.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/dtype.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::optim::detail {

/// t /= n in place, torch's arithmetic: float32/float64 divide in their own
/// type by n converted to it; float16/bfloat16 divide in float32 and round.
inline void divide_(const Tensor& t, std::int64_t n, const char* op) {
  check_cpu(t, op);
  const std::int64_t count = t.numel();
  switch (t.dtype()) {
    case DType::float32: {
      float* p = t.data<float>();
      const float d = static_cast<float>(n);
      for (std::int64_t i = 0; i < count; ++i) p[i] = p[i] / d;
      return;
    }
    case DType::float64: {
      double* p = t.data<double>();
      const double d = static_cast<double>(n);
      for (std::int64_t i = 0; i < count; ++i) p[i] = p[i] / d;
      return;
    }
    case DType::float16: {
      Half* p = t.data<Half>();
      const float d = static_cast<float>(n);
      for (std::int64_t i = 0; i < count; ++i) p[i] = Half(static_cast<float>(p[i]) / d);
      return;
    }
    case DType::bfloat16: {
      BFloat16* p = t.data<BFloat16>();
      const float d = static_cast<float>(n);
      for (std::int64_t i = 0; i < count; ++i) p[i] = BFloat16(static_cast<float>(p[i]) / d);
      return;
    }
    default:
      throw TypeError(op, "expected a floating-point tensor, got " + t.str());
  }
}

/// A future that completes when all of `futures` have; it carries the first
/// exception (in list order) if any failed.
inline Future<void> when_all(std::vector<Future<void>> futures) {
  if (futures.empty()) return make_ready_future();
  if (futures.size() == 1) return futures.front();
  struct Shared {
    std::mutex m;
    std::size_t left;
    std::vector<std::exception_ptr> errors;
    Promise<void> done;
  };
  auto s = std::make_shared<Shared>();
  s->left = futures.size();
  s->errors.resize(futures.size());
  for (std::size_t i = 0; i < futures.size(); ++i) {
    futures[i].then([s, i](Future<void> f) {
      bool last = false;
      {
        std::lock_guard<std::mutex> lock(s->m);
        s->errors[i] = f.exception();
        last = --s->left == 0;
      }
      if (!last) return;
      for (auto& e : s->errors)
        if (e) {
          s->done.set_exception(e);
          return;
        }
      s->done.set_value();
    });
  }
  return s->done.get_future();
}

/// In-place SUM all-reduce of a 1-D tensor over `group` with gloo's ring
/// algorithm (what torch 1.13 runs on CPU), so that the order in which the
/// ranks' values are added matches gloo's bit for bit: the buffer is cut in
/// 2 * n segments of ceil(bytes / 2n) bytes (rounded up to whole elements),
/// group rank c owns segments 2c and 2c + 1, and the sum of chunk c starts at
/// rank c + 1 and goes round the ring to rank c. Blocking; only send/recv.
inline void ring_all_reduce_sum(ProcessGroup& group, const Tensor& flat) {
  const int n = group.size();
  const int me = group.rank();
  const std::int64_t numel = flat.numel();
  const std::size_t es = flat.element_size();
  const std::size_t total = static_cast<std::size_t>(numel) * es;
  const std::size_t segs = static_cast<std::size_t>(2 * n);
  std::size_t seg_bytes = (total + segs - 1) / segs;
  seg_bytes = (seg_bytes + es - 1) / es * es;
  const std::int64_t seg = static_cast<std::int64_t>(seg_bytes / es);
  auto chunk = [&](int c) {
    c = ((c % n) + n) % n;
    const std::int64_t b = std::min<std::int64_t>(numel, 2 * c * seg);
    const std::int64_t e = std::min<std::int64_t>(numel, 2 * (c + 1) * seg);
    return flat.flat_slice(b, e - b);
  };
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  Tensor tmp = Tensor::empty({std::max<std::int64_t>(1, 2 * seg)}, flat.dtype());
  for (int s = 0; s < n - 1; ++s) {  // reduce-scatter
    Tensor out = chunk(me - 1 - s);
    Tensor in = chunk(me - 2 - s);
    Future<void> sf, rf;
    Tensor rbuf = tmp.flat_slice(0, in.numel());
    if (out.numel()) sf = group.send_async(out, next, 7000 + s);
    if (in.numel()) rf = group.recv_async(rbuf, prev, 7000 + s);
    if (rf.valid()) {
      rf.get();
      if (flat.dtype() == DType::float32) {
        float* a = in.data<float>();
        const float* b = rbuf.data<float>();
        for (std::int64_t i = 0; i < in.numel(); ++i) a[i] = b[i] + a[i];
      } else if (flat.dtype() == DType::float64) {
        double* a = in.data<double>();
        const double* b = rbuf.data<double>();
        for (std::int64_t i = 0; i < in.numel(); ++i) a[i] = b[i] + a[i];
      } else {
        throw TypeError("ring_all_reduce_sum", "float32 or float64 only, got " + flat.str());
      }
    }
    if (sf.valid()) sf.get();
  }
  for (int s = 0; s < n - 1; ++s) {  // all-gather
    Tensor out = chunk(me - s);
    Tensor in = chunk(me - 1 - s);
    Future<void> sf, rf;
    if (out.numel()) sf = group.send_async(out, next, 7100 + s);
    if (in.numel()) rf = group.recv_async(in, prev, 7100 + s);
    if (rf.valid()) rf.get();
    if (sf.valid()) sf.get();
  }
}

}  // namespace dopt::optim::detail
