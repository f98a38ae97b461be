#pragma once
// How ZeroRedundancyOptimizer's ranks describe state tensors to each other
// and send strings point to point (zero_recovery.cpp's recovery,
// zero_replay.cpp's snapshots); not installed.
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::optim::zero_detail {

/// One state tensor of a shard, as its holder describes it to the others.
struct Entry {
  std::int64_t index = 0;  // global parameter index
  std::string key;
  DType dtype = DType::float32;
  Shape shape;
};

inline std::string describe(const std::vector<Entry>& es) {
  std::ostringstream os;
  for (const auto& e : es) {
    os << e.index << ' ' << e.key << ' ' << static_cast<int>(e.dtype) << ' ' << e.shape.size();
    for (auto d : e.shape) os << ' ' << d;
    os << '\n';
  }
  return os.str();
}

inline std::vector<Entry> parse(const std::string& text) {
  std::vector<Entry> out;
  std::istringstream is(text);
  Entry e;
  int dt = 0;
  std::size_t nd = 0;
  while (is >> e.index >> e.key >> dt >> nd) {
    e.dtype = static_cast<DType>(dt);
    e.shape.assign(nd, 0);
    for (auto& d : e.shape) is >> d;
    out.push_back(e);
  }
  return out;
}

/// A string from group rank src (its length, then its bytes; post_string sends it).
inline std::string recv_string(ProcessGroup& g, int src, int tag) {
  Tensor len = Tensor::zeros({1}, DType::int64);
  g.recv(len, src, tag);
  const std::int64_t n = len.data<std::int64_t>()[0];
  if (n <= 0) return "";
  Tensor bytes = Tensor::empty({n}, DType::uint8);
  g.recv(bytes, src, tag);
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(n));
}

/// A string to group rank dst without waiting: the futures (which keep the tensors) go to `out`.
inline void post_string(ProcessGroup& g, const std::string& s, int dst, int tag, std::vector<Future<void>>& out) {
  out.push_back(g.send_async(Tensor::full({1}, static_cast<double>(s.size()), DType::int64), dst, tag));
  if (s.empty()) return;
  Tensor bytes = Tensor::empty({static_cast<std::int64_t>(s.size())}, DType::uint8);
  std::memcpy(bytes.data_ptr(), s.data(), s.size());
  out.push_back(g.send_async(bytes, dst, tag));
}

}  // namespace dopt::optim::zero_detail
