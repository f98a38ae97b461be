#include "checkpoint/layout.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/notice.hpp"
#include "dopt/runtime/safetensors.hpp"

namespace dopt::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

std::string rank_file_name(int rank, int world_size) {
  return "rank" + std::to_string(rank) + "-of-" + std::to_string(world_size) + ".safetensors";
}

std::string step_dir_name(std::int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string Identity::digest() const {
  std::ostringstream text;
  text << "dopt checkpoint\nstep " << step << "\nrun " << run << "\nworld_size " << world_size << "\n";
  for (const ItemEntry& i : items) text << "item " << i.name << " " << i.kind << " " << i.placement << "\n";
  for (const FileEntry& f : files) text << "file " << f.path << " " << f.rank << "\n";
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (const unsigned char c : text.str()) h = (h ^ c) * 0x100000001b3ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::map<std::string, std::string> Identity::metadata(int rank) const {
  return {{"dopt.checkpoint.step", std::to_string(step)},
          {"dopt.checkpoint.run", run},
          {"dopt.checkpoint.world_size", std::to_string(world_size)},
          {"dopt.checkpoint.manifest", digest()},
          {"dopt.checkpoint.rank", std::to_string(rank)}};
}

namespace {

void sync_file(const std::string& path, const char* op, int rank) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IOError(op, "cannot open " + path + " to sync it: " + errno_text(errno), rank);
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0) throw IOError(op, "cannot sync " + path + ": " + errno_text(e), rank);
}

/// "step-" and digits only: the folder of a complete checkpoint (the step
/// its name says), else nullopt.
std::optional<std::int64_t> step_of_name(const std::string& name) {
  if (name.size() < 13 || name.size() > 24 || name.rfind("step-", 0) != 0) return std::nullopt;
  if (!std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return std::stoll(name.substr(5));
}

/// A leftover "step-XXXXXXXX.tmp": the step, else nullopt.
std::optional<std::int64_t> step_of_tmp(const std::string& name) {
  if (name.size() < 4 || name.compare(name.size() - 4, 4, ".tmp") != 0) return std::nullopt;
  return step_of_name(name.substr(0, name.size() - 4));
}

std::string meta_of(const std::map<std::string, std::string>& meta, const std::string& key) {
  auto it = meta.find(key);
  return it == meta.end() ? std::string() : it->second;
}

/// The step folder/checkpoint.json holds (IOError naming it when unreadable).
std::int64_t step_held(const fs::path& folder, const char* op, int rank) {
  const fs::path path = folder / kManifestFile;
  std::ifstream f(path);
  if (!f) throw IOError(op, "cannot read " + path.string(), rank);
  try {
    json j;
    f >> j;
    return j.at("step").get<std::int64_t>();
  } catch (const json::exception& e) {
    throw IOError(op, path.string() + " is corrupt: " + e.what(), rank);
  }
}

struct Scan {
  std::vector<std::pair<std::int64_t, fs::path>> complete;  // name agrees with checkpoint.json
  std::vector<std::pair<std::int64_t, fs::path>> partial;   // step-*.tmp
  std::vector<std::string> odd;                             // unreadable, or name disagrees (why)
};

Scan scan(const std::string& dir, const char* op, int rank) {
  Scan s;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) throw IOError(op, "cannot list the checkpoint folder " + dir + ": " + errno_text(ec.value()), rank);
  for (const auto& e : it) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory()) continue;
    if (auto t = step_of_tmp(name)) {
      s.partial.emplace_back(*t, e.path());
      continue;
    }
    const auto named = step_of_name(name);
    if (!named || !fs::exists(e.path() / kManifestFile)) continue;  // not a checkpoint, or its write did not complete
    try {
      const std::int64_t held = step_held(e.path(), op, rank);
      if (held == *named) s.complete.emplace_back(held, e.path());
      else
        s.odd.push_back(e.path().string() + " holds step " + std::to_string(held) + " (its " + kManifestFile +
                        "), not the step its name says");
    } catch (const IOError& err) {
      s.odd.push_back(err.detail());
    }
  }
  std::sort(s.complete.begin(), s.complete.end());
  return s;
}

}  // namespace

