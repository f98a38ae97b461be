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

namespace detail {
struct AgentCore;
struct RRefState;
template <class T> struct is_vector : std::false_type {};
template <class T, class A> struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T> struct is_optional : std::false_type {};
template <class T> struct is_optional<std::optional<T>> : std::true_type {};
template <class T> struct is_pair : std::false_type {};
template <class A, class B> struct is_pair<std::pair<A, B>> : std::true_type {};
template <class T> struct is_tuple : std::false_type {};
template <class... A> struct is_tuple<std::tuple<A...>> : std::true_type {};
template <class T> struct is_rref : std::false_type {};
template <class T> struct is_rref<RRef<T>> : std::true_type {};
/// The readable (demangled) name of a type given as typeid(T).name(), for
/// error messages: "std::vector<float, std::allocator<float> >", not "St6vectorIfSaIfEE".
/// Values keep the mangled name as their identity (compared, sent); only
/// messages show this one. Falls back to the mangled name.
std::string readable_type_name(const std::string& mangled);
}  // namespace detail

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
  std::vector<std::shared_ptr<detail::RRefState>> rrefs;

 private:
  std::vector<char> bytes_;
};

class Decoder {
 public:
  /// `what` names the message in errors ("arguments of 'add'").
  Decoder(const std::vector<char>& bytes, std::shared_ptr<detail::AgentCore> core, std::string what)
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
  const std::shared_ptr<detail::AgentCore>& core() const noexcept { return core_; }
  const std::string& what() const noexcept { return what_; }
  [[noreturn]] void fail(const std::string& why) const { throw TypeError("rpc", what_ + ": " + why); }

 private:
  void need(std::size_t n) const {
    if (static_cast<std::size_t>(end_ - p_) < n) fail("the message ends early (truncated or of another type)");
  }
  const char* p_;
  const char* end_;
  std::shared_ptr<detail::AgentCore> core_;
  std::string what_;
};

/// RRefs (defined in rpc.hpp).
template <class T> void write_rref(Encoder& e, const RRef<T>& r);
template <class T> void read_rref(Decoder& d, RRef<T>& r);

/// Whether T can travel (see the top of this file).
template <class T>
constexpr bool encodable() {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_arithmetic_v<U> || std::is_enum_v<U> || std::is_same_v<U, std::string> ||
                std::is_same_v<U, Tensor> || detail::is_rref<U>::value)
    return true;
  else if constexpr (detail::is_vector<U>::value || detail::is_optional<U>::value)
    return encodable<typename U::value_type>();
  else if constexpr (detail::is_pair<U>::value)
    return encodable<typename U::first_type>() && encodable<typename U::second_type>();
  else if constexpr (detail::is_tuple<U>::value)
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (encodable<std::tuple_element_t<I, U>>() && ... && true);
    }(std::make_index_sequence<std::tuple_size_v<U>>());
  else
    return requires(Encoder& e, const U& x, Decoder& d, U& y) {
      dopt_encode(e, x);
      dopt_decode(d, y);
    };
}

void write_tensor(Encoder& e, const Tensor& t);
void read_tensor(Decoder& d, Tensor& t);

template <class T>
void write(Encoder& e, const T& x) {
  using U = std::remove_cvref_t<T>;
  static_assert(encodable<U>(), "dopt::rpc: this type cannot travel; give it dopt_encode/dopt_decode overloads");
  if constexpr (std::is_same_v<U, bool>) {
    e.put_tag(tag::boolean);
    e.put_pod<std::uint8_t>(x ? 1 : 0);
  } else if constexpr (std::is_enum_v<U>) {
    e.put_tag(tag::int64);
    e.put_pod<std::int64_t>(static_cast<std::int64_t>(x));
  } else if constexpr (std::is_integral_v<U> && std::is_signed_v<U>) {
    e.put_tag(tag::int64);
    e.put_pod<std::int64_t>(x);
  } else if constexpr (std::is_integral_v<U>) {
    e.put_tag(tag::uint64);
    e.put_pod<std::uint64_t>(x);
  } else if constexpr (std::is_floating_point_v<U>) {
    e.put_tag(tag::float64);
    e.put_pod<double>(static_cast<double>(x));
  } else if constexpr (std::is_same_v<U, std::string>) {
    e.put_tag(tag::string);
    e.put_pod<std::uint64_t>(x.size());
    e.put_raw(x.data(), x.size());
  } else if constexpr (std::is_same_v<U, Tensor>) {
    write_tensor(e, x);
  } else if constexpr (detail::is_rref<U>::value) {
    write_rref(e, x);
  } else if constexpr (detail::is_vector<U>::value) {
    e.put_tag(tag::vector);
    e.put_pod<std::uint64_t>(x.size());
    for (const auto& v : x) write(e, static_cast<const typename U::value_type&>(v));
  } else if constexpr (detail::is_optional<U>::value) {
    e.put_tag(tag::optional);
    e.put_pod<std::uint8_t>(x.has_value() ? 1 : 0);
    if (x) write(e, *x);
  } else if constexpr (detail::is_pair<U>::value) {
    e.put_tag(tag::tuple);
    e.put_pod<std::uint64_t>(2);
    write(e, x.first);
    write(e, x.second);
  } else if constexpr (detail::is_tuple<U>::value) {
    e.put_tag(tag::tuple);
    e.put_pod<std::uint64_t>(std::tuple_size_v<U>);
    std::apply([&](const auto&... v) { (write(e, v), ...); }, x);
  } else {
    dopt_encode(e, x);
  }
}

