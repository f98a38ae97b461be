#pragma once
// The files of a Checkpointer checkpoint on disk (docs/checkpointing.md,
// "The folder"): folder names, the identity every file carries, the manifest
// (checkpoint.json), the check of a folder's files against it, and the scan
// of the checkpoint folder for the newest complete checkpoint and for the
// ones keep_last removes, the probe of a folder before the first save. Plain
// file work: no collectives; the callers
// (checkpointer.cpp) decide which rank runs what. Errors are dopt::IOError
// with the op and rank passed in, naming the file.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dopt::checkpoint {

/// checkpoint.json's "format".
inline constexpr const char* kFormat = "dopt-checkpoint/1";
inline constexpr const char* kManifestFile = "checkpoint.json";
/// Where rank 0 writes the replicated items, and rank r its per-rank items.
inline constexpr const char* kReplicatedFile = "replicated.safetensors";
std::string rank_file_name(int rank, int world_size);

/// "step-00000040"; the folder a save writes first is that + ".tmp".
std::string step_dir_name(std::int64_t step);

/// An item as the manifest lists it.
struct ItemEntry {
  std::string name;
  std::string kind;       // "tensors", "optimizer", "zero", "post_local_sgd", "rng", ...
  std::string placement;  // "replicated", "per_rank", "sharded"
};

/// A file of the checkpoint and the rank that writes it.
struct FileEntry {
  std::string path;  // relative to the checkpoint folder ("zero/optim-rank0-of-3.safetensors")
  int rank = 0;
};

/// Who a checkpoint is; written into checkpoint.json and, as metadata, into
/// every file of it.
struct Identity {
  std::int64_t step = 0;
  std::string run;
  int world_size = 0;
  std::vector<ItemEntry> items;
  std::vector<FileEntry> files;
  /// 16 hex digits: FNV-1a 64 of everything above (also what the ranks
  /// compare before a save: equal digests, equal registrations and step).
  std::string digest() const;
  /// The metadata entries of a file written by `rank`: "dopt.checkpoint.step",
  /// ".run", ".world_size", ".manifest" (the digest) and ".rank".
  std::map<std::string, std::string> metadata(int rank) const;
};

/// dir/checkpoint.json (written to a temporary file, synced and renamed).
void write_manifest(const std::string& dir, const Identity& id, const char* op, int rank);
/// Reads folder/checkpoint.json. IOError when it is missing, is not a
/// Checkpointer manifest, its digest does not match, it lists a path outside
/// the folder, or the folder is named for another step than it holds.
Identity read_manifest(const std::string& folder, const char* op, int rank);
/// Reads the header of every file the manifest lists and compares its
/// identity and rank with the manifest: IOError naming the first file that is
/// missing, carries no identity, belongs to another checkpoint ("holds step
/// 20 of run X, but the checkpoint is step 40 of run X: the folder mixes
/// files of different checkpoints") or to another rank ("was written by rank
/// 2, but the manifest lists it as rank 1's").
void verify_files(const std::string& folder, const Identity& id, const char* op, int rank);

/// The step of the newest complete checkpoint in dir (nullopt: none, or no
/// dir). Skips step-*.tmp and folders without checkpoint.json; IOError when
/// dir is not a folder, a checkpoint.json cannot be read, or a folder's name
/// disagrees with the step it holds (naming every such folder).
std::optional<std::int64_t> latest_step(const std::string& dir, const char* op, int rank);
/// Removes all but the newest keep_last complete checkpoints of dir, and the
/// step-*.tmp folders older than the newest; a folder whose checkpoint.json
/// cannot be read or disagrees with its name is kept: a line for each goes
/// to *kept, or, without kept, to a notice. Returns the folders removed.
std::vector<std::string> prune(const std::string& dir, int keep_last, std::vector<std::string>* kept);

/// Creates dir (and its parents) and writes, syncs and removes a small probe
/// file in it, named after rank and process (so that simulated ranks do not
/// collide). "" when that works, else what went wrong ("cannot create /x/ck:
/// Permission denied", "D exists but is not a folder").
std::string probe_dir(const std::string& dir, int rank);

}  // namespace dopt::checkpoint
