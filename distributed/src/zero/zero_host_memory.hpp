#pragma once
// ZeroBuddyUpdate::host_memory (zero_host_keep.cpp; ZeRO's side in
// zero_host_memory.cpp): a rank's shard (its parameters, as its bucket, and
// its optimizer state) lives in a shared-memory segment that the rank's
// buddies on the same host keep mapped, so it outlives the rank's process. The owner journals its updates chunk by chunk, so that a
// buddy can tell, after the owner died at any point, which elements are at the
// step in flight and which are before it. Not installed.
//
// Segment layout (every offset 64-byte aligned): KeepHeader; done[n] and
// present[n] (int64, by the owner's parameter position); the journal's scalar
// values before and after the step of the parameter in flight; the journal's
// pre-images (one chunk of each full-size state entry); the owner's buckets
// (one per kind, in the order of ZeRO's buckets); then each parameter's state
// entries.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dopt/runtime/internal/shm.hpp"
#include "dopt/runtime/state_dict.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::optim::zero_detail {

/// One state entry of a parameter: full-size (one value per element of the
/// parameter, updated elementwise) or a scalar (the step counter, NAdam's
/// mu_product), as found by running the optimizer once on a probe.
struct KeepEntry {
  std::string name;
  DType dtype = DType::float32;
  bool full = false;
  Shape scalar_shape;  // scalars only
};

struct KeepParam {
  std::int64_t global = -1;  // ZeRO's global index
  std::int64_t numel = 0;
  Shape shape;
  DType dtype = DType::float32;
  std::size_t layout = 0;              // index into KeepPlan::layouts
  std::size_t group = 0;               // its parameter group
  std::int64_t p_offset = -1;          // byte offset of its values in the segment (trainable), -1: none
  std::vector<std::int64_t> entry_offset;  // byte offset of each entry of its layout
};

/// Everything about one rank's segment that every rank computes alike.
struct KeepPlan {
  std::vector<std::vector<KeepEntry>> layouts;
  std::vector<KeepParam> params;  // the owner's parameters in partition order
  std::vector<std::int64_t> bucket_offset;  // byte offset of the owner's bucket of each kind
  std::vector<std::int64_t> bucket_elems;
  std::vector<DType> bucket_dtypes;
  std::int64_t chunk = 0;  // elements per journaled chunk
  std::size_t max_entries = 0;
  std::int64_t done_off = 0, present_off = 0, pre_scalar_off = 0, image_off = 0;
  std::int64_t bytes = 0;
  /// Sets the offsets and the size from layouts, params (numel, dtype,
  /// layout), the bucket sizes and the bucket of each parameter (-1: not in
  /// a bucket; in a bucket, parameters follow each other in order).
  void lay_out(const std::vector<DType>& bucket_dtypes, const std::vector<int>& kind_of_param);
};

/// What one segment of a rank holds: parameters (ZeRO's global indices, in
/// bucket order), the bucket of each (an index into bucket_dtypes; -1: none,
/// its state only), the buckets' dtypes; and the segment's name once made.
struct KeepSpec {
  std::vector<std::int64_t> params;
  std::vector<int> kind;
  std::vector<DType> bucket_dtypes;
  std::string name;
};

class HostKeep;

/// share_keeps' result: this rank's new segment, the segments it maps (by
/// group rank of their owner), every rank's segments (by global rank).
struct KeepShare {
  std::shared_ptr<HostKeep> own;
  std::map<int, std::vector<std::shared_ptr<HostKeep>>> buddies;
  std::map<int, std::vector<KeepSpec>> specs;
};

/// The journal, as a buddy reads it.
struct KeepJournal {
  bool valid = false;
  std::int64_t step = -1, param = -1, begin = 0, end = 0, done = 0;
  std::int64_t line = 0;  // elements of the chunk in flight whose pre-images are saved
  std::uint64_t saved_mask = 0;  // the entries whose pre-images it saves
  bool saved = false;
  std::uint64_t present_before = 0;
};

