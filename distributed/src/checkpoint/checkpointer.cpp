// dopt::Checkpointer (dopt/distributed/checkpointer.hpp): the order of a save
// and a load across ranks. A save: the ranks agree (rank 0 has made the
// step-XXXXXXXX.tmp folder; every rank registered the same items and passed
// the same step), the caller's thread snapshots every item (the items share
// their tensors; the copies into the staging memory are made there too, or,
// with background snapshots, first thing on the writer thread), a writer
// thread writes this rank's files, then the ranks agree again on the commit
// group and rank 0 commits. A load: every rank checks the folder and prepares
// every item, the ranks agree, every rank applies, the ranks agree again.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <thread>
#include <utility>

#include "checkpoint/agree.hpp"
#include "checkpoint/items.hpp"
#include "checkpoint/layout.hpp"
#include "checkpoint/staging.hpp"
#include "dopt/distributed/checkpointer.hpp"
#include "dopt/distributed/diloco.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/distributed/zero_stage3.hpp"
#include "dopt/actors/internal/sim_hooks.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/actors/internal/call_label.hpp"
#include "dopt/optim/internal/write_fence.hpp"

namespace dopt {

namespace fs = std::filesystem;
using checkpoint::Bundle;
using checkpoint::FileEntry;
using checkpoint::FileJob;
using checkpoint::Identity;
using checkpoint::Item;

namespace {

bool valid_name(const std::string& s, const char* extra) {
  if (s.empty() || s == "." || s == "..") return false;
  return std::all_of(s.begin(), s.end(), [&](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view(extra).find(c) != std::string_view::npos;
  });
}

/// The digest as a number the ranks can compare.
std::int64_t digest_value(const Identity& id) {
  return static_cast<std::int64_t>(std::stoull(id.digest(), nullptr, 16));
}

/// Runs f; a filesystem error becomes an IOError of `op` naming it.
template <class F>
void with_io_errors(const char* op, int rank, F&& f) {
  try {
    f();
  } catch (const fs::filesystem_error& e) {
    throw IOError(op, e.what(), rank);
  }
}

}  // namespace

struct Checkpointer::Impl {
  CheckpointerOptions options;
  ProcessGroup group, commit;
  int rank = 0, world_size = 0;
  std::string run;
  std::vector<std::unique_ptr<Item>> items;
  std::thread writer;
  Future<void> in_flight;
  /// Ready once the save in flight no longer reads the registered objects.
  Future<void> snapshot_taken;
  /// The snapshots' memory, kept from one save to the next (shared with the writer).
  std::shared_ptr<checkpoint::Staging> staging = std::make_shared<checkpoint::Staging>();  // the save the writer runs (invalid: none since the last wait)

  void add(std::unique_ptr<Item> item, const char* op) {
    if (!valid_name(item->name(), "-_."))
      throw ValueError(op, "the name '" + item->name() + "' is not one of letters, digits, '-', '_' and '.'", rank);
    for (const auto& i : items)
      if (i->name() == item->name()) throw ValueError(op, "an item named '" + item->name() + "' is already registered", rank);
    items.push_back(std::move(item));
  }

  void check_same_ranks(const ProcessGroup& other, const char* op, const std::string& what) const {
    if (!other.valid() || other.ranks() != group.ranks())
      throw ValueError(op, what + "'s process group must have the ranks of CheckpointerOptions::group (its files are "
                              "named by rank in the checkpoint's folder)", rank);
  }

  Identity identity(std::int64_t step) const {
    Identity id;
    id.step = step;
    id.run = run;
    id.world_size = world_size;
    bool replicated = false, per_rank = false;
    for (const auto& item : items) {
      id.items.push_back(item->entry());
      if (item->in_bundle()) (item->entry().placement == "replicated" ? replicated : per_rank) = true;
      for (FileEntry& f : item->own_files(world_size)) id.files.push_back(std::move(f));
    }
    if (replicated) id.files.push_back({checkpoint::kReplicatedFile, 0});
    if (per_rank)
      for (int r = 0; r < world_size; ++r) id.files.push_back({checkpoint::rank_file_name(r, world_size), r});
    std::sort(id.files.begin(), id.files.end(), [](const FileEntry& a, const FileEntry& b) { return a.path < b.path; });
    return id;
  }

