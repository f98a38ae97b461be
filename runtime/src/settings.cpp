// The settings table and its parser (dopt/runtime/settings.hpp). The only
// place of the library that reads the process environment.
#include "dopt/runtime/settings.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/notice.hpp"

extern char** environ;

namespace dopt::settings {

namespace {

constexpr const char* kOp = "settings";

const std::vector<Setting> kTable = {
#define DOPT_SETTING(name, kind, def, range, component, what) Setting{name, kind, def, range, component, what},
#include "settings_table.def"
#undef DOPT_SETTING
};

std::optional<std::string> raw(const Setting& s) {
  const char* v = std::getenv(s.name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

const Setting& of_kind(std::string_view name, std::initializer_list<std::string_view> kinds) {
  const Setting& s = declared(name);
  if (std::find(kinds.begin(), kinds.end(), std::string_view(s.kind)) == kinds.end())
    throw StateError(kOp, std::string(name) + " is a setting of kind " + s.kind + ", read as another kind");
  return s;
}

/// A whole number with an optional binary suffix (K, M, G, T; KiB, MB, ... the same);
/// false when the text is not one.
bool parse_count(const std::string& text, bool suffixes, long long& out) {
  if (text.empty() || text[0] == '-' || text[0] == '+' || text[0] == ' ') return false;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str()) return false;
  std::string rest(end);
  if (rest.empty()) {
    out = x;
    return true;
  }
  if (!suffixes) return false;
  const char u = static_cast<char>(std::toupper(static_cast<unsigned char>(rest[0])));
  const int shift = u == 'K' ? 10 : u == 'M' ? 20 : u == 'G' ? 30 : u == 'T' ? 40 : -1;
  const std::string tail = rest.substr(1);
  if (shift < 0 || !(tail.empty() || tail == "B" || tail == "iB")) return false;
  if (x > (LLONG_MAX >> shift)) return false;
  out = x << shift;
  return true;
}

std::pair<long long, long long> bounds(const Setting& s) {
  const std::string r = s.range;
  const auto dots = r.find("..");
  long long lo = 0, hi = 0;
  if (dots == std::string::npos || !parse_count(r.substr(0, dots), true, lo) || !parse_count(r.substr(dots + 2), true, hi))
    throw StateError(kOp, std::string(s.name) + "'s range '" + r + "' in the settings table is not LO..HI");
  return {lo, hi};
}

std::string quoted(const std::string& v) { return "\"" + v + "\""; }

constexpr const char* kSee = " (docs/configuration.md)";

std::size_t distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

const std::vector<Setting>& table() { return kTable; }

const Setting& declared(std::string_view name) {
  for (const auto& s : kTable)
    if (name == s.name) return s;
  throw StateError(kOp, std::string(name) + " is not declared in dopt's settings table (runtime/src/settings_table.def)");
}

std::optional<long long> integer(std::string_view name) {
  const Setting& s = of_kind(name, {"integer", "bytes"});
  const auto v = raw(s);
  if (!v) return std::nullopt;
  const bool bytes = std::string_view(s.kind) == "bytes";
  const auto [lo, hi] = bounds(s);
  long long x = 0;
  if (!parse_count(*v, bytes, x) || x < lo || x > hi)
    throw ValueError(kOp, std::string(s.name) + "=" + quoted(*v) + " is not " +
                              (bytes ? "a byte count (suffixes K, M, G, T)" : "a whole number") + " in [" +
                              std::to_string(lo) + ", " + std::to_string(hi) + "]" + kSee);
  return x;
}

std::optional<std::uint64_t> unsigned_integer(std::string_view name) {
  const Setting& s = of_kind(name, {"unsigned"});
  const auto v = raw(s);
  if (!v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v->c_str(), &end, 0);
  if (*end != '\0' || errno != 0 || (*v)[0] == '-' || (*v)[0] == ' ')
    throw ValueError(kOp, std::string(s.name) + "=" + quoted(*v) +
                              " is not an unsigned integer (decimal, or 0x hexadecimal)" + kSee);
  return static_cast<std::uint64_t>(x);
}

std::optional<bool> flag(std::string_view name) {
  const Setting& s = of_kind(name, {"flag"});
  const auto v = raw(s);
  if (!v) return std::nullopt;
  if (*v == "1") return true;
  if (*v == "0") return false;
  throw ValueError(kOp, std::string(s.name) + "=" + quoted(*v) + " is not 0 or 1" + kSee);
}

std::optional<std::string> text(std::string_view name) {
  const Setting& s = of_kind(name, {"choice", "text"});
  auto v = raw(s);
  if (!v || std::string_view(s.kind) == "text") return v;
  const std::string choices = std::string("|") + s.range + "|";
  if (choices.find("|" + *v + "|") == std::string::npos) {
    std::string shown = s.range;
    std::replace(shown.begin(), shown.end(), '|', ',');
    throw ValueError(kOp, std::string(s.name) + "=" + quoted(*v) + " is not one of " + shown + kSee);
  }
  return v;
}

std::map<std::string, std::string> environment() {
  std::map<std::string, std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq != std::string::npos) out.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return out;
}

std::vector<std::string> undeclared() {
  std::vector<std::string> out;
  for (const auto& kv : environment()) {
    const std::string& k = kv.first;
    if (k.rfind("DOPT_", 0) != 0) continue;
    const bool known = std::any_of(kTable.begin(), kTable.end(), [&](const Setting& s) { return k == s.name; });
    if (!known) out.push_back(k);
  }
  return out;
}

std::string undeclared_note() {
  const auto names = undeclared();
  if (names.empty()) return "";
  std::string text = "these DOPT_ variables mean nothing to dopt and are ignored:";
  for (const auto& n : names) {
    const Setting* best = nullptr;
    std::size_t d = 4;  // suggest only close names
    for (const auto& s : kTable)
      if (const std::size_t k = distance(n, s.name); k < d) d = k, best = &s;
    text += " " + n + (best ? std::string(" (did you mean ") + best->name + "?)" : std::string());
  }
  return text + " (docs/configuration.md lists the settings)";
}

void note_undeclared() {
  static const bool once = [] {
    if (const std::string text = undeclared_note(); !text.empty()) notice(text);
    return true;
  }();
  (void)once;
}

}  // namespace dopt::settings
