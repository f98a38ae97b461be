# Every installed header compiles on its own: one generated source per header
# (the header included twice, so a missing include guard shows too), all in the
# object library dopt_header_check, built with the rest. The CTest test builds
# that target, so a header edited since the last build is checked again.
get_property(_dopt_installed_headers GLOBAL PROPERTY DOPT_INSTALLED_HEADERS)
set(_dopt_header_sources "")
foreach(_entry IN LISTS _dopt_installed_headers)
  string(REPLACE "|" ";" _parts "${_entry}")
  list(GET _parts 1 _header)  # dopt/<component>/<file>.hpp
  string(MAKE_C_IDENTIFIER "${_header}" _id)
  set(_src "${CMAKE_CURRENT_BINARY_DIR}/header_check/${_id}.cpp")
  file(CONFIGURE OUTPUT "${_src}" CONTENT "#include \"${_header}\"\n#include \"${_header}\"\n" @ONLY)
  list(APPEND _dopt_header_sources "${_src}")
endforeach()
if(_dopt_header_sources)
  add_library(dopt_header_check OBJECT ${_dopt_header_sources})
  # Only the installed include paths: what a consumer of the package gets.
  target_link_libraries(dopt_header_check PRIVATE dopt::dopt)
  add_test(NAME "headers: every installed header compiles on its own"
           COMMAND ${CMAKE_COMMAND} --build ${PROJECT_BINARY_DIR} --target dopt_header_check)
  set_tests_properties("headers: every installed header compiles on its own"
                       PROPERTIES LABELS "docs;lint" TIMEOUT 900)
endif()
