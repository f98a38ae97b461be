#include "checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/notice.hpp"
#include "dopt/runtime/safetensors.hpp"
#include "strategy.hpp"

namespace dopt_train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr const char* kInfoFile = "checkpoint.json";

/// "holds NaN at element 3 of 4096", or "" when every value is finite.
std::string first_nonfinite(const Tensor& t) {
  if (!dopt::is_floating_point(t.dtype())) return {};
  const Tensor d = t.to(dopt::DType::float64);
  const double* p = d.data<double>();
  for (std::int64_t k = 0; k < d.numel(); ++k)
    if (!std::isfinite(p[k]))
      return std::string("holds ") + (std::isnan(p[k]) ? "NaN" : p[k] > 0 ? "inf" : "-inf") + " at element " +
             std::to_string(k) + " of " + std::to_string(d.numel());
  return {};
}
constexpr const char* kModelFormat = "dopt-train-model/1";
}  // namespace

json RunInfo::to_json() const {
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
  return j;
}

CheckpointIdentity CheckpointIdentity::of(std::int64_t step, const std::string& run, int world_size) {
  CheckpointIdentity id;
  id.step = step;
  id.run = run;
  id.world_size = world_size;
  for (int r = 0; r < world_size; ++r) {
    id.files.push_back(model_file_name(r, world_size));
    id.files.push_back(optim_file_name(r, world_size));
  }
  std::sort(id.files.begin(), id.files.end());
  return id;
}

std::string CheckpointIdentity::manifest_digest() const {
  std::string text = "dopt-train checkpoint\nstep " + std::to_string(step) + "\nrun " + run + "\nworld_size " +
                     std::to_string(world_size) + "\n";
  for (const std::string& f : files) text += "file " + f + "\n";
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(XXH3_64bits(text.data(), text.size())));
  return buf;
}

std::map<std::string, std::string> CheckpointIdentity::metadata(int rank) const {
  return {{"dopt.checkpoint.step", std::to_string(step)},
          {"dopt.checkpoint.run", run},
          {"dopt.checkpoint.world_size", std::to_string(world_size)},
          {"dopt.checkpoint.manifest", manifest_digest()},
          {"dopt.checkpoint.rank", rank < 0 ? std::string("all") : std::to_string(rank)}};
}

int CheckpointIdentity::rank_of(const std::string& file) const {
  for (int r = 0; r < world_size; ++r)
    if (file == model_file_name(r, world_size) || file == optim_file_name(r, world_size)) return r;
  return -1;
}

std::string new_run_id() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return buf;
}

void check_file_rank(const std::string& path, const std::map<std::string, std::string>& meta, int rank,
                     bool required) {
  auto it = meta.find("dopt.checkpoint.rank");
  if (it == meta.end()) {
    if (required)
      throw dopt::IOError("resume", path + " carries no rank (dopt.checkpoint.rank), but rank " +
                                        std::to_string(rank) + " loads it as its own: the file was rewritten or "
                                        "comes from another program; resume from a checkpoint as it was written");
    return;
  }
  if (it->second == "all" || it->second == std::to_string(rank)) return;
  throw dopt::IOError("resume", path + " holds rank " + it->second + "'s state (dopt.checkpoint.rank " + it->second +
                                    "), but " + (rank < 0 ? std::string("every rank") : "rank " + std::to_string(rank)) +
                                    " loads it: the ranks' files were swapped or renamed; resume from a checkpoint "
                                    "as it was written");
}

