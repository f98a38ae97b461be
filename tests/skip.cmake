# The agreement on skipped steps (GradScaler) and sharded clip_grad_norm
# between real processes (tests/skip_multiprocess.test.cpp, tags
# [grad_scaler][multiprocess]): tests/skip_peer.cpp is one rank, started by
# dopt-run. The [multiprocess] label and 60 s timeout come from
# tests/rendezvous.cmake.
if(TARGET dopt_tests)
  dopt_test_peer(skip)
endif()
