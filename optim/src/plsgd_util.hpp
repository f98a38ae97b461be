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

}  // namespace dopt::optim::detail
