// The arithmetic of the DDP device ops' kernels (ddp_ops_math.hpp), built
// for the host, against the runtime's conversions and the CPU path's
// division: the same source the kernels compile, so these CPU tests check
// the kernels' bits except for the few device intrinsics (__fdiv_rn,
// __ddiv_rn, __double2float_rn, rintf), which gpu_ddp.test.cpp checks on a GPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "ddp_ops_math.hpp"
#include "dopt/distributed/internal/device_ops.hpp"
#include "dopt/runtime/dtype.hpp"
#include "dopt/runtime/tensor.hpp"

using namespace dopt;
namespace ddp = dopt::gpu::detail::ddp;

namespace {

std::vector<float> probe_floats() {
  std::vector<float> v{0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65520.0f, 65519.0f, 1e-8f, 5.9604645e-08f, 2.9802322e-08f,
                       std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max(),
                       std::numeric_limits<float>::min(), 3.3895314e38f};
  // Every half and bfloat16 value, its neighbours and the midpoints (ties).
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float f = half_to_float(static_cast<std::uint16_t>(h));
    const float b = bfloat16_to_float(static_cast<std::uint16_t>(h));
    for (float x : {f, b}) {
      v.push_back(x);
      v.push_back(std::nextafter(x, INFINITY));
      v.push_back(std::nextafter(x, -INFINITY));
    }
    const float f2 = half_to_float(static_cast<std::uint16_t>(h + 1));
    if (std::isfinite(f) && std::isfinite(f2)) v.push_back(static_cast<float>((double(f) + double(f2)) / 2));
    std::uint32_t bits = (h << 16) | 0x8000u;  // a bfloat16 tie
    float t;
    std::memcpy(&t, &bits, 4);
    v.push_back(t);
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const std::uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    v.push_back(f);
  }
  return v;
}

}  // namespace

TEST_CASE("ddp op conversions are the runtime's float16/bfloat16 conversions bit for bit", "[gpu][ddp_ops]") {
  for (float f : probe_floats()) {
    INFO("float bits " << ddp::bits_of(f));
    CHECK(ddp::f32_to_f16(f) == float_to_half(f));
    CHECK(ddp::f32_to_bf16(f) == float_to_bfloat16(f));
  }
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto x = static_cast<std::uint16_t>(h);
    CHECK(ddp::bits_of(ddp::f16_to_f32(x)) == ddp::bits_of(half_to_float(x)));
    CHECK(ddp::bits_of(ddp::bf16_to_f32(x)) == ddp::bits_of(bfloat16_to_float(x)));
  }
}

TEST_CASE("ddp op divide and convert match the CPU path (divide_any_, Tensor::copy_) for every dtype",
          "[gpu][ddp_ops]") {
  const std::vector<float> fs = probe_floats();
  std::vector<double> ds;
  for (float f : fs) ds.push_back(f);
  std::mt19937 rng(11);
  std::normal_distribution<double> nd;
  for (int i = 0; i < 20000; ++i) ds.push_back(std::ldexp(nd(rng), static_cast<int>(rng() % 60) - 30));
  const Tensor base = Tensor::from_vector(ds);
  const DType types[] = {DType::float32, DType::float64, DType::float16, DType::bfloat16};
  for (DType dt : types) {
    const Tensor src = base.to(dt);
    for (std::int64_t n : {1, 2, 3, 5, 7, 48}) {
      INFO(dtype_name(dt) << " / " << n);
      Tensor want = src.clone();
      optim::detail::divide_any_(want, n, "test");
      Tensor got = src.clone();
      for (std::int64_t i = 0; i < got.numel(); ++i) ddp::divide_at(got.data_ptr(), static_cast<int>(dt), i, n);
      CHECK(std::memcmp(got.data_ptr(), want.data_ptr(), got.nbytes()) == 0);
    }
    for (DType to : types) {
      if (to == dt) continue;
      INFO(dtype_name(dt) << " -> " << dtype_name(to));
      Tensor want = Tensor::empty(src.shape(), to);
      want.copy_(src);
      Tensor got = Tensor::empty(src.shape(), to);
      for (std::int64_t i = 0; i < got.numel(); ++i)
        ddp::convert_at(got.data_ptr(), static_cast<int>(to), src.data_ptr(), static_cast<int>(dt), i);
      CHECK(std::memcmp(got.data_ptr(), want.data_ptr(), got.nbytes()) == 0);
    }
  }
}
