#pragma once
// The bodies of rpc_serialize.hpp's templates (encodable, write, read) and
// the type traits they dispatch on. Not an API of its own (names here may
// change); include dopt/actors/rpc_serialize.hpp, which includes this file
// at its end.
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dopt/actors/rpc_serialize.hpp"

namespace dopt::rpc {

namespace detail {
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

// encodable<T>(): rpc_serialize.hpp says what travels.
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

}  // namespace dopt::rpc
