#pragma once
// dopt-train's Ctrl-C / SIGTERM (main.cpp): what a signal does to a rank
// in training, and to a replacement still waiting to rejoin the job. The
// handlers run on whichever thread the signal lands on; the training loop
// reads g_signal at each step boundary (every rank sees the same decision).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <csignal>

namespace dopt_train {

// Ctrl-C / SIGTERM: the first one asks every rank to stop after the current
// step (and to checkpoint there); a second one kills the process.
inline std::atomic<int> g_signal{0};
inline std::atomic<int> g_exit_code{0};
// A replacement waiting in join_back (join_group) has no step to finish and
// nothing to checkpoint: a signal ends it at once, with exit code 130.
inline std::atomic<bool> g_joining{false};

inline void on_signal(int sig) {
  if (g_joining.load()) {
    static const char kStopped[] =
        "dopt-train: stopped by a signal while this replacement waited in join_group() to rejoin the job\n";
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, kStopped, sizeof kStopped - 1);
    ::_exit(130);
  }
  g_signal.store(sig);
  ::signal(sig, SIG_DFL);
}

/// Installed once the ranks are connected (train_rank): during the
/// rendezvous a signal keeps its default action and ends the process at once.
inline void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

}  // namespace dopt_train
