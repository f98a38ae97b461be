# FindCAF.cmake -- locate the C++ Actor Framework (Debian's libcaf-dev 0.17.x
# ships no CMake package configuration).
#
#   find_package(CAF 0.17 REQUIRED COMPONENTS core io)
#
# Imported targets: CAF::core, CAF::io (each when found).
# Variables: CAF_FOUND, CAF_VERSION, CAF_INCLUDE_DIR, CAF_<C>_LIBRARY.
include(FindPackageHandleStandardArgs)

find_path(CAF_INCLUDE_DIR NAMES caf/all.hpp caf/config.hpp
          HINTS ${CAF_ROOT} ENV CAF_ROOT PATH_SUFFIXES include)

if(CAF_INCLUDE_DIR AND EXISTS "${CAF_INCLUDE_DIR}/caf/config.hpp")
  file(STRINGS "${CAF_INCLUDE_DIR}/caf/config.hpp" _caf_ver_line
       REGEX "^#define CAF_VERSION [0-9]+")
  string(REGEX REPLACE "^#define CAF_VERSION ([0-9]+).*" "\\1" _caf_ver "${_caf_ver_line}")
  if(_caf_ver)
    math(EXPR _caf_major "${_caf_ver} / 10000")
    math(EXPR _caf_minor "(${_caf_ver} / 100) % 100")
    math(EXPR _caf_patch "${_caf_ver} % 100")
    set(CAF_VERSION "${_caf_major}.${_caf_minor}.${_caf_patch}")
  endif()
endif()

if(NOT CAF_FIND_COMPONENTS)
  set(CAF_FIND_COMPONENTS core)
endif()
set(_caf_required_vars CAF_INCLUDE_DIR)
foreach(_comp IN LISTS CAF_FIND_COMPONENTS)
  string(TOUPPER "${_comp}" _COMP)
  find_library(CAF_${_COMP}_LIBRARY NAMES caf_${_comp}
               HINTS ${CAF_ROOT} ENV CAF_ROOT PATH_SUFFIXES lib lib64)
  if(CAF_${_COMP}_LIBRARY)
    set(CAF_${_comp}_FOUND TRUE)
  endif()
  if(CAF_FIND_REQUIRED_${_comp})
    list(APPEND _caf_required_vars CAF_${_COMP}_LIBRARY)
  endif()
endforeach()

find_package_handle_standard_args(CAF
  REQUIRED_VARS ${_caf_required_vars}
  VERSION_VAR CAF_VERSION
  HANDLE_COMPONENTS)

if(CAF_FOUND)
  find_package(Threads REQUIRED)
  foreach(_comp IN LISTS CAF_FIND_COMPONENTS)
    string(TOUPPER "${_comp}" _COMP)
    if(CAF_${_comp}_FOUND AND NOT TARGET CAF::${_comp})
      add_library(CAF::${_comp} UNKNOWN IMPORTED)
      set_target_properties(CAF::${_comp} PROPERTIES
        IMPORTED_LOCATION "${CAF_${_COMP}_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}"
        INTERFACE_LINK_LIBRARIES Threads::Threads)
    endif()
  endforeach()
  if(TARGET CAF::io AND TARGET CAF::core)
    set_property(TARGET CAF::io APPEND PROPERTY INTERFACE_LINK_LIBRARIES CAF::core)
  endif()
endif()
mark_as_advanced(CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY)