namespace {
std::string meta_of(const std::map<std::string, std::string>& meta, const std::string& k) {
  auto it = meta.find(k);
  return it == meta.end() ? std::string() : it->second;
}

/// A format-1 checkpoint without identity: each file's own step must be the
/// checkpoint's, and its rank (if it names one) the file's.
void verify_older_checkpoint_files(const CheckpointInfo& ckpt) {
  const std::string json_path = (fs::path(ckpt.dir) / kInfoFile).string();
  const int world_size = ckpt.meta.at("run").value("ranks", 0);
  const CheckpointIdentity id = CheckpointIdentity::of(ckpt.step, "", world_size);
  for (const std::string& name : id.files) {
    const std::string path = (fs::path(ckpt.dir) / name).string();
    if (!fs::exists(path))
      throw dopt::IOError("resume", path + " is missing, but the checkpoint " + ckpt.dir + " (step " +
                                        std::to_string(ckpt.step) + ", " + std::to_string(world_size) +
                                        " ranks) needs it");
    const dopt::SafetensorsReader header(path);  // the header only; IOError naming the file when malformed
    const auto& meta = header.metadata();
    if (!meta_of(meta, "dopt.checkpoint.manifest").empty())
      throw dopt::IOError("resume", path + " carries the identity of step " + meta_of(meta, "dopt.checkpoint.step") +
                                        " of run " + meta_of(meta, "dopt.checkpoint.run") + ", but " + json_path +
                                        " has none (format " + kCheckpointFormatOld +
                                        " without \"identity\"): checkpoint.json was edited; resume from a "
                                        "checkpoint as it was written");
    // The file's own step: the model's "step", a ZeRO shard's optimizer step
    // (a local optimizer's state of that dopt-train names none).
    std::string its_step = meta_of(meta, "dopt.checkpoint.step");
    if (its_step.empty()) its_step = meta_of(meta, "step");
    if (its_step.empty()) its_step = meta_of(meta, "dopt.zero.step");
    if (!its_step.empty() && its_step != std::to_string(ckpt.step))
      throw dopt::IOError("resume", path + " holds step " + its_step + ", but the checkpoint " + ckpt.dir +
                                        " is step " + std::to_string(ckpt.step) +
                                        ": the folder mixes files of different checkpoints; resume from a "
                                        "checkpoint as it was written");
    check_file_rank(path, meta, id.rank_of(name), false);
  }
}
}  // namespace

void verify_checkpoint_files(const CheckpointInfo& ckpt) {
  if (!ckpt.identity) return verify_older_checkpoint_files(ckpt);  // read_checkpoint_info: format 1 only
  const std::string what = "the checkpoint " + ckpt.dir + " (step " + std::to_string(ckpt.step) + ")";
  const CheckpointIdentity& id = *ckpt.identity;
  const auto want = id.metadata(0);
  for (const std::string& name : id.files) {
    const std::string path = (fs::path(ckpt.dir) / name).string();
    if (!fs::exists(path)) throw dopt::IOError("resume", path + " is missing, but " + what + " lists it");
    const dopt::SafetensorsReader header(path);  // the header only; IOError naming the file when malformed
    const auto& meta = header.metadata();
    auto get = [&](const std::string& k) { return meta_of(meta, k); };
    if (get("dopt.checkpoint.manifest").empty())
      throw dopt::IOError("resume", path + " carries no checkpoint identity (a file of an older dopt-train or of "
                                           "another program), but " + what + " lists it: the folder mixes files of "
                                           "different checkpoints");
    bool same = true;
    for (const auto& [k, v] : want) same = same && (k == "dopt.checkpoint.rank" || get(k) == v);
    if (!same)
      throw dopt::IOError("resume", path + " holds step " + get("dopt.checkpoint.step") + " of run " +
                                        get("dopt.checkpoint.run") + " (" + get("dopt.checkpoint.world_size") +
                                        " ranks), but the checkpoint " + ckpt.dir + " is step " +
                                        std::to_string(id.step) + " of run " + id.run + " (" +
                                        std::to_string(id.world_size) +
                                        " ranks): the folder mixes files of different checkpoints; resume from a "
                                        "checkpoint as it was written");
    // The rank that loads it is the one its name says (a format-1 checkpoint
    // with identity: its files name no rank).
    check_file_rank(path, meta, id.rank_of(name), ckpt.format == 2);
  }
}

std::string step_dir_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

