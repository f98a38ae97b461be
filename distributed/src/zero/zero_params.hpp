#pragma once
// ZeroParams: the parameters of one ZeroRedundancyOptimizer, by group and by
// global index (the position in the chain of groups), with the checks a new
// group passes (constructor, add_param_group). Owned by ZeroCore; used on the
// rank thread only (the overlap worker reads it, never while it changes).
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dopt/actors/process_group.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/optim/optimizer.hpp"

namespace dopt::optim::zero_detail {

class ZeroParams {
 public:
  explicit ZeroParams(std::string optimizer) : optimizer_(std::move(optimizer)) {}
  /// The spec's options, given to a group that has none (before add()).
  void set_defaults(std::unique_ptr<OptimizerOptions> defaults) { defaults_ = std::move(defaults); }

  /// Checks `group` (undefined or non-floating-point parameters: TypeError;
  /// another device type, a parameter already in a group, a duplicate:
  /// ValueError; options of another optimizer: TypeError; the options'
  /// validate/check_param) and appends it. Nothing changes when it throws;
  /// errors name `op` and `rank`.
  void add(OptimizerParamGroup group, const char* op, int rank);
  /// Drops the groups and parameters added after there were `groups` groups
  /// and `params` parameters (add_param_group's rollback).
  void truncate(std::size_t groups, std::size_t params);
  /// Collective over g: ValueError on every rank when the ranks' groups
  /// (sizes, dtypes, shapes) or `weight` differ.
  void check_same_everywhere(ProcessGroup g, ZeroPartitionWeight weight, const char* op, int rank) const;

  std::vector<OptimizerParamGroup>& groups() noexcept { return groups_; }
  const std::vector<OptimizerParamGroup>& groups() const noexcept { return groups_; }
  const std::vector<Tensor>& all() const noexcept { return all_; }
  std::size_t size() const noexcept { return all_.size(); }
  const Tensor& at(std::size_t i) const { return all_[i]; }
  /// Global index of p; -1 when p is not one of the parameters.
  std::int64_t index(const Tensor& p) const;
  /// Global index of p, which must be one of the parameters.
  std::int64_t index_of(const Tensor& p) const { return index_of_.at(p.key()); }
  std::int64_t index_of_key(const TensorImpl* key) const { return index_of_.at(key); }
  /// The group of every parameter, by global index.
  std::vector<std::size_t> group_of_each() const;
  /// requires_grad() of every parameter, by global index.
  std::vector<bool> trainable_mask() const;
  /// The weight of every parameter in the partition, by global index.
  std::vector<double> weights(ZeroPartitionWeight w) const;
  /// "float32[2, 3];float32[3]": every parameter, as the checkpoint names them.
  std::string describe_all() const;

 private:
  std::string optimizer_;
  std::unique_ptr<OptimizerOptions> defaults_;
  std::vector<OptimizerParamGroup> groups_;
  std::vector<Tensor> all_;
  std::unordered_map<const TensorImpl*, std::int64_t> index_of_;
};

}  // namespace dopt::optim::zero_detail
