#include "checkpoint/items.hpp"

#include <cmath>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dopt/distributed/diloco.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/optim/optimizer.hpp"
#include "dopt/runtime/distributed_sampler.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/state_dict.hpp"
#include "zero/zero_stage3_impl.hpp"
#include "zero/zero_state_dicts.hpp"

namespace dopt::checkpoint {

namespace fs = std::filesystem;

const char* placement_name(Placement p) noexcept { return p == Placement::replicated ? "replicated" : "per_rank"; }

namespace {

constexpr const char* kLoad = "Checkpointer::load";

/// "FILE (item 'NAME')": where an entry was looked for.
std::string where(const Item& item, const LoadContext& ctx) { return ctx.file + " (item '" + item.name() + "')"; }

/// The metadata entry NAME/key of `in`; StateDictError when it is absent.
const std::string& meta(const Item& item, const Bundle& in, const std::string& key, const LoadContext& ctx) {
  auto it = in.metadata.find(item.prefix() + key);
  if (it == in.metadata.end())
    throw StateDictError(kLoad, where(item, ctx) + " has no entry '" + item.prefix() + key + "'", ctx.rank);
  return it->second;
}

std::uint64_t parse_u64(const Item& item, const std::string& key, const std::string& text, const LoadContext& ctx) {
  std::size_t used = 0;
  std::uint64_t v = 0;
  try {
    v = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || text[0] == '-')
    throw StateDictError(kLoad, where(item, ctx) + ": '" + item.prefix() + key + "' is '" + text +
                                    "', not a non-negative integer", ctx.rank);
  return v;
}

/// A state dict's file form under the item's prefix (tensors shared: the
/// Checkpointer copies them).
void put_state_dict(const Item& item, const StateDict& sd, Bundle& out) {
  const SafetensorsFile f = state_dict_to_safetensors(sd);
  for (const auto& [k, t] : f.tensors) out.tensors[item.prefix() + k] = t;
  for (const auto& [k, v] : f.metadata) out.metadata[item.prefix() + k] = v;
}

/// The state dict under the item's prefix (StateDictError naming the file).
StateDict take_state_dict(const Item& item, const Bundle& in, const LoadContext& ctx) {
  SafetensorsFile sub;
  const std::string p = item.prefix();
  for (const auto& [k, t] : in.tensors)
    if (k.rfind(p, 0) == 0) sub.tensors[k.substr(p.size())] = t;
  for (const auto& [k, v] : in.metadata)
    if (k.rfind(p, 0) == 0) sub.metadata[k.substr(p.size())] = v;
  if (sub.metadata.empty())
    throw StateDictError(kLoad, where(item, ctx) + " holds no optimizer state under '" + p + "'", ctx.rank);
  return state_dict_from_safetensors(sub, where(item, ctx));
}

// --- named tensors --------------------------------------------------------------

/// "holds NaN at element 3 of 4096", or "" when every value is finite.
std::string first_nonfinite(const Tensor& t) {
  if (!is_floating_point(t.dtype())) return {};
  const Tensor d = t.to(DType::float64);
  const double* p = d.data<double>();
  for (std::int64_t k = 0; k < d.numel(); ++k)
    if (!std::isfinite(p[k]))
      return std::string("holds ") + (std::isnan(p[k]) ? "NaN" : p[k] > 0 ? "inf" : "-inf") + " at element " +
             std::to_string(k) + " of " + std::to_string(d.numel());
  return {};
}

class TensorsItem final : public Item {
 public:
  TensorsItem(const std::string& name, std::map<std::string, Tensor> tensors, Placement p, TensorValues values)
      : Item(name, "tensors", placement_name(p)), tensors_(std::move(tensors)), values_(values) {}
  void snapshot(Bundle& out, const SaveContext&) override {
    for (const auto& [k, t] : tensors_) out.tensors[prefix() + k] = t;
  }
  void prepare(const Bundle& in, const LoadContext& ctx) override {
    loaded_.clear();
    for (const auto& [k, t] : tensors_) {
      auto it = in.tensors.find(prefix() + k);
      if (it == in.tensors.end())
        throw StateDictError(kLoad, where(*this, ctx) + " has no tensor '" + prefix() + k + "'", ctx.rank);
      if (it->second.shape() != t.shape() || it->second.dtype() != t.dtype())
        throw StateDictError(kLoad, where(*this, ctx) + ": '" + prefix() + k + "' is " + it->second.str() +
                                        ", the registered tensor is " + t.str(), ctx.rank);
      if (values_ == TensorValues::finite)
        if (const std::string bad = first_nonfinite(it->second); !bad.empty())
          throw StateDictError(kLoad, ctx.file + ": tensor '" + prefix() + k + "' " + bad + " (item '" + name() +
                                          "' takes finite values only: the file is damaged or was altered)",
                               ctx.rank);
      loaded_.emplace(k, it->second);
    }
    for (const auto& [k, t] : in.tensors)
      if (k.rfind(prefix(), 0) == 0 && !tensors_.count(k.substr(prefix().size())))
        throw StateDictError(kLoad, where(*this, ctx) + " holds the tensor '" + k +
                                        "', which is not registered under '" + name() + "'", ctx.rank);
  }
  void apply(const LoadContext&) override {
    for (const auto& [k, t] : tensors_) t.copy_(loaded_.at(k));
    loaded_.clear();
  }

