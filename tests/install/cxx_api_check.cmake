# install.cxx_api_check: the configure-time rule of the installed headers
# (cmake/cxx_api_headers.cmake) passes the real ones (every header cmake/package.cmake installs
# from include/meshrt) and stops on each kind of bad include.
#   cmake -DSRC=<source root> -DWORK=<scratch> -P tests/install/cxx_api_check.cmake
cmake_policy(VERSION 3.24)
set(_rule ${SRC}/cmake/cxx_api_headers.cmake)
set(_real meshrt.h export.h meshrt.hpp tensor.hpp comm.hpp mesh.hpp blocks.hpp)
execute_process(COMMAND ${CMAKE_COMMAND} -DDIR=${SRC}/include/meshrt "-DHEADERS=${_real}" -P ${_rule}
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "FAIL: the installed headers break their own rule: ${_err}")
endif()
# The list must be the installed set: every header under include/meshrt.
file(GLOB _all RELATIVE ${SRC}/include/meshrt ${SRC}/include/meshrt/*)
list(SORT _all)
set(_sorted ${_real})
list(SORT _sorted)
if(NOT _all STREQUAL _sorted)
  message(FATAL_ERROR "FAIL: include/meshrt holds ${_all}, the checked set is ${_sorted}: keep "
                      "this list, MESHRT_INSTALLED_HEADERS in cmake/package.cmake and the folder "
                      "the same")
endif()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
# Each bad include and the message it must give.
set(_cases "#include <meshrt/runtime/tensor.h>|includes <meshrt/runtime/tensor.h>, which is not a public header"
           "#include \"runtime/tensor.h\"|the public C++ headers include only"
           "#include <nlohmann/json.hpp>|the public C++ headers include only"
           "#include <meshrt/mesh/blocks.h>|includes <meshrt/mesh/blocks.h>, which is not a public header"
           "#include <mpi.h>|the public C++ headers include only"
           "#include <cuda_runtime.h>|the public C++ headers include only")
set(_n 0)
foreach(_c ${_cases})
  string(REPLACE "|" ";" _c "${_c}")
  list(GET _c 0 _line)
  list(GET _c 1 _want)
  file(WRITE ${WORK}/meshrt.h "#include <dlpack/dlpack.h>\n")
  file(WRITE ${WORK}/bad.hpp "#include <vector>\n#include <meshrt/meshrt.h>\n${_line}\n")
  execute_process(COMMAND ${CMAKE_COMMAND} -DDIR=${WORK} "-DHEADERS=bad.hpp;meshrt.h" -P ${_rule}
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
