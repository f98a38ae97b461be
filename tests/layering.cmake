add_test(NAME "layering: no layer includes a layer above it"
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/check_layering.py ${PROJECT_SOURCE_DIR})
set_tests_properties("layering: no layer includes a layer above it" PROPERTIES LABELS lint)
add_test(NAME "lint: the environment is read only through the settings table, and every DOPT_ variable the code reads is declared there"
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/check_settings.py ${PROJECT_SOURCE_DIR})
set_tests_properties("lint: the environment is read only through the settings table, and every DOPT_ variable the code reads is declared there"
                     PROPERTIES LABELS lint)
add_test(NAME "wall: installed headers name no detail:: outside detail/ and include only installed headers, examples and benchmarks include only installed headers"
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/check_wall.py ${PROJECT_SOURCE_DIR})
set_tests_properties("wall: installed headers name no detail:: outside detail/ and include only installed headers, examples and benchmarks include only installed headers"
                     PROPERTIES LABELS lint)
