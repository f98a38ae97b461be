#include "transport/shm/shm_plane.hpp"
#include "dopt/runtime/settings.hpp"

#include <algorithm>
#include <cstdlib>

#include "dopt/actors/internal/sim_hooks.hpp"
#include "transport/shm/algorithms.hpp"

namespace dopt::detail::shm_plane {

namespace {

std::size_t env_bytes(const char* name, std::size_t fallback) {
  return static_cast<std::size_t>(settings::integer(name).value_or(static_cast<long long>(fallback)));
}

}  // namespace

ShmPlane::Options ShmPlane::Options::from_env(int ranks_on_host, bool processes) {
  Options o;
  o.heap_bytes = processes ? env_bytes("DOPT_SHM_HEAP_BYTES", 256u << 20) / 4096 * 4096 : 0;
  o.buf_bytes = env_bytes("DOPT_SHM_BUFFER_BYTES", o.buf_bytes) / 64 * 64;
  o.small_bytes = std::min(o.buf_bytes, env_bytes("DOPT_SHM_SMALL_BYTES", o.small_bytes));
  if (settings::flag("DOPT_SHM_STAGED").value_or(false)) o.staged_only = true;
  if (const auto cma = settings::flag("DOPT_SHM_CMA")) o.cma = o.p2p_cma = *cma;
  if (o.staged_only) o.cma = o.p2p_cma = false;
  o.policy = WaitPolicy::for_ranks(ranks_on_host);
  return o;
}

// --- ShmGroup ---------------------------------------------------------------------

ShmGroup::ShmGroup(std::shared_ptr<ShmPlane> plane, std::unique_ptr<Channel> channel)
    : plane_(std::move(plane)),
      ch_(std::move(channel)),
      exec_([this](const Op& op) { execute(op); }, ch_->my_global()) {}

ShmGroup::~ShmGroup() {
  // A rank that fails and lets its group go (e.g. a shrunk group held only
  // by its code) drops its queued calls: its peers must not wait for them.
  if (const auto dropped = exec_.stop("the process group was destroyed before the operation ran"))
    ch_->note_dropped(*dropped);
}

namespace {
bool is_p2p(const Op& op) { return op.desc.kind == CollKind::send || op.desc.kind == CollKind::recv; }
}  // namespace

void ShmGroup::run(const OpPtr& op) {
  if (sim::active()) [[unlikely]] sim::on_call(coll_name(op->desc.kind));  // a scheduling point; fault plans
  if (sim::active() && is_p2p(*op)) [[unlikely]] sim::model_call(*op);    // SimulateOptions::network
  if (is_p2p(*op)) return p2p().post(op).get();
  ch_->note_submitted(op->seq);
  exec_.run(op);
}

Future<void> ShmGroup::run_async(const OpPtr& op) {
  if (sim::active()) [[unlikely]] sim::on_call(coll_name(op->desc.kind));
  if (sim::active() && is_p2p(*op)) [[unlikely]] sim::model_call(*op);
  if (is_p2p(*op)) return p2p().post(op);
  ch_->note_submitted(op->seq);
  return exec_.run_async(op);
}

bool ShmGroup::supports(const CollDesc&) const { return true; }

P2PEngine& ShmGroup::p2p() {
  std::lock_guard<std::mutex> lock(p2p_mutex_);
  if (!p2p_) {
    p2p_ = std::make_unique<P2PEngine>(*ch_);
    if (!stopped_.empty()) p2p_->stop(stopped_);
  }
  return *p2p_;
}

void ShmGroup::stop(const std::string& why) {
  exec_.stop(why);
  std::lock_guard<std::mutex> lock(p2p_mutex_);
  stopped_ = why;
  if (p2p_) p2p_->stop(why);
}

std::shared_ptr<GroupPlane> ShmGroup::made_group(std::uint64_t gid) const { return plane_->take_group(gid); }

namespace {

/// A shrunk group on the shared-memory plane: fresh regions under a fresh
/// group id, so nothing of the old group's rounds can be read as the new one's.
class ShmBuilder final : public GroupBuilder {
 public:
  ShmBuilder(std::shared_ptr<ShmPlane> plane, std::uint64_t gid, std::shared_ptr<const std::vector<int>> members)
      : plane_(std::move(plane)), gid_(gid), members_(std::move(members)) {}
  ~ShmBuilder() override {
    try {
      seal();
    } catch (...) {
    }
  }
  void create() override {
    mine_ = plane_->create_region(gid_, static_cast<int>(members_->size()));
    created_ = true;
  }
  std::shared_ptr<GroupPlane> attach() override { return plane_->attach(gid_, members_, mine_); }
  void seal() override {
    if (!created_) return;
    created_ = false;
    plane_->directory().seal(gid_, plane_->rank());
  }

