# DiLoCo between real processes (tests/diloco_multiprocess.test.cpp, tags
# [diloco][multiprocess]): tests/diloco_peer.cpp is one rank, started by
# dopt-run or by hand. It shares the float64 reference of the unit tests
# (optim/src/diloco_reference.hpp).
if(TARGET dopt_tests)
  add_executable(dopt_diloco_peer diloco_peer.cpp)
  target_link_libraries(dopt_diloco_peer PRIVATE dopt::dopt)
  target_include_directories(dopt_diloco_peer PRIVATE "${PROJECT_SOURCE_DIR}/optim/src")
  add_dependencies(dopt_tests dopt_diloco_peer)
endif()
