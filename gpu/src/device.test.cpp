#include <catch2/catch.hpp>

#include "dopt/gpu/device.hpp"
#include "dopt/runtime/tensor.hpp"
#include "gpu_checks.hpp"

using namespace dopt;

TEST_CASE("CUDA tensors round-trip through device memory", "[gpu]") {
  DOPT_REQUIRE_CUDA();
  Tensor host = Tensor::from_vector<float>({1, 2, 3, 4, 5});
  Tensor dev = host.to(Device::cuda(0));
  CHECK(dev.device().is_cuda());
  CHECK(gpu::cached_bytes(0) > 0);
  Tensor back = dev.to(Device::cpu());
  CHECK(back.equal(host));
  Tensor z = Tensor::zeros({1000}, DType::float32, Device::cuda(0));
  CHECK(z.to(Device::cpu()).max_abs_diff(Tensor::zeros({1000})) == 0.0);
}
