#include "dopt/runtime/tensor.hpp"
#include "dopt/runtime/internal/device_registry.hpp"
#include "dopt/runtime/internal/shm.hpp"

#include <dlpack/dlpack.h>
#include <sys/mman.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

namespace dopt {

// --- devices, shapes ---------------------------------------------------------------

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

std::int64_t shape_numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) {
    if (d < 0) throw ShapeError("Tensor", "negative dimension in shape " + shape_str(s));
    if (d != 0 && n > INT64_MAX / d)
      throw ShapeError("Tensor", "shape " + shape_str(s) + " has too many elements");
    n *= d;
  }
  return n;
}

// --- allocators ----------------------------------------------------------------------

namespace {

constexpr std::size_t k_huge_page = std::size_t(2) << 20;

// Large CPU tensors on transparent huge pages (shm::huge_pages_advised():
// DOPT_HUGEPAGES=0 turns it off). Memory first touched costs a page fault
// per 4 KiB page: writing 50 MB into fresh memory took 187 ms on this 2-CPU
// VM, against 4.9 ms in 2 MiB pages (docs/performance.md, 2026-12-04), and an
// optimizer's state, a recovery's re-partitioned state and a checkpoint's
// load are all fresh memory. Only whole 2 MiB blocks are advised, so no
// memory is wasted; the kernel falls back to small pages where it has no
// huge ones.
class CpuAllocator final : public Allocator {
 public:
  void* allocate(std::size_t nbytes, Device) override {
    if (nbytes == 0) return nullptr;
    const std::size_t rounded = (nbytes + 63) / 64 * 64;
    const bool huge = rounded >= k_huge_page && shm::huge_pages_advised();
    void* p = std::aligned_alloc(huge ? k_huge_page : 64, huge ? (rounded + k_huge_page - 1) / k_huge_page * k_huge_page
                                                              : rounded);
    if (!p) throw std::bad_alloc();
    if (huge) ::madvise(p, rounded / k_huge_page * k_huge_page, MADV_HUGEPAGE);  // advice only: errors ignored
    return p;
  }
  void deallocate(void* ptr, std::size_t, Device) noexcept override { std::free(ptr); }
  void copy(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t n) override {
    if (!dst_dev.is_cpu() || !src_dev.is_cpu())
      throw NotSupportedError("copy", "CPU allocator cannot copy " + src_dev.str() + " -> " + dst_dev.str());
    if (n) std::memmove(dst, src, n);
  }
  void memset_zero(void* ptr, Device, std::size_t n) override {
    if (n) std::memset(ptr, 0, n);
  }
};

CpuAllocator g_cpu_allocator;
std::array<std::atomic<Allocator*>, detail::kDeviceTypeCount> g_allocators{&g_cpu_allocator, nullptr};

}  // namespace

void register_allocator(DeviceType type, Allocator* allocator) {
  g_allocators.at(static_cast<std::size_t>(type)).store(allocator);
}

bool has_allocator(DeviceType type) noexcept {
  return g_allocators[static_cast<std::size_t>(type)].load() != nullptr;
}

Allocator& allocator_for(DeviceType type) {
  Allocator* a = g_allocators.at(static_cast<std::size_t>(type)).load();
  if (!a)
    throw NotSupportedError("allocate", type == DeviceType::CUDA
                                            ? std::string("CUDA tensors need the GPU backend: call dopt::gpu::init() "
                                                          "(dopt/gpu/device.hpp) once before making or copying "
                                                          "one; it is in dopt::gpu, built with DOPT_ENABLE_CUDA")
                                            : std::string("no allocator for device type cpu"));
  return *a;
}

// Copies between devices: whichever side is not CPU decides.
static Allocator& copier(Device a, Device b) {
  return allocator_for(a.is_cpu() ? b.type : a.type);
}

Storage::Storage(std::size_t nbytes, Device device)
    : data_(allocator_for(device.type).allocate(nbytes, device)),
      nbytes_(nbytes),
      device_(device),
      owned_(true) {}

Storage::Storage(void* data, std::size_t nbytes, Device device, std::shared_ptr<void> keep_alive)
    : data_(data), nbytes_(nbytes), device_(device), owned_(false), keep_alive_(std::move(keep_alive)) {}

Storage::~Storage() {
  if (owned_ && data_) allocator_for(device_.type).deallocate(data_, nbytes_, device_);
}

// --- Tensor ----------------------------------------------------------------------------

const TensorImpl& Tensor::impl(const char* op) const {
  if (!impl_) throw StateError(op, "called on an undefined tensor");
  return *impl_;
}

