// ZeroRedundancyOptimizer: the facade (contract in zero.hpp, design in
// docs/zero.md). Every call goes to its ZeroCore (zero_core.hpp) and the
// pieces it holds (docs/architecture.md, "ZeRO inside").
#include "dopt/distributed/zero.hpp"

#include "dopt/actors/internal/call_label.hpp"
#include "zero_core.hpp"
#include "zero_internal.hpp"

namespace dopt::optim {
namespace {

using zero_detail::kName;

std::vector<OptimizerParamGroup> one_group(std::vector<Tensor> params) {
  if (params.empty()) throw ValueError(kName, "ZeroRedundancyOptimizer got an empty parameter list");
  std::vector<OptimizerParamGroup> g;
  g.emplace_back(std::move(params));
  return g;
}

/// A rank that ran out of inputs shadows the others' step() (its
/// broadcasts) until every rank joined.
class ZeroJoinHook : public JoinHook {
 public:
  explicit ZeroJoinHook(ZeroRedundancyOptimizer& z) : zero_(z) {}
  // With overlap the reducer's shadow iteration drives ZeRO through the comm hook.
  void main_hook() override {
    if (!zero_.overlap_with_ddp()) zero_.step();
  }

 private:
  ZeroRedundancyOptimizer& zero_;
};

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params, OptimizerSpec spec, ZeroOptions options)
    : ZeroRedundancyOptimizer(one_group(std::move(params)), std::move(spec), std::move(options)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<OptimizerParamGroup> groups, OptimizerSpec spec,
                                                 ZeroOptions options)
    : core_(std::make_unique<ZeroCore>(*this, std::move(groups), std::move(spec), std::move(options))) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params, const OptimizerOptions& optimizer,
                                                 ZeroOptions options)
    : ZeroRedundancyOptimizer(std::move(params), spec_of(optimizer, kName), std::move(options)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<OptimizerParamGroup> groups,
                                                 const OptimizerOptions& optimizer, ZeroOptions options)
    : ZeroRedundancyOptimizer(std::move(groups), spec_of(optimizer, kName), std::move(options)) {}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

std::optional<double> ZeroRedundancyOptimizer::step(const Optimizer::LossClosure& closure) {
  dopt::detail::CallScope call_scope("ZeroRedundancyOptimizer::step()");
  return core_->step(closure);
}
Future<void> ZeroRedundancyOptimizer::step_async() {
  dopt::detail::CallScope call_scope("ZeroRedundancyOptimizer::step_async()");
  return core_->step_async();
}
void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) { core_->zero_grad(set_to_none); }
void ZeroRedundancyOptimizer::add_param_group(OptimizerParamGroup group) {
  dopt::detail::CallScope call_scope("ZeroRedundancyOptimizer::add_param_group()");
  core_->add_param_group(std::move(group));
}

// --- state (each waits for a step_async in flight first: zero.hpp) ----------------

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  dopt::detail::CallScope call_scope("ZeroRedundancyOptimizer::consolidate_state_dict()");
  core_->settle(std::string(kName) + ".consolidate_state_dict");
  core_->dicts.consolidate(*core_, to);
}
StateDict ZeroRedundancyOptimizer::state_dict() const {
  dopt::detail::CallScope call_scope("ZeroRedundancyOptimizer::state_dict()");
  core_->settle(std::string(kName) + ".state_dict");
  return core_->dicts.global(*core_);
}
void ZeroRedundancyOptimizer::load_state_dict(const StateDict& sd) {
  dopt::detail::CallScope call_scope("ZeroRedundancyOptimizer::load_state_dict()");
  core_->settle(std::string(kName) + ".load_state_dict");
  core_->dicts.load(*core_, sd);
}
void ZeroRedundancyOptimizer::save_sharded(const std::string& dir,
                                           const std::map<std::string, std::string>& metadata) const {
  dopt::detail::CallScope call_scope("ZeroRedundancyOptimizer::save_sharded()");
  core_->settle(std::string(kName) + ".save_sharded");
  core_->dicts.save_sharded(*core_, dir, metadata);
}
StateDict ZeroRedundancyOptimizer::shard_state_dict(const std::map<std::string, std::string>& metadata) const {
  dopt::detail::CallScope call_scope("ZeroRedundancyOptimizer::shard_state_dict()");
  const std::string op = std::string(kName) + ".shard_state_dict";
  core_->settle(op);
  return core_->dicts.shard(*core_, metadata, op, /*copy=*/true);
}
ShardLoadReport ZeroRedundancyOptimizer::load_sharded(const std::string& dir) {
  dopt::detail::CallScope call_scope("ZeroRedundancyOptimizer::load_sharded()");
  core_->settle(std::string(kName) + ".load_sharded");
  return core_->dicts.load_sharded(*core_, dir);
}
std::string ZeroRedundancyOptimizer::shard_file_name(int rank, int world_size) {
  return "optim-rank" + std::to_string(rank) + "-of-" + std::to_string(world_size) + ".safetensors";
}

