# dopt::rpc and DistributedOptimizer between real processes
# (tests/rpc_multiprocess.test.cpp, tags [rpc][multiprocess]): tests/rpc_peer.cpp
# is one worker, started by dopt-run or by hand. The [multiprocess] label and
# 60 s timeout come from tests/rendezvous.cmake.
if(TARGET dopt_tests)
  add_executable(dopt_rpc_peer rpc_peer.cpp)
  target_link_libraries(dopt_rpc_peer PRIVATE dopt::dopt)
  # rpc/testing.hpp (test hooks, not installed)
  target_include_directories(dopt_rpc_peer PRIVATE "${PROJECT_SOURCE_DIR}/actors/src")
  # distributed_optimizer_survive_scenarios.hpp (test support, not installed)
  target_include_directories(dopt_rpc_peer PRIVATE "${PROJECT_SOURCE_DIR}/distributed/src")
  add_dependencies(dopt_tests dopt_rpc_peer)
endif()