template <class T>
void read(Decoder& d, T& x) {
  using U = T;
  static_assert(encodable<U>(), "dopt::rpc: this type cannot travel; give it dopt_encode/dopt_decode overloads");
  if constexpr (std::is_same_v<U, bool>) {
    d.expect_tag(tag::boolean, "bool");
    x = d.get_pod<std::uint8_t>() != 0;
  } else if constexpr (std::is_arithmetic_v<U> || std::is_enum_v<U>) {
    const char t = d.get_tag();
    if (t == tag::int64 || t == tag::uint64) {
      const std::int64_t si = t == tag::int64 ? d.get_pod<std::int64_t>() : 0;
      const std::uint64_t ui = t == tag::uint64 ? d.get_pod<std::uint64_t>() : 0;
      if constexpr (std::is_floating_point_v<U>) {
        x = t == tag::int64 ? static_cast<U>(si) : static_cast<U>(ui);
      } else if constexpr (std::is_enum_v<U>) {
        x = static_cast<U>(t == tag::int64 ? si : static_cast<std::int64_t>(ui));
      } else {
        bool fits;
        if (t == tag::int64) {
          fits = std::is_signed_v<U> ? (si >= static_cast<std::int64_t>(std::numeric_limits<U>::min()) &&
                                        si <= static_cast<std::int64_t>(std::numeric_limits<U>::max()))
                                     : (si >= 0 && static_cast<std::uint64_t>(si) <=
                                                       static_cast<std::uint64_t>(std::numeric_limits<U>::max()));
          x = static_cast<U>(si);
        } else {
          fits = ui <= static_cast<std::uint64_t>(std::numeric_limits<U>::max());
          x = static_cast<U>(ui);
        }
        if (!fits) d.fail("integer " + (t == tag::int64 ? std::to_string(si) : std::to_string(ui)) +
                          " does not fit the receiving integer type");
      }
    } else if (t == tag::float64) {
      if constexpr (std::is_floating_point_v<U>) {
        x = static_cast<U>(d.get_pod<double>());
      } else {
        d.fail("expected an integer but the sender wrote a floating-point number");
      }
    } else {
      d.fail(std::string("expected a number but the sender wrote tag '") + t + "'");
    }
  } else if constexpr (std::is_same_v<U, std::string>) {
    d.expect_tag(tag::string, "string");
    const std::size_t n = d.count(d.get_pod<std::uint64_t>(), 1, "string bytes");
    x.resize(n);
    if (n) d.get_raw(x.data(), n);
  } else if constexpr (std::is_same_v<U, Tensor>) {
    read_tensor(d, x);
  } else if constexpr (detail::is_rref<U>::value) {
    read_rref(d, x);
  } else if constexpr (detail::is_vector<U>::value) {
    d.expect_tag(tag::vector, "vector");
    const std::size_t n = d.count(d.get_pod<std::uint64_t>(), 1, "vector elements");  // each at least a tag
    x.clear();
    x.reserve(n);
    for (std::uint64_t i = 0; i < n; ++i) {
      typename U::value_type v{};
      read(d, v);
      x.push_back(std::move(v));
    }
  } else if constexpr (detail::is_optional<U>::value) {
    if (d.peek_tag() != tag::optional) {  // a plain value where an optional is taken
      typename U::value_type v{};
      read(d, v);
      x = std::move(v);
    } else if (d.get_tag(), d.get_pod<std::uint8_t>()) {
      typename U::value_type v{};
      read(d, v);
      x = std::move(v);
    } else {
      x.reset();
    }
  } else if constexpr (detail::is_pair<U>::value) {
    d.expect_tag(tag::tuple, "pair");
    if (d.get_pod<std::uint64_t>() != 2) d.fail("expected a pair (2 values)");
    read(d, x.first);
    read(d, x.second);
  } else if constexpr (detail::is_tuple<U>::value) {
    d.expect_tag(tag::tuple, "tuple");
    const auto n = d.get_pod<std::uint64_t>();
    if (n != std::tuple_size_v<U>)
      d.fail("expected " + std::to_string(std::tuple_size_v<U>) + " values but the sender wrote " + std::to_string(n));
    std::apply([&](auto&... v) { (read(d, v), ...); }, x);
  } else {
    dopt_decode(d, x);
  }
}

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
