add_test(NAME "layering: no layer includes a layer above it"
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/check_layering.py ${PROJECT_SOURCE_DIR})
set_tests_properties("layering: no layer includes a layer above it" PROPERTIES LABELS lint)
add_test(NAME "lint: the environment is read only through the settings table, and every DOPT_ variable the code reads is declared there"
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/check_settings.py ${PROJECT_SOURCE_DIR})
set_tests_properties("lint: the environment is read only through the settings table, and every DOPT_ variable the code reads is declared there"
                     PROPERTIES LABELS lint)