  /// Waits for the writer (its error stays in its future) and joins it.
  void finish_writer() noexcept {
    if (!writer.joinable()) return;
    in_flight.wait();
    detail::sim::join_thread(writer);
  }

  /// Waits for the save in flight and forgets it; `report`: rethrows its
  /// error (wait() forgets a save it reported, so no call reports one twice).
  void settle(bool report) {
    finish_writer();
    const Future<void> f = std::exchange(in_flight, {});
    snapshot_taken = {};
    if (report && f.valid())
      if (std::exception_ptr e = f.exception()) std::rethrow_exception(e);
  }

  /// The caller's part of a save: the files this rank writes, with the items'
  /// snapshots, their tensors copied into the staging memory (only those on
  /// a device with background snapshots: the writer copies the rest). An
  /// item's error is kept in *err and the others still run (a sharded item's
  /// save is a collective of its own group).
  std::vector<FileJob> snapshot(const Identity& id, const std::string& tmp, std::exception_ptr* err) {
    static constexpr const char* op = "Checkpointer::save";
    FileJob replicated{(fs::path(tmp) / checkpoint::kReplicatedFile).string(), {}, ""};
    FileJob mine{(fs::path(tmp) / checkpoint::rank_file_name(rank, world_size)).string(), {}, ""};
    const checkpoint::SaveContext ctx{tmp, &id, rank};
    std::vector<FileJob> own;  // the items' own files
    for (const auto& item : items) {
      const bool rep = item->entry().placement == "replicated";
      if (item->in_bundle() && rep && rank != 0) continue;  // rank 0 writes the replicated items
      try {
        with_io_errors(op, rank, [&] {
          item->snapshot(rep ? replicated.bundle : mine.bundle, ctx);
          for (FileJob& f : item->snapshot_files(ctx)) own.push_back(std::move(f));
        });
      } catch (...) {
        if (!*err) *err = std::current_exception();
      }
    }
    std::vector<FileJob> jobs = std::move(own);
    for (FileJob* job : {&replicated, &mine}) {
      const std::string file = fs::path(job->path).filename().string();
      if (!std::any_of(id.files.begin(), id.files.end(),
                       [&](const FileEntry& f) { return f.path == file && f.rank == rank; }))
        continue;
      for (auto& [k, v] : id.metadata(rank)) job->bundle.metadata[k] = v;
      jobs.push_back(std::move(*job));
    }
    if (!*err) {
      try {
        copy_jobs(*staging, jobs, options.background_snapshot);
      } catch (...) {
        *err = std::current_exception();
      }
    }
    return jobs;
  }

  /// Copies the jobs' tensors into the staging memory (see Staging::copy).
  static void copy_jobs(checkpoint::Staging& staging, std::vector<FileJob>& jobs, bool device_only) {
    for (FileJob& job : jobs) staging.copy(job.staged_prefix, job.bundle.tensors, device_only);
  }

  /// Loads folder (see load()); returns the step it holds.
  std::int64_t load_folder(const std::string& folder, const char* op);
};

Checkpointer::Checkpointer(CheckpointerOptions options) : impl_(std::make_unique<Impl>()) {
  dopt::detail::CallScope call_scope("Checkpointer::Checkpointer()");
  static constexpr const char* op = "Checkpointer";
  Impl& m = *impl_;
  m.options = std::move(options);
  m.group = m.options.group;
  if (!m.group.valid() || !m.group.is_member())
    throw ValueError(op, "CheckpointerOptions::group must be a valid group this rank is a member of");
  m.rank = m.group.rank();
  m.world_size = m.group.size();
  if (m.options.dir.empty()) throw ValueError(op, "CheckpointerOptions::dir is empty", m.rank);
  if (m.options.keep_last < 0)
    throw ValueError(op, "CheckpointerOptions::keep_last is " + std::to_string(m.options.keep_last) +
                             " (expected >= 0; 0 keeps every checkpoint)", m.rank);
  if (!m.options.run.empty() && !valid_name(m.options.run, "-_"))
    throw ValueError(op, "CheckpointerOptions::run '" + m.options.run + "' is not one of letters, digits, '-' and '_'",
                     m.rank);
  m.commit = m.options.commit_group;
  if (m.commit.valid()) {
    if (!m.commit.is_member() || m.commit.ranks() != m.group.ranks())
      throw ValueError(op, "CheckpointerOptions::commit_group must have the ranks of CheckpointerOptions::group",
                       m.rank);
  } else {
    try {
      m.commit = m.group.new_group(m.group.ranks());
    } catch (const StateError&) {
      throw ValueError(op, "a Checkpointer over a group other than the world needs CheckpointerOptions::commit_group "
                           "(a second group over the same ranks, made with world.new_group(ranks))", m.rank);
    }
  }
  std::random_device rd;
  const std::uint64_t drawn = (std::uint64_t(rd()) << 32) ^ rd();
  const auto v = checkpoint::agree(m.commit, nullptr, static_cast<std::int64_t>(drawn), op, "");
  if (m.options.run.empty()) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v[0]));
    m.run = buf;
  } else {
    m.run = m.options.run;
  }
}

