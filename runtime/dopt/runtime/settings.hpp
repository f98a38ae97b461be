#pragma once
// dopt's settings: every environment variable dopt reads, declared once in
// one table (name, kind, default, range, who reads it, what it does) and
// parsed by the functions below; docs/configuration.md is generated from the
// same table (scripts/settings_doc.py). Nothing else in the library reads
// the environment (tests/check_settings.py refuses getenv and environ
// elsewhere).
//
// Contract:
//   * Each getter reads the variable when called (tests and programs may set
//     it in between); callable from any thread as long as nobody changes the
//     environment at the same time (the C library's rule).
//   * Unset and empty are the same: std::nullopt, and the caller's default
//     applies (the table's "default" column documents it).
//   * A value of the wrong form or out of range throws dopt::ValueError (op
//     "settings") naming the variable, its value and what it takes.
//   * Asking for a name the table does not declare, or with the getter of
//     another kind, is a bug in dopt: StateError.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dopt::settings {

struct Setting {
  const char* name;
  /// "integer", "bytes", "unsigned", "flag", "choice" or "text".
  const char* kind;
  /// What an unset variable means (for the docs).
  const char* default_text;
  /// "LO..HI" (integer, bytes: binary suffixes K, M, G, T allowed), "a|b|c" (choice), "" (others).
  const char* range;
  /// Who reads it: runtime, launch, transport, shm, tcp, mpi, checkpoints, zero, simulation, python, tests.
  const char* component;
  const char* what;
};

/// The whole table, in its order.
const std::vector<Setting>& table();
/// The entry of `name`; StateError when the table does not declare it.
const Setting& declared(std::string_view name);

/// integer and bytes kinds: the value, checked against the range.
std::optional<long long> integer(std::string_view name);
/// unsigned kind: decimal or 0x hexadecimal.
std::optional<std::uint64_t> unsigned_integer(std::string_view name);
/// flag kind: "0" or "1".
std::optional<bool> flag(std::string_view name);
/// choice kind (one of the range's words) and text kind (as it is).
std::optional<std::string> text(std::string_view name);

/// The process's whole environment (variable -> value): for the launch
/// contract's parser (launch_env.hpp) and for launchers passing it on.
std::map<std::string, std::string> environment();
/// The DOPT_* variables set in this process that the table does not declare
/// (a misspelt name would otherwise be ignored without a word).
std::vector<std::string> undeclared();
/// The note about undeclared DOPT_* variables, each with the closest
/// declared name ("did you mean ...?"); "" when there are none.
std::string undeclared_note();
/// notice(undeclared_note()) once per process (the first Runtime does it);
/// nothing when there are none.
void note_undeclared();

}  // namespace dopt::settings
