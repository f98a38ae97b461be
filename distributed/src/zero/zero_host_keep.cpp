// ZeroBuddyUpdate::host_memory: the segment that holds a rank's shard, the
// owner's journaled update and a buddy's rebuild (zero_host_memory.hpp; the
// design in docs/fault-tolerance-optimizers.md, "Host memory"). ZeroRedundancyOptimizer's
// side: zero_host_memory.cpp.
#include "zero_host_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "dopt/runtime/error.hpp"
#include "dopt/optim/internal/chunk_journal.hpp"

namespace dopt::optim::zero_detail {
namespace {

constexpr std::uint64_t kMagic = 0x31706565686b6f64ull;  // "dokheep1"
constexpr const char* kOp = "ZeroRedundancyOptimizer (host_memory)";

struct KeepHeader {
  std::uint64_t magic;
  std::int64_t nparams;
  std::int64_t j_valid, j_step, j_param, j_begin, j_end, j_done, j_saved, j_line;
  std::int64_t j_present_before;
  std::int64_t ready;
  std::int64_t j_saved_mask;  // the entries whose pre-images the chunk in flight saves
  std::int64_t chunk, bytes;  // the plan's, checked by open()
};

std::int64_t align64(std::int64_t x) { return (x + 63) & ~std::int64_t{63}; }
std::int64_t ld(const std::int64_t& x) { return __atomic_load_n(&x, __ATOMIC_ACQUIRE); }
void st(std::int64_t& x, std::int64_t v) { __atomic_store_n(&x, v, __ATOMIC_RELEASE); }

std::atomic<std::int64_t> g_serial{0};

std::int64_t numel_of(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

}  // namespace

bool elementwise_optimizer(const std::string& o) {
  static const char* const kAll[] = {"SGD",     "Adam",    "AdamW", "Adamax", "Adagrad",
                                     "Adadelta", "RMSprop", "Rprop", "NAdam",  "RAdam"};
  return std::any_of(std::begin(kAll), std::end(kAll), [&](const char* n) { return o == n; });
}

void KeepPlan::lay_out(const std::vector<DType>& bucket_dtypes, const std::vector<int>& kind_of_param) {
  max_entries = 0;
  for (const auto& l : layouts) max_entries = std::max(max_entries, l.size());
  if (max_entries > 62)
    throw NotSupportedError(kOp, "an optimizer with more than 62 state entries per parameter");
  const auto n = static_cast<std::int64_t>(params.size());
  std::int64_t off = align64(sizeof(KeepHeader));
  done_off = off;
  off = align64(off + 8 * n);
  present_off = off;
  off = align64(off + 8 * n);
  const auto me = static_cast<std::int64_t>(max_entries);
  pre_scalar_off = off;
  off = align64(off + 8 * me);
  image_off = off;
  off = align64(off + chunk * 8 * me);
  this->bucket_dtypes = bucket_dtypes;
  bucket_offset.assign(bucket_dtypes.size(), 0);
  std::vector<std::int64_t> used(bucket_dtypes.size(), 0);
  for (std::size_t k = 0; k < bucket_dtypes.size(); ++k) {
    bucket_offset[k] = off;
    off = align64(off + std::max<std::int64_t>(bucket_elems[k], 1) * static_cast<std::int64_t>(itemsize(bucket_dtypes[k])));
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto& p = params[i];
    const int k = kind_of_param[i];
    if (k >= 0) {
      const auto uk = static_cast<std::size_t>(k);
      p.p_offset = bucket_offset[uk] + used[uk] * static_cast<std::int64_t>(itemsize(p.dtype));
      used[uk] += p.numel;
    } else {
      p.p_offset = -1;
    }
    p.entry_offset.clear();
    for (const auto& e : layouts[p.layout]) {
      p.entry_offset.push_back(off);
      const std::int64_t elems = e.full ? p.numel : numel_of(e.scalar_shape);
      off = align64(off + std::max<std::int64_t>(elems, 1) * static_cast<std::int64_t>(itemsize(e.dtype)));
    }
  }
  bytes = off;
}

std::shared_ptr<HostKeep> HostKeep::create(KeepPlan plan) {
  const std::int64_t pid = ::getpid();
  const std::int64_t serial = g_serial.fetch_add(1);
  auto seg = shm::Segment::create("/dopt-" + std::to_string(pid) + "-keep" + std::to_string(serial),
                                  static_cast<std::size_t>(plan.bytes));
  // Huge pages where the kernel gives them to this memory (a /dev/shm mounted
  // with huge=advise or always; usually not): the owner's kernels then miss
  // the TLB as seldom as over its own memory. Best effort.
  // DOPT_HUGEPAGES=0 turns the advice off, as for tensors.
  if (shm::huge_pages_advised()) (void)::madvise(seg->data(), seg->size(), MADV_HUGEPAGE);
#ifdef MADV_POPULATE_WRITE
  // Fault the pages in at once (the copies into a fresh segment are
  // otherwise one page fault per 4 KiB); best effort.
  (void)::madvise(seg->data(), seg->size(), MADV_POPULATE_WRITE);
#endif
  auto* h = static_cast<KeepHeader*>(seg->data());
  h->nparams = static_cast<std::int64_t>(plan.params.size());
  h->chunk = plan.chunk;
  h->bytes = plan.bytes;
  auto* done = reinterpret_cast<std::int64_t*>(static_cast<char*>(seg->data()) + plan.done_off);
  for (std::size_t i = 0; i < plan.params.size(); ++i) done[i] = -1;
  st(h->j_valid, 0);
  __atomic_store_n(&h->magic, kMagic, __ATOMIC_RELEASE);
  return std::shared_ptr<HostKeep>(new HostKeep(std::move(seg), std::move(plan), pid, serial));
}

std::shared_ptr<HostKeep> HostKeep::open(const std::string& name, KeepPlan plan) {
  auto seg = shm::Segment::open(name, static_cast<std::size_t>(plan.bytes));
  const auto* h = static_cast<const KeepHeader*>(seg->data());
  if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != kMagic ||
      h->nparams != static_cast<std::int64_t>(plan.params.size()) || h->bytes != plan.bytes)
    throw IOError(kOp, "shared memory segment " + name + " does not hold the shard this rank expects");
  if (h->chunk != plan.chunk)
    throw IOError(kOp, "shared memory segment " + name + " was laid out with host_memory_chunk " +
                           std::to_string(h->chunk) + ", this rank's is " + std::to_string(plan.chunk) +
                           " (every rank must pass the same ZeroOptions::host_memory_chunk)");
  return std::shared_ptr<HostKeep>(new HostKeep(std::move(seg), std::move(plan), 0, 0));
}

void HostKeep::mark_ready(bool ready) {
  st(reinterpret_cast<KeepHeader*>(base())->ready, ready ? 1 : 0);
  __atomic_thread_fence(__ATOMIC_RELEASE);
}

bool HostKeep::ready() const { return ld(reinterpret_cast<const KeepHeader*>(base())->ready) != 0; }

Tensor HostKeep::bucket(std::size_t k) const {
  return Tensor::from_blob(base() + plan_.bucket_offset[k], Shape{std::max<std::int64_t>(plan_.bucket_elems[k], 1)},
                           plan_.bucket_dtypes[k], Device::cpu(), seg_);
}

Tensor HostKeep::param_values(std::size_t i) const {
  const auto& p = plan_.params[i];
  return Tensor::from_blob(base() + p.p_offset, Shape{p.numel}, p.dtype, Device::cpu(), seg_);
}

Tensor HostKeep::entry(std::size_t i, std::size_t e) const {
  const auto& p = plan_.params[i];
  const auto& en = plan_.layouts[p.layout][e];
  return Tensor::from_blob(base() + p.entry_offset[e], en.full ? p.shape : en.scalar_shape, en.dtype, Device::cpu(),
                           seg_);
}

Tensor HostKeep::entry_for(std::int64_t global, const std::string& name, const Shape& shape, DType dtype) const {
  for (std::size_t i = 0; i < plan_.params.size(); ++i) {
    if (plan_.params[i].global != global) continue;
    const auto& layout = plan_.layouts[plan_.params[i].layout];
    for (std::size_t e = 0; e < layout.size(); ++e)
      if (layout[e].name == name && layout[e].dtype == dtype &&
          (layout[e].full ? plan_.params[i].shape : layout[e].scalar_shape) == shape)
        return entry(i, e);
  }
  return Tensor();
}

std::int64_t HostKeep::done(std::size_t i) const {
  return ld(reinterpret_cast<const std::int64_t*>(base() + plan_.done_off)[i]);
}

std::uint64_t HostKeep::present(std::size_t i) const {
  return static_cast<std::uint64_t>(ld(reinterpret_cast<const std::int64_t*>(base() + plan_.present_off)[i]));
}

KeepJournal HostKeep::journal() const {
  const auto* h = reinterpret_cast<const KeepHeader*>(base());
  KeepJournal j;
  j.valid = ld(h->j_valid) != 0;
  if (!j.valid) return j;
  j.step = ld(h->j_step);
  j.param = ld(h->j_param);
  j.done = ld(h->j_done);
  j.saved = ld(h->j_saved) != 0;
  j.begin = ld(h->j_begin);
  j.end = ld(h->j_end);
  j.line = ld(h->j_line);
  j.saved_mask = static_cast<std::uint64_t>(ld(h->j_saved_mask));
  j.present_before = static_cast<std::uint64_t>(ld(h->j_present_before));
  return j;
}

ParamState HostKeep::view_state(std::size_t i) const {
  ParamState out;
  const auto& layout = plan_.layouts[plan_.params[i].layout];
  const std::uint64_t mask = present(i);
  for (std::size_t e = 0; e < layout.size(); ++e)
    if (mask >> e & 1u) out[layout[e].name] = entry(i, e);
  return out;
}

std::uint64_t HostKeep::mask_of(std::size_t i, const ParamState& s, const char* op) const {
  const auto& p = plan_.params[i];
  const auto& layout = plan_.layouts[p.layout];
  std::uint64_t mask = 0;
  for (const auto& [name, t] : s) {
    if (!t.defined()) continue;
    std::size_t e = 0;
    while (e < layout.size() && layout[e].name != name) ++e;
    const bool fits = e < layout.size() && t.dtype() == layout[e].dtype &&
                      t.numel() == (layout[e].full ? p.numel : numel_of(layout[e].scalar_shape));
    if (!fits)
      throw StateError(op, "state entry '" + name + "' (" + t.str() +
                               ") is not one the host-memory redundancy laid out for this parameter (entries, "
                               "dtypes and sizes are fixed when ZeRO is built, from one step of the optimizer)");
    mask |= std::uint64_t{1} << e;
  }
  return mask;
}

void HostKeep::adopt(std::size_t i, ParamState& s) {
  st(reinterpret_cast<KeepHeader*>(base())->j_valid, 0);  // a journal from before describes nothing now
  const auto& layout = plan_.layouts[plan_.params[i].layout];
  const std::uint64_t mask = mask_of(i, s, kOp);
  for (std::size_t e = 0; e < layout.size(); ++e) {
    if (!(mask >> e & 1u)) continue;
    Tensor view = entry(i, e);
    Tensor& t = s[layout[e].name];
    if (t.data_ptr() != view.data_ptr()) view.copy_(t);
    t = view;
  }
  auto* present_a = reinterpret_cast<std::int64_t*>(base() + plan_.present_off);
  auto* done_a = reinterpret_cast<std::int64_t*>(base() + plan_.done_off);
  st(present_a[i], static_cast<std::int64_t>(mask));
  st(done_a[i], -1);  // the state before the step in flight, whatever step that is
}

namespace {

/// The journal of one parameter's kernel call: before each chunk the
/// pre-images of the state entries it writes (the parameter's own values
/// need none: every other rank holds them as they were before the step).
class Sink final : public kernels::ChunkJournal {
 public:
  Sink(KeepHeader* h, char* image, std::int64_t stride, const void* param, std::vector<const void*> entries,
       const std::function<void(int)>& after_chunk, std::int64_t chunk_elems)
      : h_(h), image_(image), stride_(stride), param_(param), entries_(std::move(entries)), after_chunk_(after_chunk) {
    chunk = chunk_elems;
  }
  void before(void* const* outs, std::size_t count, std::size_t esize, kernels::i64 b, kernels::i64 len) override {
    // The chunk's call sees the arrays from element b on; the kernel saves
    // each line's pre-images into the image as it goes (lines.progress).
    if (b == 0 && begun_)
      throw StateError(kOp, "an optimizer ran two kernels over one parameter; this optimizer cannot be journaled");
    begun_ = true;
    lines.count = 0;
    std::int64_t saved = 0;
    for (std::size_t k = 0; k < count; ++k) {
      if (outs[k] == param_) continue;
      std::size_t e = 0;
      while (e < entries_.size() && entries_[e] != outs[k]) ++e;
      if (e == entries_.size() || lines.count == 8)
        throw StateError(kOp, "an optimizer kernel wrote memory that is neither the parameter nor its state in "
                              "shared memory; this optimizer cannot be journaled");
      lines.out[lines.count] = static_cast<char*>(outs[k]) + b * static_cast<std::int64_t>(esize);
      lines.image[lines.count] = image_ + stride_ * static_cast<std::int64_t>(e);
      ++lines.count;
      saved |= std::int64_t{1} << e;
    }
    lines.progress = &h_->j_line;
    lines.matched = 0;
    st(h_->j_line, 0);
    st(h_->j_saved_mask, saved);
    st(h_->j_begin, b);
    st(h_->j_end, b + len);
    st(h_->j_saved, 1);
    __atomic_thread_fence(__ATOMIC_RELEASE);  // the chunk's writes come after
  }
  void after(kernels::i64 b, kernels::i64 len) override {
    if (lines.matched != lines.count)  // an array it writes is missing from its DOPT_FOR_EACH_ELEMENT list
      throw StateError(kOp, "an optimizer kernel does not list every array it writes among its streams; its "
                            "writes cannot be journaled");
    if (after_chunk_) after_chunk_(c_++);
    st(h_->j_done, b + len);  // before clearing j_saved: a chunk is never both done and "not begun"
    st(h_->j_saved, 0);
  }

