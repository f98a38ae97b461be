#pragma once
// Repoint: moves a parameter onto memory ZeRO owns (bucket views, overlap
// buffers, a frozen parameter's own copy) and tells the caller through
// ZeroOptions::rebind_parameter (zero.hpp, "Parameters re-pointed at memory
// ZeRO owns"). Runs on whichever thread re-points (see there).
#include <functional>
#include <vector>

#include "dopt/runtime/tensor.hpp"

namespace dopt::optim::zero_detail {

class ZeroParams;

class Repoint {
 public:
  explicit Repoint(std::function<void(const Tensor&)> rebind) : rebind_(std::move(rebind)) {}
  /// ValueError (naming op and the parameter) for a parameter over memory
  /// that re-pointing would cut off from its owner, when no rebind hook is set.
  void check(const std::vector<Tensor>& params, const ZeroParams& all, const char* op, const char* why,
             int rank) const;
  /// p.set_data(to), then the rebind hook.
  void operator()(const Tensor& p, const Tensor& to) const;

 private:
  std::function<void(const Tensor&)> rebind_;
};

}  // namespace dopt::optim::zero_detail
