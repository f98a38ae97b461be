// The framing check of CAF's BASP protocol (basp_frame_check.hpp).
#include "core/basp_frame_check.hpp"

#include <algorithm>
#include <cstring>

namespace dopt::detail {

namespace {

constexpr unsigned char kServerHandshake = 0, kClientHandshake = 1, kHeartbeat = 6, kLastOperation = 6;
constexpr unsigned char kKnownFlags = 0x01 | 0x02;

std::uint32_t be32(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

}  // namespace

const std::string& BaspFrameCheck::feed(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0 && error_.empty()) {
    if (payload_left_ > 0) {  // payload bytes: only counted
      const std::size_t skip = payload_left_ < n ? static_cast<std::size_t>(payload_left_) : n;
      payload_left_ -= skip;
      p += skip;
      n -= skip;
      continue;
    }
    const std::size_t take = std::min(n, kHeaderSize - have_);
    std::memcpy(header_ + have_, p, take);
    have_ += take;
    p += take;
    n -= take;
    if (have_ == kHeaderSize) check_header();
  }
  return error_;
}

void BaspFrameCheck::check_header() {
  have_ = 0;
  const unsigned char op = header_[0];
  const std::uint32_t len = be32(header_ + 4);
  const bool first = frames_++ == 0;
  // The handshake this side receives (a client may send its handshake again,
  // with BASP's select-connection flag); the other one it never receives.
  const unsigned char theirs = side_ == Side::server ? kClientHandshake : kServerHandshake;
  const unsigned char ours = side_ == Side::server ? kServerHandshake : kClientHandshake;
  if (op > kLastOperation) {
    error_ = "a frame header with operation " + std::to_string(op) + ", which CAF's protocol does not have";
  } else if (header_[1] != 0 || header_[2] != 0 || (header_[3] & ~kKnownFlags) != 0) {
    error_ = "a frame header whose padding or flags are not CAF's";
  } else if (first && op != theirs) {
    error_ = "a first frame of operation " + std::to_string(op) + " where CAF's " +
             (side_ == Side::server ? "client" : "server") + " handshake must come first";
  } else if (op == ours) {
    error_ = std::string("a ") + (side_ == Side::server ? "server" : "client") +
             " handshake, which only this side sends";
  } else if (op == kHeartbeat && len != 0) {
    error_ = "a heartbeat that announces " + std::to_string(len) + " payload bytes";
  } else if (op == theirs && len > kHandshakeMax) {
    error_ = "a handshake that announces " + std::to_string(len) + " payload bytes (at most " +
             std::to_string(kHandshakeMax) + ")";
  } else if (len > max_payload_) {
    error_ = "a frame that announces " + std::to_string(len) + " payload bytes, more than the " +
             std::to_string(max_payload_) + " this connection accepts";
  }
  payload_left_ = len;
}

}  // namespace dopt::detail