namespace {
/// The step dir/checkpoint.json holds, or nullopt and *why.
std::optional<std::int64_t> step_held(const fs::path& dir, std::string* why) {
  const fs::path path = dir / kInfoFile;
  std::ifstream f(path);
  if (!f) {
    *why = "cannot read " + path.string();
    return std::nullopt;
  }
  try {
    json j;
    f >> j;
    const std::int64_t step = j.at("step").get<std::int64_t>();
    if (step >= 0) return step;
    *why = path.string() + " holds the negative step " + std::to_string(step);
  } catch (const json::exception& e) {
    *why = path.string() + " is corrupt: " + e.what();
  }
  return std::nullopt;
}

/// The complete checkpoint folders of checkpoint_dir (step-XXXXXXXX holding
/// a checkpoint.json), sorted by name.
std::vector<fs::path> complete_folders(const std::string& checkpoint_dir, std::vector<std::string>* partial) {
  std::vector<fs::path> out;
  std::error_code ec;
  fs::directory_iterator it(checkpoint_dir, ec);
  if (ec) throw dopt::IOError("resume", "cannot list --checkpoint-dir " + checkpoint_dir + ": " + ec.message());
  for (const auto& e : it) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || !e.is_directory()) continue;
    if (name.size() == 13 && fs::exists(e.path() / kInfoFile)) out.push_back(e.path());
    else if (partial && name.size() == 17 && name.compare(13, 4, ".tmp") == 0) partial->push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

std::optional<std::string> find_latest_checkpoint(const std::string& checkpoint_dir) {
  std::error_code ec;
  const auto st = fs::status(checkpoint_dir, ec);
  if (!fs::exists(st)) return std::nullopt;
  if (!fs::is_directory(st))
    throw dopt::IOError("resume", "--checkpoint-dir " + checkpoint_dir + " exists but is not a folder");
  std::optional<std::string> best;
  std::int64_t best_step = -1;
  std::string lying;
  for (const fs::path& dir : complete_folders(checkpoint_dir, nullptr)) {
    std::string why;
    const auto step = step_held(dir, &why);
    if (!step)
      throw dopt::IOError("resume", "--resume cannot tell which checkpoint in " + checkpoint_dir +
                                        " is the newest: " + why + "; repair or remove " + dir.string());
    if (dir.filename().string() != step_dir_name(*step)) {
      lying += ", " + dir.string() + " holds step " + std::to_string(*step);
      continue;
    }
    if (*step > best_step) best = dir.string(), best_step = *step;
  }
  if (!lying.empty())
    throw dopt::IOError("resume", "--resume: the name of a checkpoint folder in " + checkpoint_dir +
                                      " disagrees with the step its checkpoint.json holds (" + lying.substr(2) +
                                      "): dopt-train names each folder after its step, so these were renamed, and "
                                      "resuming by name could go back to an older step; rename each to "
                                      "step-XXXXXXXX of the step it holds, or remove it");
  return best;
}

std::string probe_checkpoint_dir(const std::string& checkpoint_dir, int rank) {
  std::error_code ec;
  const auto st = fs::status(checkpoint_dir, ec);
  if (fs::exists(st) && !fs::is_directory(st)) return checkpoint_dir + " exists but is not a folder";
  fs::create_directories(checkpoint_dir, ec);
  if (ec) return "cannot create " + checkpoint_dir + ": " + ec.message();
  const std::string probe = (fs::path(checkpoint_dir) / (".write-probe-rank" + std::to_string(rank) + "-" +
                                                         std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return "cannot create a file in " + checkpoint_dir + ": " + std::strerror(errno);
  const char byte = 0;
  std::string why;
  if (::write(fd, &byte, 1) != 1) why = "cannot write a file in " + checkpoint_dir + ": " + std::strerror(errno);
  else if (::fsync(fd) != 0) why = "cannot sync a file in " + checkpoint_dir + ": " + std::strerror(errno);
  ::close(fd);
  if (::unlink(probe.c_str()) != 0 && why.empty())
    why = "cannot remove a file in " + checkpoint_dir + ": " + std::strerror(errno);
  return why;
}

std::vector<std::string> prune_checkpoints(const std::string& checkpoint_dir, int keep_last,
                                           std::vector<std::string>* kept) {
  std::vector<std::string> removed;
  if (keep_last <= 0) return removed;
  std::vector<std::string> partial;
  std::vector<std::pair<std::int64_t, fs::path>> complete;  // by the step held
  for (const fs::path& dir : complete_folders(checkpoint_dir, &partial)) {
    std::string why;
    const auto step = step_held(dir, &why);
    if (!step) {
      if (kept) kept->push_back("--keep-last: kept " + dir.string() + ": " + why + " (not removed, not counted)");
      continue;
    }
    if (dir.filename().string() != step_dir_name(*step)) {
      if (kept)
        kept->push_back("--keep-last: kept " + dir.string() + ": it holds step " + std::to_string(*step) +
                        " (its checkpoint.json), not the step its name says (not removed, not counted; rename it "
                        "to " + step_dir_name(*step) + " or remove it)");
      continue;
    }
    complete.emplace_back(*step, dir);
  }
  std::sort(complete.begin(), complete.end());
  if (complete.empty()) return removed;
  auto remove = [&](const fs::path& dir) {
    std::error_code rec;
    fs::remove_all(dir, rec);
    if (!rec) removed.push_back(dir.string());
  };
  if (static_cast<int>(complete.size()) > keep_last)
    for (std::size_t k = 0; k + static_cast<std::size_t>(keep_last) < complete.size(); ++k) remove(complete[k].second);
  const std::string newest = step_dir_name(complete.back().first);
  for (const auto& name : partial)
    if (name.substr(0, 13) < newest) remove(fs::path(checkpoint_dir) / name);
  return removed;
}

CheckpointInfo read_checkpoint_info(const std::string& dir) {
  const std::string path = (fs::path(dir) / kInfoFile).string();
  std::ifstream f(path);
  if (!fs::is_directory(dir)) throw dopt::IOError("resume", "checkpoint folder " + dir + " does not exist");
  if (!f) throw dopt::IOError("resume", path + " is missing: " + dir + " is not a complete dopt-train checkpoint");
  CheckpointInfo ck;
  ck.dir = dir;
  try {
    f >> ck.meta;
    const std::string format = ck.meta.is_object() ? ck.meta.value("format", "") : "";
    if (format != kCheckpointFormat && format != kCheckpointFormatOld)
      throw dopt::IOError("resume", path + " is not a dopt-train checkpoint (expected \"format\": \"" +
                                        kCheckpointFormat + "\", or the older \"" + kCheckpointFormatOld + "\")");
    ck.format = format == kCheckpointFormat ? 2 : 1;
    ck.step = ck.meta.at("step").get<std::int64_t>();
    if (ck.step < 0) throw dopt::IOError("resume", path + ": negative step " + std::to_string(ck.step));
    // A folder named for a step (step-XXXXXXXX) must hold that step.
    fs::path folder(dir);
    if (folder.filename().empty()) folder = folder.parent_path();
    const std::string name = folder.filename().string();
    if (name.size() == 13 && name.rfind("step-", 0) == 0 &&
        std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
        name != step_dir_name(ck.step))
      throw dopt::IOError("resume", dir + " is named for step " + std::to_string(std::stoll(name.substr(5))) +
                                        ", but its checkpoint.json holds step " + std::to_string(ck.step) +
                                        ": dopt-train names each folder after its step, so this one was renamed; "
                                        "rename it to " + step_dir_name(ck.step) + " or resume from the folder of "
                                        "the step you mean");
    if (ck.format == 2 && !ck.meta.contains("identity"))
      throw dopt::IOError("resume", path + " is format \"" + kCheckpointFormat +
                                        "\" but carries no \"identity\" (the run, world size and files of the "
                                        "checkpoint, which every file is checked against): the file was edited; "
                                        "resume from a checkpoint as it was written");
    (void)ck.meta.at("run").at("optim").get<std::string>();
    if (ck.meta.contains("identity")) {
      const json& j = ck.meta.at("identity");
      CheckpointIdentity id;
      id.step = ck.step;
      id.run = j.at("run").get<std::string>();
      id.world_size = j.at("world_size").get<int>();
      id.files = j.at("files").get<std::vector<std::string>>();
      if (j.at("manifest").get<std::string>() != id.manifest_digest())
        throw dopt::IOError("resume", path + ": the manifest digest does not match its step, run and files (the "
                                          "file was edited or damaged)");
      for (const std::string& f : id.files)
        if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
          throw dopt::IOError("resume", path + ": the manifest lists '" + f + "', which is not a file name");
      ck.identity = std::move(id);
    }
  } catch (const json::exception& e) {
    throw dopt::IOError("resume", path + " is corrupt: " + e.what());
  }
  return ck;
}

void check_compatible(const CheckpointInfo& ckpt, const RunInfo& run) {
  const json want = run.to_json();
  const json& have = ckpt.meta.at("run");
  std::string diffs;
  for (const auto& [key, value] : want.items()) {
    const std::string flag = "--" + [&] {
      std::string k = key;
      for (char& c : k)
        if (c == '_') c = '-';
      return k;
    }();
    if (!have.contains(key)) {
      diffs += "; " + flag + ": missing in the checkpoint, this run " + value.dump();
    } else if (have.at(key) != value) {
      diffs += "; " + flag + ": checkpoint " + have.at(key).dump() + ", this run " + value.dump();
    }
  }
  if (!diffs.empty())
    throw dopt::ValueError("resume", "checkpoint " + ckpt.dir + " was written by a different run (" + diffs.substr(2) +
                                         "); resume with the checkpoint's settings");
}

void write_checkpoint_info(const std::string& dir, const RunInfo& run, const CheckpointIdentity& id) {
  const json identity = {
      {"run", id.run}, {"world_size", id.world_size}, {"files", id.files}, {"manifest", id.manifest_digest()}};
  const json j = {{"format", kCheckpointFormat}, {"step", id.step}, {"run", run.to_json()}, {"identity", identity}};
  const std::string path = (fs::path(dir) / kInfoFile).string();
  std::ofstream f(path);
  f << j.dump(2) << "\n";
  if (!f) throw dopt::IOError("checkpoint", "cannot write " + path);
}

std::string model_file_name(int rank, int world_size) {
  return "model-rank" + std::to_string(rank) + "-of-" + std::to_string(world_size) + ".safetensors";
}

void save_model(const std::string& dir, int rank, const Mlp& model, const CheckpointIdentity& id) {
  std::map<std::string, Tensor> tensors;
  for (std::size_t i = 0; i < model.params().size(); ++i) tensors[model.names()[i]] = model.params()[i];
  auto meta = id.metadata(rank);
  meta["dopt.train.format"] = kModelFormat;
  meta["step"] = std::to_string(id.step);
  dopt::write_safetensors((fs::path(dir) / model_file_name(rank, id.world_size)).string(), tensors, meta);
}

void load_model(const std::string& dir, int rank, int world_size, Mlp& model, std::int64_t step) {
  const std::string path = (fs::path(dir) / model_file_name(rank, world_size)).string();
  if (!fs::exists(path)) throw dopt::IOError("resume", path + " is missing");
  const dopt::SafetensorsFile file = dopt::read_safetensors(path);  // IOError naming the file when malformed
  if (!file.has_checksums)
    dopt::notice_once(path + " has no checksums (written by an older dopt-train): loaded without verifying it");
  auto meta = [&](const char* k) {
    auto it = file.metadata.find(k);
    return it == file.metadata.end() ? std::string() : it->second;
  };
  if (meta("dopt.train.format") != kModelFormat)
    throw dopt::StateDictError("resume", path + " is not a dopt-train model file");
  if (meta("step") != std::to_string(step))
    throw dopt::StateDictError("resume", path + " holds step " + meta("step") + ", checkpoint.json says " +
                                             std::to_string(step));
  check_file_rank(path, file.metadata, rank, false);  // verify_checkpoint_files requires it in format 2
  for (std::size_t i = 0; i < model.params().size(); ++i) {
    const Tensor& p = model.params()[i];
    auto it = file.tensors.find(model.names()[i]);
    if (it == file.tensors.end()) throw dopt::StateDictError("resume", path + " has no tensor " + model.names()[i]);
    if (it->second.shape() != p.shape() || it->second.dtype() != p.dtype())
      throw dopt::StateDictError("resume", path + ": " + model.names()[i] + " is " + it->second.str() +
                                               ", the model's is " + p.str());
    if (const std::string bad = first_nonfinite(it->second); !bad.empty())
      throw dopt::StateDictError("resume", path + ": tensor '" + model.names()[i] + "' " + bad +
                                               "; a checkpoint never holds non-finite parameters");
    p.copy_(it->second);
  }
}

}  // namespace dopt_train