Checkpointer::~Checkpointer() {
  if (impl_) impl_->finish_writer();
}

void Checkpointer::add_tensors(const std::string& name, std::map<std::string, Tensor> tensors, Placement placement,
                               TensorValues values) {
  static constexpr const char* op = "Checkpointer::add_tensors";
  for (const auto& [k, t] : tensors) {
    if (k.empty()) throw ValueError(op, "'" + name + "': a tensor has an empty name", impl_->rank);
    if (!t.defined()) throw ValueError(op, "'" + name + "': the tensor '" + k + "' is undefined", impl_->rank);
  }
  impl_->add(checkpoint::make_tensors_item(name, std::move(tensors), placement, values), op);
}

void Checkpointer::add_optimizer(const std::string& name, optim::Optimizer& optimizer, Placement placement) {
  impl_->add(checkpoint::make_optimizer_item(name, optimizer, placement), "Checkpointer::add_optimizer");
}

void Checkpointer::add_optimizer(const std::string& name, optim::ZeroRedundancyOptimizer& optimizer) {
  static constexpr const char* op = "Checkpointer::add_optimizer";
  impl_->check_same_ranks(optimizer.process_group(), op, "ZeroRedundancyOptimizer '" + name + "'");
  impl_->add(checkpoint::make_zero_item(name, optimizer), op);
}

void Checkpointer::add_optimizer(const std::string& name, optim::ShardedUnits& units) {
  static constexpr const char* op = "Checkpointer::add_optimizer";
  impl_->check_same_ranks(units.process_group(), op, "ShardedUnits '" + name + "'");
  impl_->add(checkpoint::make_sharded_units_item(name, units), op);
}

void Checkpointer::add_optimizer(const std::string& name, optim::PostLocalSGDOptimizer& optimizer) {
  static constexpr const char* op = "Checkpointer::add_optimizer";
  if (const auto* d = dynamic_cast<const optim::DiLoCoAverager*>(&optimizer.averager()))
    impl_->check_same_ranks(d->process_group(), op, "the DiLoCoAverager of '" + name + "'");
  impl_->add(checkpoint::make_post_local_sgd_item(name, optimizer), op);
}

void Checkpointer::add_rng(const std::string& name, std::mt19937_64& rng, Placement placement) {
  impl_->add(checkpoint::make_rng_item(name, rng, placement), "Checkpointer::add_rng");
}

void Checkpointer::add_rng(const std::string& name, std::uint64_t& seed, std::uint64_t& counter, Placement placement) {
  impl_->add(checkpoint::make_counter_rng_item(name, seed, counter, placement), "Checkpointer::add_rng");
}

void Checkpointer::add_data_position(const std::string& name, DistributedSampler& sampler, std::int64_t& offset) {
  impl_->add(checkpoint::make_data_position_item(name, sampler, offset), "Checkpointer::add_data_position");
}

void Checkpointer::add_extras(const std::string& name, std::map<std::string, std::string>& extras,
                              Placement placement, ExtrasCheck check) {
  impl_->add(checkpoint::make_extras_item(name, extras, placement, std::move(check)), "Checkpointer::add_extras");
}

void Checkpointer::save(std::int64_t step) {
  dopt::detail::CallScope call_scope("Checkpointer::save()");
  save_async(step);
  wait();
}