void write_manifest(const std::string& dir, const Identity& id, const char* op, int rank) {
  json items = json::array(), files = json::array();
  for (const ItemEntry& i : id.items) items.push_back({{"name", i.name}, {"kind", i.kind}, {"placement", i.placement}});
  for (const FileEntry& f : id.files) files.push_back({{"path", f.path}, {"rank", f.rank}});
  const json j = {{"format", kFormat}, {"step", id.step},   {"run", id.run},        {"world_size", id.world_size},
                  {"items", items},    {"files", files},    {"manifest", id.digest()}};
  const std::string path = (fs::path(dir) / kManifestFile).string(), tmp = path + ".part";
  {
    std::ofstream f(tmp);
    f << j.dump(2) << "\n";
    if (!f.flush()) throw IOError(op, "cannot write " + tmp, rank);
  }
  sync_file(tmp, op, rank);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw IOError(op, "cannot rename " + tmp + " to " + path + ": " + errno_text(ec.value()), rank);
}

Identity read_manifest(const std::string& folder, const char* op, int rank) {
  const std::string path = (fs::path(folder) / kManifestFile).string();
  if (!fs::is_directory(folder)) throw IOError(op, "the checkpoint folder " + folder + " does not exist", rank);
  std::ifstream f(path);
  if (!f)
    throw IOError(op, path + " is missing: " + folder + " is not a complete checkpoint (its save did not finish)", rank);
  Identity id;
  std::string digest;
  try {
    json j;
    f >> j;
    if (!j.is_object() || j.value("format", "") != kFormat)
      throw IOError(op, path + " is not a Checkpointer manifest (expected \"format\": \"" + kFormat + "\")", rank);
    id.step = j.at("step").get<std::int64_t>();
    id.run = j.at("run").get<std::string>();
    id.world_size = j.at("world_size").get<int>();
    for (const json& i : j.at("items"))
      id.items.push_back({i.at("name").get<std::string>(), i.at("kind").get<std::string>(),
                          i.at("placement").get<std::string>()});
    for (const json& e : j.at("files")) id.files.push_back({e.at("path").get<std::string>(), e.at("rank").get<int>()});
    digest = j.at("manifest").get<std::string>();
  } catch (const json::exception& e) {
    throw IOError(op, path + " is corrupt: " + e.what(), rank);
  }
  if (digest != id.digest())
    throw IOError(op, path + ": the manifest digest does not match its contents (the file was edited or damaged)", rank);
  for (const FileEntry& e : id.files) {
    const fs::path p(e.path);
    if (e.path.empty() || p.is_absolute() ||
        std::any_of(p.begin(), p.end(), [](const fs::path& c) { return c == ".." || c == "."; }))
      throw IOError(op, path + " lists '" + e.path + "', which is not a path inside the checkpoint", rank);
  }
  fs::path name_of(folder);
  if (name_of.filename().empty()) name_of = name_of.parent_path();
  const auto named = step_of_name(name_of.filename().string());
  if (named && *named != id.step)
    throw IOError(op, folder + " is named for step " + std::to_string(*named) + ", but its " + kManifestFile +
                          " holds step " + std::to_string(id.step) +
                          ": the folder was renamed; rename it to " + step_dir_name(id.step) + " or remove it", rank);
  return id;
}