 private:
  std::shared_ptr<ShmPlane> plane_;
  std::uint64_t gid_;
  std::shared_ptr<const std::vector<int>> members_;
  Mapped mine_;
  bool created_ = false;
};

}  // namespace

std::unique_ptr<GroupBuilder> ShmGroup::builder(std::uint64_t gid,
                                                std::shared_ptr<const std::vector<int>> members) const {
  return std::make_unique<ShmBuilder>(plane_, gid, std::move(members));
}

bool ShmGroup::renew_process(int global_rank, std::int64_t pid) {
  plane_->directory().renew_process(global_rank, static_cast<int>(pid));
  return true;
}

void ShmGroup::execute(const Op& op) {
  Call c;
  c.op = &op;
  c.name = op.desc.who();
  if (sim::active()) [[unlikely]] sim::model_call(op);  // the network model's time (SimulateOptions::network)
  ch_->begin_call(c);
  switch (op.desc.kind) {
    case CollKind::all_reduce:
    case CollKind::all_reduce_coalesced: return all_reduce(*ch_, c);
    case CollKind::reduce: return reduce(*ch_, c);
    case CollKind::broadcast:
    case CollKind::broadcast_coalesced: return broadcast(*ch_, c);
    case CollKind::all_gather:
    case CollKind::all_gather_flat: return all_gather(*ch_, c);
    case CollKind::reduce_scatter: return reduce_scatter(*ch_, c);
    case CollKind::barrier: return barrier(*ch_, c);
    case CollKind::new_group: return plane_->new_groups(*ch_, c);
    case CollKind::send:
    case CollKind::recv: break;
  }
  throw StateError(c.name, "not a collective of the shared-memory plane", ch_->my_global());
}

// --- ShmPlane ---------------------------------------------------------------------

ShmPlane::ShmPlane(int global_rank, std::shared_ptr<RegionDirectory> directory, std::shared_ptr<PeerTable> peers,
                   Options options)
    : rank_(global_rank), dir_(std::move(directory)), peers_(std::move(peers)), options_(options) {}

Mapped ShmPlane::create_region(std::uint64_t gid, int n) {
  // Everything but the send heap is reserved now: the heap's blocks are
  // reserved as sends stage into them (p2p.cpp).
  const Layout layout = Layout::of(n, options_.buf_bytes, options_.heap_bytes);
  Mapped m = dir_->create(gid, rank_, layout.total, layout.heap);
  static_cast<ControlBlock*>(m.base)->group_size = static_cast<std::uint32_t>(n);
  return m;
}

std::unique_ptr<Channel> ShmPlane::make_channel(std::uint64_t gid, std::shared_ptr<const std::vector<int>> members,
                                                const Mapped& mine) {
  const auto& m = *members;
  auto pos = std::find(m.begin(), m.end(), rank_);
  if (pos == m.end()) throw StateError("shm", "rank " + std::to_string(rank_) + " is not in group " + std::to_string(gid));
  GroupMemory mem;
  GroupRegions regions = dir_->open_group(
      gid, m, rank_, mine, Layout::of(static_cast<int>(m.size()), options_.buf_bytes, options_.heap_bytes).total);
  mem.base = std::move(regions.base);
  mem.keep = std::move(regions.keep);
  mem.board = std::move(regions.board);
  mem.buf_bytes = options_.buf_bytes;
  mem.small_bytes = options_.small_bytes;
  mem.heap_bytes = options_.heap_bytes;
  mem.shared = dir_->shared();
  mem.in_process = dir_->in_process() && !options_.staged_only;
  auto ch = std::make_unique<Channel>(gid, static_cast<int>(pos - m.begin()), std::move(members), std::move(mem), peers_,
                                      options_.policy);
  ch->probe_cma(options_.cma, options_.p2p_cma);
  return ch;
}

std::shared_ptr<ShmGroup> ShmPlane::attach(std::uint64_t gid, std::shared_ptr<const std::vector<int>> members,
                                           const Mapped& mine) {
  auto g = std::make_shared<ShmGroup>(shared_from_this(), make_channel(gid, std::move(members), mine));
  groups_.add(gid, g);
  return g;
}

std::shared_ptr<ShmGroup> ShmPlane::take_group(std::uint64_t gid) { return groups_.take(gid); }

void ShmPlane::new_groups(Channel& world, Call& c) {
  const Op& op = *c.op;
  // Regions first, so that they exist once this rank announces the call.
  std::vector<std::pair<const GroupSpec*, Mapped>> mine;
  auto drop = [&] {
    for (auto& [spec, m] : mine) dir_->seal(spec->gid, rank_);
  };
  try {
    for (const auto& spec : op.creates)
      if (std::find(spec.members.begin(), spec.members.end(), rank_) != spec.members.end())
        mine.emplace_back(&spec, create_region(spec.gid, static_cast<int>(spec.members.size())));
    const std::uint64_t k = world.begin_round(c);
    world.publish(k, op);
    world.signal(Channel::A(k));
    world.wait_all(Channel::A(k), c);
    world.match(k, c);
    for (auto& [spec, m] : mine) {
      groups_.add_fresh(spec->gid, attach(spec->gid, std::make_shared<const std::vector<int>>(spec->members), m));
    }
    world.signal(Channel::B(k));
    world.wait_all(Channel::B(k), c);  // every member mapped every region
  } catch (...) {
    drop();
    throw;
  }
  drop();  // sealed: the names go, the mappings stay
}

void ShmPlane::shutdown(const std::string& why) {
  groups_.shutdown(why, [&] { peers_->shut_down(); });
}

}  // namespace dopt::detail::shm_plane
