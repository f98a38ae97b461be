// The bodies of rpc.hpp's templates: registration, the calls of Agent and
// RRef, and RRefs on the wire. Not an API of its own (names here may
// change); include dopt/actors/rpc.hpp, which includes this file at its end.
#ifndef DOPT_RPC_CALLS_FROM_RPC_HPP
#include "dopt/actors/rpc.hpp"  // included alone: rpc.hpp brings this file in
#elif !defined(DOPT_ACTORS_DETAIL_RPC_TEMPLATES_HPP)
#define DOPT_ACTORS_DETAIL_RPC_TEMPLATES_HPP
#include <cstdint>
#include <memory>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "dopt/actors/detail/rpc_calls.hpp"

namespace dopt::rpc {

template <class F>
void register_function(const std::string& name, F f) {
  detail::register_entry(name, detail::make_entry<void, false>(std::move(f)));
}
template <class T, class F>
void register_method(const std::string& name, F f) {
  detail::register_entry(name, detail::make_entry<T, true>(std::move(f)));
}

// --- RRef<T> ---------------------------------------------------------------

template <class T>
WorkerInfo RRef<T>::owner() const {
  return detail::core_worker(*state("RRef.owner").core, s_->owner);
}
template <class T>
int RRef<T>::owner_rank() const {
  return state("RRef.owner_rank").owner;
}
template <class T>
bool RRef<T>::is_owner() const {
  return detail::core_rank(*state("RRef.is_owner").core) == s_->owner;
}
template <class T>
std::uint64_t RRef<T>::id() const {
  return state("RRef.id").id;
}
template <class T>
T& RRef<T>::local_value() const {
  auto& s = state("RRef.local_value");
  return *static_cast<T*>(detail::local_object(*s.core, s.id, s.owner, typeid(T).name(), "RRef.local_value"));
}
template <class T>
template <class R, class... A>
Future<R> RRef<T>::call(const Fn& method, const A&... args) const {
  auto& s = state("RRef.rpc_async");
  auto spec = detail::make_spec(To(s.owner), method, detail::Mode::method, args...);
  spec.target = s.id;
  auto f = detail::send_call(s.core, std::move(spec));
  // The value must outlive the call: the future keeps this handle.
  auto keep = s_;
  return detail::typed_result<R>(s.core, f.then([keep](Future<std::vector<char>> b) { return b.get(); }),
                                 "result of '" + method.name + "'");
}
template <class T>
const RRefState& RRef<T>::state(const char* op) const {
  if (!s_) throw StateError(op, "the RRef is empty (default-constructed)");
  return *s_;
}

template <class T>
void write_rref(Encoder& e, const RRef<T>& r) {
  if (!r.valid()) throw ValueError("rpc", "an empty RRef cannot be sent");
  const auto& s = *r.state_ptr();
  e.put_tag(tag::rref);
  e.put_pod<std::int64_t>(s.owner);
  e.put_pod<std::uint64_t>(s.id);
  write(e, s.type);
  e.rrefs.push_back(r.state_ptr());
}
template <class T>
void read_rref(Decoder& d, RRef<T>& r) {
  d.expect_tag(tag::rref, "RRef");
  const auto owner = d.get_pod<std::int64_t>();
  const auto id = d.get_pod<std::uint64_t>();
  std::string type;
  read(d, type);
  if (type != typeid(T).name())
    d.fail("an RRef to a value of type " + detail::readable_type_name(type) + " cannot be read as an RRef to " +
           detail::readable_type_name(typeid(T).name()));
  if (!d.core()) d.fail("RRefs can only be read by an agent");
  r = RRef<T>(detail::adopt_rref(d.core(), static_cast<int>(owner), id, type));
}

// --- Agent -----------------------------------------------------------------

template <class R, class... A>
Future<R> Agent::rpc_async(const To& to, const Fn& fn, const A&... args) const {
  auto f = detail::send_call(core_, detail::make_spec(to, fn, detail::Mode::call, args...));
  return detail::typed_result<R>(core_, std::move(f), "result of '" + fn.name + "'");
}
template <class T, class... A>
RRef<T> Agent::remote(const To& to, const Fn& fn, const A&... args) const {
  auto spec = detail::make_spec(to, fn, detail::Mode::remote, args...);
  const int owner = detail::resolve_rank(*core_, to, "remote");
  spec.new_object = detail::new_object_id(*core_);
  auto state = detail::created_rref(core_, owner, spec.new_object, typeid(T).name());
  // The creation's own reply carries only errors; uses of the RRef see them.
  (void)detail::send_call(core_, std::move(spec));
  return RRef<T>(std::move(state));
}
template <class T>
RRef<T> Agent::make_rref(T value) const {
  detail::ObjectValue v;
  v.value = std::make_shared<T>(std::move(value));
  v.type = typeid(T).name();
  v.encode = [](const void* p, Encoder& out) {
    if constexpr (encodable<T>())
      write(out, *static_cast<const T*>(p));
    else
      throw TypeError("RRef.to_here", "the value type " + detail::readable_type_name(typeid(T).name()) + " cannot travel");
  };
  return RRef<T>(detail::own_value(core_, std::move(v)));
}

}  // namespace dopt::rpc

#endif
