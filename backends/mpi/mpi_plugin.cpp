// The MPI backend's function table (collectives/mpi_backend.h), what libmeshrt-mpi.so's entry
// point returns (mpi_plugin_table()), and mpi_backend() for the static builds, which link the
// backend in.
#include <mpi.h>

#include <mutex>

#include "backends/mpi/mpi_comm.h"
#include "backends/mpi/mpi_process.h"
#include "backends/mpi/mpi_runtime.h"
#include "collectives/mpi_backend.h"

namespace meshrt::detail {

namespace {

int mpi_check_world(void* mpi_comm, std::string* why) {
  int cmp = MPI_UNEQUAL;
  const int rc = MPI_Comm_compare(*static_cast<MPI_Comm*>(mpi_comm), MPI_COMM_WORLD, &cmp);
  if (rc != MPI_SUCCESS) {
    *why = "MPI_Comm_compare on *mpi_comm failed (" + std::to_string(rc) +
           "): pass a pointer to a valid MPI_Comm";
    return 1;
  }
  if (cmp != MPI_IDENT && cmp != MPI_CONGRUENT) {
    *why =
        "*mpi_comm is not MPI_COMM_WORLD (nor congruent with it): create the world with "
        "mpi_comm NULL, then meshrt_comm_split it into the group you need";
    return 2;
  }
  return 0;
}

WorldFactory mpi_world_factory(const WorldPlan& plan) {
  const CommConfig cfg = plan.config;
  return [cfg](int) { return make_mpi_world_communicator(cfg); };
}

std::string mpi_library_version() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  if (MPI_Get_library_version(buf, &len) != MPI_SUCCESS) return "";
  std::string m(buf, static_cast<size_t>(len));
  if (auto nl = m.find_first_of("\n,"); nl != std::string::npos) m.resize(nl);
  return m;
}

void mpi_mark_aborted(const std::string& why) {
  if (!mpi_live()) return;
  MpiProcess& mp = mpi_process();
  std::lock_guard<std::mutex> lk(mp.mu);
  if (!mp.aborted.load()) {
    mp.reason = why;
    mp.aborted.store(true);
  }
}

const MpiBackend kMpiTable{mpi_init,          make_mpi_transport,  mpi_check_world,
                           mpi_world_factory, mpi_library_version, mpi_mark_aborted};

}  // namespace

const MpiBackend& mpi_backend() { return kMpiTable; }
const MpiBackend* mpi_backend_if_loaded() { return &kMpiTable; }
std::string mpi_backend_origin() { return "linked in"; }

// What libmeshrt-mpi.so's entry point returns (runtime/plugin.h's MESHRT_DEFINE_PLUGIN_ENTRY).
const void* mpi_plugin_table() { return &kMpiTable; }

}  // namespace meshrt::detail