void verify_files(const std::string& folder, const Identity& id, const char* op, int rank) {
  const auto want = id.metadata(0);
  const std::string what = "the checkpoint " + folder + " (step " + std::to_string(id.step) + " of run " + id.run +
                           ", " + std::to_string(id.world_size) + " ranks)";
  for (const FileEntry& e : id.files) {
    const std::string path = (fs::path(folder) / e.path).string();
    if (!fs::exists(path)) throw IOError(op, path + " is missing, but " + what + " lists it", rank);
    const SafetensorsReader header(path);  // IOError naming the file when malformed
    const auto& meta = header.metadata();
    auto get = [&](const char* k) { return meta_of(meta, k); };
    if (get("dopt.checkpoint.manifest").empty())
      throw IOError(op, path + " carries no checkpoint identity (dopt.checkpoint.*), but " + what +
                            " lists it: the file comes from elsewhere", rank);
    bool same = true;
    for (const auto& [k, v] : want) same = same && (k == "dopt.checkpoint.rank" || meta_of(meta, k) == v);
    if (!same)
      throw IOError(op, path + " holds step " + get("dopt.checkpoint.step") + " of run " + get("dopt.checkpoint.run") +
                            " (" + get("dopt.checkpoint.world_size") + " ranks), but " + what +
                            ": the folder mixes files of different checkpoints; load a checkpoint as it was written", rank);
    if (get("dopt.checkpoint.rank") != std::to_string(e.rank))
      throw IOError(op, path + " was written by rank " + get("dopt.checkpoint.rank") + " (dopt.checkpoint.rank), but " +
                            what + " lists it as rank " + std::to_string(e.rank) +
                            "'s: the ranks' files were swapped or renamed; load a checkpoint as it was written", rank);
  }
}

std::optional<std::int64_t> latest_step(const std::string& dir, const char* op, int rank) {
  std::error_code ec;
  const auto st = fs::status(dir, ec);
  if (!fs::exists(st)) return std::nullopt;
  if (!fs::is_directory(st)) throw IOError(op, "the checkpoint folder " + dir + " exists but is not a folder", rank);
  const Scan s = scan(dir, op, rank);
  if (!s.odd.empty()) {
    std::string all;
    for (const std::string& o : s.odd) all += (all.empty() ? "" : "; ") + o;
    throw IOError(op, "cannot tell which checkpoint in " + dir + " is the newest: " + all +
                          "; rename each folder to step-XXXXXXXX of the step it holds, or remove it", rank);
  }
  if (s.complete.empty()) return std::nullopt;
  return s.complete.back().first;
}

std::vector<std::string> prune(const std::string& dir, int keep_last, std::vector<std::string>* kept) {
  std::vector<std::string> removed;
  if (keep_last <= 0) return removed;
  const Scan s = scan(dir, "Checkpointer::save", 0);
  for (const std::string& o : s.odd) {
    if (kept) kept->push_back(o);
    else notice_once("Checkpointer keep_last: kept " + o + " (not removed, not counted)");
  }
  if (s.complete.empty()) return removed;
  auto remove = [&](const fs::path& p) {
    std::error_code ec;
    fs::remove_all(p, ec);
    if (!ec) removed.push_back(p.string());
  };
  const std::size_t keep = static_cast<std::size_t>(keep_last);
  for (std::size_t k = 0; k + keep < s.complete.size(); ++k) remove(s.complete[k].second);
  for (const auto& [step, p] : s.partial)
    if (step < s.complete.back().first) remove(p);
  return removed;
}

std::string probe_dir(const std::string& dir, int rank) {
  std::error_code ec;
  const auto st = fs::status(dir, ec);
  if (fs::exists(st) && !fs::is_directory(st)) return dir + " exists but is not a folder";
  fs::create_directories(dir, ec);
  if (ec) return "cannot create " + dir + ": " + ec.message();
  const std::string probe =
      (fs::path(dir) / (".write-probe-rank" + std::to_string(rank) + "-" + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return "cannot create a file in " + dir + ": " + errno_text(errno);
  const char byte = 0;
  std::string why;
  if (::write(fd, &byte, 1) != 1) why = "cannot write a file in " + dir + ": " + errno_text(errno);
  else if (::fsync(fd) != 0) why = "cannot sync a file in " + dir + ": " + errno_text(errno);
  ::close(fd);
  if (::unlink(probe.c_str()) != 0 && why.empty()) why = "cannot remove a file in " + dir + ": " + errno_text(errno);
  return why;
}

}  // namespace dopt::checkpoint
