// The MPI plane (mpi_plane.hpp).
#include "transport/mpi/mpi_plane.hpp"
#include "dopt/runtime/settings.hpp"

#include "dopt/runtime/error.hpp"

#ifndef DOPT_HAVE_MPI

namespace dopt::detail::mpi {

bool available() noexcept { return false; }

std::shared_ptr<GroupPlane> make_world_plane(const LaunchEnv& env, std::shared_ptr<PeerTable>,
                                             std::vector<std::string>) {
  throw ValueError("init_process_group",
                   "DOPT_BACKEND=mpi, but this build of dopt has no MPI plane (MPI was not found when it was built; "
                   "install libopenmpi-dev and rebuild)",
                   env.rank);
}

}  // namespace dopt::detail::mpi

#else

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "plane/executor.hpp"
#include "dopt/actors/internal/call_label.hpp"
#include "plane/failure.hpp"
#include "plane/kernels.hpp"
#include "transport/mpi/scratch.hpp"

namespace dopt::detail::mpi {

bool available() noexcept { return true; }

namespace {

using Clock = std::chrono::steady_clock;

/// How long a wait goes on after a member was lost (see wait()).
constexpr auto kLostGrace = std::chrono::seconds(3);

/// Bytes of one round of all_reduce / reduce_scatter / all_gather: the
/// scratch memory of a call (DOPT_MPI_CHUNK_BYTES, default 16 MiB).
std::size_t chunk_bytes() {
  static const std::size_t v =
      static_cast<std::size_t>(settings::integer("DOPT_MPI_CHUNK_BYTES").value_or(std::int64_t{16} << 20));
  return v;
}

std::uint64_t fnv(const std::string& s) {
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

/// What every rank of this process's world shares: liveness, hosts, the
/// groups that new_group calls made and nobody took yet.
struct Shared {
  int rank = 0;
  std::shared_ptr<PeerTable> peers;
  std::vector<std::string> host_ids;
  std::mutex mutex;
  std::map<std::uint64_t, std::shared_ptr<GroupPlane>> fresh;
  /// The calls' scratch (reused: fresh memory faults in every page, and a
  /// std::vector also zeroed it), and the buffers of calls that failed,
  /// which MPI may still write (it cannot cancel a collective): never reused.
  ScratchPool scratch;
};

class MpiGroup final : public GroupPlane {
 public:
  MpiGroup(std::shared_ptr<Shared> sh, std::uint64_t gid, std::vector<int> members, MPI_Comm comm)
      : sh_(std::move(sh)),
        gid_(gid),
        members_(std::move(members)),
        comm_(comm),
        exec_([this](const Op& op) { execute(op); }, sh_->rank) {
    MPI_Comm_rank(comm_, &me_);
    for (int m : members_)
      other_host_.push_back(sh_->host_ids[static_cast<std::size_t>(m)] !=
                            sh_->host_ids[static_cast<std::size_t>(sh_->rank)]);
  }
  ~MpiGroup() override { exec_.stop("the process group was destroyed"); }

  void run(const OpPtr& op) override { exec_.run(op); }
  Future<void> run_async(const OpPtr& op) override { return exec_.run_async(op); }
  bool supports(const CollDesc& d) const override { return d.kind != CollKind::send && d.kind != CollKind::recv; }
  const char* name() const noexcept override { return "mpi"; }
  std::uint64_t bytes_to_other_hosts() const noexcept override { return bytes_.load(std::memory_order_relaxed); }
  std::shared_ptr<GroupPlane> made_group(std::uint64_t gid) const override {
    std::lock_guard<std::mutex> lock(sh_->mutex);
    auto it = sh_->fresh.find(gid);
    if (it == sh_->fresh.end()) return nullptr;
    auto g = it->second;
    sh_->fresh.erase(it);
    return g;
  }

 private:
  int n() const { return static_cast<int>(members_.size()); }
  std::string where() const { return group_str(gid_); }

  void execute(const Op& op);
  void match(const Op& op);
  void wait(std::vector<MPI_Request>& reqs, const Op& op, Clock::time_point deadline);
  void count(int to_group_rank, std::size_t bytes) {
    if (other_host_[static_cast<std::size_t>(to_group_rank)]) bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  void count_all_others(std::size_t bytes) {
    for (int g = 0; g < n(); ++g)
      if (g != me_) count(g, bytes);
  }

  /// Reduces the flat buffer data (total elements) into data on every member
  /// (root < 0) or on root only; others' data is left unchanged.
  void reduce_flat(const Op& op, char* data, std::int64_t total, int root, Clock::time_point deadline);
  void all_gather_into(const Op& op, const char* input, std::size_t bytes, const std::vector<char*>& outs,
                       Clock::time_point deadline);
  void reduce_scatter(const Op& op, Clock::time_point deadline);
  void new_groups(const Op& op);

  std::shared_ptr<Shared> sh_;
  std::uint64_t gid_;
  std::vector<int> members_;
  MPI_Comm comm_;
  int me_ = 0;
  std::vector<bool> other_host_;
  std::atomic<std::uint64_t> bytes_{0};
  std::string broken_;  // why the group is unusable ("" = usable); executor thread only
  SerialExecutor exec_;
};

void MpiGroup::wait(std::vector<MPI_Request>& reqs, const Op& op, Clock::time_point deadline) {
  const char* what = op.desc.who();
  std::uint64_t seen = ~std::uint64_t{0};  // look at the peers on the first poll
  Clock::time_point lost_at{};
  int lost_rank = -1;
  for (int polls = 0;; ++polls) {
    int done = 0;
    MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (done) return;
    if (sh_->peers->shutting_down()) {
      broken_ = "the runtime shut down during " + op.desc.str();
      throw StateError(what, broken_, sh_->rank);
    }
    if (sh_->peers->generation() != seen) {
      seen = sh_->peers->generation();
      for (int q : sh_->peers->order()) {
        if (sh_->peers->state(q) != PeerTable::lost) continue;
        if (std::find(members_.begin(), members_.end(), q) == members_.end()) continue;
        // A peer that finished this call and shut down may still owe MPI
        // the last bytes of it (they leave when its MPI progresses, at the
        // latest in MPI_Finalize at its exit): give it a grace period.
        if (lost_at == Clock::time_point{}) {
          lost_at = Clock::now();
          lost_rank = q;
        }
      }
    }
    if (lost_at != Clock::time_point{} && Clock::now() - lost_at > kLostGrace) {
      const int q = lost_rank;
      broken_ = "rank " + std::to_string(q) + " was lost during " + op.desc.str() + " in " + where() + ": " +
                sh_->peers->why(q);
      throw PeerLostError(what, broken_, sh_->rank);
    }
    if (Clock::now() >= deadline) {
      broken_ = op.desc.str() + " in " + where() + " (seq " + std::to_string(op.seq) + ") did not complete within " +
                std::to_string(op.timeout.count()) + " ms on the MPI plane (MPI cannot cancel it: the group is unusable)";
      throw TimeoutError(what, broken_, sh_->rank);
    }
    if (polls > 2000) std::this_thread::sleep_for(std::chrono::microseconds(polls > 20000 ? 200 : 20));
    else if (polls > 200) std::this_thread::yield();
  }
}

void MpiGroup::match(const Op& op) {
  // Every member's descriptor hash, then (only on a difference) the texts.
  const std::string mine = op.desc.str() + "|" + op.desc.extra + "|" + std::to_string(static_cast<int>(op.desc.order)) +
                           "|" + std::to_string(op.desc.pre_divisor);
  std::uint64_t h = fnv(mine);
  std::vector<std::uint64_t> all(static_cast<std::size_t>(n()));
  const auto deadline = Clock::now() + op.timeout;
  std::vector<MPI_Request> reqs(1);
  MPI_Iallgather(&h, 8, MPI_BYTE, all.data(), 8, MPI_BYTE, comm_, &reqs[0]);
  wait(reqs, op, deadline);
  if (std::all_of(all.begin(), all.end(), [&](std::uint64_t x) { return x == all[0]; })) return;
  // Each member's text: its call (kDesc bytes), then its caller (the rest).
  constexpr std::size_t kText = 512, kDesc = 448;
  std::string text = op.desc.str().substr(0, kDesc - 1);
  text.resize(kDesc, '\0');
  text += op.desc.caller.substr(0, kText - kDesc - 1);
  text.resize(kText, '\0');
  std::string texts(kText * static_cast<std::size_t>(n()), '\0');
  MPI_Iallgather(text.data(), static_cast<int>(kText), MPI_BYTE, texts.data(), static_cast<int>(kText), MPI_BYTE,
                 comm_, &reqs[0]);
  wait(reqs, op, deadline);
  auto at = [&](int g) { return std::string(texts.c_str() + static_cast<std::size_t>(g) * kText); };
  auto caller_at = [&](int g) { return std::string(texts.c_str() + static_cast<std::size_t>(g) * kText + kDesc); };
  std::vector<std::pair<int, std::string>> calls;
  for (int g = 0; g < n(); ++g) calls.emplace_back(members_[static_cast<std::size_t>(g)], caller_at(g));
  for (int g = 1; g < n(); ++g)
    if (all[static_cast<std::size_t>(g)] != all[0])
      throw CollectiveMismatchError(op.desc.who(),
                                    mismatch_text(calls, "collective mismatch in " + where() + " at seq " +
                                                             std::to_string(op.seq) + ": rank " +
                                                             std::to_string(members_[0]) + " called " + at(0) +
                                                             " but rank " +
                                                             std::to_string(members_[static_cast<std::size_t>(g)]) +
                                                             " called " + at(g)),
                                    sh_->rank);
}

void MpiGroup::reduce_flat(const Op& op, char* data, std::int64_t total, int root, Clock::time_point deadline) {
  const DType dt = op.desc.dtype;
  const std::size_t item = itemsize(dt);
  const ReduceSpec spec = reduce_spec_of(op, total);
  const std::int64_t chunk = std::max<std::int64_t>(n(), static_cast<std::int64_t>(chunk_bytes() / item));
  Scratch scratch(sh_->scratch), result(sh_->scratch);
  std::vector<int> counts(static_cast<std::size_t>(n())), displs(static_cast<std::size_t>(n()));
  std::vector<int> rcounts(static_cast<std::size_t>(n())), rdispls(static_cast<std::size_t>(n()));
  std::vector<MPI_Request> reqs(1);
  for (std::int64_t lo = 0; lo < total; lo += chunk) {
    const std::int64_t len = std::min(chunk, total - lo);
    auto bound = [&](int k) { return len * k / n(); };
    for (int k = 0; k < n(); ++k) {
      counts[static_cast<std::size_t>(k)] = static_cast<int>((bound(k + 1) - bound(k)) * static_cast<std::int64_t>(item));
      displs[static_cast<std::size_t>(k)] = static_cast<int>(bound(k) * static_cast<std::int64_t>(item));
    }
    const int mine = counts[static_cast<std::size_t>(me_)];
    for (int k = 0; k < n(); ++k) {
      rcounts[static_cast<std::size_t>(k)] = mine;
      rdispls[static_cast<std::size_t>(k)] = k * mine;
    }
    char* in = scratch.get(static_cast<std::size_t>(mine) * static_cast<std::size_t>(n()));
    char* base = data + lo * static_cast<std::int64_t>(item);
    MPI_Ialltoallv(base, counts.data(), displs.data(), MPI_BYTE, in, rcounts.data(), rdispls.data(),
                   MPI_BYTE, comm_, &reqs[0]);
    for (int k = 0; k < n(); ++k)
      if (k != me_) count(k, static_cast<std::size_t>(counts[static_cast<std::size_t>(k)]));
    wait(reqs, op, deadline);
    // My slice, every member's contribution in the group's order.
    std::vector<const void*> ins;
    for (int k = 0; k < n(); ++k) ins.push_back(in + static_cast<std::size_t>(k) * mine);
    const std::int64_t my_count = mine / static_cast<std::int64_t>(item);
    char* my_out = base + displs[static_cast<std::size_t>(me_)];
    if (root >= 0 && root != me_) my_out = result.get(static_cast<std::size_t>(mine));
    if (my_count > 0) reduce_members(spec, ins, {my_out}, lo + bound(me_), my_count);
    if (root < 0) {
      MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, base, counts.data(), displs.data(), MPI_BYTE, comm_, &reqs[0]);
      count_all_others(static_cast<std::size_t>(mine));
    } else if (root == me_) {
      MPI_Igatherv(MPI_IN_PLACE, 0, MPI_BYTE, base, counts.data(), displs.data(), MPI_BYTE, root, comm_, &reqs[0]);
    } else {
      MPI_Igatherv(my_out, mine, MPI_BYTE, nullptr, nullptr, nullptr, MPI_BYTE, root, comm_, &reqs[0]);
      count(root, static_cast<std::size_t>(mine));
    }
    wait(reqs, op, deadline);
  }
}

void MpiGroup::all_gather_into(const Op& op, const char* input, std::size_t bytes, const std::vector<char*>& outs,
                               Clock::time_point deadline) {
  const std::size_t chunk = std::max<std::size_t>(1, chunk_bytes() / static_cast<std::size_t>(n()));
  Scratch scratch(sh_->scratch);
  std::vector<MPI_Request> reqs(1);
  for (std::size_t lo = 0; lo < bytes; lo += chunk) {
    const std::size_t len = std::min(chunk, bytes - lo);
    char* all = scratch.get(len * static_cast<std::size_t>(n()));
    MPI_Iallgather(input + lo, static_cast<int>(len), MPI_BYTE, all, static_cast<int>(len), MPI_BYTE, comm_,
                   &reqs[0]);
    count_all_others(len);
    wait(reqs, op, deadline);
    for (int k = 0; k < n(); ++k) std::memcpy(outs[static_cast<std::size_t>(k)] + lo, all + k * len, len);
  }
}

void MpiGroup::reduce_scatter(const Op& op, Clock::time_point deadline) {
  // tensors: [output, in_0, ..., in_{n-1}]; member k reduces in_k of everybody.
  const DType dt = op.desc.dtype;
  const std::size_t item = itemsize(dt);
  const Tensor& out = op.tensors[0];
  const std::int64_t total = out.numel();
  const ReduceSpec spec = reduce_spec_of(op, total);
  const std::int64_t chunk =
      std::max<std::int64_t>(1, static_cast<std::int64_t>(chunk_bytes() / item / static_cast<std::size_t>(n())));
  Scratch send_buf(sh_->scratch), recv_buf(sh_->scratch);
  std::vector<MPI_Request> reqs(1);
  for (std::int64_t lo = 0; lo < total; lo += chunk) {
    const std::int64_t len = std::min(chunk, total - lo);
    const std::size_t b = static_cast<std::size_t>(len) * item;
    char* send = send_buf.get(b * static_cast<std::size_t>(n()));
    char* recv = recv_buf.get(b * static_cast<std::size_t>(n()));
    for (int k = 0; k < n(); ++k)
      std::memcpy(send + k * b,
                  static_cast<const char*>(op.tensors[static_cast<std::size_t>(k) + 1].data_ptr()) + lo * item, b);
    MPI_Ialltoall(send, static_cast<int>(b), MPI_BYTE, recv, static_cast<int>(b), MPI_BYTE, comm_, &reqs[0]);
    count_all_others(b);
    wait(reqs, op, deadline);
    std::vector<const void*> ins;
    for (int k = 0; k < n(); ++k) ins.push_back(recv + k * b);
    reduce_members(spec, ins, {static_cast<char*>(out.data_ptr()) + lo * static_cast<std::int64_t>(item)}, lo, len);
  }
}

void MpiGroup::new_groups(const Op& op) {
  // Every world member is in this call, in the same order of groups: a
  // collective MPI_Comm_split per group (blocking: MPI has no split with a
  // deadline).
  for (const GroupSpec& spec : op.creates) {
    const bool member = std::find(spec.members.begin(), spec.members.end(), sh_->rank) != spec.members.end();
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_Comm_split(comm_, member ? 0 : MPI_UNDEFINED, sh_->rank, &sub);
    if (!member) continue;
    auto g = std::make_shared<MpiGroup>(sh_, spec.gid, spec.members, sub);
    std::lock_guard<std::mutex> lock(sh_->mutex);
    sh_->fresh[spec.gid] = std::move(g);
  }
}

void MpiGroup::execute(const Op& op) {
  const char* what = op.desc.who();
  if (!broken_.empty()) throw StateError(what, where() + " is unusable: " + broken_, sh_->rank);
  const auto deadline = Clock::now() + op.timeout;
  match(op);
  std::vector<MPI_Request> reqs(1);
  switch (op.desc.kind) {
    case CollKind::barrier: {
      MPI_Ibarrier(comm_, &reqs[0]);
      wait(reqs, op, deadline);
      return;
    }
    case CollKind::new_group: return new_groups(op);
    case CollKind::all_reduce:
    case CollKind::reduce: {
      const Tensor& t = op.tensors[0];
      const int root = op.desc.kind == CollKind::reduce ? op.desc.root : -1;
      return reduce_flat(op, static_cast<char*>(t.data_ptr()), t.numel(), root, deadline);
    }
    case CollKind::all_reduce_coalesced: {
      std::int64_t total = 0;
      for (const auto& t : op.tensors) total += t.numel();
      Scratch flat_buf(sh_->scratch);
      char* flat = flat_buf.get(static_cast<std::size_t>(total) * itemsize(op.desc.dtype));
      std::size_t off = 0;
      for (const auto& t : op.tensors) {
        std::memcpy(flat + off, t.data_ptr(), t.nbytes());
        off += t.nbytes();
      }
      reduce_flat(op, flat, total, -1, deadline);
      off = 0;
      for (const auto& t : op.tensors) {
        std::memcpy(t.data_ptr(), flat + off, t.nbytes());
        off += t.nbytes();
      }
      return;
    }
    case CollKind::broadcast:
    case CollKind::broadcast_coalesced: {
      Scratch flat(sh_->scratch);
      char* data = nullptr;
      std::size_t bytes = 0;
      if (op.desc.kind == CollKind::broadcast) {
        data = static_cast<char*>(op.tensors[0].data_ptr());
        bytes = op.tensors[0].nbytes();
      } else {
        for (const auto& t : op.tensors) bytes += t.nbytes();
        data = flat.get(bytes);
        std::size_t off = 0;
        if (me_ == op.desc.root)
          for (const auto& t : op.tensors) {
            std::memcpy(data + off, t.data_ptr(), t.nbytes());
            off += t.nbytes();
          }
      }
      const std::size_t step = std::size_t{1} << 30;
      for (std::size_t lo = 0; lo < bytes; lo += step) {
        const int len = static_cast<int>(std::min(step, bytes - lo));
        MPI_Ibcast(data + lo, len, MPI_BYTE, op.desc.root, comm_, &reqs[0]);
        if (me_ == op.desc.root) count_all_others(static_cast<std::size_t>(len));
        wait(reqs, op, deadline);
      }
      if (op.desc.kind == CollKind::broadcast_coalesced && me_ != op.desc.root) {
        std::size_t off = 0;
        for (const auto& t : op.tensors) {
          std::memcpy(t.data_ptr(), data + off, t.nbytes());
          off += t.nbytes();
        }
      }
      return;
    }
    case CollKind::all_gather: {
      std::vector<char*> outs;
      for (int k = 0; k < n(); ++k) outs.push_back(static_cast<char*>(op.tensors[static_cast<std::size_t>(k) + 1].data_ptr()));
      return all_gather_into(op, static_cast<const char*>(op.tensors[0].data_ptr()), op.tensors[0].nbytes(), outs,
                             deadline);
    }
    case CollKind::all_gather_flat: {
      const std::size_t b = op.tensors[0].nbytes();
      std::vector<char*> outs;
      for (int k = 0; k < n(); ++k) outs.push_back(static_cast<char*>(op.tensors[1].data_ptr()) + k * b);
      return all_gather_into(op, static_cast<const char*>(op.tensors[0].data_ptr()), b, outs, deadline);
    }
    case CollKind::reduce_scatter: return reduce_scatter(op, deadline);
    case CollKind::send:
    case CollKind::recv: break;
  }
  throw StateError(what, "the MPI plane does not run " + op.desc.str(), sh_->rank);
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

std::shared_ptr<GroupPlane> make_world_plane(const LaunchEnv& env, std::shared_ptr<PeerTable> peers,
                                             std::vector<std::string> host_ids) {
  const char* op = "init_process_group";
  int inited = 0, provided = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    std::atexit(finalize_at_exit);
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE)
    throw StateError(op, "DOPT_BACKEND=mpi needs an MPI library with MPI_THREAD_MULTIPLE; this one provides level " +
                             std::to_string(provided), env.rank);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != env.world_size || rank != env.rank)
    throw ValueError(op, "DOPT_BACKEND=mpi: MPI_COMM_WORLD has " + std::to_string(size) + " ranks and this is rank " +
                             std::to_string(rank) + ", but the launch says rank " + std::to_string(env.rank) + " of " +
                             std::to_string(env.world_size) +
                             " (start the ranks with mpirun or srun, not with another launcher)",
                     env.rank);
  MPI_Comm world = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &world);
  auto sh = std::make_shared<Shared>();
  sh->rank = env.rank;
  sh->peers = std::move(peers);
  sh->host_ids = std::move(host_ids);
  std::vector<int> members;
  for (int r = 0; r < env.world_size; ++r) members.push_back(r);
  return std::make_shared<MpiGroup>(sh, 0, std::move(members), world);
}

}  // namespace dopt::detail::mpi

#endif
