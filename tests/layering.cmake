add_test(NAME "layering: no layer includes a layer above it"
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/check_layering.py ${PROJECT_SOURCE_DIR})
set_tests_properties("layering: no layer includes a layer above it" PROPERTIES LABELS lint)
