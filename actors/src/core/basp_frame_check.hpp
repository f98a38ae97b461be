#pragma once
// Internal to dopt_actors: the framing check of CAF's BASP protocol that
// every CAF connection dopt makes reads through (basp_guard.hpp has the
// rules and why). No CAF types: the fuzz target fuzz/basp_frames.cpp builds
// it alone.
#include <cstddef>
#include <cstdint>
#include <string>

namespace dopt::detail {

/// The framing check of one direction of one connection, without CAF (the
/// fuzz target fuzz/basp_frames.cpp drives it).
class BaspFrameCheck {
 public:
  /// server: this side accepted the connection (the first frame it reads is
  /// a client handshake); client: it connected (it reads a server handshake).
  enum class Side { server, client };
  static constexpr std::size_t kHeaderSize = 32;
  static constexpr std::uint32_t kHandshakeMax = 64 * 1024;

  BaspFrameCheck(Side side, std::uint32_t max_payload) noexcept : side_(side), max_payload_(max_payload) {}
  /// Feeds the next n bytes of the stream. Returns "" while every byte so
  /// far is well-formed, else what is wrong (and keeps returning it).
  const std::string& feed(const void* data, std::size_t n);
  /// Complete headers seen.
  std::uint64_t frames() const noexcept { return frames_; }

 private:
  void check_header();
  Side side_;
  std::uint32_t max_payload_;
  unsigned char header_[kHeaderSize] = {};
  std::size_t have_ = 0;          // bytes of the current header
  std::uint64_t payload_left_ = 0;  // bytes of the current payload still to come
  std::uint64_t frames_ = 0;
  std::string error_;
};

}  // namespace dopt::detail
