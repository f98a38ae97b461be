# Installs the libraries and an exported CMake package:
#   find_package(dopt CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE dopt::dopt)
include(CMakePackageConfigHelpers)
get_property(_dopt_components GLOBAL PROPERTY DOPT_COMPONENTS)
install(TARGETS dopt ${_dopt_components}
        EXPORT doptTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT doptTargets NAMESPACE dopt:: FILE doptTargets.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dopt)
configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/doptConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/doptConfig.cmake"
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dopt)
write_basic_package_version_file("${PROJECT_BINARY_DIR}/doptConfigVersion.cmake"
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/doptConfig.cmake"
              "${PROJECT_BINARY_DIR}/doptConfigVersion.cmake"
              "${PROJECT_SOURCE_DIR}/cmake/FindCAF.cmake"
              "${PROJECT_SOURCE_DIR}/cmake/Findxxhash.cmake"
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dopt)
