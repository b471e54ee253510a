// Backend plugins: shared libraries (libmeshrt-<name>.so: mpi, cuda) that libmeshrt.so loads on
// first use, so that the core needs none of their libraries (MPI, CUDA, NCCL) to load and run.
// Each plugin exports one C entry point, meshrt_backend_init_v1, returning a PluginInfo whose
// `table` is the backend's function table (collectives/mpi_backend.h's MpiBackend,
// runtime/cuda_plugin.h's CudaPlugin). The static libraries (tests, the CLI, libmeshrt.a) link the
// backends in and never load plugins.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshrt/version.h"
#include "runtime/plugin_api.h"

namespace meshrt::detail {

// The version of the entry point's contract; a plugin built for another one is refused.
constexpr uint32_t kPluginAbi = 1;

// What meshrt_backend_init_v1(kPluginAbi, core_version) returns (nullptr: the plugin refuses).
struct PluginInfo {
  uint32_t abi;         // kPluginAbi of the plugin's build
  const char* version;  // the meshrt version it was built from (must equal the core's)
  const char* name;     // "mpi"
  const void* table;    // the backend's function table
};
using PluginEntry = const PluginInfo* (*)(uint32_t core_abi, const char* core_version);
#define MESHRT_PLUGIN_ENTRY "meshrt_backend_init_v1"

// Defines plugin `name`'s entry point, returning `table_fn()` (the backend defines
// `const void* meshrt::detail::<name>_plugin_table()`). Only the plugin library holds it:
// cmake/package.cmake generates one such line per plugin, since the static builds link every
// backend into one program, where two entry points would collide.
#define MESHRT_DEFINE_PLUGIN_ENTRY(name, table_fn)                                         \
  extern "C" MESHRT_PLUGIN_API const meshrt::detail::PluginInfo* meshrt_backend_init_v1(   \
      uint32_t core_abi, const char* core_version) {                                       \
    static const meshrt::detail::PluginInfo info{meshrt::detail::kPluginAbi,               \
                                                 MESHRT_VERSION_STRING, name, table_fn()}; \
    (void)core_abi;                                                                        \
    (void)core_version;                                                                    \
    return &info;                                                                          \
  }

// "libmeshrt-mpi.so".
std::string plugin_file_name(const std::string& name);
// Where plugins are looked for, in order: each folder of MESHRT_BACKEND_PATH (':'-separated),
// then the folder of the library (or program) that holds meshrt's core.
std::vector<std::string> plugin_search_path();
// The path of libmeshrt-<name>.so on the search path, or "" when no folder has it.
std::string find_plugin(const std::string& name);
// The table of plugin `name`, loaded once per process (later calls return the same table).
// Throws a one-line Error naming the library and why it could not be loaded (dlerror(), a missing
// entry point or a version mismatch) and where it was looked for.
const void* load_plugin(const std::string& name);
// Where the loaded plugin `name` came from, or "" when it is not loaded.
std::string loaded_plugin_path(const std::string& name);

}  // namespace meshrt::detail
