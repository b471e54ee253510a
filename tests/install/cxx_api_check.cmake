# install.cxx_api_check: the configure-time rule of the public C++ headers
# (cmake/cxx_api_headers.cmake) passes the real headers and stops on each kind of bad include.
#   cmake -DSRC=<source root> -DWORK=<scratch> -P tests/install/cxx_api_check.cmake
cmake_policy(VERSION 3.24)
set(_rule ${SRC}/cmake/cxx_api_headers.cmake)
set(_real tensor.hpp comm.hpp mesh.hpp blocks.hpp)
execute_process(COMMAND ${CMAKE_COMMAND} -DDIR=${SRC}/include/meshrt "-DHEADERS=${_real}" -P ${_rule}
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "FAIL: the installed C++ headers break their own rule: ${_err}")
endif()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
# Each bad include and the message it must give.
set(_cases "#include <meshrt/runtime/tensor.h>|includes <meshrt/runtime/tensor.h>, which is not a public header"
           "#include \"runtime/tensor.h\"|the public C++ headers include only"
           "#include <nlohmann/json.hpp>|the public C++ headers include only")
set(_n 0)
foreach(_c ${_cases})
  string(REPLACE "|" ";" _c "${_c}")
  list(GET _c 0 _line)
  list(GET _c 1 _want)
  file(WRITE ${WORK}/bad.hpp "#include <vector>\n#include <meshrt/meshrt.h>\n${_line}\n")
  execute_process(COMMAND ${CMAKE_COMMAND} -DDIR=${WORK} "-DHEADERS=bad.hpp" -P ${_rule}
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  string(REPLACE "\n" " " _err1 "${_err}")
  string(REGEX REPLACE " +" " " _err1 "${_err1}")
  string(FIND "${_err1}" "${_want}" _at)
  if(_rc EQUAL 0 OR _at EQUAL -1)
    message(FATAL_ERROR "FAIL: '${_line}' in a public C++ header: want an error with '${_want}', "
                        "got rc ${_rc}: ${_err}")
  endif()
  math(EXPR _n "${_n} + 1")
endforeach()
message("${_n} bad includes refused, the real headers accepted")
message("PASS")
