#pragma once
// Bitwise checks of a tensor against a scalar reference, for the unit tests:
// where the bits differ first, a REQUIRE on it, steps of an optimizer against
// its reference, and the comparison of optimizer state. On the test thread
// (they use Catch's assertions; from rank threads see rank_checks.hpp).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dopt/optim/optimizer.hpp"
#include "reference_data.hpp"

namespace dopt::testing {

/// Whether t holds exactly the bits of ref; otherwise says where it differs first.
template <class T>
std::string bitwise_mismatch(const Tensor& t, const std::vector<T>& ref) {
  if (t.dtype() != dtype_of_v<T>) return "dtype " + std::string(dtype_name(t.dtype()));
  if (t.numel() != static_cast<std::int64_t>(ref.size())) return "numel " + std::to_string(t.numel());
  const T* d = t.data<T>();
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (std::memcmp(&d[i], &ref[i], sizeof(T)) != 0) {
      std::ostringstream os;
      os.precision(17);
      os << "element " << i << ": got " << d[i] << ", reference " << ref[i];
      return os.str();
    }
  }
  return "";
}

#define DOPT_REQUIRE_BITWISE(tensor, ref) \
  do {                                    \
    const std::string m_ = ::dopt::testing::bitwise_mismatch((tensor), (ref)); \
    INFO(m_);                             \
    REQUIRE(m_.empty());                  \
  } while (0)

/// Steps `opt` (whose only parameter with a gradient is p) `steps` times with
/// gradients values(numel, 1000 + t, 2), applies ref_step(ref_p, g) to the
/// reference copy each time and requires bitwise equality after every step.
template <class T, class RefStep>
void compare_steps(optim::Optimizer& opt, const Tensor& p, std::vector<T>& ref_p, int steps, RefStep&& ref_step) {
  for (int t = 0; t < steps; ++t) {
    const std::vector<T> g = values<T>(ref_p.size(), 1000 + static_cast<std::uint64_t>(t), 2.0);
    p.set_grad(tensor_of(g, p.shape()));
    opt.step();
    ref_step(ref_p, g);
    INFO("after step " << (t + 1));
    DOPT_REQUIRE_BITWISE(p, ref_p);
  }
}

/// The body of an optimizer's "matches the reference bit for bit" test: a
/// DYNAMIC_SECTION per named case that steps a fresh Opt over one parameter of
/// kRefNumel T (values(kRefNumel, seed)) `steps` times against
/// ref_of(options) (compare_steps), then hands the parameter's state, the
/// reference and the options to check_state.
template <class Opt, class T, class Options, class RefOf, class CheckState>
void match_reference(const std::vector<std::pair<const char*, Options>>& cases, int steps, RefOf&& ref_of,
                     CheckState&& check_state, std::uint64_t seed = 7) {
  for (const auto& [name, o] : cases) {
    DYNAMIC_SECTION(name) {
      const auto init = values<T>(kRefNumel, seed);
      Tensor p = tensor_of(init);
      Opt opt({p}, o);
      auto ref = ref_of(o);
      std::vector<T> ref_p = init;
      compare_steps(opt, p, ref_p, steps, ref);
      check_state(opt.state().at(p.key()), ref, o);
    }
  }
}

/// An optimizer's 0-d step counter: of `dtype`, at `steps`.
inline void check_step_counter(const Tensor& step, DType dtype, double steps) {
  CHECK(step.dtype() == dtype);
  CHECK(step.dim() == 0);
  CHECK(step.item() == steps);
}

inline ParamState deep_copy(const ParamState& st) {
  ParamState out;
  for (const auto& [k, v] : st) out[k] = v.clone();
  return out;
}

inline void require_same_state(const ParamState& a, const ParamState& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [k, v] : a) {
    INFO("state key " << k);
    REQUIRE(b.count(k) == 1);
    REQUIRE(v.equal(b.at(k)));
  }
}

}  // namespace dopt::testing
