#pragma once
// dopt::Tensor: a dense, contiguous, row-major tensor handle.
//
// A Tensor is a shared handle (like torch.Tensor / at::Tensor): copying a
// Tensor shares its storage and its grad slot. Storage is either owned
// (allocated by dopt through the allocator registered for its device) or a
// view over memory the caller owns (Tensor::from_blob), so a trainer can hand
// its own buffers in without a copy; the caller then keeps that memory alive
// for as long as any Tensor over it lives.
//
// Thread-safety: distinct Tensors may be used from distinct threads; one
// Tensor's data must not be written while another thread reads it.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "dopt/runtime/dtype.hpp"
#include "dopt/runtime/error.hpp"

struct DLManagedTensor;

namespace dopt {

enum class DeviceType : std::uint8_t { CPU = 0, CUDA = 1 };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(i) {}
  static constexpr Device cpu() { return Device(DeviceType::CPU, 0); }
  static constexpr Device cuda(int i = 0) { return Device(DeviceType::CUDA, i); }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  friend bool operator==(const Device&, const Device&) = default;
  std::string str() const;  // "cpu", "cuda:1"
};

using Shape = std::vector<std::int64_t>;
std::string shape_str(const Shape& s);  // "[4, 3]"
std::int64_t shape_numel(const Shape& s);

/// Allocates and frees device memory. CPU has a built-in one (64-byte
/// aligned; blocks of 2 MiB and more 2 MiB aligned, their whole 2 MiB
/// pages advised for transparent huge pages unless DOPT_HUGEPAGES=0, read
/// once per process); gpu/ registers a caching CUDA allocator at load time.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(std::size_t nbytes, Device device) = 0;
  virtual void deallocate(void* ptr, std::size_t nbytes, Device device) noexcept = 0;
  /// Copies nbytes between any two devices this allocator knows (one of them may be CPU).
  virtual void copy(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t nbytes) = 0;
  /// Fills nbytes with zero.
  virtual void memset_zero(void* ptr, Device device, std::size_t nbytes) = 0;
};
void register_allocator(DeviceType type, Allocator* allocator);
/// Throws NotSupportedError when nothing is registered (e.g. CUDA without gpu/).
Allocator& allocator_for(DeviceType type);
bool has_allocator(DeviceType type) noexcept;

/// Bytes that a tensor's data lives in.
class Storage {
 public:
  /// Owned storage of nbytes on device (uninitialised).
  Storage(std::size_t nbytes, Device device);
  /// Non-owning view; `keep_alive` (may be empty) is released with the storage.
  Storage(void* data, std::size_t nbytes, Device device, std::shared_ptr<void> keep_alive);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const noexcept { return data_; }
  std::size_t nbytes() const noexcept { return nbytes_; }
  Device device() const noexcept { return device_; }
  bool owned() const noexcept { return owned_; }

 private:
  void* data_ = nullptr;
  std::size_t nbytes_ = 0;
  Device device_;
  bool owned_ = false;
  std::shared_ptr<void> keep_alive_;
};

struct TensorImpl;

class Tensor {
 public:
  /// An undefined tensor (torch's None).
  Tensor() = default;