 private:
  std::map<std::string, Tensor> tensors_;
  TensorValues values_;
  std::map<std::string, Tensor> loaded_;
};

// --- a local optimizer ------------------------------------------------------------

class OptimizerItem final : public Item {
 public:
  OptimizerItem(const std::string& name, optim::Optimizer& o, Placement p)
      : Item(name, "optimizer", placement_name(p)), optim_(o) {}
  void snapshot(Bundle& out, const SaveContext&) override { put_state_dict(*this, optim_.state_dict(), out); }
  void prepare(const Bundle& in, const LoadContext& ctx) override { loaded_ = take_state_dict(*this, in, ctx); }
  void apply(const LoadContext&) override { optim_.load_state_dict(loaded_); }

 private:
  optim::Optimizer& optim_;
  StateDict loaded_;
};

// --- ZeRO (stages 1 and 2: ZeroRedundancyOptimizer; stage 3: ShardedUnits): their own shards ---

StateDict shared_shard_of(optim::ZeroRedundancyOptimizer& z, const std::map<std::string, std::string>& metadata) {
  return optim::zero_detail::shared_shard(z, metadata);
}
StateDict shared_shard_of(optim::ShardedUnits& s, const std::map<std::string, std::string>& metadata) {
  return optim::stage3_detail::shared_shard(s, metadata);
}

/// Z: ZeroRedundancyOptimizer or ShardedUnits (shard_file_name, load_sharded).
template <class Z>
class ZeroItem final : public Item {
 public:
  ZeroItem(const std::string& name, const char* kind, Z& z) : Item(name, kind, "sharded"), zero_(z) {}
  std::vector<FileEntry> own_files(int n) const override {
    std::vector<FileEntry> files;
    for (int r = 0; r < n; ++r) files.push_back({name() + "/" + Z::shard_file_name(r, n), r});
    return files;
  }
  bool in_bundle() const override { return false; }
  void snapshot(Bundle&, const SaveContext&) override {}
  // The shard as save_sharded writes it (shard_state_dict's, its tensors
  // shared), copied into the staging memory under the item's prefix.
  std::vector<FileJob> snapshot_files(const SaveContext& ctx) override {
    const std::string file = Z::shard_file_name(ctx.rank, ctx.id->world_size);
    std::vector<FileJob> out(1);
    out[0].path = (fs::path(ctx.folder) / name() / file).string();
    out[0].bundle = state_dict_to_safetensors(shared_shard_of(zero_, ctx.id->metadata(ctx.rank)));
    out[0].staged_prefix = prefix();
    return out;
  }
  void prepare(const Bundle&, const LoadContext&) override {}
  void apply(const LoadContext& ctx) override { zero_.load_sharded((fs::path(ctx.folder) / name()).string()); }