// --- redundancy ----------------------------------------------------------------

ZeroRecovery ZeroRedundancyOptimizer::recover() {
  dopt::detail::CallScope call_scope("ZeroRedundancyOptimizer::recover()");
  core_->settle(std::string(kName) + ".recover");
  return core_->redundancy->recover(*core_);
}
int ZeroRedundancyOptimizer::redundancy() const noexcept { return core_->redundancy->k(core_->world); }
std::vector<int> ZeroRedundancyOptimizer::buddies(int r) const {
  if (r < 0 || r >= core_->world)
    throw ValueError("ZeroRedundancyOptimizer.buddies", "rank " + std::to_string(r) + " is not in the group",
                     core_->rank);
  return core_->redundancy->buddies(r);
}
std::int64_t ZeroRedundancyOptimizer::buddy_state_bytes() const { return core_->redundancy->copy_bytes(); }
ZeroBuddyUpdate ZeroRedundancyOptimizer::buddy_update() const noexcept { return core_->buddy_update; }
bool ZeroRedundancyOptimizer::reads_parameters_from_segments() const noexcept {
  return core_->redundancy->reads_parameters_from_segments();
}

// --- Joinable ------------------------------------------------------------------

std::unique_ptr<JoinHook> ZeroRedundancyOptimizer::join_hook() { return std::make_unique<ZeroJoinHook>(*this); }
Device ZeroRedundancyOptimizer::join_device() const { return core_->params.at(0).device(); }
ProcessGroup ZeroRedundancyOptimizer::join_process_group() const { return core_->group; }

// --- accessors -----------------------------------------------------------------

std::vector<OptimizerParamGroup>& ZeroRedundancyOptimizer::param_groups() noexcept { return core_->params.groups(); }
const std::vector<OptimizerParamGroup>& ZeroRedundancyOptimizer::param_groups() const noexcept {
  return core_->params.groups();
}
Optimizer& ZeroRedundancyOptimizer::optim() noexcept { return *core_->optim; }
const Optimizer& ZeroRedundancyOptimizer::optim() const noexcept { return *core_->optim; }
const OptimizerSpec& ZeroRedundancyOptimizer::spec() const noexcept { return core_->spec; }
const ProcessGroup& ZeroRedundancyOptimizer::process_group() const noexcept { return core_->group; }
int ZeroRedundancyOptimizer::rank() const noexcept { return core_->rank; }
int ZeroRedundancyOptimizer::world_size() const noexcept { return core_->world; }
bool ZeroRedundancyOptimizer::parameters_as_bucket_view() const noexcept { return core_->bucket_view; }
ZeroPartitionWeight ZeroRedundancyOptimizer::partition_weight() const noexcept { return core_->weight; }
std::vector<double> ZeroRedundancyOptimizer::partition_weights() const { return core_->params.weights(core_->weight); }
const std::vector<std::vector<std::vector<Tensor>>>& ZeroRedundancyOptimizer::partition() const noexcept {
  return core_->part.by_rank();
}
std::vector<int> ZeroRedundancyOptimizer::param_owners() const { return core_->part.owners(); }
std::int64_t ZeroRedundancyOptimizer::global_index(const Tensor& p) const { return core_->params.index(p); }
const std::vector<Tensor>& ZeroRedundancyOptimizer::all_params() const noexcept { return core_->params.all(); }
std::size_t ZeroRedundancyOptimizer::bucket_count() const noexcept { return core_->buckets.size(); }
const std::vector<std::vector<Tensor>>& ZeroRedundancyOptimizer::buckets() const noexcept {
  return core_->buckets.rows();
}
std::int64_t ZeroRedundancyOptimizer::local_state_bytes() const {
  std::int64_t b = 0;
  for (const auto& [k, st] : core_->optim->state())
    for (const auto& [name, t] : st)
      if (t.defined()) b += static_cast<std::int64_t>(t.nbytes());
  return b;
}
std::int64_t ZeroRedundancyOptimizer::step_count() const noexcept { return core_->steps; }
bool ZeroRedundancyOptimizer::overlap_with_ddp() const noexcept { return core_->overlap != nullptr; }
std::vector<int> ZeroRedundancyOptimizer::overlap_bucket_owners() const {
  return core_->overlap ? core_->overlap->bucket_owners() : std::vector<int>{};
}

}  // namespace dopt::optim
