// The framing check of CAF's BASP in front of every CAF connection
// (basp_guard.hpp): frames as CAF writes them pass however they are cut
// into reads; every rule refuses what breaks it, naming it. The guard on a
// live connection is tested with real processes in tests/hostile.test.cpp.
#include "core/basp_guard.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

using dopt::detail::BaspFrameCheck;

namespace {

/// A BASP header as CAF 0.17 serialises it (big-endian), then `payload` bytes.
std::string frame(unsigned op, std::uint32_t len, unsigned flags = 0, std::size_t payload = SIZE_MAX) {
  std::string f(32, '\0');
  f[0] = static_cast<char>(op);
  f[3] = static_cast<char>(flags);
  for (int k = 0; k < 4; ++k) f[4 + k] = static_cast<char>((len >> (24 - 8 * k)) & 0xff);
  f[8] = 7;  // operation data, source and destination actors: anything
  f[20] = 1;
  f[31] = 9;
  f += std::string(payload == SIZE_MAX ? len : payload, 'p');
  return f;
}

std::string feed_all(BaspFrameCheck& c, const std::string& bytes, std::size_t piece) {
  std::string err;
  for (std::size_t at = 0; at < bytes.size() && err.empty(); at += piece)
    err = c.feed(bytes.data() + at, std::min(piece, bytes.size() - at));
  return err;
}

}  // namespace

TEST_CASE("basp guard: CAF's own traffic passes, cut into reads of any size", "[basp][security]") {
  // Server side: the client's handshake, then messages, heartbeats, a monitor
  // and a down message, a routed message, one of the bound's size.
  const std::string server_in = frame(1, 300) + frame(1, 58, 0x02) + frame(2, 5000) + frame(6, 0) + frame(4, 40) + frame(5, 80) +
                                frame(3, 100, 0x01) + frame(2, 1u << 20) + frame(2, 0, 0x02);
  // Client side: the server's handshake first.
  const std::string client_in = frame(0, 900) + frame(2, 64) + frame(6, 0);
  for (std::size_t piece : {std::size_t{1}, std::size_t{7}, std::size_t{32}, std::size_t{33}, std::size_t{4096},
                            std::size_t{1} << 22}) {
    INFO("reads of " << piece << " bytes");
    BaspFrameCheck s(BaspFrameCheck::Side::server, 1u << 20);
    CHECK(feed_all(s, server_in, piece).empty());
    CHECK(s.frames() == 9);
    BaspFrameCheck c(BaspFrameCheck::Side::client, 64u << 20);
    CHECK(feed_all(c, client_in, piece).empty());
    CHECK(c.frames() == 3);
  }
}

TEST_CASE("basp guard: each rule refuses what breaks it, before the payload is read", "[basp][security]") {
  using Side = BaspFrameCheck::Side;
  struct Case {
    const char* what;
    Side side;
    std::string bytes;
    const char* error;
  };
  const std::vector<Case> cases{
      {"the issue's header: 0xFFFFFFF0 bytes after a handshake", Side::server, frame(1, 10) + frame(2, 0xFFFFFFF0u, 0, 0),
       "a frame that announces 4294967280 payload bytes, more than the 1048576 this connection accepts"},
      {"the same header as the first frame", Side::server, frame(2, 0xFFFFFFF0u, 0, 0),
       "a first frame of operation 2 where CAF's client handshake must come first"},
      {"a huge handshake", Side::server, frame(1, 0xFFFFFFF0u, 0, 0),
       "a handshake that announces 4294967280 payload bytes (at most 65536)"},
      {"an operation BASP does not have", Side::server, frame(1, 4) + frame(0x7f, 0),
       "a frame header with operation 127, which CAF's protocol does not have"},
      {"garbage", Side::server, std::string("GET / HTTP/1.1\r\nHost: x\r\n\r\n") + std::string(8, 'x'),
       "a frame header with operation 71, which CAF's protocol does not have"},
      {"padding that is not zero", Side::server, frame(1, 4) + "\x02\x01" + std::string(30, '\0'),
       "a frame header whose padding or flags are not CAF's"},
      {"an unknown flag", Side::server, frame(1, 4) + frame(2, 4, 0x80), "a frame header whose padding or flags are not CAF's"},
      {"a heartbeat with a payload", Side::server, frame(1, 4) + frame(6, 12), "a heartbeat that announces 12 payload bytes"},
      {"a client's handshake sent to the client", Side::client, frame(0, 4) + frame(1, 4),
       "a client handshake, which only this side sends"},
      {"a server's handshake sent to the server later", Side::server, frame(1, 4) + frame(0, 4),
       "a server handshake, which only this side sends"},
      {"a huge second client handshake", Side::server, frame(1, 4) + frame(1, 70000, 0x02, 0),
       "a handshake that announces 70000 payload bytes (at most 65536)"},
      {"a server's handshake sent to a server", Side::server, frame(0, 4),
       "a first frame of operation 0 where CAF's client handshake must come first"},
      {"a client's handshake sent to a client", Side::client, frame(1, 4),
       "a first frame of operation 1 where CAF's server handshake must come first"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    for (std::size_t piece : {std::size_t{1}, std::size_t{32}, std::size_t{1000}}) {
      BaspFrameCheck check(c.side, c.side == Side::server ? 1u << 20 : 64u << 20);
      CHECK(feed_all(check, c.bytes, piece) == c.error);
      // The verdict stays: later bytes change nothing.
      CHECK(check.feed("x", 1) == c.error);
    }
  }
}
