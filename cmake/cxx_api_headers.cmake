# The include rule of the installed headers (cmake/package.cmake calls it at configure time on
# every header it installs; the test install.cxx_api_check runs it in script mode on good and bad
# fixtures):
#   meshrt_check_cxx_api_headers(<dir> <header>...)
# Each header in <dir> may include only <meshrt/...> headers of the list, the generated
# <meshrt/version.h>, <dlpack/dlpack.h> (the declared DLPack dependency of meshrt.h) and the
# standard library (the C++20 and C11 headers below: no quoted includes, no other <a/b> paths,
# no other <x.h> such as <mpi.h>); the first one that does not stops with a FATAL_ERROR naming
# the header and the include.
if(CMAKE_SCRIPT_MODE_FILE)
  cmake_policy(VERSION 3.24)  # IN_LIST (a project has it from cmake_minimum_required)
endif()
set(MESHRT_STD_HEADERS
    # C++20
    algorithm any array atomic barrier bit bitset charconv chrono codecvt compare complex concepts
    condition_variable coroutine deque exception execution filesystem format forward_list fstream
    functional future initializer_list iomanip ios iosfwd iostream istream iterator latch limits
    list locale map memory memory_resource mutex new numbers numeric optional ostream queue random
    ranges ratio regex scoped_allocator semaphore set shared_mutex source_location span sstream
    stack stdexcept stop_token streambuf string string_view syncstream system_error thread tuple
    type_traits typeindex typeinfo unordered_map unordered_set utility valarray variant vector
    version cassert cctype cerrno cfenv cfloat cinttypes climits clocale cmath csetjmp csignal
    cstdarg cstddef cstdint cstdio cstdlib cstring ctime cuchar cwchar cwctype
    # C11
    assert.h complex.h ctype.h errno.h fenv.h float.h inttypes.h iso646.h limits.h locale.h math.h
    setjmp.h signal.h stdalign.h stdarg.h stdatomic.h stdbool.h stddef.h stdint.h stdio.h
    stdlib.h stdnoreturn.h string.h tgmath.h threads.h time.h uchar.h wchar.h wctype.h)
function(meshrt_check_cxx_api_headers dir)
  set(_public ${ARGN})
  foreach(_h ${_public})
    file(STRINGS ${dir}/${_h} _incs REGEX "^[ \t]*#[ \t]*include")
    foreach(_i ${_incs})
      if(_i MATCHES "include[ \t]*[<\"]meshrt/([^>\"]+)[>\"]")
        set(_inc ${CMAKE_MATCH_1})
        if(NOT _inc IN_LIST _public AND NOT _inc STREQUAL "version.h")
          message(FATAL_ERROR "include/meshrt/${_h} includes <meshrt/${_inc}>, which is not "
                              "a public header (${_public} version.h)")
        endif()
      elseif(_i MATCHES "include[ \t]*<dlpack/dlpack\\.h>")
        # DLPack: declared by the package (find_dependency(dlpack); meshrt.pc's Cflags).
      elseif(_i MATCHES "include[ \t]*<([^>/]+)>" AND CMAKE_MATCH_1 IN_LIST MESHRT_STD_HEADERS)
        # the standard library
      else()
        string(STRIP "${_i}" _i)
        message(FATAL_ERROR "include/meshrt/${_h}: '${_i}': the public C++ headers include only "
                            "<meshrt/...> public headers, <dlpack/dlpack.h> and the standard "
                            "library")
      endif()
    endforeach()
  endforeach()
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  # cmake -DDIR=<dir> "-DHEADERS=a.hpp;b.hpp" -P cmake/cxx_api_headers.cmake
  meshrt_check_cxx_api_headers(${DIR} ${HEADERS})
  message(STATUS "public headers: includes OK")
endif()
