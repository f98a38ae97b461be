#pragma once
// gloo's ring all_reduce order, computed independently of dopt's planes, for
// tests that check model averaging bitwise (averagers.test.cpp,
// post_local_sgd_grow.test.cpp, diloco_grow.test.cpp). Nothing here
// communicates.
#include <algorithm>
#include <cstdint>

namespace dopt::ring_reference {

/// The group rank whose contribution gloo's ring adds k-th (k = 0 .. n-1)
/// into element e of a flat float32 buffer of `numel` elements over n ranks.
/// gloo's ring as measured against torch 1.13: segments of at most 1 MiB, at
/// least 2n of them and a multiple of n, ceil(bytes / segments) bytes each;
/// run b of segments / n segments is summed from rank b - 1 down to rank b
/// (at 1 and 2 ranks: rank order).
inline int contributor(std::int64_t e, std::int64_t numel, int n, int k) {
  auto up = [](long v, long m) { return (v + m - 1) / m * m; };
  const long bytes = 4L * static_cast<long>(numel);
  const long seg0 = up(std::min<long>((bytes + 2 * n - 1) / (2 * n), 1L << 20), 4);
  const long nseg = up(std::max<long>((bytes + seg0 - 1) / seg0, 2L * n), n);
  const long span = std::max<long>(1, (nseg / n) * up((bytes + nseg - 1) / nseg, 4) / 4);
  const int b = static_cast<int>(std::min<long>(static_cast<long>(e) / span, n - 1));
  return n >= 3 ? ((b - 1 - k) % n + n) % n : k;
}

}  // namespace dopt::ring_reference