Future<void> Checkpointer::save_async(std::int64_t step) {
  dopt::detail::CallScope call_scope("Checkpointer::save_async()");
  static constexpr const char* op = "Checkpointer::save";
  Impl& m = *impl_;
  if (step < 0) throw ValueError(op, "the step is " + std::to_string(step) + " (expected >= 0)", m.rank);
  m.settle(/*report=*/true);
  const Identity id = m.identity(step);
  const std::string final_dir = folder(step);
  const std::string tmp = final_dir + ".tmp";

  // Rank 0 makes the folder; every rank must save the same items at the same step.
  std::exception_ptr err;
  if (m.rank == 0) {
    try {
      with_io_errors(op, m.rank, [&] {
        fs::remove_all(tmp);
        fs::create_directories(tmp);
      });
    } catch (...) {
      err = std::current_exception();
    }
  }
  const auto digests = checkpoint::agree(m.commit, err, digest_value(id), op, "nothing was saved");
  for (int r = 1; r < m.world_size; ++r)
    if (digests[static_cast<std::size_t>(r)] != digests[0])
      throw ValueError(op, "rank " + std::to_string(r) + " saves another step or other items than rank 0 (every "
                           "rank saves the same step with the same items registered, in the same order); nothing "
                           "was saved", m.rank);

  std::exception_ptr snapshot_error;
  std::vector<FileJob> jobs = m.snapshot(id, tmp, &snapshot_error);

  Promise<void> done, taken;
  m.in_flight = done.get_future();
  m.snapshot_taken = taken.get_future();
  if (!m.options.background_snapshot) taken.set_value();
  else dopt::detail::fence_add(m.snapshot_taken);  // dopt's optimizers and averagers wait for the copies
  // A simulated task under deterministic simulation (scheduled like the ranks).
  m.writer = detail::sim::make_thread([call = dopt::detail::current_call(), done, taken, jobs = std::move(jobs), err = snapshot_error, commit = m.commit, id, tmp, final_dir,
                          dir = m.options.dir, keep_last = m.options.keep_last, hook = m.options.before_write,
                          on_commit = m.options.on_commit, rank = m.rank, staging = m.staging,
                          background = m.options.background_snapshot]() mutable {
    dopt::detail::CallScope call_scope(call);  // its collectives name the save that started it
    try {
      if (background) {
        // The snapshot's copies; the caller's wait_snapshot() returns once they are made.
        try {
          if (!err) Impl::copy_jobs(*staging, jobs, /*device_only=*/false);
        } catch (...) {
          err = std::current_exception();
        }
        taken.set_value();
      }
      if (!err) {
        try {
          for (const FileJob& job : jobs) {
            if (hook) hook(job.path);
            fs::create_directories(fs::path(job.path).parent_path());
            write_safetensors(job.path, job.bundle.tensors, job.bundle.metadata);
          }
        } catch (...) {
          err = std::current_exception();
        }
      }
      // The snapshot's memory goes back to the staging before the commit.
      for (FileJob& job : jobs) staging->give_back(job.staged_prefix, std::move(job.bundle.tensors));
      jobs.clear();
      const std::string what = "the checkpoint of step " + std::to_string(id.step) + " was not committed";
      checkpoint::agree(commit, err, 0, op, what + " (" + tmp + " is left incomplete)");
      std::exception_ptr commit_error;
      if (rank == 0) {
        try {
          with_io_errors(op, rank, [&] {
            checkpoint::write_manifest(tmp, id, op, rank);
            fs::remove_all(final_dir);
            fs::rename(tmp, final_dir);
          });
          CheckpointCommit report{id.step, final_dir, {}, {}};
          report.removed = checkpoint::prune(dir, keep_last, on_commit ? &report.kept : nullptr);
          if (on_commit) on_commit(report);
        } catch (...) {
          commit_error = std::current_exception();
        }
      }
      checkpoint::agree(commit, commit_error, 0, op, what);
      done.set_value();
    } catch (...) {
      done.set_exception(std::current_exception());
    }
  }, "checkpoint writer");
  return m.in_flight;
}

void Checkpointer::check_dir() {
  static constexpr const char* op = "Checkpointer::check_dir";
  Impl& m = *impl_;
  m.finish_writer();  // the commit group is the writer's until then
  std::exception_ptr err;
  if (const std::string why = checkpoint::probe_dir(m.options.dir, m.rank); !why.empty())
    err = std::make_exception_ptr(IOError(op, why, m.rank));
  checkpoint::agree(m.commit, err, 0, op, "the checkpoint folder " + m.options.dir + " cannot be used");
}

void Checkpointer::wait() {
  impl_->settle(/*report=*/true);
}

void Checkpointer::wait_snapshot() {
  Impl& m = *impl_;
  if (m.snapshot_taken.valid()) m.snapshot_taken.wait();
}

