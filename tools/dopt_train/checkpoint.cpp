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
#include <sstream>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/notice.hpp"
#include "dopt/runtime/safetensors.hpp"

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

std::string step_dir_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::optional<std::string> find_latest_checkpoint(const std::string& checkpoint_dir) {
  std::error_code ec;
  const auto st = fs::status(checkpoint_dir, ec);
  if (!fs::exists(st)) return std::nullopt;
  if (!fs::is_directory(st))
    throw dopt::IOError("resume", "--checkpoint-dir " + checkpoint_dir + " exists but is not a folder");
  fs::directory_iterator it(checkpoint_dir, ec);
  if (ec) throw dopt::IOError("resume", "cannot list --checkpoint-dir " + checkpoint_dir + ": " + ec.message());
  std::optional<std::string> best;
  std::string best_name;
  for (const auto& e : it) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || name.size() != 13 || !e.is_directory()) continue;  // skips *.tmp
    if (!fs::exists(e.path() / kInfoFile)) continue;
    if (!best || name > best_name) best = e.path().string(), best_name = name;
  }
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

std::vector<std::string> prune_checkpoints(const std::string& checkpoint_dir, int keep_last) {
  std::vector<std::string> removed;
  if (keep_last <= 0) return removed;
  std::vector<std::string> complete, partial;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(checkpoint_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || !e.is_directory()) continue;
    if (name.size() == 13 && fs::exists(e.path() / kInfoFile)) complete.push_back(name);
    else if (name.size() == 17 && name.compare(13, 4, ".tmp") == 0) partial.push_back(name);
  }
  std::sort(complete.begin(), complete.end());
  if (complete.empty()) return removed;
  auto remove = [&](const std::string& name) {
    std::error_code rec;
    fs::remove_all(fs::path(checkpoint_dir) / name, rec);
    if (!rec) removed.push_back((fs::path(checkpoint_dir) / name).string());
  };
  if (static_cast<int>(complete.size()) > keep_last)
    for (std::size_t k = 0; k + static_cast<std::size_t>(keep_last) < complete.size(); ++k) remove(complete[k]);
  for (const auto& name : partial)
    if (name.substr(0, 13) < complete.back()) remove(name);
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
    if (!ck.meta.is_object() || ck.meta.value("format", "") != kCheckpointFormat)
      throw dopt::IOError("resume", path + " is not a dopt-train checkpoint (expected \"format\": \"" +
                                        kCheckpointFormat + "\")");
    ck.step = ck.meta.at("step").get<std::int64_t>();
    if (ck.step < 0) throw dopt::IOError("resume", path + ": negative step " + std::to_string(ck.step));
    (void)ck.meta.at("run").at("optim").get<std::string>();
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

void write_checkpoint_info(const std::string& dir, const RunInfo& run, std::int64_t step) {
  const json j = {{"format", kCheckpointFormat}, {"step", step}, {"run", run.to_json()}};
  const std::string path = (fs::path(dir) / kInfoFile).string();
  std::ofstream f(path);
  f << j.dump(2) << "\n";
  if (!f) throw dopt::IOError("checkpoint", "cannot write " + path);
}

std::string model_file_name(int rank, int world_size) {
  return "model-rank" + std::to_string(rank) + "-of-" + std::to_string(world_size) + ".safetensors";
}

void save_model(const std::string& dir, int rank, int world_size, const Mlp& model, std::int64_t step) {
  std::map<std::string, Tensor> tensors;
  for (std::size_t i = 0; i < model.params().size(); ++i) tensors[model.names()[i]] = model.params()[i];
  dopt::write_safetensors((fs::path(dir) / model_file_name(rank, world_size)).string(), tensors,
                          {{"dopt.train.format", kModelFormat}, {"step", std::to_string(step)}});
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
