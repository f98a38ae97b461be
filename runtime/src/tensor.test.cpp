#include <catch2/catch.hpp>

#include <dlpack/dlpack.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "dopt/runtime/tensor.hpp"

using namespace dopt;

TEST_CASE("Tensor factories, shape and dtype", "[tensor]") {
  Tensor t = Tensor::zeros({4, 3});
  CHECK(t.defined());
  CHECK(t.numel() == 12);
  CHECK(t.nbytes() == 48);
  CHECK(t.dtype() == DType::float32);
  CHECK(t.device() == Device::cpu());
  CHECK(t.at(5) == 0.0);
  Tensor f = Tensor::full({2}, 2.5, DType::float64);
  CHECK(f.to_vector<double>() == std::vector<double>{2.5, 2.5});
  Tensor s = Tensor::scalar(7.0);
  CHECK(s.dim() == 0);
  CHECK(s.numel() == 1);
  CHECK(s.item() == 7.0);
  CHECK_THROWS_AS(Tensor::zeros({-1, 2}), ShapeError);
  CHECK_THROWS_AS(Tensor().numel(), StateError);
  CHECK_THROWS_AS(t.data<double>(), DTypeError);
  CHECK_THROWS_AS(t.item(), ValueError);
}

TEST_CASE("Tensor handles share storage and grad, clone does not", "[tensor]") {
  Tensor a = Tensor::from_vector<float>({1, 2, 3});
  Tensor b = a;
  b.data<float>()[0] = 9;
  CHECK(a.at(0) == 9);
  Tensor c = a.clone();
  c.data<float>()[0] = 1;
  CHECK(a.at(0) == 9);
  CHECK_FALSE(c.is_same(a));
  a.set_grad(Tensor::full({3}, 1.0));
  CHECK(b.grad().defined());
  b.set_grad(Tensor());
  CHECK_FALSE(a.grad().defined());
  CHECK_THROWS_AS(a.set_grad(Tensor::zeros({2})), ShapeError);
  CHECK_THROWS_AS(a.set_grad(Tensor::zeros({3}, DType::float64)), DTypeError);
}

TEST_CASE("from_blob views caller memory without a copy", "[tensor]") {
  std::vector<float> buf{1, 2, 3, 4, 5, 6};
  Tensor t = Tensor::from_blob(buf.data(), {2, 3}, DType::float32);
  CHECK(t.data_ptr() == buf.data());
  CHECK_FALSE(t.storage()->owned());
  t.fill_(0.5);
  CHECK(buf[4] == 0.5f);
  Tensor s = t.flat_slice(2, 3);
  CHECK(s.data_ptr() == buf.data() + 2);
  CHECK(s.shares_storage_with(t));
  CHECK_THROWS_AS(t.flat_slice(4, 3), ShapeError);
  CHECK_THROWS_AS(Tensor::from_blob(nullptr, {2}, DType::float32), ValueError);
}

TEST_CASE("dtype conversion, half and bfloat16 round trip", "[tensor][dtype]") {
  Tensor a = Tensor::from_vector<float>({1.0f, -2.5f, 65504.0f, 1e-8f, 0.1f});
  Tensor h = a.to(DType::float16);
  Tensor back = h.to(DType::float32);
  CHECK(back.at(0) == 1.0);
  CHECK(back.at(1) == -2.5);
  CHECK(back.at(2) == 65504.0);
  CHECK(std::abs(back.at(4) - 0.1) < 1e-4);
  Tensor bf = a.to(DType::bfloat16).to(DType::float32);
  CHECK(bf.at(1) == -2.5);
  CHECK(std::abs(bf.at(4) - 0.1) < 1e-3);
  CHECK(half_to_float(float_to_half(std::nanf(""))) != half_to_float(float_to_half(std::nanf(""))));
  CHECK(std::isinf(half_to_float(float_to_half(1e6f))));
  CHECK(dtype_from_name("BF16") == DType::bfloat16);
  CHECK(dtype_from_name("float64") == DType::float64);
  CHECK_THROWS_AS(dtype_from_name("F8"), DTypeError);
  Tensor i = Tensor::from_vector<std::int64_t>({3, -4});
  CHECK(i.to(DType::float32).to_vector<float>() == std::vector<float>{3, -4});
}

