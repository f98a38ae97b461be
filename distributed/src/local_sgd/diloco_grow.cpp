// DiLoCoAverager::take_grown_group (diloco.hpp, "growing back"): the ranks of
// the grown group agree on how their averagers were built (one all_gather,
// averager_agreement.hpp), then the averager goes on over the grown group
// once an average in flight over the old group has landed
// (post_local_sgd_catch_up, post_local_sgd_grow.cpp, sends the state to the
// newcomers). Rank thread.
#include <charconv>
#include <string>
#include <utility>
#include <vector>

#include "dopt/distributed/diloco.hpp"
#include "local_sgd/averager_agreement.hpp"

namespace dopt::optim {
namespace {

/// What must be equal on every rank of the group, in a fixed order (the
/// outer optimizer with its defaults filled in, so that equal specs written
/// otherwise agree; the point-to-point settings only where the wire format
/// uses them).
detail::AveragerConfig config_of(const DiLoCoAverager& a) {
  const DiLoCoOptions& o = a.options();
  detail::AveragerConfig c{detail::AveragerConfig::diloco, a.warmup_steps(), {}};
  c.settings.emplace_back("sync_every", std::to_string(o.sync_every));
  std::string frags = "[";
  for (std::size_t k = 0; k < a.fragments().size(); ++k) {
    frags += k ? ", [" : "[";
    for (std::size_t j = 0; j < a.fragments()[k].size(); ++j)
      frags += (j ? ", " : "") + std::to_string(a.fragments()[k][j]);
    frags += "]";
  }
  c.settings.emplace_back("fragments", frags + "]");
  c.settings.emplace_back("fragment_sync_delay", std::to_string(o.fragment_sync_delay));
  char alpha[32];
  const auto end = std::to_chars(alpha, alpha + sizeof alpha, o.fragment_update_alpha).ptr;
  c.settings.emplace_back("fragment_update_alpha", std::string(alpha, end));
  std::vector<OptimizerParamGroup> probe;
  probe.emplace_back(std::vector<Tensor>{Tensor::zeros({1}, DType::float32)});
  const StateDict filled = make_optimizer(o.outer_optimizer, std::move(probe))->state_dict();
  c.settings.emplace_back("outer_optimizer",
                          OptimizerSpec{o.outer_optimizer.name, filled.param_groups.at(0).hyperparams}.to_json());
  const bool quantized = o.wire_format != WireFormat::float32;
  const bool rows = o.wire_format == WireFormat::int8 || o.wire_format == WireFormat::int4;
  c.settings.emplace_back("wire_format", std::string(wire_format_name(o.wire_format)));
  c.settings.emplace_back("error_feedback", o.error_feedback ? "true" : "false");
  c.settings.emplace_back("row_size", rows ? std::to_string(o.row_size) : "unused");
  c.settings.emplace_back("wire_tag", quantized ? std::to_string(o.wire_tag) : "unused");
  std::string params = std::to_string(a.params().size()) + ":";
  for (const auto& p : a.params()) params += " " + std::string(dtype_name(p.dtype())) + shape_str(p.shape());
  c.settings.emplace_back("parameters", params);
  return c;
}

}  // namespace

void DiLoCoAverager::take_grown_group(ProcessGroup grown, const char* op) {
  if (!grown.valid() || !grown.is_member())
    throw ValueError(op, "the grown group is invalid or does not hold this rank", process_group().rank());
  settle();
  // Before anything changes: a newcomer built otherwise raises on every rank.
  detail::agree_averager_config(grown, config_of(*this), op);
  // land() divides by the group's size: the average in flight must land
  // while the averager still holds the group that prepared it.
  if (pending_) finish_pending();
  set_process_group(std::move(grown));
}

}  // namespace dopt::optim
