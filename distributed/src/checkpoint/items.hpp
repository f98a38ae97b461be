#pragma once
// The things a Checkpointer saves, one class per kind (tensors, a local
// optimizer, ZeRO, post-local SGD with or without DiLoCo, generators, a data
// position, extras): how each turns into entries of a checkpoint file, and
// back. The Checkpointer (checkpointer.cpp) owns the order, the files and the
// collectives; an item only reads and writes its own object.
//
// An item's entries in the replicated or per-rank file are named with its
// prefix "NAME/" (tensors and metadata alike). A sharded item (ZeRO, DiLoCo's
// replicated state) writes files of its own under the folder NAME/.
// Threads: every call on the caller's thread. A snapshot shares the object's
// tensors (it copies none): the Checkpointer copies every tensor of the
// file jobs into its staging memory (on the caller's thread, or on the
// writer's with background snapshots, while the caller waits for it before
// it changes the object); small state (numbers, strings) is copied here.
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/layout.hpp"
#include "dopt/distributed/checkpointer.hpp"
#include "dopt/runtime/safetensors.hpp"

namespace dopt::checkpoint {

/// The entries of one file (tensors on the CPU, owned).
using Bundle = SafetensorsFile;

/// A file of a save: where it goes and what it holds (written by the
/// background writer, which creates its folder).
struct FileJob {
  std::string path;
  Bundle bundle;
  /// The tensors are copied with Staging::copy under this prefix plus their
  /// entry names ("" for the replicated and per-rank files, whose entry
  /// names carry their item's prefix already).
  std::string staged_prefix;
};

struct SaveContext {
  std::string folder;  // the step-XXXXXXXX.tmp folder
  const Identity* id = nullptr;
  int rank = 0;
};

struct LoadContext {
  std::string folder;  // the checkpoint's folder
  const Identity* id = nullptr;
  int rank = 0, world_size = 0;
  /// The file `in` of prepare() comes from (for messages).
  std::string file;
};

class Item {
 public:
  Item(std::string name, std::string kind, std::string placement)
      : entry_{std::move(name), std::move(kind), std::move(placement)} {}
  virtual ~Item() = default;
  const ItemEntry& entry() const noexcept { return entry_; }
  const std::string& name() const noexcept { return entry_.name; }
  std::string prefix() const { return entry_.name + "/"; }

  /// The files of its own at world size n, each with the rank that writes it
  /// (relative to the checkpoint folder). Most items: none.
  virtual std::vector<FileEntry> own_files(int /*world_size*/) const { return {}; }
  /// Whether it has entries in the replicated or per-rank file.
  virtual bool in_bundle() const { return true; }
  /// Save, on the caller's thread: its state into `out` (tensors shared,
  /// the rest copied), and its own files written into ctx.folder.
  virtual void snapshot(Bundle& out, const SaveContext& ctx) = 0;
  /// Save, on the caller's thread: snapshots of its own files (own_files()
  /// of this rank; tensors shared, staged_prefix set), written by the
  /// background writer with the others. Items
  /// that write their own files in snapshot() return none.
  virtual std::vector<FileJob> snapshot_files(const SaveContext& /*ctx*/) { return {}; }
  /// Load, first half: reads what it needs from `in` (the file of its saved
  /// placement; empty when it has none) and checks that it fits the object;
  /// changes nothing. StateDictError naming ctx.file and the entry otherwise.
  virtual void prepare(const Bundle& in, const LoadContext& ctx) = 0;
  /// Load, second half: into the object.
  virtual void apply(const LoadContext& ctx) = 0;

 private:
  ItemEntry entry_;
};

std::unique_ptr<Item> make_tensors_item(const std::string& name, std::map<std::string, Tensor> tensors,
                                        Placement placement, TensorValues values);
std::unique_ptr<Item> make_optimizer_item(const std::string& name, optim::Optimizer& optimizer, Placement placement);
std::unique_ptr<Item> make_zero_item(const std::string& name, optim::ZeroRedundancyOptimizer& optimizer);
std::unique_ptr<Item> make_sharded_units_item(const std::string& name, optim::ShardedUnits& units);
std::unique_ptr<Item> make_post_local_sgd_item(const std::string& name, optim::PostLocalSGDOptimizer& optimizer);
std::unique_ptr<Item> make_rng_item(const std::string& name, std::mt19937_64& rng, Placement placement);
std::unique_ptr<Item> make_counter_rng_item(const std::string& name, std::uint64_t& seed, std::uint64_t& counter,
                                            Placement placement);
std::unique_ptr<Item> make_data_position_item(const std::string& name, DistributedSampler& sampler,
                                              std::int64_t& offset);
std::unique_ptr<Item> make_extras_item(const std::string& name, std::map<std::string, std::string>& extras,
                                       Placement placement, ExtrasCheck check);

const char* placement_name(Placement p) noexcept;

}  // namespace dopt::checkpoint
