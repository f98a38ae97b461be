#include "checkpoint.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/safetensors.hpp"

namespace dopt_train {

namespace fs = std::filesystem;
using nlohmann::json;

std::map<std::string, std::string> RunInfo::to_extras() const {
  json j = {{"optim", optim},
            {"inner", inner},
            {"ranks", ranks},
            {"seed", seed},
            {"hidden", hidden},
            {"layers", layers},
            {"batch", batch},
            {"input_dim", data.input_dim},
            {"classes", data.classes},
            {"samples", data.samples},
            {"lr", lr}};
  if (optim == "post-local-sgd") {
    j["plsgd_warmup"] = plsgd_warmup;
    j["plsgd_period"] = plsgd_period;
    j["plsgd_local_group"] = plsgd_local_group;
  }
  if (optim == "diloco") {
    j["diloco_sync_every"] = diloco_sync_every;
    j["diloco_fragments"] = diloco_fragments;
    j["diloco_delay"] = diloco_delay;
    j["diloco_alpha"] = diloco_alpha;
    j["diloco_outer_lr"] = diloco_outer_lr;
    j["diloco_outer_momentum"] = diloco_outer_momentum;
    j["diloco_wire"] = diloco_wire;
    j["diloco_error_feedback"] = diloco_error_feedback;
  }
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : j.items()) out[key] = value.dump();
  return out;
}

void check_compatible(const std::map<std::string, std::string>& saved, const RunInfo& run,
                      const std::string& folder) {
  std::string diffs;
  for (const auto& [key, value] : run.to_extras()) {
    if (run.any_ranks && key == "ranks") continue;
    std::string flag = "--" + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    auto it = saved.find(key);
    if (it == saved.end()) diffs += "; " + flag + ": missing in the checkpoint, this run " + value;
    else if (it->second != value) diffs += "; " + flag + ": checkpoint " + it->second + ", this run " + value;
  }
  if (!diffs.empty())
    throw dopt::ValueError("resume", "checkpoint " + folder + " was written by a different run (" + diffs.substr(2) +
                                         "); resume with the checkpoint's settings" +
                                         (diffs.find("; --ranks:") != std::string::npos
                                              ? std::string(" (another number of ranks: --elastic)")
                                              : std::string()));
}

void CommitLog::add(const dopt::CheckpointCommit& commit) {
  std::lock_guard<std::mutex> lock(m_);
  lines_.push_back("checkpoint: " + commit.folder + " (step " + std::to_string(commit.step) + ")");
  for (const std::string& gone : commit.removed)
    lines_.push_back("removed " + gone + " (--keep-last " + std::to_string(keep_last_) + ")");
  for (const std::string& why : commit.kept)
    if (warned_.insert(why).second)
      lines_.push_back("dopt-train: warning: --keep-last: kept " + why +
                       " (not removed, not counted; rename it to step-XXXXXXXX of the step it holds, or remove it)");
}

std::vector<std::string> CommitLog::take() {
  std::lock_guard<std::mutex> lock(m_);
  return std::exchange(lines_, {});
}

namespace {

/// "dopt-train-checkpoint/2" when folder/checkpoint.json is a checkpoint of
/// a dopt-train before the Checkpointer, else "" (none, unreadable, or
/// another format: the Checkpointer judges those).
std::string older_format(const fs::path& folder) {
  std::ifstream f(folder / "checkpoint.json");
  if (!f) return {};
  const json j = json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("format") || !j.at("format").is_string()) return {};
  const std::string format = j.at("format").get<std::string>();
  return format.rfind("dopt-train-checkpoint/", 0) == 0 ? format : std::string();
}

}  // namespace

void refuse_older_checkpoints(const std::string& checkpoint_dir, const std::string& resume_from) {
  std::vector<std::string> found;  // "FOLDER (FORMAT)"
  auto look = [&](const fs::path& folder) {
    if (const std::string format = older_format(folder); !format.empty())
      found.push_back(folder.string() + " (" + format + ")");
  };
  if (!resume_from.empty()) look(resume_from);
  std::error_code ec;
  if (!checkpoint_dir.empty() && fs::is_directory(checkpoint_dir, ec))
    for (const auto& e : fs::directory_iterator(checkpoint_dir, ec))
      if (e.is_directory(ec) && e.path() != fs::path(resume_from)) look(e.path());
  if (found.empty()) return;
  std::sort(found.begin(), found.end());
  std::string list;
  for (const std::string& f : found) list += (list.empty() ? "" : ", ") + f;
  throw dopt::IOError("checkpoint",
                      "checkpoints of an older dopt-train, which this one does not read: " + list +
                          ". Finish that run with the dopt-train that wrote them, or start afresh: move them out of "
                          "the way or give another --checkpoint-dir (docs/dopt-train.md, \"Checkpoints\")");
}

/// Writes every rank's parameters (gathered to rank 0) to one safetensors file,
/// tensors "rank{r}.{name}" (for comparing runs bitwise). Collective.
void dump_params(dopt::ProcessGroup& world, const std::vector<Tensor>& params, const std::vector<std::string>& names,
                 const std::string& path, std::int64_t step) {
  std::int64_t n = 0;
  for (const Tensor& p : params) n += p.numel();
  Tensor flat = Tensor::empty({n});
  std::int64_t off = 0;
  for (const Tensor& p : params) {
    flat.flat_slice(off, p.numel()).copy_(p.flatten());
    off += p.numel();
  }
  std::vector<Tensor> all;
  for (int r = 0; r < world.size(); ++r) all.push_back(Tensor::empty({n}));
  world.all_gather(all, flat);
  if (world.rank() != 0) return;
  std::map<std::string, Tensor> tensors;
  for (int r = 0; r < world.size(); ++r) {
    off = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const Tensor& p = params[i];
      tensors["rank" + std::to_string(r) + "." + names[i]] =
          all[static_cast<std::size_t>(r)].flat_slice(off, p.numel()).view(p.shape());
      off += p.numel();
    }
  }
  dopt::write_safetensors(path, tensors, {{"step", std::to_string(step)}});
}

}  // namespace dopt_train