  // --- factories ------------------------------------------------------------
  static Tensor empty(Shape shape, DType dtype = DType::float32, Device device = Device::cpu());
  static Tensor zeros(Shape shape, DType dtype = DType::float32, Device device = Device::cpu());
  static Tensor full(Shape shape, double value, DType dtype = DType::float32,
                     Device device = Device::cpu());
  /// 0-d tensor holding one value.
  static Tensor scalar(double value, DType dtype = DType::float32);
  /// A view over caller-owned memory (no copy). `keep_alive` is held as long as the view lives.
  static Tensor from_blob(void* data, Shape shape, DType dtype, Device device = Device::cpu(),
                          std::shared_ptr<void> keep_alive = {});
  /// Copies values in (CPU).
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, Shape shape);
  template <class T>
  static Tensor from_vector(const std::vector<T>& values) {
    return from_vector(values, Shape{static_cast<std::int64_t>(values.size())});
  }

  // --- properties -------------------------------------------------------------
  bool defined() const noexcept { return impl_ != nullptr; }
  explicit operator bool() const noexcept { return defined(); }
  DType dtype() const;
  Device device() const;
  const Shape& shape() const;
  const Shape& sizes() const { return shape(); }
  std::int64_t dim() const { return static_cast<std::int64_t>(shape().size()); }
  std::int64_t numel() const;
  std::size_t nbytes() const;
  std::size_t element_size() const { return itemsize(dtype()); }
  /// Identity: the same tensor object (shares impl), not equal values.
  bool is_same(const Tensor& other) const noexcept { return impl_ == other.impl_; }
  /// A stable key for identity-keyed maps (torch keys optimizer state by tensor object).
  const TensorImpl* key() const noexcept { return impl_.get(); }
  /// Whether this tensor shares storage bytes with other (overlapping ranges).
  bool shares_storage_with(const Tensor& other) const;
  const std::shared_ptr<Storage>& storage() const;
  std::size_t storage_offset_bytes() const;

  // --- data access (CPU) ------------------------------------------------------
  void* data_ptr() const;
  template <class T> T* data() const;
  /// The single element of a 1-element tensor, as double.
  double item() const;
  /// Element i of the flattened tensor, as double (slow; for tests and tools).
  double at(std::int64_t i) const;
  template <class T> std::vector<T> to_vector() const;

  // --- autograd-like slots ----------------------------------------------------
  /// The gradient; undefined when there is none (torch: .grad is None).
  Tensor grad() const;
  /// Sets or clears (undefined tensor) the gradient. Shape, dtype and device must match.
  void set_grad(const Tensor& g) const;
  bool requires_grad() const;
  const Tensor& set_requires_grad(bool v) const;

  // --- operations -------------------------------------------------------------
  /// A deep copy with its own owned storage.
  Tensor clone() const;
  /// Copies src's values into this tensor (same numel; dtype converted; devices may differ).
  const Tensor& copy_(const Tensor& src) const;
  const Tensor& zero_() const;
  const Tensor& fill_(double value) const;
  /// A new tensor converted to dtype (a clone when dtype is already this one's).
  Tensor to(DType dtype) const;
  /// A new tensor on device (a clone when already there).
  Tensor to(Device device) const;
  /// A view with another shape and the same numel.
  Tensor view(Shape shape) const;
  Tensor flatten() const { return view(Shape{numel()}); }
  /// A view of elements [offset, offset + count) of the flattened tensor.
  Tensor flat_slice(std::int64_t offset, std::int64_t count) const;
  /// Re-points this tensor object (every handle to it) at other's storage, shape
  /// and dtype, like torch's `param.data = other`. The grad slot is kept.
  void set_data(const Tensor& other) const;
  /// Element-wise equality of shape, dtype and every value (bitwise for floats, NaN == NaN).
  bool equal(const Tensor& other) const;
  /// Maximum absolute difference of values (both converted to double).
  double max_abs_diff(const Tensor& other) const;

  // --- DLPack -------------------------------------------------------------------
  /// Exports a DLPack tensor that shares this tensor's memory and keeps it alive
  /// until the consumer calls its deleter.
  DLManagedTensor* to_dlpack() const;
  /// Imports a DLPack tensor without a copy; calls its deleter when the last
  /// handle goes away. Only contiguous row-major tensors are accepted.
  static Tensor from_dlpack(DLManagedTensor* managed);

  std::string str() const;  // "Tensor[float32, [4, 3], cpu]"

 private:
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  const TensorImpl& impl(const char* op) const;
  std::shared_ptr<TensorImpl> impl_;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  std::size_t offset_bytes = 0;
  Shape shape;
  DType dtype = DType::float32;
  std::int64_t numel = 0;
  bool requires_grad = true;
  std::shared_ptr<TensorImpl> grad;
};

// --- checks that throw errors naming the op -------------------------------------
void check_defined(const Tensor& t, const char* op, const char* what = "tensor");
void check_same_shape(const Tensor& a, const Tensor& b, const char* op);
void check_same_dtype(const Tensor& a, const Tensor& b, const char* op);
void check_same_device(const Tensor& a, const Tensor& b, const char* op);
void check_cpu(const Tensor& t, const char* op);

// --- templates -------------------------------------------------------------------
template <class T>
T* Tensor::data() const {
  const auto& i = impl("data");
  if (i.dtype != dtype_of_v<T>)
    throw DTypeError("Tensor::data", "requested " + std::string(dtype_name(dtype_of_v<T>)) +
                                         " from a " + std::string(dtype_name(i.dtype)) + " tensor");
  return static_cast<T*>(data_ptr());
}

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, Shape shape) {
  if (shape_numel(shape) != static_cast<std::int64_t>(values.size()))
    throw ShapeError("Tensor::from_vector", std::to_string(values.size()) +
                                                " values do not fill shape " + shape_str(shape));
  Tensor t = empty(std::move(shape), dtype_of_v<T>);
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(T));
  return t;
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = device().is_cpu() ? *this : to(Device::cpu());
  if (c.dtype() != dtype_of_v<T>) c = c.to(dtype_of_v<T>);
  std::vector<T> out(static_cast<std::size_t>(c.numel()));
  if (!out.empty()) std::memcpy(out.data(), c.data_ptr(), out.size() * sizeof(T));
  return out;
}

}  // namespace dopt
