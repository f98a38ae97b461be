# Installs the build tree into a scratch prefix and builds + runs a consumer
# project against it with find_package(dopt CONFIG).
add_test(NAME "install: consumer project builds against the installed package"
  COMMAND ${CMAKE_COMMAND}
    -DBUILD_DIR=${PROJECT_BINARY_DIR}
    -DSOURCE_DIR=${CMAKE_CURRENT_SOURCE_DIR}/consumer
    -DWORK_DIR=${PROJECT_BINARY_DIR}/install-test
    -P ${CMAKE_CURRENT_SOURCE_DIR}/consumer/run_install_test.cmake)
set_tests_properties("install: consumer project builds against the installed package"
  PROPERTIES LABELS "install;slow" TIMEOUT 600)
