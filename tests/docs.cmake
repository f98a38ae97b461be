# The documentation matches the code: every C++ block in README.md and docs/
# is quoted from a file the build compiles, docs/ and the installed headers
# name nothing a clone lacks, and every relative link of README.md, docs/ and
# bench/results/ leads to a file and heading that exist (tests/check_docs.py
# says what exactly).
add_test(NAME "docs: every C++ snippet is quoted from compiled code; no references outside the repository; relative links and anchors resolve"
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/check_docs.py ${PROJECT_SOURCE_DIR})
set_tests_properties("docs: every C++ snippet is quoted from compiled code; no references outside the repository; relative links and anchors resolve"
                     PROPERTIES LABELS "docs;lint" TIMEOUT 60)
# The link check itself, on a small tree with planted broken links.
add_test(NAME "docs: the link check reports every planted broken link and no good one"
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/check_docs_links_test.py)
set_tests_properties("docs: the link check reports every planted broken link and no good one"
                     PROPERTIES LABELS "docs;lint" TIMEOUT 60)