void check_defined(const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) throw ValueError(op, std::string(what) + " is undefined");
}
void check_same_shape(const Tensor& a, const Tensor& b, const char* op) {
  if (a.shape() != b.shape())
    throw ShapeError(op, "shape " + shape_str(a.shape()) + " does not match " + shape_str(b.shape()));
}
void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  if (a.dtype() != b.dtype())
    throw DTypeError(op, "dtype " + std::string(dtype_name(a.dtype())) + " does not match " +
                             std::string(dtype_name(b.dtype())));
}
void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  if (a.device() != b.device())
    throw DeviceError(op, "device " + a.device().str() + " does not match " + b.device().str());
}
void check_cpu(const Tensor& t, const char* op) {
  if (!t.device().is_cpu())
    throw DeviceError(op, "expected a cpu tensor, got one on " + t.device().str());
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  auto impl = std::make_shared<TensorImpl>();
  impl->numel = shape_numel(shape);
  impl->shape = std::move(shape);
  impl->dtype = dtype;
  impl->storage = std::make_shared<Storage>(static_cast<std::size_t>(impl->numel) * itemsize(dtype), device);
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::full(Shape shape, double value, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::scalar(double value, DType dtype) { return full(Shape{}, value, dtype); }

Tensor Tensor::from_blob(void* data, Shape shape, DType dtype, Device device,
                         std::shared_ptr<void> keep_alive) {
  auto impl = std::make_shared<TensorImpl>();
  impl->numel = shape_numel(shape);
  if (impl->numel > 0 && data == nullptr)
    throw ValueError("Tensor::from_blob", "null data pointer for shape " + shape_str(shape));
  impl->shape = std::move(shape);
  impl->dtype = dtype;
  impl->storage = std::make_shared<Storage>(data, static_cast<std::size_t>(impl->numel) * itemsize(dtype),
                                            device, std::move(keep_alive));
  return Tensor(std::move(impl));
}

DType Tensor::dtype() const { return impl("dtype").dtype; }
Device Tensor::device() const { return impl("device").storage->device(); }
const Shape& Tensor::shape() const { return impl("shape").shape; }
std::int64_t Tensor::numel() const { return impl("numel").numel; }
std::size_t Tensor::nbytes() const {
  const auto& i = impl("nbytes");
  return static_cast<std::size_t>(i.numel) * itemsize(i.dtype);
}
const std::shared_ptr<Storage>& Tensor::storage() const { return impl("storage").storage; }
std::size_t Tensor::storage_offset_bytes() const { return impl("storage_offset_bytes").offset_bytes; }

bool Tensor::shares_storage_with(const Tensor& other) const {
  if (!defined() || !other.defined()) return false;
  auto* a = static_cast<const char*>(data_ptr());
  auto* b = static_cast<const char*>(other.data_ptr());
  if (!a || !b || device() != other.device()) return false;
  return a < b + other.nbytes() && b < a + nbytes();
}

void* Tensor::data_ptr() const {
  const auto& i = impl("data_ptr");
  auto* base = static_cast<char*>(i.storage->data());
  return base ? base + i.offset_bytes : nullptr;
}

double Tensor::at(std::int64_t idx) const {
  const auto& i = impl("at");
  if (idx < 0 || idx >= i.numel)
    throw ValueError("Tensor::at", "index " + std::to_string(idx) + " out of range for " +
                                       std::to_string(i.numel) + " elements");
  if (!device().is_cpu()) return to(Device::cpu()).at(idx);
  return dispatch_dtype(i.dtype, [&](auto tag) {
    using T = decltype(tag);
    return to_double(static_cast<const T*>(data_ptr())[idx]);
  });
}

double Tensor::item() const {
  if (numel() != 1)
    throw ValueError("Tensor::item", "a tensor with " + std::to_string(numel()) +
                                         " elements cannot be converted to a scalar");
  return at(0);
}

Tensor Tensor::grad() const {
  const auto& i = impl("grad");
  return i.grad ? Tensor(i.grad) : Tensor();
}

void Tensor::set_grad(const Tensor& g) const {
  auto& i = const_cast<TensorImpl&>(impl("set_grad"));
  if (!g.defined()) {
    i.grad.reset();
    return;
  }
  if (g.is_same(*this) || g.shares_storage_with(*this))
    throw ValueError("set_grad", "the gradient shares memory with the tensor itself");
  check_same_shape(*this, g, "set_grad");
  check_same_dtype(*this, g, "set_grad");
  check_same_device(*this, g, "set_grad");
  i.grad = g.impl_;
}

bool Tensor::requires_grad() const { return impl("requires_grad").requires_grad; }
const Tensor& Tensor::set_requires_grad(bool v) const {
  const_cast<TensorImpl&>(impl("set_requires_grad")).requires_grad = v;
  return *this;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  out.copy_(*this);
  out.set_requires_grad(requires_grad());
  return out;
}

namespace {
template <class D, class S>
void convert_loop(D* dst, const S* src, std::int64_t n) {
  for (std::int64_t k = 0; k < n; ++k) {
    if constexpr (std::is_same_v<D, S>) dst[k] = src[k];
    else if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>)
      dst[k] = from_double<D>(double(float(src[k])));
    else if constexpr (std::is_same_v<D, float> && std::is_same_v<S, double>)
      dst[k] = static_cast<float>(src[k]);
    else dst[k] = from_double<D>(static_cast<double>(src[k]));
  }
}
}  // namespace

const Tensor& Tensor::copy_(const Tensor& src) const {
  check_defined(src, "copy_", "source");
  if (src.numel() != numel())
    throw ShapeError("copy_", "cannot copy " + std::to_string(src.numel()) + " elements into " +
                                  std::to_string(numel()));
  if (src.is_same(*this) || numel() == 0) return *this;
  if (src.dtype() == dtype()) {
    if (device().is_cpu() && src.device().is_cpu())
      std::memmove(data_ptr(), src.data_ptr(), nbytes());
    else
      copier(device(), src.device()).copy(data_ptr(), device(), src.data_ptr(), src.device(), nbytes());
    return *this;
  }
  if (!device().is_cpu() || !src.device().is_cpu()) {
    // convert on the host
    Tensor host = src.to(Device::cpu()).to(dtype());
    return copy_(host);
  }
  dispatch_dtype(dtype(), [&](auto dtag) {
    using D = decltype(dtag);
    dispatch_dtype(src.dtype(), [&](auto stag) {
      using S = decltype(stag);
      convert_loop(static_cast<D*>(data_ptr()), static_cast<const S*>(src.data_ptr()), numel());
    });
  });
  return *this;
}

const Tensor& Tensor::zero_() const {
  if (numel() == 0) return *this;
  if (device().is_cpu()) std::memset(data_ptr(), 0, nbytes());
  else allocator_for(device().type).memset_zero(data_ptr(), device(), nbytes());
  return *this;
}

const Tensor& Tensor::fill_(double value) const {
  if (!device().is_cpu()) {
    Tensor host = full(shape(), value, dtype());
    return copy_(host);
  }
  dispatch_dtype(dtype(), [&](auto tag) {
    using T = decltype(tag);
    T v = from_double<T>(value);
    T* p = static_cast<T*>(data_ptr());
    for (std::int64_t k = 0; k < numel(); ++k) p[k] = v;
  });
  return *this;
}

Tensor Tensor::to(DType dt) const {
  Tensor out = empty(shape(), dt, device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device dev) const {
  Tensor out = empty(shape(), dtype(), dev);
  out.copy_(*this);
  return out;
}

Tensor Tensor::view(Shape new_shape) const {
  const auto& i = impl("view");
  if (shape_numel(new_shape) != i.numel)
    throw ShapeError("view", "shape " + shape_str(new_shape) + " is invalid for " +
                                 std::to_string(i.numel) + " elements");
  auto v = std::make_shared<TensorImpl>(i);
  v->grad.reset();
  v->shape = std::move(new_shape);
  return Tensor(std::move(v));
}

Tensor Tensor::flat_slice(std::int64_t offset, std::int64_t count) const {
  const auto& i = impl("flat_slice");
  if (offset < 0 || count < 0 || offset > i.numel || count > i.numel - offset)
    throw ShapeError("flat_slice", "range [" + std::to_string(offset) + ", " +
                                       std::to_string(offset + count) + ") is outside " +
                                       std::to_string(i.numel) + " elements");
  auto v = std::make_shared<TensorImpl>(i);
  v->grad.reset();
  v->shape = Shape{count};
  v->numel = count;
  v->offset_bytes = i.offset_bytes + static_cast<std::size_t>(offset) * itemsize(i.dtype);
  return Tensor(std::move(v));
}

void Tensor::set_data(const Tensor& other) const {
  check_defined(other, "set_data", "new data");
  auto& i = const_cast<TensorImpl&>(impl("set_data"));
  const auto& o = other.impl("set_data");
  i.storage = o.storage;
  i.offset_bytes = o.offset_bytes;
  i.shape = o.shape;
  i.numel = o.numel;
  i.dtype = o.dtype;
}

bool Tensor::equal(const Tensor& other) const {
  if (!defined() || !other.defined()) return defined() == other.defined();
  if (shape() != other.shape() || dtype() != other.dtype()) return false;
  Tensor a = device().is_cpu() ? *this : to(Device::cpu());
  Tensor b = other.device().is_cpu() ? other : other.to(Device::cpu());
  return nbytes() == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), nbytes()) == 0;
}

