# Conformance tests: one CTest per case under ${DOPT_SHARED_DIR}/conformance/cases,
# and per listed case of cases-next (below) (format: ../shared/conformance/FORMAT.md). Each runs dopt-replay on the case
# and then check_replay.py --quiet on its output (tests/run_conformance.sh).
#
# Cases are registered for the wrapper kinds in DOPT_REPLAY_WRAPPERS (the
# kinds dopt-replay supports); cases of other kinds are listed as skipped.
#
#   ctest -L conformance
option(DOPT_CONFORMANCE "Require the conformance cases in DOPT_SHARED_DIR" ON)
# Each further kind is added on its own line: list(APPEND DOPT_REPLAY_WRAPPERS kind)
set(DOPT_REPLAY_WRAPPERS local)
list(APPEND DOPT_REPLAY_WRAPPERS post_local_sgd)
list(APPEND DOPT_REPLAY_WRAPPERS zero)
list(APPEND DOPT_REPLAY_WRAPPERS diloco)
set(_conf_cases_dir "${DOPT_SHARED_DIR}/conformance/cases")
set(_conf_checker "${DOPT_SHARED_DIR}/conformance/check_replay.py")
find_program(DOPT_PYTHON3 python3)

file(GLOB _conf_case_jsons CONFIGURE_DEPENDS "${_conf_cases_dir}/*/case.json")
# Without cases (or python3) the suite cannot check conformance: say so with a
# failing test rather than a green run, unless DOPT_CONFORMANCE=OFF.
if(DOPT_CONFORMANCE AND (NOT _conf_case_jsons OR NOT DOPT_PYTHON3))
  add_test(NAME "conformance: cases and python3 are available"
           COMMAND ${CMAKE_COMMAND} -E echo
                   "no conformance cases under ${_conf_cases_dir} or no python3; set DOPT_SHARED_DIR or -DDOPT_CONFORMANCE=OFF")
  set_tests_properties("conformance: cases and python3 are available" PROPERTIES LABELS conformance WILL_FAIL TRUE)
endif()
if(NOT _conf_case_jsons)
  message(STATUS "conformance: no cases under ${_conf_cases_dir}; conformance tests skipped")
elseif(NOT EXISTS "${_conf_checker}")
  message(STATUS "conformance: ${_conf_checker} not found; conformance tests skipped")
elseif(NOT DOPT_PYTHON3)
  message(STATUS "conformance: python3 not found; conformance tests skipped")
elseif(NOT TARGET dopt-replay)
  message(STATUS "conformance: target dopt-replay does not exist; conformance tests skipped")
