#pragma once
// Helpers for writing OptimizerOptions subclasses, libtorch style:
//   AdamOptions(1e-3).betas({0.9, 0.999}).weight_decay(0.01)
#include <array>
#include <memory>

#include "dopt/optim/optimizer.hpp"

/// Declares a chainable setter `name(v)`, a getter `name()` and the field `name_`.
#define DOPT_ARG(Self, T, name, init)                     \
 public:                                                  \
  Self& name(const T& v) {                                \
    name##_ = v;                                          \
    return *this;                                         \
  }                                                       \
  const T& name() const noexcept { return name##_; }      \
  T& name() noexcept { return name##_; }                  \
                                                          \
 private:                                                 \
  T name##_ = init

namespace dopt::optim {

using Pair = std::array<double, 2>;

/// CRTP base providing clone, get_lr/set_lr for options with an `lr` field.
template <class Self>
class OptionsCRTP : public OptimizerOptions {
 public:
  std::unique_ptr<OptimizerOptions> clone() const override {
    return std::make_unique<Self>(static_cast<const Self&>(*this));
  }
  double get_lr() const override { return static_cast<const Self&>(*this).lr(); }
  void set_lr(double lr) override { static_cast<Self&>(*this).lr(lr); }
};

namespace detail {
/// Reads keys of h into fields; throws ValueError for keys not in `known`.
void check_known_keys(const Hyperparams& h, std::initializer_list<const char*> known, const std::string& op);
inline Pair to_pair(const std::vector<double>& v) { return Pair{v[0], v[1]}; }
inline std::vector<double> from_pair(const Pair& p) { return {p[0], p[1]}; }
}  // namespace detail

}  // namespace dopt::optim
