# Run at build time on each Catch2 test binary (POST_BUILD): fails the build when a test case
# name contains ';' (ctest discovery splits such a name into two entries that match nothing), and
# when the binary lists no test case: Catch2's discovery then registers nothing without an error
# (as when a sanitizer runtime refuses its options and exits before main), so ctest would pass
# without running the suite.
# Usage: cmake -DTEST_BIN=<path> -P check_test_names.cmake
execute_process(COMMAND "${TEST_BIN}" --list-test-names-only OUTPUT_VARIABLE _out
                ERROR_VARIABLE _err RESULT_VARIABLE _rc)
# --list-test-names-only exits with the number of tests listed; only a crash is an error.
if(NOT _rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "${TEST_BIN} --list-test-names-only failed: ${_rc}")
endif()
if(NOT _out MATCHES "[^ \t\r\n]")
  message(FATAL_ERROR "${TEST_BIN} --list-test-names-only listed no test case (exit ${_rc}): "
                      "${_err}")
endif()
string(REPLACE ";" "<SEMICOLON>" _out "${_out}")
string(REPLACE "\n" ";" _lines "${_out}")
foreach(_name IN LISTS _lines)
  if(_name MATCHES "<SEMICOLON>")
    string(REPLACE "<SEMICOLON>" ";" _name "${_name}")
    message(FATAL_ERROR "${TEST_BIN}: test name \"${_name}\" contains ';'. ctest discovery "
                        "splits it into names that match no test case: rename it.")
  endif()
endforeach()
