// mpi_backend() of libmeshrt.so: the table of the libmeshrt-mpi.so plugin, loaded on first use
// (runtime/plugin.h). The static builds use mpi_plugin.cpp's linked-in table instead.
#include "collectives/mpi_backend.h"
#include "runtime/plugin.h"

namespace meshrt::detail {

const MpiBackend& mpi_backend() { return *static_cast<const MpiBackend*>(load_plugin("mpi")); }

const MpiBackend* mpi_backend_if_loaded() {
  return loaded_plugin_path("mpi").empty() ? nullptr : &mpi_backend();
}

std::string mpi_backend_origin() { return loaded_plugin_path("mpi"); }

}  // namespace meshrt::detail
