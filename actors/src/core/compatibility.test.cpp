// What a newcomer must share with the running job (core/compatibility.hpp).
#include "core/compatibility.hpp"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "dopt/runtime/error.hpp"

using dopt::detail::compatibility_differences;
using dopt::detail::compatibility_items;

namespace {

/// Sets (or, for nullptr, unsets) DOPT_MIN_WORLD_SIZE, and restores it.
struct MinWorldSize {
  explicit MinWorldSize(const char* value) {
    if (const char* was = std::getenv("DOPT_MIN_WORLD_SIZE")) saved = was, had = true;
    if (value)
      ::setenv("DOPT_MIN_WORLD_SIZE", value, 1);
    else
      ::unsetenv("DOPT_MIN_WORLD_SIZE");
  }
  ~MinWorldSize() {
    if (had)
      ::setenv("DOPT_MIN_WORLD_SIZE", saved.c_str(), 1);
    else
      ::unsetenv("DOPT_MIN_WORLD_SIZE");
  }
  std::string saved;
  bool had = false;
};

dopt::LaunchEnv env_of(int world, int local_world) {
  dopt::LaunchEnv env;
  env.rank = 1;
  env.world_size = world;
  env.local_world_size = local_world;
  return env;
}

}  // namespace

TEST_CASE("compatibility: the launch facts come first, then the program's items, and each difference is named",
          "[compatibility]") {
  dopt::InitOptions job_options;
  job_options.compatibility = {{"--hidden", "64"}, {"--steps", "3000"}};
  const auto job = [&] {
    MinWorldSize unset(nullptr);
    return compatibility_items(env_of(6, 2), job_options, "init_process_group");
  }();
  CHECK(job == std::vector<std::string>{"WORLD_SIZE", "6", "LOCAL_WORLD_SIZE", "2", "DOPT_MIN_WORLD_SIZE", "6",
                                        "--hidden", "64", "--steps", "3000"});
  CHECK(compatibility_differences(job, job, "this node").empty());

  dopt::InitOptions other;
  other.compatibility = {{"--hidden", "32"}, {"--optim", "zero"}};
  const auto newcomer = [&] {
    MinWorldSize four("4");
    return compatibility_items(env_of(6, 2), other, "init_process_group");
  }();
  CHECK(compatibility_differences(job, newcomer, "this node") ==
        "--hidden: the job has 64, this node 32; --optim: the job has (not declared), this node zero; --steps: the job "
        "has 3000, this node (not declared); DOPT_MIN_WORLD_SIZE (dopt-run --nproc-per-node times --nnodes MIN): the "
        "job has 6, this node 4");
}

TEST_CASE("compatibility: a job that declares no items of its own compares the launch facts only", "[compatibility]") {
  MinWorldSize unset(nullptr);
  const auto job = compatibility_items(env_of(4, 2), dopt::InitOptions{}, "init_process_group");
  dopt::InitOptions declared;
  declared.compatibility = {{"--hidden", "32"}};
  CHECK(
      compatibility_differences(job, compatibility_items(env_of(4, 2), declared, "init_process_group"), "this process")
          .empty());
  CHECK(compatibility_differences(job, compatibility_items(env_of(4, 1), declared, "init_process_group"),
                                  "this process") ==
        "LOCAL_WORLD_SIZE (dopt-run --nproc-per-node): the job has 2, this process 1");
}

TEST_CASE("compatibility: an empty key or a launch fact's name among the program's items is a ValueError",
          "[compatibility]") {
  for (const char* key : {"", "WORLD_SIZE", "DOPT_MIN_WORLD_SIZE"}) {
    INFO("key '" << key << "'");
    dopt::InitOptions o;
    o.compatibility = {{key, "1"}};
    CHECK_THROWS_AS(compatibility_items(env_of(2, 1), o, "init_process_group"), dopt::ValueError);
  }
}
