# dopt-train run as a process (tests/train.test.cpp, tags [train], and
# [train][multiprocess] for the runs under dopt-run, which get the label
# "multiprocess" and a 60 s timeout from tests/rendezvous.cmake).
if(TARGET dopt_tests AND TARGET dopt-train)
  add_dependencies(dopt_tests dopt-train dopt-run)
  # dopt-train has --optim remote when DistributedOptimizer is there (tools/CMakeLists.txt).
  if(EXISTS "${PROJECT_SOURCE_DIR}/distributed/dopt/distributed/distributed_optimizer.hpp")
    target_compile_definitions(dopt_tests PRIVATE DOPT_TRAIN_HAVE_REMOTE)
  endif()
endif()
