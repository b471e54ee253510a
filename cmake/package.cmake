# Packaging (included by the top CMakeLists.txt when MESHRT_BUILD_SHARED is ON):
#   libmeshrt.so      the static layer libraries (and the C API's meshrt_capi when it exists)
#                     linked --whole-archive into one shared library, SONAME libmeshrt.so.0.<minor> at 0.x,
#                     exporting only meshrt_* and meshrt:: symbols (cmake/libmeshrt.map); no MPI,
#                     CUDA or NCCL library
#   libmeshrt-mpi.so  the MPI backend as a plugin the core loads for an MPI launch
#   libmeshrt-cuda.so the CUDA backend (CUDA runtime, kernels, cuBLASLt, NCCL) as a plugin the
#                     core loads when a CUDA device is asked for (CUDA builds)
#   public headers    include/meshrt/meshrt.hpp's #include lines and their include closure
#   CMake package     lib/cmake/meshrt: meshrtConfig.cmake (target meshrt::meshrt) + version file
#   pkg-config        lib/pkgconfig/meshrt.pc
#   libmeshrt.a       with -DMESHRT_INSTALL_STATIC=ON: every layer in one archive
#                     (target meshrt::meshrt_static)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_layers meshrt_runtime meshrt_kernels meshrt_collectives meshrt_mesh)
if(TARGET meshrt_capi)
  list(APPEND _layers meshrt_capi)
endif()
set(_incdir ${CMAKE_INSTALL_INCLUDEDIR})
set(_libdir ${CMAKE_INSTALL_LIBDIR})
set(_cmakedir ${CMAKE_INSTALL_LIBDIR}/cmake/meshrt)

# ---- public headers ---------------------------------------------------------------------------
# The set is the project #include lines of include/meshrt/meshrt.hpp; everything they include,
# transitively, is installed too, under <prefix>/include/meshrt/<same path>. A header in that
# closure may include only the standard library and other meshrt headers: one that reaches a
# third-party or backend header (or a backend-internal meshrt header) stops the configure here,
# naming the chain, instead of producing a package that does not compile for its users.
set(_forbidden_system "^(cuda|cuda_[a-z0-9_]+|cublas[A-Za-z]*|curand[a-z_]*|nvtx3?/.*|mpi|mpi[a-z_]*|nccl|cblas|openblas[a-z_]*|nlohmann/.*|spdlog/.*|fmt/.*|CLI/.*)\\.(h|hpp)$")
set(_forbidden_meshrt "(^|/)(cuda|host)/|(^|/)(backend|event_impl|event_pool|caching_allocator|comm_impl|ordered_comm)\\.h$")
set(_todo)
file(STRINGS ${PROJECT_SOURCE_DIR}/include/meshrt/meshrt.hpp _lines REGEX "^#include \"")
foreach(_l ${_lines})
  string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" _h "${_l}")
  if(NOT _h MATCHES "^meshrt/")
    list(APPEND _todo ${_h})
    set(_why_${_h} "include/meshrt/meshrt.hpp")
  endif()
endforeach()
set(MESHRT_PUBLIC_HEADERS)
while(_todo)
  list(POP_FRONT _todo _h)
  if(_h IN_LIST MESHRT_PUBLIC_HEADERS)
    continue()
  endif()
  set(_chain "${_why_${_h}} -> ${_h}")
  if(NOT EXISTS ${PROJECT_SOURCE_DIR}/${_h})
    message(FATAL_ERROR "public header set: ${_chain}: no such file (paths are relative to the "
                        "source root, as in the rest of meshrt)")
  endif()
  if(_h MATCHES "${_forbidden_meshrt}")
    message(FATAL_ERROR "public header set: ${_chain}: ${_h} is backend-internal and is not "
                        "installed; include it from the .cpp instead")
  endif()
  list(APPEND MESHRT_PUBLIC_HEADERS ${_h})
  file(STRINGS ${PROJECT_SOURCE_DIR}/${_h} _incs REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]")
  foreach(_i ${_incs})
    if(_i MATCHES "include[ \t]*\"([^\"]+)\"")
      set(_dep ${CMAKE_MATCH_1})
      if(_dep MATCHES "^meshrt/(export|version|meshrt)\\.h$")
        continue()  # installed below
      endif()
      if(NOT DEFINED _why_${_dep})
        set(_why_${_dep} "${_chain}")
      endif()
      list(APPEND _todo ${_dep})
    elseif(_i MATCHES "include[ \t]*<([^>]+)>")
      set(_sys ${CMAKE_MATCH_1})
      if(NOT _sys MATCHES "${_forbidden_system}")
        continue()
      endif()
      message(FATAL_ERROR "public header set: ${_chain} includes <${_sys}>: installed "
                          "headers may not need CUDA, MPI, NCCL, BLAS, JSON, logging or CLI "
                          "headers; move that include (and what uses it) to the .cpp or to a "
                          "private header")
    endif()
  endforeach()
