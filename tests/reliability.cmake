# Nothing lost, nothing hangs, no one joins who does not belong: the tests
# tagged [reliability] (checkpoint checksums and checks before work in
# tests/train.test.cpp, dopt-run's blame and Ctrl-Z in tests/launcher.test.cpp,
# bounded hand-shakes and job identities in tests/reliability.test.cpp) get the
# label "reliability" and a 60 s TIMEOUT; those also tagged [slow] (a hand-shake
# that must run into its deadline) the label "slow" as well:
#   ctest -L reliability -LE slow
if(TARGET dopt_tests)
  dopt_catch_test_properties("[reliability]" "reliability" 60)
  dopt_catch_test_properties("[slow]" "slow" 90)
  if(TARGET dopt-replay)
    add_dependencies(dopt_tests dopt-replay)
  endif()
endif()
if(TARGET dopt_tests AND TARGET dopt-train)
  add_dependencies(dopt_tests dopt-train dopt-run)
endif()
