# Nothing lost, nothing hangs, no one joins who does not belong: the tests
# tagged [reliability] (checkpoint checks in tests/train.test.cpp, dopt-run's
# blame, Ctrl-Z and job secret in tests/launcher.test.cpp, bounded hand-shakes
# and job identities between processes in tests/reliability.test.cpp) get the
# label "reliability" and a 60 s TIMEOUT (ctest -L reliability: about 15 s on
# 2 cores). None needs a long deadline to run out: the hand-shake tests set
# DOPT_HANDSHAKE_TIMEOUT_MS to 1 s.
if(TARGET dopt_tests)
  dopt_catch_test_properties("[reliability]" "reliability" 60)
  if(TARGET dopt-replay)
    add_dependencies(dopt_tests dopt-replay)
  endif()
  if(TARGET dopt-train)
    add_dependencies(dopt_tests dopt-train dopt-run)
  endif()
endif()
