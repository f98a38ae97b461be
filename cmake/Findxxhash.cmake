# Findxxhash.cmake -- locate xxHash (Debian's libxxhash-dev ships no CMake
# package configuration).
#
#   find_package(xxhash REQUIRED)
#
# Imported target: xxhash::xxhash. Variables: xxhash_FOUND, xxhash_VERSION,
# xxhash_INCLUDE_DIR, xxhash_LIBRARY.
include(FindPackageHandleStandardArgs)

find_path(xxhash_INCLUDE_DIR NAMES xxhash.h HINTS ${xxhash_ROOT} ENV xxhash_ROOT PATH_SUFFIXES include)
find_library(xxhash_LIBRARY NAMES xxhash HINTS ${xxhash_ROOT} ENV xxhash_ROOT PATH_SUFFIXES lib)

if(xxhash_INCLUDE_DIR AND EXISTS "${xxhash_INCLUDE_DIR}/xxhash.h")
  file(STRINGS "${xxhash_INCLUDE_DIR}/xxhash.h" _xxh_lines REGEX "^#define XXH_VERSION_(MAJOR|MINOR|RELEASE) +[0-9]+")
  foreach(_part MAJOR MINOR RELEASE)
    string(REGEX REPLACE ".*#define XXH_VERSION_${_part} +([0-9]+).*" "\\1" _xxh_${_part} "${_xxh_lines}")
  endforeach()
  set(xxhash_VERSION "${_xxh_MAJOR}.${_xxh_MINOR}.${_xxh_RELEASE}")
endif()

find_package_handle_standard_args(xxhash REQUIRED_VARS xxhash_LIBRARY xxhash_INCLUDE_DIR
                                  VERSION_VAR xxhash_VERSION)
if(xxhash_FOUND AND NOT TARGET xxhash::xxhash)
  add_library(xxhash::xxhash UNKNOWN IMPORTED)
  set_target_properties(xxhash::xxhash PROPERTIES
    IMPORTED_LOCATION "${xxhash_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${xxhash_INCLUDE_DIR}")
endif()
mark_as_advanced(xxhash_INCLUDE_DIR xxhash_LIBRARY)
