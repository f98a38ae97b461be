# dopt_add_component(<name> [DEPS <targets>...] [PRIVATE_DEPS <targets>...])
#
# A component is a folder <name>/ holding its public header tree
# <name>/dopt/<name>/*.hpp, its sources <name>/src/*.cpp and its unit tests
# beside them as <name>/src/*.test.cpp. It becomes the library dopt_<name>.
# Unit tests are collected into the global property DOPT_UNIT_TEST_SOURCES and
# compiled into one binary (tests/), because Catch2 compiles slowly.
function(dopt_add_component name)
  cmake_parse_arguments(ARG "" "" "DEPS;PRIVATE_DEPS" ${ARGN})
  set(dir "${CMAKE_CURRENT_SOURCE_DIR}")
  file(GLOB_RECURSE all_sources CONFIGURE_DEPENDS "${dir}/src/*.cpp")
  set(lib_sources "")
  set(test_sources "")
  foreach(src IN LISTS all_sources)
    if(src MATCHES "\\.test\\.cpp$")
      list(APPEND test_sources "${src}")
    else()
      list(APPEND lib_sources "${src}")
    endif()
  endforeach()
  if(lib_sources)
    add_library(dopt_${name} ${lib_sources})
    set(scope PUBLIC)
  else()  # header-only so far
    add_library(dopt_${name} INTERFACE)
    set(scope INTERFACE)
  endif()
  add_library(dopt::${name} ALIAS dopt_${name})
  target_include_directories(dopt_${name} ${scope}
    $<BUILD_INTERFACE:${dir}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(dopt_${name} ${scope} ${ARG_DEPS})
  if(lib_sources AND ARG_PRIVATE_DEPS)
    target_link_libraries(dopt_${name} PRIVATE ${ARG_PRIVATE_DEPS})
  endif()
  target_compile_features(dopt_${name} ${scope} cxx_std_20)
  set_property(TARGET dopt_${name} PROPERTY EXPORT_NAME ${name})
  set_property(GLOBAL APPEND PROPERTY DOPT_UNIT_TEST_SOURCES ${test_sources})
  set_property(GLOBAL APPEND PROPERTY DOPT_COMPONENTS dopt_${name})
  install(DIRECTORY "${dir}/dopt" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          FILES_MATCHING PATTERN "*.hpp")
endfunction()
