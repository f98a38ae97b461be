#pragma once
// Helpers for writing OptimizerOptions subclasses, libtorch style:
//   AdamOptions(1e-3).betas({0.9, 0.999}).weight_decay(0.01)
#include <array>
#include <memory>
#include <typeinfo>
#include <vector>

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

/// One hyperparameter of an options class: its name (the key in state dicts
/// and in torch's param_groups) and the member that holds it (one of three
/// kinds).
template <class Self>
struct HyperField {
  HyperField(const char* n, double Self::*m) : name(n), number(m) {}
  HyperField(const char* n, Pair Self::*m) : name(n), pair(m) {}
  HyperField(const char* n, bool Self::*m) : name(n), flag(m) {}
  const char* name;
  double Self::*number = nullptr;
  Pair Self::*pair = nullptr;
  bool Self::*flag = nullptr;
};

namespace detail {
void check_known_keys(const Hyperparams& h, const std::vector<const char*>& known, const std::string& op);
/// Throws dopt::StateError: an options class has neither fields() nor its own hyperparameter map.
[[noreturn]] void no_fields(const char* type);
inline HyperValue to_hyper(double v) { return v; }
inline HyperValue to_hyper(bool v) { return v; }
inline HyperValue to_hyper(const Pair& v) { return std::vector<double>{v[0], v[1]}; }
void from_hyper(const Hyperparams& h, const char* key, const char* op, double& out);
void from_hyper(const Hyperparams& h, const char* key, const char* op, bool& out);
void from_hyper(const Hyperparams& h, const char* key, const char* op, Pair& out);
}  // namespace detail

/// CRTP base of the optimizers' options: clone, get_lr/set_lr, and the
/// hyperparameter map, made from Self's
///   static constexpr const char* kName;                 // e.g. "AdamOptions"
///   static std::vector<HyperField<Self>> fields();      // every hyperparameter
/// (a Self without fields() overrides to_hyperparams and set_hyperparams).
template <class Self>
class OptionsCRTP : public OptimizerOptions {
 public:
  std::unique_ptr<OptimizerOptions> clone() const override {
    return std::make_unique<Self>(static_cast<const Self&>(*this));
  }
  double get_lr() const override { return static_cast<const Self&>(*this).lr(); }
  void set_lr(double lr) override { static_cast<Self&>(*this).lr(lr); }

  Hyperparams to_hyperparams() const override {
    Hyperparams h;
    if constexpr (requires { Self::fields(); }) {
      const Self& self = static_cast<const Self&>(*this);
      for (const auto& f : Self::fields()) {
        if (f.number) h[f.name] = detail::to_hyper(self.*f.number);
        if (f.pair) h[f.name] = detail::to_hyper(self.*f.pair);
        if (f.flag) h[f.name] = detail::to_hyper(self.*f.flag);
      }
    } else {
      detail::no_fields(typeid(Self).name());
    }
    return h;
  }
  /// Sets the keys present in h; an unknown key or a value of the wrong kind
  /// is a dopt::ValueError naming Self::kName.
  void set_hyperparams(const Hyperparams& h) override {
    if constexpr (requires { Self::fields(); }) {
      Self& self = static_cast<Self&>(*this);
      const auto fields = Self::fields();
      std::vector<const char*> names;
      for (const auto& f : fields) names.push_back(f.name);
      detail::check_known_keys(h, names, Self::kName);
      for (const auto& f : fields) {
        if (!h.count(f.name)) continue;
        if (f.number) detail::from_hyper(h, f.name, Self::kName, self.*f.number);
        if (f.pair) detail::from_hyper(h, f.name, Self::kName, self.*f.pair);
        if (f.flag) detail::from_hyper(h, f.name, Self::kName, self.*f.flag);
      }
    } else {
      detail::no_fields(typeid(Self).name());
    }
  }
};

namespace detail {
inline Pair to_pair(const std::vector<double>& v) { return Pair{v[0], v[1]}; }
inline std::vector<double> from_pair(const Pair& p) { return {p[0], p[1]}; }
/// torch's argument checks, with torch's messages: "Invalid <what>: <v>"
/// unless v >= 0 (NaN fails), and each beta in [0, 1).
void require_nonnegative(const std::string& op, const char* what, double v);
void require_betas(const std::string& op, const Pair& betas);
}  // namespace detail

}  // namespace dopt::optim