class HostKeep {
 public:
  /// The owner: a new segment ("/dopt-<pid>-keep<serial>": a dead owner's are
  /// removed by shm::remove_stale_segments, its buddies keep their mappings).
  static std::shared_ptr<HostKeep> create(KeepPlan plan);
  /// A buddy: the owner's segment. Throws IOError when it cannot be mapped.
  static std::shared_ptr<HostKeep> open(const std::string& name, KeepPlan plan);

  const std::string& name() const { return seg_->name(); }
  const shm::Segment& segment() const { return *seg_; }
  std::int64_t pid_tag() const { return pid_; }
  std::int64_t serial() const { return serial_; }
  const KeepPlan& plan() const { return plan_; }
  /// Removes the name (the mappings stay): the owner's own, or a dead
  /// owner's by one of its host-mates.
  void remove_name() const;
  /// The owner: its bucket and state are in place (before that a rebuild
  /// refuses: nothing of the shard is in the segment yet).
  void mark_ready(bool ready = true);
  bool ready() const;

  /// The owner's bucket of kind k (a view that keeps the segment mapped).
  Tensor bucket(std::size_t k) const;
  /// Parameter i's values (trainable parameters), flat.
  Tensor param_values(std::size_t i) const;
  /// Entry e of parameter i's layout: shape of the parameter, or the scalar's.
  Tensor entry(std::size_t i, std::size_t e) const;

  /// The view of entry `name` of the parameter with global index `global`
  /// when this segment has one of that shape and dtype; undefined otherwise.
  Tensor entry_for(std::int64_t global, const std::string& name, const Shape& shape, DType dtype) const;

  std::int64_t done(std::size_t i) const;
  std::uint64_t present(std::size_t i) const;
  KeepJournal journal() const;
  /// Parameter i's state as kept (its present entries), as views of the
  /// segment (they keep it mapped). A dead owner's segment changes no more,
  /// so a buddy hands these on.
  ParamState view_state(std::size_t i) const;

  // --- the owner ---
  /// Parameter i's state is `st` (copied into the segment; st's entries are
  /// replaced by views of it), as the state before the step in flight.
  void adopt(std::size_t i, ParamState& st);
  /// The journaled update of parameter i at step t (see the header above);
  /// `after_chunk(c)` runs after chunk c is written, before it is committed,
  /// and with c = -1 between the stores of the parameter's state entries and
  /// of its step (fault injection).
  void update(std::size_t i, std::int64_t t, const Tensor& p, const Tensor& g, ParamState& st,
              const std::function<void(const Tensor&, const Tensor&, ParamState&)>& run,
              const std::function<void(int)>& after_chunk);

  /// A buddy: rebuilds parameter i's state at step t after the owner was
  /// lost. `replica` is this rank's copy of the parameter (it holds the
  /// values of step t-1 where the owner had not finished), `run` updates a
  /// range (an optimizer over a fresh tensor). in_step false: the state as
  /// of the last completed step. Returns the state (views of the segment
  /// where nothing was redone); replica ends at step t.
  ParamState rebuild(std::size_t i, std::int64_t t, bool in_step, const Tensor& replica,
                     const std::function<void(const Tensor& q, const Tensor& g, ParamState& st)>& run) const;

 private:
  /// The journal names parameter i at step t, with the entries present
  /// before (`before`) and the scalars' values before; stored last: valid.
  void open_journal(std::size_t i, std::int64_t t, std::uint64_t before);
  HostKeep(std::shared_ptr<shm::Segment> seg, KeepPlan plan, std::int64_t pid, std::int64_t serial)
      : seg_(std::move(seg)), plan_(std::move(plan)), pid_(pid), serial_(serial) {}
  char* base() const { return static_cast<char*>(seg_->data()); }
  std::uint64_t mask_of(std::size_t i, const ParamState& st, const char* op) const;
  std::shared_ptr<shm::Segment> seg_;
  KeepPlan plan_;
  std::int64_t pid_ = 0, serial_ = 0;
};

/// Whether `optimizer` updates every element from that element alone (so a
/// parameter can be updated in pieces): every optimizer but Muon.
bool elementwise_optimizer(const std::string& optimizer);

}  // namespace dopt::optim::zero_detail
