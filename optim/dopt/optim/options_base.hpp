#pragma once
// Helpers for writing OptimizerOptions subclasses, libtorch style:
//   AdamOptions(1e-3).betas({0.9, 0.999}).weight_decay(0.01)
// Each hyperparameter is declared once, with DOPT_ARG: its type, name,
// default and (optionally) the rule validate() checks. OptionsCRTP makes the
// hyperparameter map, validate, clone, get_lr and set_lr from those lines.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <variant>
#include <vector>

#include "dopt/optim/optimizer.hpp"

/// Starts the hyperparameters of options class Self: kName is "Self", the
/// constructors are Self() (every field at its default) and Self(lr), and the
/// DOPT_ARG lines that follow are its fields, in their order (lr among them).
#define DOPT_OPTIONS(Self)   \
  DOPT_OPTIONS_LR_REQUIRED(Self); \
  Self() = default

/// DOPT_OPTIONS without Self(): the learning rate must be given (SGD).
#define DOPT_OPTIONS_LR_REQUIRED(Self)          \
 public:                                        \
  static constexpr const char* kName = #Self;   \
  explicit Self(double lr) { lr_ = lr; }        \
  static constexpr int kFirstField = __COUNTER__ + 1

/// Declares the hyperparameter `name` of type T (double, bool, Pair, Triple,
/// std::int64_t or std::string) with default `init`: a chainable setter
/// `name(v)`, getters `name()`, the field `name_`, its entry in the
/// hyperparameter map under "name", and, when a rule follows (one of
/// dopt::optim::checks), the check validate() makes.
#define DOPT_ARG(Self, T, name, init, ...)                                                                 \
 public:                                                                                                   \
  Self& name(const T& v) {                                                                                 \
    name##_ = v;                                                                                           \
    return *this;                                                                                          \
  }                                                                                                        \
  const T& name() const noexcept { return name##_; }                                                       \
  T& name() noexcept { return name##_; }                                                                   \
  static ::dopt::optim::HyperField<Self> dopt_field(std::integral_constant<int, __COUNTER__>) {             \
    return {#name, &Self::name##_ __VA_OPT__(, [](const Self& s, const std::string& op) {                 \
              ::dopt::optim::checks::apply(op, s.name##_, __VA_ARGS__);                                     \
            })};                                                                                           \
  }                                                                                                        \
                                                                                                           \
 private:                                                                                                  \
  T name##_ = init

/// The hyperparameters most of torch's optimizers share, each with its
/// torch check (DOPT_ARG lines with the name, type and rule fixed): the
/// learning rate, epsilon, L2 weight decay and the maximize flag.
#define DOPT_ARG_LR(Self, init) DOPT_ARG(Self, double, lr, init, ::dopt::optim::checks::NonNegative{"learning rate"})
#define DOPT_ARG_EPS(Self, init) DOPT_ARG(Self, double, eps, init, ::dopt::optim::checks::NonNegative{"epsilon value"})
#define DOPT_ARG_WEIGHT_DECAY(Self, init) \
  DOPT_ARG(Self, double, weight_decay, init, ::dopt::optim::checks::NonNegative{"weight_decay value"})
#define DOPT_ARG_MAXIMIZE(Self) DOPT_ARG(Self, bool, maximize, false)

/// DOPT_OPTIONS, then the learning rate with torch 1.13's check (default
/// lr_init): how the options of torch 1.13's optimizers start.
#define DOPT_OPTIONS_WITH_LR(Self, lr_init) \
  DOPT_OPTIONS(Self);                       \
  DOPT_ARG_LR(Self, lr_init)

/// What Adam's family (Adam, AdamW, Adamax, NAdam, RAdam) has after lr, in
/// torch's order: betas (0.9, 0.999), eps (1e-8) and weight_decay (wd_init).
#define DOPT_ADAM_ARGS(Self, wd_init)                                                                     \
  DOPT_ARG(Self, ::dopt::optim::Pair, betas, (::dopt::optim::Pair{0.9, 0.999}), ::dopt::optim::checks::Betas{}); \
  DOPT_ARG_EPS(Self, 1e-8);                                                                               \
  DOPT_ARG_WEIGHT_DECAY(Self, wd_init)

namespace dopt::optim {

using Pair = std::array<double, 2>;
using Triple = std::array<double, 3>;

/// The rules a DOPT_ARG can name; each throws dopt::ValueError(op, ...) with
/// torch's message.
namespace checks {
/// "Invalid <what>: <v>" unless v >= 0 (NaN fails).
struct NonNegative { const char* what; };
/// "Invalid <what>: <v>" unless 0 <= v <= 1.
struct UnitInterval { const char* what; };
/// "Invalid beta parameter at index <i>: <v>" unless 0 <= betas[i] < 1.
struct Betas {};
/// "Invalid eta values: <a>, <b>" unless 0 < etas[0] < 1 < etas[1].
struct Etas {};
/// torch 2.x's "<what> should be >= 0 but is: <v>" unless v >= 0.
struct AtLeastZero { const char* what; };
void apply(const std::string& op, double v, NonNegative rule);
void apply(const std::string& op, double v, UnitInterval rule);
void apply(const std::string& op, const Pair& betas, Betas rule);
void apply(const std::string& op, const Pair& etas, Etas rule);
void apply(const std::string& op, double v, AtLeastZero rule);
}  // namespace checks

/// One hyperparameter of an options class: its name (the key in state dicts
/// and in torch's param_groups), the member that holds it and, optionally,
/// its check. DOPT_ARG makes these; an options class may instead list them
/// itself in `static std::vector<HyperField<Self>> fields()` ({"lr", &Self::lr_}, ...).
template <class Self>
struct HyperField {
  using Member = std::variant<double Self::*, bool Self::*, Pair Self::*, Triple Self::*, std::int64_t Self::*,
                              std::string Self::*>;
  template <class T>
  HyperField(const char* n, T Self::*m, void (*c)(const Self&, const std::string&) = nullptr)
      : name(n), member(m), check(c) {}
  const char* name;
  Member member;
  void (*check)(const Self&, const std::string& op) = nullptr;
};

/// The part of OptionsCRTP that does not depend on Self: one field's value
/// to and from the hyperparameter map, and the errors of a bad map.
class OptionsFields : public OptimizerOptions {
 protected:
  /// ValueError naming op for a key of h not in `known`.
  static void check_known_keys(const Hyperparams& h, const std::vector<const char*>& known, const std::string& op);
  /// Throws dopt::StateError: an options class has neither fields nor its own hyperparameter map.
  [[noreturn]] static void no_fields(const char* type);
  static HyperValue to_hyper(double v) { return v; }
  static HyperValue to_hyper(bool v) { return v; }
  static HyperValue to_hyper(std::int64_t v) { return static_cast<double>(v); }
  static HyperValue to_hyper(const std::string& v) { return v; }
  template <std::size_t N>
  static HyperValue to_hyper(const std::array<double, N>& v) {
    return std::vector<double>(v.begin(), v.end());
  }
  static void from_hyper(const Hyperparams& h, const char* key, const char* op, double& out);
  static void from_hyper(const Hyperparams& h, const char* key, const char* op, bool& out);
  static void from_hyper(const Hyperparams& h, const char* key, const char* op, Pair& out);
  static void from_hyper(const Hyperparams& h, const char* key, const char* op, Triple& out);
  /// A whole number (ValueError otherwise).
  static void from_hyper(const Hyperparams& h, const char* key, const char* op, std::int64_t& out);
  static void from_hyper(const Hyperparams& h, const char* key, const char* op, std::string& out);
};

/// CRTP base of the optimizers' options: clone, get_lr/set_lr, validate and
/// the hyperparameter map, made from Self's fields (DOPT_OPTIONS and DOPT_ARG,
/// or a static fields() table and kName). A Self with neither overrides
/// to_hyperparams, set_hyperparams and validate.
template <class Self>
class OptionsCRTP : public OptionsFields {
 public:
  std::unique_ptr<OptimizerOptions> clone() const override {
    return std::make_unique<Self>(static_cast<const Self&>(*this));
  }
  double get_lr() const override { return static_cast<const Self&>(*this).lr(); }
  void set_lr(double lr) override { static_cast<Self&>(*this).lr(lr); }

  /// Whether Self lists its fields (DOPT_OPTIONS, or fields() and kName).
  static constexpr bool has_fields() {
    return requires { Self::fields(); } || requires { Self::kFirstField; };
  }
  /// Self's hyperparameters, in declaration order.
  static std::vector<HyperField<Self>> hyper_fields() {
    if constexpr (requires { Self::fields(); }) {
      return Self::fields();
    } else if constexpr (requires { Self::kFirstField; }) {
      std::vector<HyperField<Self>> out;
      collect_fields<Self::kFirstField>(out);
      return out;
    } else {
      no_fields(typeid(Self).name());
    }
  }

  Hyperparams to_hyperparams() const override {
    Hyperparams h;
    if constexpr (has_fields()) {
      const Self& self = static_cast<const Self&>(*this);
      for (const auto& f : hyper_fields())
        std::visit([&](auto m) { h[f.name] = to_hyper(self.*m); }, f.member);
    } else {
      no_fields(typeid(Self).name());
    }
    return h;
  }
  /// Sets the keys present in h; an unknown key or a value of the wrong kind
  /// is a dopt::ValueError naming Self::kName.
  void set_hyperparams(const Hyperparams& h) override {
    if constexpr (has_fields()) {
      Self& self = static_cast<Self&>(*this);
      const auto fields = hyper_fields();
      std::vector<const char*> names;
      for (const auto& f : fields) names.push_back(f.name);
      check_known_keys(h, names, Self::kName);
      for (const auto& f : fields) {
        if (!h.count(f.name)) continue;
        std::visit([&](auto m) { from_hyper(h, f.name, Self::kName, self.*m); }, f.member);
      }
    } else {
      no_fields(typeid(Self).name());
    }
  }
  /// Each field's rule, in declaration order (the first failure throws).
  void validate(const std::string& op) const override {
    if constexpr (has_fields()) {
      for (const auto& f : hyper_fields())
        if (f.check) f.check(static_cast<const Self&>(*this), op);
    }
  }

 private:
  /// Appends the DOPT_ARG fields numbered I, I + 1, ... (up to the first gap).
  template <int I>
  static void collect_fields(std::vector<HyperField<Self>>& out) {
    if constexpr (requires { Self::dopt_field(std::integral_constant<int, I>{}); }) {
      out.push_back(Self::dopt_field(std::integral_constant<int, I>{}));
      collect_fields<I + 1>(out);
    }
  }
};

}  // namespace dopt::optim