TEST_CASE("set_data re-points every handle, like param.data = x", "[tensor]") {
  Tensor p = Tensor::from_vector<float>({1, 2, 3});
  p.set_grad(Tensor::full({3}, 0.5));
  Tensor alias = p;
  Tensor flat = Tensor::zeros({10});
  Tensor view = flat.flat_slice(4, 3);
  view.copy_(p);
  p.set_data(view);
  CHECK(alias.data_ptr() == flat.data<float>() + 4);
  CHECK(alias.to_vector<float>() == std::vector<float>{1, 2, 3});
  REQUIRE(alias.grad().defined());  // the grad slot survives
  CHECK(alias.grad().at(0) == 0.5);
  // Writes through the parameter now land in the flat buffer.
  alias.fill_(7);
  CHECK(flat.at(4) == 7);
  CHECK(flat.at(3) == 0);
  CHECK_THROWS_AS(p.set_grad(flat.flat_slice(4, 3)), ValueError);  // a grad aliasing the param
}

TEST_CASE("DLPack export and import share memory and release it", "[tensor][dlpack]") {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2});
  DLManagedTensor* m = a.to_dlpack();
  CHECK(m->dl_tensor.data == a.data_ptr());
  CHECK(m->dl_tensor.ndim == 2);
  CHECK(m->dl_tensor.dtype.code == kDLFloat);
  Tensor b = Tensor::from_dlpack(m);
  CHECK(b.data_ptr() == a.data_ptr());
  CHECK(b.shape() == Shape{2, 2});
  b.data<float>()[3] = 7;
  CHECK(a.at(3) == 7);
  // The export keeps the bytes alive after the exporter lets go, and even
  // after the exporter is re-pointed elsewhere (param.data = ...).
  std::weak_ptr<Storage> bytes = a.storage();
  a.set_data(Tensor::zeros({2, 2}));
  a = Tensor();
  CHECK_FALSE(bytes.expired());
  CHECK(b.at(3) == 7);
  b = Tensor();  // the consumer's deleter runs: the bytes go
  CHECK(bytes.expired());

  // Imported with non-compact strides: rejected, and the deleter still runs.
  static bool deleted = false;
  static std::int64_t shape[2] = {2, 2};
  static std::int64_t strides[2] = {1, 2};
  static float data[4] = {};
  auto* bad = new DLManagedTensor{};
  bad->dl_tensor.data = data;
  bad->dl_tensor.device = {kDLCPU, 0};
  bad->dl_tensor.ndim = 2;
  bad->dl_tensor.dtype = {kDLFloat, 32, 1};
  bad->dl_tensor.shape = shape;
  bad->dl_tensor.strides = strides;
  bad->deleter = [](DLManagedTensor* self) { deleted = true; delete self; };
  CHECK_THROWS_AS(Tensor::from_dlpack(bad), ShapeError);
  CHECK(deleted);
}

TEST_CASE("A CUDA tensor without the GPU backend says which call to make", "[tensor]") {
  if (has_allocator(DeviceType::CUDA)) SUCCEED("a CUDA allocator is registered in this process");
  else
    CHECK_THROWS_WITH(Tensor::zeros({2}, DType::float32, Device::cuda(0)),
                      Catch::Contains("allocate") && Catch::Contains("call dopt::gpu::init()"));
}

TEST_CASE("Large CPU tensors are advised onto huge pages, small ones are not", "[tensor]") {
  // The allocator aligns tensors of 2 MiB and more to 2 MiB and advises
  // their whole 2 MiB blocks with MADV_HUGEPAGE (unless DOPT_HUGEPAGES=0).
  const char* off = std::getenv("DOPT_HUGEPAGES");
  if (off && std::string(off) == "0") return;
  auto flags_of = [](const void* p) {  // VmFlags of the mapping holding p
    std::ifstream smaps("/proc/self/smaps");
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    bool inside = false;
    for (std::string line; std::getline(smaps, line);) {
      std::uintptr_t lo = 0, hi = 0;
      if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find('-') < 17) inside = lo <= a && a < hi;
      if (inside && line.rfind("VmFlags:", 0) == 0) return line;
    }
    return std::string();
  };
  Tensor big = Tensor::zeros({3 << 20}, DType::float32);  // 12 MiB
  CHECK(reinterpret_cast<std::uintptr_t>(big.data_ptr()) % (2u << 20) == 0);
  CHECK(big.at((3 << 20) - 1) == 0.0);
  Tensor small = Tensor::zeros({1000}, DType::float32);
  if (std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) {  // a kernel with THP
    CHECK_THAT(flags_of(big.data_ptr()), Catch::Contains(" hg"));
    CHECK_THAT(flags_of(small.data_ptr()), !Catch::Contains(" hg"));
  }
}
