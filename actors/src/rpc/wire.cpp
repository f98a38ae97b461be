// The RPC wire format's out-of-line parts (rpc_serialize.hpp): tensors,
// readable type names, and errors by kind.
#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "dopt/actors/rpc.hpp"

namespace dopt::rpc {

// --- errors ---------------------------------------------------------------------------

std::string error_kind(const Error& e) {
#define DOPT_KIND(T) \
  if (dynamic_cast<const T*>(&e)) return #T;
  DOPT_KIND(PeerLostError)
  DOPT_KIND(CollectiveMismatchError)
  DOPT_KIND(TimeoutError)
  DOPT_KIND(NotSupportedError)
  DOPT_KIND(IOError)
  DOPT_KIND(StateDictError)
  DOPT_KIND(StateError)
  DOPT_KIND(DeviceError)
  DOPT_KIND(DTypeError)
  DOPT_KIND(ShapeError)
  DOPT_KIND(KeyError)
  DOPT_KIND(TypeError)
  DOPT_KIND(ValueError)
#undef DOPT_KIND
  return "Error";
}

std::exception_ptr make_error(const std::string& kind, const std::string& op, const std::string& what,
                              std::optional<int> rank) {
#define DOPT_MAKE(T) \
  if (kind == #T) return std::make_exception_ptr(T(op, what, rank));
  DOPT_MAKE(PeerLostError)
  DOPT_MAKE(CollectiveMismatchError)
  DOPT_MAKE(TimeoutError)
  DOPT_MAKE(NotSupportedError)
  DOPT_MAKE(IOError)
  DOPT_MAKE(StateDictError)
  DOPT_MAKE(StateError)
  DOPT_MAKE(DeviceError)
  DOPT_MAKE(DTypeError)
  DOPT_MAKE(ShapeError)
  DOPT_MAKE(KeyError)
  DOPT_MAKE(TypeError)
  DOPT_MAKE(ValueError)
#undef DOPT_MAKE
  return std::make_exception_ptr(Error(op, what, rank));
}

// --- tensors on the wire ------------------------------------------------------------------

void write_tensor(Encoder& e, const Tensor& t) {
  e.put_tag(tag::tensor);
  e.put_pod<std::uint8_t>(t.defined() ? 1 : 0);
  if (!t.defined()) return;
  const Tensor c = t.device().is_cpu() ? t : t.to(Device::cpu());
  e.put_pod<std::uint8_t>(static_cast<std::uint8_t>(c.dtype()));
  e.put_pod<std::uint64_t>(c.shape().size());
  for (auto d : c.shape()) e.put_pod<std::int64_t>(d);
  e.put_pod<std::uint64_t>(c.nbytes());
  if (c.nbytes()) e.put_raw(c.data_ptr(), c.nbytes());
}

void read_tensor(Decoder& d, Tensor& t) {
  d.expect_tag(tag::tensor, "Tensor");
  if (!d.get_pod<std::uint8_t>()) {
    t = Tensor();
    return;
  }
  const auto dt = d.get_pod<std::uint8_t>();
  if (dt > static_cast<std::uint8_t>(DType::bool_)) d.fail("unknown dtype code " + std::to_string(dt));
  const auto nd = d.get_pod<std::uint64_t>();
  if (nd > 64) d.fail("a tensor of " + std::to_string(nd) + " dimensions");
  Shape shape(nd);
  std::uint64_t numel = 1;
  bool overflow = false;
  for (auto& x : shape) {
    x = d.get_pod<std::int64_t>();
    if (x < 0) d.fail("a tensor with a negative dimension " + std::to_string(x));
    overflow = overflow || __builtin_mul_overflow(numel, static_cast<std::uint64_t>(x), &numel);
  }
  const auto nbytes = d.get_pod<std::uint64_t>();
  const DType dtype = static_cast<DType>(dt);
  std::uint64_t want = 0;
  if (overflow || __builtin_mul_overflow(numel, static_cast<std::uint64_t>(itemsize(dtype)), &want) || nbytes != want)
    d.fail("tensor bytes do not match its shape " + shape_str(shape));
  // Checked before the tensor is allocated: a shape may promise more than came.
  if (nbytes > d.remaining()) d.fail("the message ends early (truncated or of another type)");
  t = Tensor::empty(shape, dtype);
  if (nbytes) d.get_raw(t.data_ptr(), nbytes);
}

namespace detail {

std::string readable_type_name(const std::string& mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status),
                                              std::free);
  return status == 0 && out ? std::string(out.get()) : mangled;
}

}  // namespace detail

}  // namespace dopt::rpc