else()
  list(SORT _conf_case_jsons)
  set(_conf_registered 0)
  set(_conf_skipped "")
  set(_conf_zero "")
  foreach(_json IN LISTS _conf_case_jsons)
    get_filename_component(_case_dir "${_json}" DIRECTORY)
    get_filename_component(_case "${_case_dir}" NAME)
    file(READ "${_json}" _content)
    string(JSON _kind ERROR_VARIABLE _err GET "${_content}" wrapper kind)
    if(_err)
      message(WARNING "conformance: cannot read wrapper.kind of ${_json}: ${_err}")
      continue()
    endif()
    if(NOT _kind IN_LIST DOPT_REPLAY_WRAPPERS)
      list(APPEND _conf_skipped "${_case}")
      if(_kind STREQUAL "zero")
        list(APPEND _conf_zero "${_case}")
      endif()
      continue()
    endif()
    add_test(NAME "conformance: ${_case}"
             COMMAND sh "${CMAKE_CURRENT_SOURCE_DIR}/run_conformance.sh"
                     $<TARGET_FILE:dopt-replay> "${DOPT_PYTHON3}" "${_conf_checker}"
                     "${_case_dir}" "${CMAKE_CURRENT_BINARY_DIR}/conformance/${_case}.safetensors"
                     "${CMAKE_CURRENT_SOURCE_DIR}/check_bitwise.py")
    set_tests_properties("conformance: ${_case}" PROPERTIES LABELS conformance TIMEOUT 120)
    math(EXPR _conf_registered "${_conf_registered} + 1")
  endforeach()
  # Cases of cases-next/ (FORMAT.md: features newer than cases/) that
  # dopt-replay supports, by name: they run exactly like the cases above.
  # To add one: make it pass (run_conformance.sh: dopt-replay, check_replay.py
  # and check_bitwise.py), add its name on its own line below, and copy its
  # folder into tests/shared-snapshot/conformance/cases-next/ so that a clone
  # without ../shared checks it too. A listed case that is missing fails.
  set(DOPT_CONFORMANCE_NEXT_CASES
    # learning-rate schedulers, clip_grad_norm, NAdam, RAdam
    adam_multisteplr
    adam_onecyclelr
    adam_reduce_lr_on_plateau
    adam_two_groups_chained_scheduler
    adamw_exponentiallr_clip_l2
    nadam_default
    nadam_polynomiallr_clip_inf
    radam_weight_decay
    rmsprop_linearlr_clip_l1
    sgd_cosine_warm_restarts
    sgd_cycliclr_momentum
    sgd_nesterov_cosineannealinglr
    sgd_sequentiallr
    sgd_steplr
    zero_adam_ws3_bucket_clip_steplr
    # the diloco wrapper (DiLoCo, Streaming DiLoCo)
    diloco_adam_ws3_outer_sgd_nesterov
    diloco_adamw_ws2_outer_sgd_nesterov
    diloco_sgd_ws2_fragments_delay_alpha
  )
  foreach(_case IN LISTS DOPT_CONFORMANCE_NEXT_CASES)
    set(_case_dir "${DOPT_SHARED_DIR}/conformance/cases-next/${_case}")
    add_test(NAME "conformance: ${_case}"
             COMMAND sh "${CMAKE_CURRENT_SOURCE_DIR}/run_conformance.sh"
                     $<TARGET_FILE:dopt-replay> "${DOPT_PYTHON3}" "${_conf_checker}"
                     "${_case_dir}" "${CMAKE_CURRENT_BINARY_DIR}/conformance/${_case}.safetensors"
                     "${CMAKE_CURRENT_SOURCE_DIR}/check_bitwise.py")
    set_tests_properties("conformance: ${_case}" PROPERTIES LABELS "conformance;conformance-next" TIMEOUT 120)
    math(EXPR _conf_registered "${_conf_registered} + 1")
  endforeach()
  # Muon's cases: checked with check_replay.py's float64 tolerances only, not
  # byte for byte: the Newton-Schulz matrix products sum in another order than
  # torch's BLAS (FORMAT.md: such a replay stays far inside the tolerances).
  set(DOPT_CONFORMANCE_NEXT_TOLERANCE_CASES
    muon_default
    muon_no_nesterov_match_rms_adamw_no_wd
    muon_two_groups
    zero_muon_ws2_bucket
  )
  foreach(_case IN LISTS DOPT_CONFORMANCE_NEXT_TOLERANCE_CASES)
    set(_case_dir "${DOPT_SHARED_DIR}/conformance/cases-next/${_case}")
    add_test(NAME "conformance: ${_case}"
             COMMAND sh "${CMAKE_CURRENT_SOURCE_DIR}/run_conformance.sh"
                     $<TARGET_FILE:dopt-replay> "${DOPT_PYTHON3}" "${_conf_checker}"
                     "${_case_dir}" "${CMAKE_CURRENT_BINARY_DIR}/conformance/${_case}.safetensors")
    set_tests_properties("conformance: ${_case}" PROPERTIES LABELS "conformance;conformance-next" TIMEOUT 120)
    math(EXPR _conf_registered "${_conf_registered} + 1")
  endforeach()

  # The replayer's own error paths. While 'zero' is unsupported, replaying a
  # zero case must say so and exit non-zero (dropped once 'zero' is supported).
  if(_conf_zero AND NOT "zero" IN_LIST DOPT_REPLAY_WRAPPERS)
    list(GET _conf_zero 0 _zero_case)
    add_test(NAME "dopt-replay: unsupported wrapper is reported"
             COMMAND sh -c "\"$1\" \"$2\" --out \"$3\" 2>&1; test $? -ne 0"
                     sh $<TARGET_FILE:dopt-replay> "${_conf_cases_dir}/${_zero_case}"
                     "${CMAKE_CURRENT_BINARY_DIR}/conformance/unsupported.safetensors")
    set_tests_properties("dopt-replay: unsupported wrapper is reported" PROPERTIES
                         LABELS tools PASS_REGULAR_EXPRESSION "wrapper 'zero' is not supported yet")
  endif()
  add_test(NAME "dopt-replay: missing case dir fails"
           COMMAND $<TARGET_FILE:dopt-replay> "${CMAKE_CURRENT_BINARY_DIR}/no-such-case"
                   --out "${CMAKE_CURRENT_BINARY_DIR}/conformance/missing.safetensors")
  set_tests_properties("dopt-replay: missing case dir fails" PROPERTIES LABELS tools
                       PASS_REGULAR_EXPRESSION "no-such-case: not a directory")

  list(LENGTH _conf_skipped _n_skipped)
  message(STATUS "conformance: ${_conf_registered} cases registered (wrappers: ${DOPT_REPLAY_WRAPPERS}); "
                 "${_n_skipped} cases of other wrappers skipped")
endif()
