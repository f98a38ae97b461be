#include "report.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dopt/runtime/error.hpp"

namespace dopt_train {

using nlohmann::json;

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

std::string thousands(std::int64_t v) {
  const std::string digits = std::to_string(v);
  const std::size_t sign = v < 0 ? 1 : 0;
  std::string out = digits.substr(0, sign);
  for (std::size_t i = sign; i < digits.size(); ++i) {
    if (i > sign && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (b >= 1024 && u < 3) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

Progress::Progress(std::int64_t first_step, std::int64_t total_steps, bool tty, bool quiet, std::int64_t every)
    : first_(first_step), total_(total_steps), tty_(tty), quiet_(quiet), every_(std::max<std::int64_t>(1, every)) {}

void Progress::update(const StepRecord& r) {
  if (quiet_) return;
  const double eta = r.steps_per_s > 0 ? double(total_ - r.step) / r.steps_per_s : NAN;
  if (tty_) {
    const auto now = std::chrono::steady_clock::now();
    if (drawn_ && r.step != total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    drawn_ = true;
    constexpr int kWidth = 30;
    const int filled = total_ > 0 ? static_cast<int>(kWidth * r.step / total_) : kWidth;
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::printf("\r[%s] step %lld/%lld  loss %.4f  acc %.3f  %.1f steps/s  ETA %s   ", bar.c_str(),
                static_cast<long long>(r.step), static_cast<long long>(total_), r.loss, r.accuracy, r.steps_per_s,
                format_duration(eta).c_str());
    std::fflush(stdout);
  } else if (r.step == first_ + 1 || r.step % every_ == 0 || r.step == total_) {
    std::printf("step %lld/%lld  loss %.4f  acc %.3f  %.1f steps/s  ETA %s\n", static_cast<long long>(r.step),
                static_cast<long long>(total_), r.loss, r.accuracy, r.steps_per_s, format_duration(eta).c_str());
    std::fflush(stdout);
  }
}

void Progress::note(const std::string& line) {
  if (quiet_) return;
  if (tty_ && drawn_) std::printf("\r\033[K");
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  drawn_ = false;  // redraw the bar at the next update
}

void Progress::finish() {
  if (tty_ && drawn_ && !quiet_) {
    std::printf("\n");
    std::fflush(stdout);
  }
}

MetricsWriter::MetricsWriter(const std::string& path, std::int64_t keep_up_to) : path_(path) {
  std::string kept;
  if (keep_up_to > 0) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      try {
        const json j = json::parse(line);
        const std::int64_t s = j.at("step").get<std::int64_t>();
        if (s <= keep_up_to) {
          kept += line + "\n";
          history_.emplace_back(s, j.at("loss").get<double>());
          if (j.contains("bytes_sent"))
            bytes_history_.emplace_back(j.at("bytes_sent").get<double>(), j.at("loss").get<double>());
          if (j.contains("mem_bytes")) memory_history_.emplace_back(s, j.at("mem_bytes").get<double>());
        }
      } catch (const json::exception&) {
        // a line the interrupted run left half-written: dropped
      }
    }
  }
  // The kept lines go to a file of their own that then replaces path.
  const std::string fresh = keep_up_to > 0 ? path + ".tmp." + std::to_string(::getpid()) : path;
  fd_ = ::open(fresh.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw dopt::IOError("metrics", "cannot write " + fresh + ": " + dopt::errno_text(errno));
  append(kept);
  if (fresh != path && ::rename(fresh.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(fresh.c_str());
    throw dopt::IOError("metrics", "cannot replace " + path + " with " + fresh + ": " + dopt::errno_text(e));
  }
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::append(const std::string& line) {
  for (std::size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw dopt::IOError("metrics", "cannot write " + path_ + ": " + dopt::errno_text(errno));
    done += static_cast<std::size_t>(n);
  }
}

void MetricsWriter::write(const StepRecord& r) {
  const json j = {{"step", r.step},           {"loss", r.loss},    {"accuracy", r.accuracy},
                  {"lr", r.lr},               {"steps_per_s", r.steps_per_s}, {"time_s", r.time_s},
                  {"bytes_step", r.bytes_step}, {"bytes_sent", r.bytes_sent},
                  {"mem_bytes", r.mem_bytes}, {"peak_rss", r.peak_rss}};
  append(j.dump() + "\n");  // one write: the whole line or (an error) nothing
  history_.emplace_back(r.step, r.loss);
  bytes_history_.emplace_back(r.bytes_sent, r.loss);
  memory_history_.emplace_back(r.step, r.mem_bytes);
}

namespace {

/// 1, 2 or 5 times a power of ten, about range / n.
double nice_step(double range, int n) {
  if (!(range > 0)) return 1;
  const double raw = range / n, p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}

}  // namespace

namespace {

/// The plot of write_curve_svg; with `second`, that series too on a
/// right-hand axis labelled second_label.
void draw_svg(const std::string& path, const std::vector<std::pair<double, double>>& points, const std::string& title,
              const std::string& xlabel, const std::vector<std::pair<double, double>>& second,
              const std::string& second_label) {
  const bool two = !second.empty();
  const double W = 720, H = 420, left = 70, right = two ? 80 : 20, top = 40, bottom = 50;
  const double pw = W - left - right, ph = H - top - bottom;
  double x0 = 0, x1 = 1, y1 = 1, z1 = 1;
  if (!points.empty()) {
    x1 = std::max<double>(xlabel == "step" ? 1.0 : 1e-9, points.back().first);
    x0 = std::min<double>(points.front().first, xlabel == "step" ? x1 - 1 : 0.0);
    y1 = 0;
    for (const auto& [s, l] : points)
      if (std::isfinite(l)) y1 = std::max(y1, l);
    if (!(y1 > 0)) y1 = 1;
  }
  if (two) {
    z1 = 0;
    for (const auto& [s, v] : second)
      if (std::isfinite(v)) z1 = std::max(z1, v);
    if (!(z1 > 0)) z1 = 1;
  }
  const double ystep = nice_step(y1, 5), zstep = nice_step(z1, 5);
  y1 = std::ceil(y1 / ystep) * ystep;
  z1 = std::ceil(z1 / zstep) * zstep;
  const double xstep = nice_step(x1 - x0, 6);
  auto X = [&](double s) { return left + (s - x0) / (x1 - x0) * pw; };
  auto Y = [&](double l) { return top + ph - l / y1 * ph; };
  auto Z = [&](double v) { return top + ph - v / z1 * ph; };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W
    << " " << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << escape(title) << "</text>\n";
  // Grid and ticks.
  for (double v = 0; v <= y1 + ystep / 2; v += ystep) {
    o << "<line x1=\"" << left << "\" y1=\"" << Y(v) << "\" x2=\"" << left + pw << "\" y2=\"" << Y(v)
      << "\" stroke=\"#e0e0e0\"/>\n";
    o << "<text x=\"" << left - 6 << "\" y=\"" << Y(v) + 4 << "\" text-anchor=\"end\">" << num(v) << "</text>\n";
  }
  for (double v = std::ceil(x0 / xstep) * xstep; v <= x1 + xstep / 100; v += xstep) {
    o << "<line x1=\"" << X(v) << "\" y1=\"" << top + ph << "\" x2=\"" << X(v) << "\" y2=\"" << top + ph + 5
      << "\" stroke=\"black\"/>\n";
    o << "<text x=\"" << X(v) << "\" y=\"" << top + ph + 18 << "\" text-anchor=\"middle\">" << num(v) << "</text>\n";
  }
  // Axes and labels.
  o << "<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\"" << top + ph
    << "\" stroke=\"black\"/>\n";
  o << "<line x1=\"" << left << "\" y1=\"" << top + ph << "\" x2=\"" << left + pw << "\" y2=\"" << top + ph
    << "\" stroke=\"black\"/>\n";
  o << "<text x=\"" << left + pw / 2 << "\" y=\"" << H - 10 << "\" text-anchor=\"middle\">" << escape(xlabel) << "</text>\n";
  o << "<text x=\"16\" y=\"" << top + ph / 2 << "\" text-anchor=\"middle\" fill=\"#1f77b4\" transform=\"rotate(-90 16 "
    << top + ph / 2 << ")\">loss</text>\n";
  if (two) {
    const double ax = left + pw;
    o << "<line x1=\"" << ax << "\" y1=\"" << top << "\" x2=\"" << ax << "\" y2=\"" << top + ph
      << "\" stroke=\"black\"/>\n";
    for (double v = 0; v <= z1 + zstep / 2; v += zstep)
      o << "<text x=\"" << ax + 6 << "\" y=\"" << Z(v) + 4 << "\" text-anchor=\"start\" fill=\"#d95f02\">" << num(v)
        << "</text>\n";
    o << "<text x=\"" << W - 14 << "\" y=\"" << top + ph / 2 << "\" text-anchor=\"middle\" fill=\"#d95f02\" "
      << "transform=\"rotate(90 " << W - 14 << " " << top + ph / 2 << ")\">" << escape(second_label) << "</text>\n";
    o << "<polyline fill=\"none\" stroke=\"#d95f02\" stroke-width=\"1.5\" stroke-dasharray=\"5,3\" points=\"";
    for (const auto& [s, v] : second)
      if (std::isfinite(v)) o << num(X(s)) << "," << num(Z(v)) << " ";
    o << "\"/>\n";
  }
  // The curve.
  o << "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"";
  for (const auto& [s, l] : points)
    if (std::isfinite(l)) o << num(X(s)) << "," << num(Y(l)) << " ";
  o << "\"/>\n</svg>\n";

  std::ofstream f(path, std::ios::trunc);
  f << o.str();
  if (!f) throw dopt::IOError("svg", "cannot write " + path);
}

}  // namespace

void write_loss_svg(const std::string& path, const std::vector<std::pair<std::int64_t, double>>& points,
                    const std::string& title, const std::vector<std::pair<std::int64_t, double>>& memory) {
  std::vector<std::pair<double, double>> p, m;
  for (const auto& [s, l] : points) p.emplace_back(double(s), l);
  for (const auto& [s, b] : memory) m.emplace_back(double(s), b / 1e6);
  draw_svg(path, p, title, "step", m, "memory per rank, MB (parameters, gradients, state)");
}

void write_curve_svg(const std::string& path, const std::vector<std::pair<double, double>>& points,
                     const std::string& title, const std::string& xlabel) {
  draw_svg(path, points, title, xlabel, {}, "");
}

}  // namespace dopt_train