 private:
  Z& zero_;
};

// --- post-local SGD (and DiLoCo) ----------------------------------------------------------

class PostLocalSgdItem final : public Item {
 public:
  PostLocalSgdItem(const std::string& name, optim::PostLocalSGDOptimizer& o)
      : Item(name, "post_local_sgd", "per_rank"), plsgd_(o),
        diloco_(dynamic_cast<optim::DiLoCoAverager*>(&o.averager())) {
    if (diloco_) diloco_->set_sharded_checkpoints(true);
  }
  std::vector<FileEntry> own_files(int n) const override {
    std::vector<FileEntry> files;
    if (diloco_)
      for (int r = 0; r < n; ++r) files.push_back({name() + "/" + optim::DiLoCoAverager::shard_file_name(r, n), r});
    return files;
  }
  void snapshot(Bundle& out, const SaveContext& ctx) override {
    put_state_dict(*this, plsgd_.state_dict(), out);
    if (!diloco_) return;
    // DiLoCo's replicated state: written here, on the caller's thread (no
    // in-memory form in its public API), then given the checkpoint's identity.
    const fs::path dir = fs::path(ctx.folder) / name();
    fs::create_directories(dir);
    diloco_->save_sharded(dir.string());
    const std::string path = (dir / optim::DiLoCoAverager::shard_file_name(ctx.rank, ctx.id->world_size)).string();
    SafetensorsFile f = read_safetensors(path);
    for (const auto& [k, v] : ctx.id->metadata(ctx.rank)) f.metadata[k] = v;
    write_safetensors(path, f.tensors, f.metadata);
  }
  void prepare(const Bundle& in, const LoadContext& ctx) override { loaded_ = take_state_dict(*this, in, ctx); }
  void apply(const LoadContext& ctx) override {
    plsgd_.load_state_dict(loaded_);
    if (diloco_) diloco_->load_sharded((fs::path(ctx.folder) / name()).string());
  }

 private:
  optim::PostLocalSGDOptimizer& plsgd_;
  optim::DiLoCoAverager* diloco_;
  StateDict loaded_;
};

// --- generators -------------------------------------------------------------------------------

class RngItem final : public Item {
 public:
  RngItem(const std::string& name, std::mt19937_64& rng, Placement p) : Item(name, "mt19937_64", placement_name(p)), rng_(rng) {}
  void snapshot(Bundle& out, const SaveContext&) override {
    std::ostringstream s;
    s << rng_;
    out.metadata[prefix() + "state"] = s.str();
  }
  void prepare(const Bundle& in, const LoadContext& ctx) override {
    std::istringstream s(meta(*this, in, "state", ctx));
    s >> loaded_;
    if (s.fail())
      throw StateDictError(kLoad, where(*this, ctx) + ": '" + prefix() + "state' is not a std::mt19937_64 state",
                           ctx.rank);
  }
  void apply(const LoadContext&) override { rng_ = loaded_; }

 private:
  std::mt19937_64& rng_;
  std::mt19937_64 loaded_;
};

class CounterRngItem final : public Item {
 public:
  CounterRngItem(const std::string& name, std::uint64_t& seed, std::uint64_t& counter, Placement p)
      : Item(name, "counter_rng", placement_name(p)), seed_(seed), counter_(counter) {}
  void snapshot(Bundle& out, const SaveContext&) override {
    out.metadata[prefix() + "seed"] = std::to_string(seed_);
    out.metadata[prefix() + "counter"] = std::to_string(counter_);
  }
  void prepare(const Bundle& in, const LoadContext& ctx) override {
    seed_loaded_ = parse_u64(*this, "seed", meta(*this, in, "seed", ctx), ctx);
    counter_loaded_ = parse_u64(*this, "counter", meta(*this, in, "counter", ctx), ctx);
  }
  void apply(const LoadContext&) override { seed_ = seed_loaded_, counter_ = counter_loaded_; }

 private:
  std::uint64_t& seed_;
  std::uint64_t& counter_;
  std::uint64_t seed_loaded_ = 0, counter_loaded_ = 0;
};

// --- a data loader's position ---------------------------------------------------------------------

class DataPositionItem final : public Item {
 public:
  DataPositionItem(const std::string& name, DistributedSampler& sampler, std::int64_t& offset)
      : Item(name, "data_position", "replicated"), sampler_(sampler), offset_(offset) {}
  void snapshot(Bundle& out, const SaveContext&) override {
    out.metadata[prefix() + "epoch"] = std::to_string(sampler_.epoch());
    out.metadata[prefix() + "offset"] = std::to_string(offset_);
  }
  void prepare(const Bundle& in, const LoadContext& ctx) override {
    epoch_ = static_cast<std::int64_t>(parse_u64(*this, "epoch", meta(*this, in, "epoch", ctx), ctx));
    const auto offset = static_cast<std::int64_t>(parse_u64(*this, "offset", meta(*this, in, "offset", ctx), ctx));
    // The samples taken over all ranks stay the same (each rank takes every
    // world_size-th index of the epoch's list).
    const std::int64_t taken = offset * ctx.id->world_size;
    if (taken % ctx.world_size != 0)
      throw StateDictError(kLoad, where(*this, ctx) + ": " + std::to_string(taken) + " samples of epoch " +
                                      std::to_string(epoch_) + " were taken at " + std::to_string(ctx.id->world_size) +
                                      " ranks, which " + std::to_string(ctx.world_size) +
                                      " ranks cannot continue evenly; load at a world size that divides it",
                           ctx.rank);
    offset_loaded_ = taken / ctx.world_size;
  }
  void apply(const LoadContext&) override {
    sampler_.set_epoch(epoch_);
    offset_ = offset_loaded_;
  }

