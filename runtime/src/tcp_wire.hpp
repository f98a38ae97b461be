#pragma once
// Internal to TcpMesh (runtime/src/tcp_*.cpp): wire format v2 (docs/transport.md)
// and the helpers every part of the mesh uses. Not installed.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>

#include <boost/asio/error.hpp>
#include <boost/system/error_code.hpp>

#include "dopt/runtime/internal/tcp_transport.hpp"

namespace dopt::transport::tcp_detail {

inline constexpr const char* k_op = "tcp mesh";

inline constexpr std::uint32_t k_magic = 0x32745064u;        // "dPt2"
inline constexpr std::uint32_t k_piece_magic = 0x70745064u;  // "dPtp"
inline constexpr std::uint32_t k_hello_magic = 0x6f6c6548u;  // "Helo"
inline constexpr std::uint32_t k_version = 2;

struct Header {
  std::uint32_t magic;
  std::uint32_t aux;
  std::uint64_t hi;
  std::uint64_t lo;
  std::uint64_t len;
  std::uint32_t pieces;  // 0: the payload follows; else striped over the data connections
  std::uint32_t seq;     // striped messages: their number (per peer and direction)
};
static_assert(sizeof(Header) == 40);

// Before each piece of a striped message on a data connection.
struct PieceHeader {
  std::uint32_t magic;
  std::uint32_t seq;
  std::uint64_t len;
};
static_assert(sizeof(PieceHeader) == 16);

struct Hello {
  std::uint32_t magic;
  std::uint32_t version;
  std::int32_t rank;
  std::int32_t world;
  std::int32_t conn;     // 0: control connection; k > 0: data connection k - 1
  std::int32_t streams;  // data connections per pair on the sender's side
};
static_assert(sizeof(Hello) == 24);

/// No tensor is larger than this (x86-64 and AArch64 give a process 128 TiB
/// of addresses at most): a header announcing more is corrupt.
inline constexpr std::uint64_t k_max_message = std::uint64_t{1} << 47;

/// What is wrong with a message header read from a peer, "" when nothing:
/// checked before anything is allocated or read for it. streams: the data
/// connections per peer; expect_seq: the number of the next striped
/// message from this peer.
inline std::string header_problem(const Header& h, int streams, std::uint32_t expect_seq) {
  if (h.magic != k_magic) return "corrupt message header";
  if (h.len > k_max_message)
    return "corrupt message header (a message of " + std::to_string(h.len) + " bytes, more than any process can hold)";
  if (h.pieces > 0 && (h.pieces > std::uint32_t(streams) || h.pieces > h.len || h.seq != expect_seq))
    return "corrupt message header (striped message " + std::to_string(h.seq) + " in " + std::to_string(h.pieces) +
           " pieces; expected message " + std::to_string(expect_seq) + " in at most " + std::to_string(streams) + ")";
  return {};
}

/// What is wrong with a piece header on a data connection (the piece the
/// lane expects: its message's number and size), "" when nothing.
inline std::string piece_problem(const PieceHeader& h, std::uint32_t seq, std::uint64_t len) {
  if (h.magic != k_piece_magic || h.seq != seq || h.len != len) return "corrupt piece header";
  return {};
}

// Piece i of a message of len bytes cut into `pieces`: [offset, offset + size).
inline std::pair<std::size_t, std::size_t> piece_of(std::size_t len, std::uint32_t pieces, std::uint32_t i) {
  const std::size_t lo = std::size_t((unsigned __int128)len * i / pieces);
  const std::size_t hi = std::size_t((unsigned __int128)len * (i + 1) / pieces);
  return {lo, hi - lo};
}

inline std::string describe(const boost::system::error_code& ec) {
  if (ec == boost::asio::error::eof) return "end of stream (the peer closed the connection)";
  return ec.message();
}

// Runs a completion callback (noexcept: a callback that throws terminates).
inline void call(const Completion& cb, std::exception_ptr e) noexcept { cb(std::move(e)); }

}  // namespace dopt::transport::tcp_detail
