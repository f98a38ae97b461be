// dopt-replay: replays a conformance case (../shared/conformance/FORMAT.md)
// with dopt's optimizers and writes what check_replay.py compares.
//
//   dopt-replay CASE_DIR --out OUT.safetensors [--threads N] [--quiet]
//
// Exit status: 0 on success; 1 for a bad case directory, case.json or tensor
// file, or an error while replaying; 2 for a usage error; 3 for a valid case
// this build cannot replay yet (e.g. wrapper 'zero').
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/safetensors.hpp"
#include "replay_case.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Replay a dopt-trace/1 conformance case with dopt and write the replay output"};
  std::string case_dir;
  std::string out_path;
  int threads = 1;
  bool quiet = false;
  app.add_option("case_dir", case_dir, "Case directory holding case.json and tensors.safetensors")->required();
  app.add_option("-o,--out", out_path, "Output safetensors file")->required();
  app.add_option("-j,--threads", threads, "Threads for Optimizer::step (default 1)")->check(CLI::PositiveNumber);
  app.add_flag("-q,--quiet", quiet, "No summary line on stderr");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  const auto t0 = std::chrono::steady_clock::now();
  try {
    const dopt::replay::Case c = dopt::replay::load_case(case_dir);
    const dopt::replay::ReplayOutput r = dopt::replay::replay_case(c, threads);
    dopt::write_safetensors(out_path, r.tensors, r.metadata);
    if (!quiet) {
      std::size_t n_param = 0, n_state = 0;
      for (const auto& [k, v] : r.tensors) (k.rfind("param.", 0) == 0 ? n_param : n_state)++;
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr,
                   "dopt-replay: %s: %s, wrapper %s, %zu params, %d steps -> %s (%zu param + %zu state "
                   "tensors, %.1f ms)\n",
                   c.name.c_str(), c.optimizer_class.c_str(), c.wrapper_kind.c_str(), c.shapes.size(), c.steps,
                   out_path.c_str(), n_param, n_state, ms);
    }
    return 0;
  } catch (const dopt::replay::UnsupportedCase& e) {
    std::fprintf(stderr, "dopt-replay: %s: %s\n", case_dir.c_str(), e.detail().c_str());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt-replay: error: %s\n", e.what());
    return 1;
  }
}
