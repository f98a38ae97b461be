// ZeroRedundancyOptimizer as a Joinable: a rank that ran out of inputs
// shadows the others' step() (its broadcasts) until every rank joined.
#include "dopt/distributed/zero.hpp"

namespace dopt::optim {
namespace {

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

std::unique_ptr<JoinHook> ZeroRedundancyOptimizer::join_hook() { return std::make_unique<ZeroJoinHook>(*this); }

Device ZeroRedundancyOptimizer::join_device() const { return all_params_.front().device(); }

}  // namespace dopt::optim
