#pragma once
// dopt-train's output on rank 0: the progress bar (or plain lines), the JSON
// lines metrics file and the SVG loss curve.
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace dopt_train {

/// One step as rank 0 reports it (loss and accuracy averaged over all ranks).
struct StepRecord {
  std::int64_t step = 0;  // 1-based: the number of steps done
  double loss = 0;
  double accuracy = 0;
  double lr = 0;
  double steps_per_s = 0;
  double time_s = 0;  // since this run started
  /// Bytes rank 0 sent for the optimizer's communication: in this step, and
  /// in all steps so far (Strategy::bytes_sent; continued across a resume).
  double bytes_step = 0;
  double bytes_sent = 0;
  /// Memory, mean per rank (memory.hpp): parameters + gradients + optimizer
  /// state by the library's accounting, and the processes' peak resident set.
  double mem_bytes = 0;
  double peak_rss = 0;
};

/// "\r[#####-----] step 120/600 ..." on a terminal; a plain line every
/// `every` steps otherwise; nothing when quiet.
class Progress {
 public:
  Progress(std::int64_t first_step, std::int64_t total_steps, bool tty, bool quiet, std::int64_t every);
  void update(const StepRecord& r);
  /// Prints a line of its own (a checkpoint written, ...) without breaking the bar.
  void note(const std::string& line);
  /// Ends the bar's line.
  void finish();

 private:
  std::int64_t first_, total_;
  bool tty_, quiet_;
  std::int64_t every_;
  std::chrono::steady_clock::time_point last_draw_{};
  bool drawn_ = false;
};

/// "1m05s", "12s".
std::string format_duration(double seconds);
/// "208,394".
std::string thousands(std::int64_t v);
/// "12.5 KiB".
std::string format_bytes(double bytes);

/// --metrics: one JSON object per step. Every line goes to the file in one
/// write(2) on a descriptor opened with O_APPEND: a stale writer (a lead that
/// was stopped and removed, --survive) can never leave half a line or write
/// over another writer's lines.
class MetricsWriter {
 public:
  /// Fresh (truncates) or, when resuming or taking the lead at `keep_up_to`,
  /// keeps the lines of steps <= keep_up_to already in the file (returned by
  /// history()) and drops later ones (they belonged to the interrupted run):
  /// the kept lines go to a new file that replaces the old one (rename), so
  /// a writer that still has the old one open writes where nobody reads.
  MetricsWriter(const std::string& path, std::int64_t keep_up_to);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const StepRecord& r);
  void flush() {}  // every line is written at once
  /// (step, loss) of the kept lines.
  const std::vector<std::pair<std::int64_t, double>>& history() const { return history_; }
  /// (bytes_sent, loss) of the kept lines (lines without bytes_sent are left out).
  const std::vector<std::pair<double, double>>& bytes_history() const { return bytes_history_; }
  /// (step, mem_bytes) of the kept lines (lines without it are left out).
  const std::vector<std::pair<std::int64_t, double>>& memory_history() const { return memory_history_; }

 private:
  void append(const std::string& line);
  std::string path_;
  int fd_ = -1;
  std::vector<std::pair<std::int64_t, double>> history_;
  std::vector<std::pair<double, double>> bytes_history_;
  std::vector<std::pair<std::int64_t, double>> memory_history_;
};

/// Draws the loss curve (steps on x, loss on y) as a small SVG file; with
/// `memory` (step, bytes per rank), beside it the memory per rank in MB on
/// a right-hand axis.
void write_loss_svg(const std::string& path, const std::vector<std::pair<std::int64_t, double>>& points,
                    const std::string& title, const std::vector<std::pair<std::int64_t, double>>& memory = {});
/// The same plot with any x axis (e.g. megabytes sent per rank), labelled `xlabel`.
void write_curve_svg(const std::string& path, const std::vector<std::pair<double, double>>& points,
                     const std::string& title, const std::string& xlabel);

}  // namespace dopt_train
