#include "tools/info.h"

#include <algorithm>
#include <thread>

#include "collectives/algorithms/algorithm.h"
#include "collectives/mpi_backend.h"
#include "collectives/nccl_comm.h"
#include "kernels/host/gemm_f32_path.h"
#include "kernels/ops.h"
#include "runtime/cuda_plugin.h"
#include "runtime/device.h"
#include "runtime/env.h"
#include "runtime/plugin.h"
#include "tools/build_info.h"

extern "C" {
char* openblas_get_config(void);
int openblas_get_num_threads(void);
int openblas_get_parallel(void);
}

namespace meshrt::cli {

namespace {

// One plugin's line: how this program has the backend, then the plugin file libmeshrt.so would
// load (or where it was looked for).
void print_plugin(std::ostream& os, const std::string& name, const std::string& origin,
                  const std::string& dirs) {
  const std::string file = detail::find_plugin(name);
  os << "  " << name << std::string(name.size() < 9 ? 9 - name.size() : 1, ' ') << origin
     << " (plugin " << detail::plugin_file_name(name) << ": "
     << (file.empty() ? "not found in " + dirs : file) << ")\n";
}

// The backends: how this program has each one and, for those libmeshrt.so loads as plugins, the
// file it would load (runtime/plugin.h's search path).
void print_backends(std::ostream& os) {
  std::string dirs;
  for (const std::string& d : detail::plugin_search_path()) dirs += (dirs.empty() ? "" : ", ") + d;
  os << "\nbackends\n";
  os << "  host     built in\n";
  print_plugin(os, "mpi", detail::mpi_backend_origin(), dirs);
  if (std::string(MESHRT_BUILD_CUDA) == "ON") {
    print_plugin(os, "cuda", detail::cuda_plugin_origin(), dirs);
  } else {
    os << "  cuda     not built\n";
  }
}

// The collective algorithm each backend's table row picks (collectives/algorithms/), per op and
// message size, on as many ranks as this machine has hardware threads (at least 2); hier on 2
// nodes of that many.
void print_algorithms(std::ostream& os, int ranks) {
  const std::string forced = env_or("MESHRT_ALGO");
  os << "\ncollective algorithms ("
     << (forced.empty() ? "the table's choice; MESHRT_ALGO forces others" : "MESHRT_ALGO=" + forced)
     << ")\n";
  os << detail::algo_table_text({"host", ranks, 1}, forced);
  os << detail::algo_table_text({"shm", ranks, 1}, forced);
  os << detail::algo_table_text({"mpi", ranks, 1}, forced);
  os << detail::algo_table_text({"tcp", ranks, 1}, forced);
  os << detail::algo_table_text({"hier", 2 * ranks, 2}, forced);
  if (std::string(MESHRT_BUILD_CUDA) == "ON")
    os << detail::algo_table_text({"nccl", ranks, 1}, forced);
}

}  // namespace

int run_info(std::ostream& os) {
  const std::map<std::string, std::string> v = version_info();
  auto get = [&](const char* k) {
    auto it = v.find(k);
    return it == v.end() ? std::string() : it->second;
  };
  os << "meshrt " << MESHRT_VERSION_STRING << "\n\n";
  os << "devices\n";
  os << "  cpu      " << get("hardware_threads")
     << " hardware threads (host ranks: --devices cpu:N)\n";
  std::string why;
  if (cuda_available(&why)) {
    os << "  cuda     " << cuda_device_count() << " device(s)\n";
  } else {
    os << "  cuda     unavailable: " << why << "\n";
  }
  os << "\nlibraries\n";
  if (v.count("cuda")) os << "  cuda     " << get("cuda") << "\n";
  if (v.count("cublaslt")) os << "  gemm     " << get("cublaslt") << " (CUDA)\n";
  if (v.count("nccl")) os << "  nccl     NCCL " << get("nccl") << "\n";
  os << "  blas     " << get("blas") << ", threading " << get("blas_threading") << "\n";
  os << "  gemm32   " << get("host_gemm_f32") << "\n";
  os << "  gemm16   " << get("host_gemm_16bit") << "\n";
  os << "  loops    " << get("host_isa") << "\n";
  if (v.count("mpi")) os << "  mpi      " << get("mpi") << "\n";
  print_backends(os);
  print_algorithms(os, std::max(2, static_cast<int>(std::thread::hardware_concurrency())));
  os << "\nbuild\n";
  os << "  type     " << get("build_type") << ", " << get("compiler") << "\n";
  os << "  cuda     " << get("cuda_build") << "\n";
  os << "  sanitize " << get("sanitize") << "\n";
  return 0;
}

std::map<std::string, std::string> version_info() {
  std::map<std::string, std::string> v;
  v["meshrt"] = MESHRT_VERSION_STRING;
  v["build_type"] = MESHRT_BUILD_TYPE;
  v["compiler"] = MESHRT_BUILD_COMPILER;
  v["cuda_build"] = std::string(MESHRT_BUILD_CUDA) == "ON"
                        ? std::string("ON (arch ") + MESHRT_BUILD_CUDA_ARCHS + ")"
                        : "OFF";
  v["sanitize"] = std::string(MESHRT_BUILD_SANITIZE).empty() ? "none" : MESHRT_BUILD_SANITIZE;
  std::string why;
  if (const std::string c = device_versions(DeviceType::CUDA); !c.empty()) v["cuda"] = c;
  if (!cuda_available(&why)) v["cuda_unavailable"] = why;
  if (const std::string g = ops::gemm_library_version(); !g.empty()) v["cublaslt"] = g;
  // ncclGetVersion is a library call: it needs no GPU.
  if (detail::cuda_plugin() != nullptr) v["nccl"] = nccl_version_string();
  const char* par[] = {"sequential", "pthreads", "OpenMP"};
  const int p = openblas_get_parallel();
  v["blas"] = std::string("OpenBLAS (") + openblas_get_config() + ")";
  v["blas_threading"] = std::string(p >= 0 && p <= 2 ? par[p] : "?") + ", " +
                        std::to_string(openblas_get_num_threads()) + " threads by default";
  v["host_gemm_f32"] = kernels::host::host_gemm_f32_info();
  v["host_gemm_16bit"] = ops::host_gemm_16bit_info();
  v["host_isa"] = ops::host_isa_info();
  if (const std::string m = detail::mpi_backend().library_version(); !m.empty()) v["mpi"] = m;
  v["hardware_threads"] = std::to_string(std::thread::hardware_concurrency());
  return v;
}

}  // namespace meshrt::cli
