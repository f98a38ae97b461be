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

/// dopt::when_all (future.hpp): waits for all, carries the first failure in list order.
using ::dopt::when_all;

}  // namespace dopt::optim::detail
