#include "dopt/runtime/notice.hpp"

#include <unistd.h>

#include <mutex>
#include <set>

namespace dopt {
namespace {

void to_stderr(const std::string& text) {
  const std::string line = "dopt: note: " + text + "\n";
  const char* p = line.data();
  std::size_t n = line.size();
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, p, n);
    if (w <= 0) return;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

struct State {
  std::mutex m;
  NoticeHandler handler = to_stderr;
  std::set<std::string> seen;
};

State& state() {
  static State s;
  return s;
}

}  // namespace

NoticeHandler set_notice_handler(NoticeHandler h) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.m);
  NoticeHandler old = std::move(s.handler);
  s.handler = std::move(h);
  return old;
}

void notice(const std::string& text) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.m);
  if (s.handler) s.handler(text);
}

void notice_once(const std::string& text) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.m);
  if (!s.seen.insert(text).second) return;
  if (s.handler) s.handler(text);
}

}  // namespace dopt
