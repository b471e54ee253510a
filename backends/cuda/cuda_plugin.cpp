// The CUDA backend's table (runtime/cuda_plugin.h), assembled from its parts in
// backends/cuda/runtime, backends/cuda/kernels and nccl_comm.cpp; what libmeshrt-cuda.so's entry
// point returns, and cuda_plugin() for the static builds, which link the backend in.
#include "runtime/cuda_plugin.h"
#include "backends/cuda/kernels/gemm_version.h"
#include "backends/cuda/runtime/cuda_device.h"
#include "collectives/nccl_comm.h"
#include "kernels/backend.h"

namespace meshrt::detail {

const void* cuda_plugin_table() {
  static const CudaPlugin table{&cuda_detail::device_backend(),
                                cuda_detail::nvtx_push,
                                cuda_detail::nvtx_pop,
                                &kernels::cuda::backend(),
                                kernels::cuda::gemm_library_version,
                                &nccl_table()};
  return &table;
}

const CudaPlugin* cuda_plugin(std::string*) {
  return static_cast<const CudaPlugin*>(cuda_plugin_table());
}
const CudaPlugin* cuda_plugin_if_loaded() { return cuda_plugin(); }
std::string cuda_plugin_origin() { return "linked in"; }

}  // namespace meshrt::detail
