#pragma once
// Internal to dopt_actors: every CAF connection dopt makes (secure_link.hpp)
// reads through a scribe that checks the framing of CAF's BASP protocol
// before CAF sees a byte of it. CAF 0.17 trusts a frame header: a header
// that announces 4 GiB makes its broker allocate and zero 4 GiB for the
// payload on its one I/O thread. The check runs inside the socket read, on
// the bytes just read, so a header is judged before CAF sizes any buffer
// after it. A connection whose bytes break a rule is closed at once (CAF
// sees a failed read of that connection only) and reported once through
// dopt::notice(), naming the peer's address and the port.
//
// The rules (BASP of CAF 0.17: a 32-byte header {u8 operation, u8 0, u8 0,
// u8 flags, u32 payload length, u64 operation data, u64 source actor, u64
// destination actor}, integers big-endian, then the payload):
//   * the operation is one of BASP's seven (0..6), the two padding bytes are
//     zero, no flag but BASP's two (0x01, 0x02) is set;
//   * the first frame is the handshake of the other side (a server receives
//     the client's handshake, a client the server's); a handshake is at most
//     kHandshakeMax bytes; a client sends its handshake again with BASP's
//     select-connection flag, so a server may receive it later too, but
//     neither side ever receives its own kind of handshake;
//   * a heartbeat carries no payload;
//   * no payload is longer than the connection's bound (max_payload).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/basp_frame_check.hpp"
#include "caf/actor_system.hpp"
#include "caf/io/scribe.hpp"

namespace dopt::detail {

/// The bounds of a connection admitted without a secret (the rendezvous of
/// a job without one): to rank 0 a rank sends its registration (a few
/// hundred bytes of host info) and small requests; rank 0 sends every rank
/// the table of all ranks (some 300 bytes a rank).
inline constexpr std::uint32_t kUnauthenticatedToServer = 1u << 20;
inline constexpr std::uint32_t kUnauthenticatedToClient = 64u << 20;

/// A scribe over the connected socket fd for sys's BASP broker (the caller
/// hands it on as it would the one middleman().backend().new_scribe(fd)
/// makes) whose reads pass through a BaspFrameCheck of `side` and
/// `max_payload`. `what` names the port in the note ("rank 0's rendezvous
/// port").
caf::io::scribe_ptr guarded_scribe(caf::actor_system& sys, int fd, BaspFrameCheck::Side side,
                                   std::uint32_t max_payload, std::string what);

}  // namespace dopt::detail
