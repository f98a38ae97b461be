// The machinery that the templates of rpc.hpp expand to: call specs,
// type-erased function entries, RRef holds. Not an API of its own (names
// here may change); include dopt/actors/rpc.hpp, which includes this file at
// its end, before the templates' bodies (rpc_templates.hpp).
#ifndef DOPT_RPC_CALLS_FROM_RPC_HPP
#include "dopt/actors/rpc.hpp"  // included alone: rpc.hpp brings this file in
#elif !defined(DOPT_ACTORS_DETAIL_RPC_CALLS_HPP)
#define DOPT_ACTORS_DETAIL_RPC_CALLS_HPP
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/actors/rpc_serialize.hpp"

namespace dopt::rpc {

/// One worker's counted hold on an object (rpc.hpp, "RRefs"). The
/// destructor tells the owner.
struct RRefState {
  std::shared_ptr<AgentCore> core;
  int owner = -1;
  std::uint64_t id = 0;
  std::string type;
  ~RRefState();
};

namespace detail {

/// A value owned by a worker, type-erased.
struct ObjectValue {
  std::shared_ptr<void> value;
  std::string type;  // typeid(T).name()
  /// Writes the value (TypeError when T is not encodable).
  std::function<void(const void*, Encoder&)> encode;
};

struct FunctionEntry {
  /// Methods: typeid(T).name() of the value they run on; free functions: "".
  std::string target_type;
  /// Runs the function and writes its result.
  std::function<void(Agent&, void* target, Decoder& args, Encoder& result)> call;
  /// Free functions with a result: runs it and keeps the result (remote()).
  std::function<ObjectValue(Agent&, Decoder& args)> make_object;
};

void register_entry(const std::string& name, FunctionEntry entry);

enum class Mode : int { call = 0, remote = 1, method = 2 };

struct CallSpec {
  To to{-1};
  std::string fn;
  Mode mode = Mode::call;
  std::uint64_t target = 0;      // method: the object
  std::uint64_t new_object = 0;  // remote: the object to create
  std::vector<char> args;
  std::vector<std::shared_ptr<RRefState>> rrefs;  // handed on to the receiver
  std::optional<std::chrono::milliseconds> timeout;
  int copies = 1;
  int retries = 0;
};

/// Posts the call to the agent; the future holds the encoded result.
Future<std::vector<char>> send_call(const std::shared_ptr<AgentCore>& core, CallSpec spec);
int resolve_rank(const AgentCore& core, const To& to, const char* op);
std::uint64_t new_object_id(AgentCore& core);
int core_rank(const AgentCore& core);
WorkerInfo core_worker(const AgentCore& core, int rank);

/// A state for an RRef that arrived in a message (counted by its sender).
std::shared_ptr<RRefState> adopt_rref(const std::shared_ptr<AgentCore>& core, int owner, std::uint64_t id,
                                      const std::string& type);
/// A state for `id`, created here by remote() (counted by the owner on receipt).
std::shared_ptr<RRefState> created_rref(const std::shared_ptr<AgentCore>& core, int owner, std::uint64_t id,
                                        const std::string& type);
/// Stores v as a new object owned here, held by the returned state.
std::shared_ptr<RRefState> own_value(const std::shared_ptr<AgentCore>& core, ObjectValue v);
/// The owned object's value (StateError when `owner` is another worker or
/// the value was freed; waits while its remote() runs or has not arrived,
/// TimeoutError after rpc_timeout; TypeError for another type).
void* local_object(AgentCore& core, std::uint64_t id, int owner, const std::string& type, const char* op);

template <class F> struct fn_traits : fn_traits<decltype(&std::remove_cvref_t<F>::operator())> {};
template <class R, class... A> struct fn_traits<R (*)(A...)> {
  using result = R;
  using args = std::tuple<A...>;
};
template <class R, class... A> struct fn_traits<R(A...)> : fn_traits<R (*)(A...)> {};
template <class C, class R, class... A> struct fn_traits<R (C::*)(A...) const> : fn_traits<R (*)(A...)> {};
template <class C, class R, class... A> struct fn_traits<R (C::*)(A...)> : fn_traits<R (*)(A...)> {};

template <class T>
auto normalise_arg(const T& x) {
  if constexpr (std::is_convertible_v<const T&, std::string> && !std::is_same_v<T, std::string>)
    return std::string(x);
  else
    return std::cref(x);
}

template <class... A>
CallSpec make_spec(const To& to, const Fn& fn, Mode mode, const A&... a) {
  CallSpec s;
  s.to = to;
  s.fn = fn.name;
  s.mode = mode;
  s.timeout = fn.timeout;
  s.retries = fn.retries;
  Encoder e;
  e.put_tag(tag::tuple);
  e.put_pod<std::uint64_t>(sizeof...(A));
  [[maybe_unused]] auto one = [&](const auto& x) {
    auto n = normalise_arg(x);
    if constexpr (std::is_same_v<decltype(n), std::string>)
      write(e, n);
    else
      write(e, n.get());
  };
  (one(a), ...);
  s.rrefs = std::move(e.rrefs);
  s.args = e.take();
  return s;
}

template <class R>
Future<R> typed_result(const std::shared_ptr<AgentCore>& core, Future<std::vector<char>> f, std::string what) {
  return f.then([core, what](Future<std::vector<char>> b) -> R {
    std::vector<char> bytes = b.get();
    if constexpr (std::is_void_v<R>) {
      return;
    } else {
      Decoder d(bytes, core, what);
      R r{};
      read(d, r);
      return r;
    }
  });
}

template <class Args, std::size_t Skip, std::size_t... I>
auto decode_params(Decoder& d, std::index_sequence<I...>) {
  std::tuple<std::remove_cvref_t<std::tuple_element_t<Skip + I, Args>>...> vals;
  d.expect_tag(tag::tuple, "argument list");
  const auto n = d.get_pod<std::uint64_t>();
  if (n != sizeof...(I))
    d.fail("the function takes " + std::to_string(sizeof...(I)) + " argument(s) but the caller sent " +
           std::to_string(n));
  (read(d, std::get<I>(vals)), ...);
  if (!d.at_end()) d.fail("trailing bytes after the arguments");
  return vals;
}

template <class T, bool Method, class F>
FunctionEntry make_entry(F f) {
  using Tr = fn_traits<F>;
  using Args = typename Tr::args;
  using R = typename Tr::result;
  constexpr std::size_t N = std::tuple_size_v<Args>;
  constexpr bool has_agent = [] {
    if constexpr (N > 0) return std::is_same_v<std::remove_cvref_t<std::tuple_element_t<0, Args>>, Agent>;
    else return false;
  }();
  constexpr std::size_t skip = (has_agent ? 1 : 0) + (Method ? 1 : 0);
  static_assert(N >= skip, "a method takes the value (T&) first, after an optional Agent&");
  auto run = [f](Agent& a, void* target, Decoder& d) -> R {
    auto vals = decode_params<Args, skip>(d, std::make_index_sequence<N - skip>());
    return [&]<std::size_t... I>(std::index_sequence<I...>) -> R {
      auto arg = [&]<std::size_t J>(std::integral_constant<std::size_t, J>) -> decltype(auto) {
        return static_cast<std::tuple_element_t<skip + J, Args>&&>(std::get<J>(vals));
      };
      if constexpr (Method) {
        T& obj = *static_cast<T*>(target);
        if constexpr (has_agent) return f(a, obj, arg(std::integral_constant<std::size_t, I>{})...);
        else return f(obj, arg(std::integral_constant<std::size_t, I>{})...);
      } else {
        (void)target;
        if constexpr (has_agent) return f(a, arg(std::integral_constant<std::size_t, I>{})...);
        else return f(arg(std::integral_constant<std::size_t, I>{})...);
      }
    }(std::make_index_sequence<N - skip>());
  };
  FunctionEntry e;
  if constexpr (Method) e.target_type = typeid(T).name();
  e.call = [run](Agent& a, void* target, Decoder& d, Encoder& out) {
    if constexpr (std::is_void_v<R>) {
      run(a, target, d);
    } else if constexpr (encodable<R>()) {
      write(out, run(a, target, d));
    } else {
      throw TypeError("rpc", "the result type " + readable_type_name(typeid(R).name()) +
                                 " cannot travel; call this function with remote() instead");
    }
  };
  if constexpr (!Method && !std::is_void_v<R>) {
    e.make_object = [run](Agent& a, Decoder& d) {
      ObjectValue v;
      v.value = std::make_shared<std::remove_cvref_t<R>>(run(a, nullptr, d));
      v.type = typeid(std::remove_cvref_t<R>).name();
      v.encode = [](const void* p, Encoder& out) {
        if constexpr (encodable<R>())
          write(out, *static_cast<const std::remove_cvref_t<R>*>(p));
        else
          throw TypeError("RRef.to_here", "the value type " + readable_type_name(typeid(R).name()) + " cannot travel");
      };
      return v;
    };
  }
  return e;
}

}  // namespace detail

}  // namespace dopt::rpc

#endif