 private:
  KeepHeader* h_;
  char* image_;
  std::int64_t stride_;
  const void* param_;
  std::vector<const void*> entries_;
  const std::function<void(int)>& after_chunk_;
  int c_ = 0;
  bool begun_ = false;
};

struct JournalGuard {
  explicit JournalGuard(kernels::ChunkJournal* j) { kernels::chunk_journal() = j; }
  ~JournalGuard() { kernels::chunk_journal() = nullptr; }
  JournalGuard(const JournalGuard&) = delete;
  JournalGuard& operator=(const JournalGuard&) = delete;
};

}  // namespace

void HostKeep::open_journal(std::size_t i, std::int64_t t, std::uint64_t before) {
  auto* h = reinterpret_cast<KeepHeader*>(base());
  const auto& layout = plan_.layouts[plan_.params[i].layout];
  st(h->j_valid, 0);
  st(h->j_step, t);
  st(h->j_param, static_cast<std::int64_t>(i));
  st(h->j_done, 0);
  st(h->j_saved, 0);
  st(h->j_present_before, static_cast<std::int64_t>(before));
  for (std::size_t e = 0; e < layout.size(); ++e)
    if (!layout[e].full && (before >> e & 1u)) {
      const Tensor v = entry(i, e);
      std::memcpy(base() + plan_.pre_scalar_off + 8 * static_cast<std::int64_t>(e), v.data_ptr(), v.nbytes());
    }
  st(h->j_valid, 1);
  __atomic_thread_fence(__ATOMIC_RELEASE);  // the update's writes come after
}

void HostKeep::remove_name() const { ::shm_unlink(name().c_str()); }

void HostKeep::update(std::size_t i, std::int64_t t, const Tensor& p, const Tensor& g, ParamState& s,
                      const std::function<void(const Tensor&, const Tensor&, ParamState&)>& run,
                      const std::function<void(int)>& after_chunk) {
  const auto& kp = plan_.params[i];
  const auto& layout = plan_.layouts[kp.layout];
  auto* h = reinterpret_cast<KeepHeader*>(base());
  auto* present_a = reinterpret_cast<std::int64_t*>(base() + plan_.present_off);
  auto* done_a = reinterpret_cast<std::int64_t*>(base() + plan_.done_off);
  if (kp.p_offset >= 0 && (p.data_ptr() != base() + kp.p_offset || p.numel() != kp.numel))
    throw StateError(kOp, "parameter " + std::to_string(i) + " of this rank's shard is not in its shared-memory "
                          "bucket (was it re-pointed by the caller?)");
  // The state entries into the segment, as views; the step done.
  auto finish = [&] {
    const std::uint64_t mask = mask_of(i, s, kOp);
    for (std::size_t e = 0; e < layout.size(); ++e) {
      if (!(mask >> e & 1u)) continue;
      Tensor view = entry(i, e);
      Tensor& cur = s[layout[e].name];
      if (cur.data_ptr() != view.data_ptr()) {
        view.copy_(cur);
        cur = view;
      }
    }
    st(present_a[i], static_cast<std::int64_t>(mask));
    if (after_chunk) after_chunk(-1);  // fault injection: present stored, done not yet
    st(done_a[i], t);
  };
  const std::uint64_t region = present(i);
  if (region == 0) {
    // Nothing of this parameter's state is in the segment yet (its first
    // step): the journal says so (nothing present before, nothing done), a
    // buddy redoes the step from scratch until it is done, so the update
    // runs as it is, then its state goes in.
    open_journal(i, t, 0);
    run(p, g, s);
    if (after_chunk) after_chunk(0);  // fault injection: updated, not yet done
    finish();
    return;
  }
  const std::uint64_t before = mask_of(i, s, kOp);
  std::vector<const void*> bases(layout.size(), nullptr);
  for (std::size_t e = 0; e < layout.size(); ++e) {
    if (!(before >> e & 1u)) continue;
    bases[e] = s[layout[e].name].data_ptr();
    if (bases[e] != entry(i, e).data_ptr() || before != region)
      throw StateError(kOp, "the state of parameter " + std::to_string(i) + " of this rank's shard was replaced "
                            "outside step() and load_state_dict()/load_sharded(); it is no longer in shared memory");
  }
  open_journal(i, t, before);
  {
    Sink sink(h, base() + plan_.image_off, plan_.chunk * 8, p.data_ptr(), bases, after_chunk, plan_.chunk);
    JournalGuard guard(&sink);
    run(p, g, s);
  }
  finish();
}

ParamState HostKeep::rebuild(std::size_t i, std::int64_t t, bool in_step, const Tensor& replica,
                             const std::function<void(const Tensor&, const Tensor&, ParamState&)>& run) const {
  const auto& kp = plan_.params[i];
  const auto& layout = plan_.layouts[kp.layout];
  if (!ready())
    throw StateError(kOp, "the lost rank's shard was not yet in shared memory (the rank was lost while ZeRO placed "
                          "it there, at construction or at the end of a recovery); fall back to the last checkpoint");
  const std::int64_t d = done(i);
  const KeepJournal j = journal();
  const bool in_journal = j.valid && j.param == static_cast<std::int64_t>(i) && j.step == t;
  if (!in_step) {
    // Outside step(): every survivor is at step t-1 = the last completed.
    if (d >= t || in_journal)
      throw StateError(kOp, "the lost rank had begun its next step while the survivors had not (its shard's state "
                            "is partly at step " + std::to_string(t) + "); recover inside step() instead, or fall "
                            "back to the last checkpoint");
    return view_state(i);
  }
  const Tensor g = replica.grad();
  if (d == t) {  // done: the parameter's values and state at step t
    if (kp.p_offset >= 0) replica.flatten().copy_(param_values(i));
    return view_state(i);
  }
  if (!g.defined() || kp.p_offset < 0 || !replica.requires_grad()) return view_state(i);
  // Redo the step from where the owner stopped: elements [0, jd) are done
  // (their values and state in the segment); the chunk in flight goes back
  // to its pre-images; the rest is as before the step (the state in the
  // segment, the values in this rank's replica).
  const std::int64_t n = kp.numel;
  const std::uint64_t mask = in_journal ? j.present_before : present(i);
  const std::int64_t jd = in_journal ? j.done : 0;
  std::vector<Tensor> priv(layout.size());
  for (std::size_t e = 0; e < layout.size(); ++e) {
    if (!(mask >> e & 1u)) continue;
    if (layout[e].full) {
      priv[e] = entry(i, e).clone();
    } else {
      priv[e] = Tensor::empty(layout[e].scalar_shape, layout[e].dtype);
      if (in_journal)
        std::memcpy(priv[e].data_ptr(), base() + plan_.pre_scalar_off + 8 * static_cast<std::int64_t>(e),
                    priv[e].nbytes());
      else
        priv[e].copy_(entry(i, e));
    }
  }
  if (in_journal && j.saved && j.begin == jd)
    for (std::size_t e = 0; e < layout.size(); ++e)
      if (layout[e].full && (mask >> e & 1u) && (j.saved_mask >> e & 1u)) {
        const std::size_t isz = itemsize(layout[e].dtype);
        std::memcpy(static_cast<char*>(priv[e].data_ptr()) + static_cast<std::size_t>(j.begin) * isz,
                    base() + plan_.image_off + plan_.chunk * 8 * static_cast<std::int64_t>(e),
                    static_cast<std::size_t>(std::min(j.line, j.end - j.begin)) * isz);
      }
  const Tensor rf = replica.flatten();
  if (jd > 0) rf.flat_slice(0, jd).copy_(param_values(i).flat_slice(0, jd));
  // The rest (possibly empty: then only the scalars move on).
  ParamState sub;
  for (std::size_t e = 0; e < layout.size(); ++e)
    if (mask >> e & 1u) sub[layout[e].name] = layout[e].full ? priv[e].flatten().flat_slice(jd, n - jd) : priv[e];
  const Tensor q = rf.flat_slice(jd, n - jd).clone();
  run(q, g.flatten().flat_slice(jd, n - jd), sub);
  if (jd < n) rf.flat_slice(jd, n - jd).copy_(q);
  ParamState out;
  for (std::size_t e = 0; e < layout.size(); ++e) {
    auto it = sub.find(layout[e].name);
    if (it == sub.end() || !it->second.defined()) continue;
    if (!layout[e].full) {
      out[layout[e].name] = it->second.clone();
      continue;
    }
    if (!priv[e].defined()) {  // made by the update (a first step)
      priv[e] = Tensor::zeros(kp.shape, layout[e].dtype);
      priv[e].flatten().flat_slice(jd, n - jd).copy_(it->second);
    }
    out[layout[e].name] = priv[e];
  }
  return out;
}

}  // namespace dopt::optim::zero_detail
