// The NCCL plane: ProcessGroup's collectives on CUDA tensors, as a GroupPlane
// (dopt/actors/internal/device_plane.hpp) over the group's NcclProcessGroup
// (nccl_group_for). ProcessGroup has checked and numbered the call; this
// maps its kind to the communicator's method. NCCL matches calls by their
// order; with DOPT_NCCL_CHECK_CALLS=1 the calls are compared across ranks
// first (check_calls_match, over the CPU group).
#include <memory>
#include <vector>

#include "dopt/actors/internal/device_plane.hpp"
#include "dopt/gpu/nccl.hpp"
#include "dopt/runtime/settings.hpp"

namespace dopt::gpu {
namespace detail {
namespace {

using dopt::detail::CollKind;
using dopt::detail::OpPtr;

class NcclPlane final : public dopt::detail::GroupPlane {
 public:
  NcclPlane(std::shared_ptr<NcclProcessGroup> nccl, bool check_calls)
      : nccl_(std::move(nccl)), check_calls_(check_calls) {}

  void run(const OpPtr& op) override { run_async(op).get(); }

  Future<void> run_async(const OpPtr& op) override {
    if (check_calls_) {
      try {
        dopt::detail::check_calls_match(nccl_->cpu_group(), *op);
      } catch (...) {
        return make_failed_future(std::current_exception());
      }
    }
    auto& ts = op->tensors;
    const auto& d = op->desc;
    const std::vector<Tensor> per_rank(ts.begin() + (ts.empty() ? 0 : 1), ts.end());
    switch (d.kind) {
      case CollKind::broadcast: return nccl_->broadcast_async(ts[0], d.root);
      case CollKind::all_reduce: return nccl_->all_reduce_async(ts[0], d.op);
      case CollKind::reduce: return nccl_->reduce_async(ts[0], d.root, d.op);
      case CollKind::all_gather: return nccl_->all_gather_async(per_rank, ts[0]);
      case CollKind::all_gather_flat: return nccl_->all_gather_into_tensor_async(ts[1], ts[0]);
      case CollKind::reduce_scatter: return nccl_->reduce_scatter_async(ts[0], per_rank, d.op);
      // NCCL has no tags: sends and receives between two ranks match in order.
      case CollKind::send: return nccl_->send_async(ts[0], nccl_->cpu_group().group_rank(op->peer));
      case CollKind::recv: return nccl_->recv_async(ts[0], nccl_->cpu_group().group_rank(op->peer));
      default: break;
    }
    throw NotSupportedError(std::string("ProcessGroup.") + dopt::detail::coll_name(d.kind),
                            "the NCCL plane does not run it");
  }

  bool supports(const dopt::detail::CollDesc& d) const override {
    switch (d.kind) {
      case CollKind::broadcast:
      case CollKind::all_reduce:
      case CollKind::reduce:
      case CollKind::all_gather:
      case CollKind::all_gather_flat:
      case CollKind::reduce_scatter:
      case CollKind::send:
      case CollKind::recv: return true;
      default: return false;  // the coalesced calls: flatten the tensors first
    }
  }

  const char* name() const noexcept override { return "nccl"; }

 private:
  std::shared_ptr<NcclProcessGroup> nccl_;
  bool check_calls_;
};

class NcclPlanes final : public dopt::detail::DevicePlaneFactory {
 public:
  std::shared_ptr<dopt::detail::GroupPlane> make(const ProcessGroup& group, Device device) override {
    const bool check = settings::flag("DOPT_NCCL_CHECK_CALLS").value_or(false);
    return std::make_shared<NcclPlane>(nccl_group_for(group, device.index), check);
  }
};

}  // namespace

void register_nccl_plane() {
  static NcclPlanes* factory = new NcclPlanes();  // lives until exit
  dopt::detail::register_device_plane(DeviceType::CUDA, factory);
}

}  // namespace detail
}  // namespace dopt::gpu