double Tensor::max_abs_diff(const Tensor& other) const {
  if (numel() != other.numel())
    throw ShapeError("max_abs_diff", "element counts differ: " + std::to_string(numel()) + " vs " +
                                         std::to_string(other.numel()));
  Tensor a = to(DType::float64).to(Device::cpu());
  Tensor b = other.to(DType::float64).to(Device::cpu());
  double m = 0;
  const double* pa = a.data<double>();
  const double* pb = b.data<double>();
  for (std::int64_t k = 0; k < numel(); ++k) {
    const double d = std::fabs(pa[k] - pb[k]);
    if (std::isnan(d)) return d;
    if (d > m) m = d;
  }
  return m;
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor[undefined]";
  return "Tensor[" + std::string(dtype_name(dtype())) + ", " + shape_str(shape()) + ", " +
         device().str() + "]";
}

// --- DLPack ----------------------------------------------------------------------------

namespace {
DLDataType to_dl(DType dt) {
  switch (dt) {
    case DType::float32: return {kDLFloat, 32, 1};
    case DType::float64: return {kDLFloat, 64, 1};
    case DType::float16: return {kDLFloat, 16, 1};
    case DType::bfloat16: return {kDLBfloat, 16, 1};
    case DType::int8: return {kDLInt, 8, 1};
    case DType::uint8: return {kDLUInt, 8, 1};
    case DType::int32: return {kDLInt, 32, 1};
    case DType::int64: return {kDLInt, 64, 1};
    case DType::bool_: return {kDLUInt, 8, 1};  // this DLPack version has no kDLBool
  }
  return {kDLFloat, 32, 1};
}

DType from_dl(DLDataType t) {
  if (t.lanes != 1) throw DTypeError("from_dlpack", "vector lanes are not supported");
  if (t.code == kDLFloat && t.bits == 32) return DType::float32;
  if (t.code == kDLFloat && t.bits == 64) return DType::float64;
  if (t.code == kDLFloat && t.bits == 16) return DType::float16;
  if (t.code == kDLBfloat && t.bits == 16) return DType::bfloat16;
  if (t.code == kDLInt && t.bits == 8) return DType::int8;
  if (t.code == kDLUInt && t.bits == 8) return DType::uint8;
  if (t.code == kDLInt && t.bits == 32) return DType::int32;
  if (t.code == kDLInt && t.bits == 64) return DType::int64;
  throw DTypeError("from_dlpack", "unsupported DLPack dtype code " + std::to_string(t.code) +
                                      " bits " + std::to_string(t.bits));
}

struct DlpackExport {
  std::shared_ptr<Storage> storage;  // the bytes, even if the tensor is re-pointed by set_data
  std::vector<std::int64_t> shape;
  DLManagedTensor managed{};
};
}  // namespace

