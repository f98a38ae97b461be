#pragma once
// How RPC arguments and results travel: a tagged, self-describing byte
// format written by rpc::Encoder and read by rpc::Decoder.
//
// Built in: bool, every integral and floating-point type, enums,
// std::string, std::vector, std::optional, std::pair, std::tuple,
// dopt::Tensor (dtype, shape and bytes; an undefined tensor travels as
// such; a CUDA tensor is copied to the CPU and arrives as a CPU tensor) and
// rpc::RRef<T> (rpc.hpp: the reference, never the value). Every value is
// preceded by a one-byte tag, so a mismatch between what the caller sent and
// what the function takes is a dopt::TypeError naming both, never garbage:
//   * integers travel as int64 ('i') or uint64 ('u') and can be read into
//     any integral type that holds the value (else ValueError) or into a
//     floating-point type;
//   * floating-point values travel as float64 ('d') and can only be read
//     into floating-point types (a float32 round-trips exactly);
//   * bool only into bool.
// User types: give them ADL overloads in their own namespace
//   void dopt_encode(dopt::rpc::Encoder& e, const MyType& x) { dopt::rpc::write(e, x.a); ... }
//   void dopt_decode(dopt::rpc::Decoder& d, MyType& x)       { dopt::rpc::read(d, x.a); ... }
// (MyType must be default-constructible to be decoded).
//
// rpc::encodable<T>() says at compile time whether T can travel; values
// held by RRefs need not be encodable (then to_here() is a TypeError).
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::rpc {

template <class T> class RRef;

/// The state behind an Agent (rpc.hpp), shared by its copies, its
/// decoders and its RRefs: opaque, defined and used by the library only.
struct AgentCore;
/// One worker's counted hold on a value an RRef names (rpc.hpp); every copy
/// of an RRef handle shares one. Not an API (detail/rpc_calls.hpp defines it
/// for rpc.hpp's templates).
struct RRefState;

/// Tags of the wire format (one byte before every value).
namespace tag {
inline constexpr char boolean = 'b', int64 = 'i', uint64 = 'u', float64 = 'd', string = 's', vector = 'v',
                      optional = 'o', tuple = 't', tensor = 'T', rref = 'R';
}

class Encoder {
 public:
  void put_tag(char t) { bytes_.push_back(t); }
  void put_raw(const void* p, std::size_t n) {
    // resize + memcpy, not insert: GCC 12 inlines insert's reallocation path
    // into callers and then warns about it (-Warray-bounds, a false positive).
    if (n == 0) return;
    const std::size_t at = bytes_.size();
    bytes_.resize(at + n);
    std::memcpy(bytes_.data() + at, p, n);
  }
  template <class T> void put_pod(T v) { put_raw(&v, sizeof v); }
  std::vector<char>& bytes() noexcept { return bytes_; }
  std::vector<char> take() { return std::move(bytes_); }

  /// The RRefs written into this message. Whoever sends the message hands
  /// them on to its receiver (the fork protocol of rpc.hpp) and keeps them
  /// alive until the owner has counted the receiver as a holder.
  std::vector<std::shared_ptr<RRefState>> rrefs;

 private:
  std::vector<char> bytes_;
};

class Decoder {
 public:
  /// `what` names the message in errors ("arguments of 'add'").
  Decoder(const std::vector<char>& bytes, std::shared_ptr<AgentCore> core, std::string what)
      : p_(bytes.data()), end_(bytes.data() + bytes.size()), core_(std::move(core)), what_(std::move(what)) {}
  char peek_tag() {
    need(1);
    return *p_;
  }
  char get_tag() {
    need(1);
    return *p_++;
  }
  void expect_tag(char want, const char* type) {
    const char got = get_tag();
    if (got != want)
      fail(std::string("expected ") + type + " (tag '" + want + "') but the sender wrote tag '" + got + "'");
  }
  void get_raw(void* out, std::size_t n) {
    need(n);
    std::memcpy(out, p_, n);
    p_ += n;
  }
  template <class T> T get_pod() {
    T v;
    get_raw(&v, sizeof v);
    return v;
  }
  bool at_end() const noexcept { return p_ == end_; }
  /// Bytes not read yet.
  std::size_t remaining() const noexcept { return static_cast<std::size_t>(end_ - p_); }
  /// A count read from the message, checked before anything is allocated
  /// for it: `n` items of at least `min_bytes` each must fit in what is left
  /// (a hostile or damaged count is a TypeError, never a huge allocation).
  std::size_t count(std::uint64_t n, std::size_t min_bytes, const char* of) const {
    if (min_bytes > 0 && n > remaining() / min_bytes)
      fail("a count of " + std::to_string(n) + " " + of + " where only " + std::to_string(remaining()) +
           " bytes are left (truncated or damaged)");
    return static_cast<std::size_t>(n);
  }
  /// The agent whose message this is (RRefs are made there).
  const std::shared_ptr<AgentCore>& core() const noexcept { return core_; }
  const std::string& what() const noexcept { return what_; }
  [[noreturn]] void fail(const std::string& why) const { throw TypeError("rpc", what_ + ": " + why); }

 private:
  void need(std::size_t n) const {
    if (static_cast<std::size_t>(end_ - p_) < n) fail("the message ends early (truncated or of another type)");
  }
  const char* p_;
  const char* end_;
  std::shared_ptr<AgentCore> core_;
  std::string what_;
};

/// RRefs (defined in rpc.hpp).
template <class T> void write_rref(Encoder& e, const RRef<T>& r);
template <class T> void read_rref(Decoder& d, RRef<T>& r);

/// Whether T can travel (see the top of this file).
template <class T>
constexpr bool encodable();

void write_tensor(Encoder& e, const Tensor& t);
void read_tensor(Decoder& d, Tensor& t);

/// Appends x to e (a static_assert when T cannot travel). Any thread; e is
/// the caller's own.
template <class T>
void write(Encoder& e, const T& x);
/// Reads the next value of d into x, converting as the top of this file
/// says; a TypeError (or ValueError for an integer that does not fit) when
/// the sender wrote something else.
template <class T>
void read(Decoder& d, T& x);

/// One value to bytes and back (tests, tools).
template <class T>
std::vector<char> to_bytes(const T& x) {
  Encoder e;
  write(e, x);
  return e.take();
}
template <class T>
T from_bytes(const std::vector<char>& b, const std::string& what = "value") {
  Decoder d(b, nullptr, what);
  T x{};
  read(d, x);
  if (!d.at_end()) d.fail("trailing bytes after the value");
  return x;
}

}  // namespace dopt::rpc

// The bodies of encodable, write and read (not an API of their own).
#include "dopt/actors/detail/rpc_codec.hpp"