void Checkpointer::load(std::int64_t step) {
  dopt::detail::CallScope call_scope("Checkpointer::load()");
  static constexpr const char* op = "Checkpointer::load";
  Impl& m = *impl_;
  if (step < 0) throw ValueError(op, "the step is " + std::to_string(step) + " (expected >= 0)", m.rank);
  m.settle(/*report=*/false);
  m.load_folder(folder(step), op);
}

std::optional<std::int64_t> Checkpointer::load_latest() {
  dopt::detail::CallScope call_scope("Checkpointer::load_latest()");
  static constexpr const char* op = "Checkpointer::load_latest";
  Impl& m = *impl_;
  m.settle(/*report=*/false);
  // Rank 0 chooses, so that every rank loads the same step.
  std::exception_ptr err;
  std::int64_t found = -1;
  if (m.rank == 0) {
    try {
      found = checkpoint::latest_step(m.options.dir, op, m.rank).value_or(-1);
    } catch (...) {
      err = std::current_exception();
    }
  }
  const std::int64_t step = checkpoint::agree(m.commit, err, found, op, "nothing was loaded")[0];
  if (step < 0) return std::nullopt;
  m.load_folder(folder(step), op);
  return step;
}

std::int64_t Checkpointer::load_from(const std::string& folder) {
  dopt::detail::CallScope call_scope("Checkpointer::load_from()");
  static constexpr const char* op = "Checkpointer::load_from";
  Impl& m = *impl_;
  m.settle(/*report=*/false);
  return m.load_folder(folder, op);
}

std::int64_t Checkpointer::Impl::load_folder(const std::string& folder, const char* op) {
  Identity id;
  checkpoint::LoadContext ctx{folder, &id, rank, world_size, {}};
  std::exception_ptr err;
  try {
    id = checkpoint::read_manifest(folder, op, rank);
    checkpoint::verify_files(folder, id, op, rank);
    std::optional<Bundle> replicated, mine;
    for (const auto& item : items) {
      auto saved = std::find_if(id.items.begin(), id.items.end(),
                                [&](const checkpoint::ItemEntry& e) { return e.name == item->name(); });
      if (saved == id.items.end())
        throw StateDictError(op, folder + " holds no item '" + item->name() + "' (it was saved without it)", rank);
      if (saved->kind != item->entry().kind)
        throw StateDictError(op, folder + ": the item '" + item->name() + "' was saved as " + saved->kind +
                                     ", but is registered as " + item->entry().kind, rank);
      if (saved->placement == "per_rank" && id.world_size != world_size)
        throw StateDictError(op, folder + ": the item '" + item->name() + "' (" + saved->kind + ") is per-rank state "
                                     "saved at " + std::to_string(id.world_size) + " ranks, which cannot be loaded at " +
                                     std::to_string(world_size) + " ranks (it does not reshard); load it at " +
                                     std::to_string(id.world_size) + " ranks", rank);
      const Bundle* in = nullptr;
      static const Bundle none;
      if (saved->placement == "replicated" || saved->placement == "per_rank") {
        const bool rep = saved->placement == "replicated";
        std::optional<Bundle>& slot = rep ? replicated : mine;
        ctx.file = (fs::path(folder) / (rep ? std::string(checkpoint::kReplicatedFile)
                                            : checkpoint::rank_file_name(rank, world_size))).string();
        if (!slot) slot = read_safetensors(ctx.file);
        in = &*slot;
      } else {
        ctx.file = (fs::path(folder) / item->name()).string();
        in = &none;
      }
      item->prepare(*in, ctx);
    }
  } catch (...) {
    err = std::current_exception();
  }
  checkpoint::agree(commit, err, 0, op, "nothing was loaded");
  try {
    for (const auto& item : items) item->apply(ctx);
  } catch (...) {
    err = std::current_exception();
  }
  checkpoint::agree(commit, err, 0, op, "some items were loaded and others not: load again before training");
  run = id.run;
  return id.step;
}

const std::string& Checkpointer::dir() const noexcept { return impl_->options.dir; }
const std::string& Checkpointer::run() const noexcept { return impl_->run; }
std::string Checkpointer::folder(std::int64_t step) const {
  return (fs::path(impl_->options.dir) / checkpoint::step_dir_name(step)).string();
}

}  // namespace dopt