endwhile()
list(SORT MESHRT_PUBLIC_HEADERS)
list(LENGTH MESHRT_PUBLIC_HEADERS _n)
message(STATUS "meshrt: ${_n} public headers (include/meshrt/meshrt.hpp and its closure)")

foreach(_h ${MESHRT_PUBLIC_HEADERS})
  get_filename_component(_dir ${_h} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${_h} DESTINATION ${_incdir}/meshrt/${_dir})
endforeach()
# The public C++ API (header-only over the C API): each may include only <meshrt/...> headers of
# this list, meshrt.h, version.h and the standard library; anything else stops the configure.
include(${PROJECT_SOURCE_DIR}/cmake/cxx_api_headers.cmake)
set(MESHRT_CXX_API_HEADERS tensor.hpp comm.hpp mesh.hpp blocks.hpp)
meshrt_check_cxx_api_headers(${PROJECT_SOURCE_DIR}/include/meshrt ${MESHRT_CXX_API_HEADERS})
foreach(_h ${MESHRT_CXX_API_HEADERS})
  install(FILES ${PROJECT_SOURCE_DIR}/include/meshrt/${_h} DESTINATION ${_incdir}/meshrt)
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/include/meshrt/meshrt.hpp
              ${PROJECT_SOURCE_DIR}/include/meshrt/export.h
              ${PROJECT_BINARY_DIR}/include/meshrt/version.h DESTINATION ${_incdir}/meshrt)
if(EXISTS ${PROJECT_SOURCE_DIR}/include/meshrt/meshrt.h)
  install(FILES ${PROJECT_SOURCE_DIR}/include/meshrt/meshrt.h DESTINATION ${_incdir}/meshrt)
endif()

# ---- libmeshrt.so -----------------------------------------------------------------------------
# --whole-archive of the existing static libraries rather than object libraries: the layers stay
# ordinary static libraries (tests and the CLI link them as before, with their own usage
# requirements), every object is compiled once for both, and nothing is dropped from the shared
# library for lack of a reference (the linker would otherwise take only the archive members the
# library itself references, leaving most of the API out).
set(_empty ${PROJECT_BINARY_DIR}/generated/libmeshrt.cpp)
file(CONFIGURE OUTPUT ${_empty} CONTENT
     "// Generated by cmake/package.cmake: libmeshrt.so is made of the layer libraries only.\n")
# mpi_loaded.cpp, cuda_loaded.cpp: the core's mpi_backend() and cuda_plugin() load the
# libmeshrt-mpi.so and libmeshrt-cuda.so plugins (below) on first use.
set(_loaders ${PROJECT_SOURCE_DIR}/collectives/mpi_loaded.cpp)
if(MESHRT_WITH_CUDA)
  list(APPEND _loaders ${PROJECT_SOURCE_DIR}/runtime/cuda_loaded.cpp)
endif()
add_library(meshrt_shared SHARED ${_empty} ${_loaders})
target_include_directories(meshrt_shared PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include
                                                 ${PROJECT_BINARY_DIR}/include)
