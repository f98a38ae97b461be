// Fuzz target: the framing check in front of CAF's BASP
// (actors/src/core/basp_frame_check.hpp), on both sides of a connection and with
// the bounds of a rendezvous without a secret. The verdict must not depend
// on how the bytes are cut into reads.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/basp_frame_check.hpp"

using dopt::detail::BaspFrameCheck;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const auto side = (data[0] & 1) ? BaspFrameCheck::Side::server : BaspFrameCheck::Side::client;
  const std::uint32_t max = (data[0] & 2) ? 1u << 20 : 0xffffffffu;
  const std::size_t piece = 1 + data[1] % 64;
  const std::uint8_t* p = data + 2;
  const std::size_t n = size - 2;
  BaspFrameCheck whole(side, max), cut(side, max);
  const std::string a = whole.feed(p, n);
  std::string b;
  for (std::size_t at = 0; at < n; at += piece) b = cut.feed(p + at, std::min(piece, n - at));
  if (a != b || whole.frames() != cut.frames()) __builtin_trap();
  return 0;
}