 private:
  DistributedSampler& sampler_;
  std::int64_t& offset_;
  std::int64_t epoch_ = 0, offset_loaded_ = 0;
};

// --- user extras ---------------------------------------------------------------------------------------

class ExtrasItem final : public Item {
 public:
  ExtrasItem(const std::string& name, std::map<std::string, std::string>& extras, Placement p, ExtrasCheck check)
      : Item(name, "extras", placement_name(p)), extras_(extras), check_(std::move(check)) {}
  void snapshot(Bundle& out, const SaveContext&) override {
    out.metadata[prefix() + "json"] = nlohmann::json(extras_).dump();
  }
  void prepare(const Bundle& in, const LoadContext& ctx) override {
    try {
      loaded_ = nlohmann::json::parse(meta(*this, in, "json", ctx)).get<std::map<std::string, std::string>>();
    } catch (const nlohmann::json::exception& e) {
      throw StateDictError(kLoad, where(*this, ctx) + ": '" + prefix() + "json' is not an object of strings: " +
                                      e.what(), ctx.rank);
    }
    if (check_) check_(loaded_, ctx.folder);
  }
  void apply(const LoadContext&) override { extras_ = loaded_; }

 private:
  std::map<std::string, std::string>& extras_;
  ExtrasCheck check_;
  std::map<std::string, std::string> loaded_;
};

}  // namespace

std::unique_ptr<Item> make_tensors_item(const std::string& name, std::map<std::string, Tensor> tensors,
                                        Placement placement, TensorValues values) {
  return std::make_unique<TensorsItem>(name, std::move(tensors), placement, values);
}
std::unique_ptr<Item> make_optimizer_item(const std::string& name, optim::Optimizer& optimizer, Placement placement) {
  return std::make_unique<OptimizerItem>(name, optimizer, placement);
}
std::unique_ptr<Item> make_zero_item(const std::string& name, optim::ZeroRedundancyOptimizer& optimizer) {
  return std::make_unique<ZeroItem<optim::ZeroRedundancyOptimizer>>(name, "zero", optimizer);
}
std::unique_ptr<Item> make_sharded_units_item(const std::string& name, optim::ShardedUnits& units) {
  return std::make_unique<ZeroItem<optim::ShardedUnits>>(name, "zero3", units);
}
std::unique_ptr<Item> make_post_local_sgd_item(const std::string& name, optim::PostLocalSGDOptimizer& optimizer) {
  return std::make_unique<PostLocalSgdItem>(name, optimizer);
}
std::unique_ptr<Item> make_rng_item(const std::string& name, std::mt19937_64& rng, Placement placement) {
  return std::make_unique<RngItem>(name, rng, placement);
}
std::unique_ptr<Item> make_counter_rng_item(const std::string& name, std::uint64_t& seed, std::uint64_t& counter,
                                            Placement placement) {
  return std::make_unique<CounterRngItem>(name, seed, counter, placement);
}
std::unique_ptr<Item> make_data_position_item(const std::string& name, DistributedSampler& sampler,
                                              std::int64_t& offset) {
  return std::make_unique<DataPositionItem>(name, sampler, offset);
}
std::unique_ptr<Item> make_extras_item(const std::string& name, std::map<std::string, std::string>& extras,
                                       Placement placement, ExtrasCheck check) {
  return std::make_unique<ExtrasItem>(name, extras, placement, std::move(check));
}

}  // namespace dopt::checkpoint