DLManagedTensor* Tensor::to_dlpack() const {
  const auto& i = impl("to_dlpack");
  auto* ctx = new DlpackExport{i.storage, i.shape, {}};
  DLTensor& dl = ctx->managed.dl_tensor;
  dl.data = data_ptr();
  dl.device = DLDevice{device().is_cpu() ? kDLCPU : kDLCUDA, device().index};
  dl.ndim = static_cast<std::int32_t>(i.shape.size());
  dl.dtype = to_dl(i.dtype);
  dl.shape = ctx->shape.data();
  dl.strides = nullptr;  // compact row-major
  dl.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<DlpackExport*>(self->manager_ctx);
  };
  return &ctx->managed;
}

Tensor Tensor::from_dlpack(DLManagedTensor* managed) {
  if (!managed) throw ValueError("from_dlpack", "null DLManagedTensor");
  std::shared_ptr<DLManagedTensor> guard(managed, [](DLManagedTensor* m) {
    if (m->deleter) m->deleter(m);
  });
  const DLTensor& dl = managed->dl_tensor;
  Device dev;
  if (dl.device.device_type == kDLCPU) dev = Device::cpu();
  else if (dl.device.device_type == kDLCUDA) dev = Device::cuda(dl.device.device_id);
  else
    throw DeviceError("from_dlpack", "unsupported DLPack device type " +
                                         std::to_string(static_cast<int>(dl.device.device_type)));
  if (dl.ndim < 0) throw ShapeError("from_dlpack", "negative ndim");
  if (dl.ndim > 0 && dl.shape == nullptr) throw ShapeError("from_dlpack", "null shape with ndim > 0");
  Shape shape(dl.shape, dl.shape + dl.ndim);
  if (dl.strides) {
    std::int64_t expect = 1;
    for (std::int64_t d = dl.ndim - 1; d >= 0; --d) {
      if (shape[d] != 1 && dl.strides[d] != expect)
        throw ShapeError("from_dlpack", "only compact row-major tensors are supported (dim " +
                                            std::to_string(d) + " has stride " +
                                            std::to_string(dl.strides[d]) + ")");
      expect *= shape[d];
    }
  }
  DType dt = from_dl(dl.dtype);
  void* data = static_cast<char*>(dl.data) + dl.byte_offset;
  return from_blob(data, std::move(shape), dt, dev, guard);
}

}  // namespace dopt