target_compile_options(meshrt_shared PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${MESHRT_CXX_WARNINGS}>")
# The archives by path between the two flags (CMake's WHOLE_ARCHIVE feature refuses a library
# that also comes in as another layer's dependency), then the libraries they need, named here
# rather than through the layer targets: those bring the static MPI and CUDA backends (meshrt_mpi,
# meshrt_cuda), which libmeshrt.so loads as plugins instead. --no-undefined below catches one
# missing from the list.
set(_archives)
foreach(_t ${_layers})
  list(APPEND _archives $<TARGET_FILE:${_t}>)
endforeach()
set(_core_deps Threads::Threads spdlog::spdlog fmt::fmt meshrt::blas ${CMAKE_DL_LIBS})
if(MESHRT_HAVE_DNNL)
  list(APPEND _core_deps meshrt::dnnl)
endif()
add_dependencies(meshrt_shared ${_layers})
target_link_libraries(meshrt_shared PRIVATE -Wl,--whole-archive ${_archives}
                                            -Wl,--no-whole-archive ${_core_deps})
# The ABI policy (docs/architecture.md): the SONAME changes whenever the ABI may. While the major
# version is 0 a minor release may break it, so the SONAME carries major.minor (libmeshrt.so.0.2);
# from 1.0 on it is the major version alone.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(MESHRT_SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
else()
  set(MESHRT_SOVERSION ${PROJECT_VERSION_MAJOR})
endif()
set(_map ${PROJECT_SOURCE_DIR}/cmake/libmeshrt.map)
target_link_options(meshrt_shared PRIVATE "LINKER:--version-script=${_map}" "LINKER:--no-undefined")
set_target_properties(
  meshrt_shared
  PROPERTIES OUTPUT_NAME meshrt
             VERSION ${PROJECT_VERSION}
             SOVERSION ${MESHRT_SOVERSION}
             LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/lib
             LINK_DEPENDS ${_map}
             INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS meshrt_shared LIBRARY DESTINATION ${_libdir})

# ---- backend plugins (runtime/plugin.h) -------------------------------------------------------
# libmeshrt-<name>.so: the backend's static library whole, linked against libmeshrt.so (whose
# MESHRT_PLUGIN_API internals it calls) and the backend's own libraries; it exports only its entry
# point. Installed next to libmeshrt.so, where the core looks for it (or MESHRT_BACKEND_PATH).
set(_plugin_map ${PROJECT_BINARY_DIR}/generated/meshrt-plugin.map)
file(CONFIGURE OUTPUT ${_plugin_map} CONTENT "{\n  global:\n    meshrt_backend_init_v1;\n  local:\n    *;\n};\n")
set(MESHRT_PLUGINS)
function(meshrt_backend_plugin name archive)
  set(_src ${PROJECT_BINARY_DIR}/generated/libmeshrt-${name}.cpp)
  file(CONFIGURE OUTPUT ${_src} CONTENT
       "// Generated by cmake/package.cmake: libmeshrt-${name}.so is ${archive} and this entry point.
#include \"runtime/plugin.h\"

namespace meshrt::detail {
const void* ${name}_plugin_table();
}  // namespace meshrt::detail

MESHRT_DEFINE_PLUGIN_ENTRY(\"${name}\", meshrt::detail::${name}_plugin_table)
")
  set(_t meshrt_plugin_${name})
  add_library(${_t} SHARED ${_src})
  target_include_directories(${_t} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include
                                           ${PROJECT_BINARY_DIR}/include)
  target_compile_options(${_t} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${MESHRT_CXX_WARNINGS}>")
  add_dependencies(${_t} ${archive})
  target_link_libraries(${_t} PRIVATE -Wl,--whole-archive $<TARGET_FILE:${archive}>
                                      -Wl,--no-whole-archive meshrt_shared ${ARGN})
  target_link_options(${_t} PRIVATE "LINKER:--version-script=${_plugin_map}" "LINKER:--no-undefined")
  set_target_properties(${_t} PROPERTIES OUTPUT_NAME meshrt-${name}
                                         LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/lib
                                         LINK_DEPENDS ${_plugin_map}
                                         INSTALL_RPATH "$ORIGIN"
                                         INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS ${_t} LIBRARY DESTINATION ${_libdir})
  set(MESHRT_PLUGINS ${MESHRT_PLUGINS} ${_t} PARENT_SCOPE)
endfunction()
meshrt_backend_plugin(mpi meshrt_mpi MPI::MPI_C)
if(MESHRT_WITH_CUDA)
  meshrt_backend_plugin(cuda meshrt_cuda CUDA::cudart CUDA::cublasLt CUDA::cublas meshrt::nccl
                        ${CMAKE_DL_LIBS})
endif()

# ---- libmeshrt.a (optional) -------------------------------------------------------------------
set(MESHRT_STATIC_INSTALLED OFF)
if(MESHRT_INSTALL_STATIC)
  # One archive with every layer's members, made by ar's MRI script mode.
  set(_mri "CREATE ${PROJECT_BINARY_DIR}/lib/libmeshrt.a\n")
  set(_static_backends meshrt_mpi)
  if(MESHRT_WITH_CUDA)
    list(APPEND _static_backends meshrt_cuda)
  endif()
  foreach(_t ${_layers} ${_static_backends})
    string(APPEND _mri "ADDLIB $<TARGET_FILE:${_t}>\n")
  endforeach()
  string(APPEND _mri "SAVE\nEND\n")
  file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/generated/libmeshrt.mri CONTENT "${_mri}")
  add_custom_command(
    OUTPUT ${PROJECT_BINARY_DIR}/lib/libmeshrt.a
    COMMAND ${CMAKE_COMMAND} -E rm -f ${PROJECT_BINARY_DIR}/lib/libmeshrt.a
    COMMAND ${CMAKE_AR} -M < ${PROJECT_BINARY_DIR}/generated/libmeshrt.mri
    DEPENDS ${_layers} ${_static_backends} ${PROJECT_BINARY_DIR}/generated/libmeshrt.mri
    COMMENT "Combining the layer libraries into libmeshrt.a")
  add_custom_target(meshrt_static_archive ALL DEPENDS ${PROJECT_BINARY_DIR}/lib/libmeshrt.a)
  install(FILES ${PROJECT_BINARY_DIR}/lib/libmeshrt.a DESTINATION ${_libdir})
  set(MESHRT_STATIC_INSTALLED ON)
else()
  message(STATUS "meshrt: libmeshrt.a not installed (-DMESHRT_INSTALL_STATIC=ON adds it)")
endif()

# ---- CMake package ----------------------------------------------------------------------------
# What the config file needs to know about this build.
set(MESHRT_PKG_CUDA ${MESHRT_WITH_CUDA})
set(MESHRT_PKG_NCCL_DIR "")
if(MESHRT_WITH_CUDA)
  get_filename_component(MESHRT_PKG_NCCL_DIR "${NCCL_LIBRARY}" DIRECTORY)
endif()
configure_package_config_file(cmake/meshrtConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/generated/meshrtConfig.cmake
                              INSTALL_DESTINATION ${_cmakedir})
# While the major version is 0, a minor release may break the API: 0.2 accepts 0.2.x only.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/generated/meshrtConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/generated/meshrtConfig.cmake
              ${PROJECT_BINARY_DIR}/generated/meshrtConfigVersion.cmake DESTINATION ${_cmakedir})

# ---- pkg-config -------------------------------------------------------------------------------
# DLPack has no .pc file to Require: its include directory goes on Cflags unless it is the
# compiler's default (/usr/include), where it is found anyway.
set(MESHRT_PC_DLPACK_CFLAGS "")
get_target_property(_dlpack_inc dlpack::dlpack INTERFACE_INCLUDE_DIRECTORIES)
foreach(_d ${_dlpack_inc})
  if(NOT _d STREQUAL "/usr/include")
    string(APPEND MESHRT_PC_DLPACK_CFLAGS " -I${_d}")
  endif()
endforeach()
file(RELATIVE_PATH MESHRT_PC_TO_PREFIX /${_libdir}/pkgconfig /)
string(REGEX REPLACE "/$" "" MESHRT_PC_TO_PREFIX "${MESHRT_PC_TO_PREFIX}")
configure_file(cmake/meshrt.pc.in ${PROJECT_BINARY_DIR}/generated/meshrt.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/generated/meshrt.pc DESTINATION ${_libdir}/pkgconfig)
