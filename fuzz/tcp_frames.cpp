// Fuzz target: the TCP data plane's wire format (runtime/src/tcp_wire.hpp):
// message headers and piece headers as a peer sends them. A header that is
// accepted must describe pieces that tile the message exactly; nothing it
// announces may exceed the bound checked before allocation.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "tcp_wire.hpp"

using namespace dopt::transport::tcp_detail;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < sizeof(Header) + 2) return 0;
  Header h;
  std::memcpy(&h, data, sizeof h);
  const int streams = data[sizeof h] % 17;  // DOPT_TCP_STREAMS: 0..16
  const std::uint32_t expect_seq = data[sizeof h + 1];
  if (!header_problem(h, streams, expect_seq).empty()) return 0;
  if (h.len > k_max_message) __builtin_trap();
  if (h.pieces > 0) {
    if (h.pieces > std::uint32_t(streams) || h.pieces > h.len) __builtin_trap();
    std::uint64_t next = 0;
    for (std::uint32_t i = 0; i < h.pieces; ++i) {
      const auto [off, n] = piece_of(h.len, h.pieces, i);
      if (off != next || n == 0) __builtin_trap();
      next = off + n;
      PieceHeader ph{k_piece_magic, h.seq, n};
      if (!piece_problem(ph, h.seq, n).empty()) __builtin_trap();
      if (size >= sizeof(Header) + 2 + sizeof(PieceHeader)) {
        std::memcpy(&ph, data + sizeof h + 2, sizeof ph);
        (void)piece_problem(ph, h.seq, n);
      }
    }
    if (next != h.len) __builtin_trap();
  }
  return 0;
}
