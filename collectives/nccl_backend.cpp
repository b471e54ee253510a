// The core's side of the NCCL backend: the "nccl" entry of the collective-backend registry, whose
// refusal of CPU launches needs no CUDA, and the functions of nccl_comm.h, which reach the backend
// (nccl_comm.cpp) through the CUDA backend's table (runtime/cuda_plugin.h), loading
// libmeshrt-cuda.so when it is a plugin.
#include <vector>

#include "collectives/nccl_comm.h"
#include "runtime/cuda_plugin.h"
#include "runtime/error.h"

namespace meshrt {

namespace {

// The NCCL table, or nullptr with `why` (the plugin's load error) when it cannot be had.
const detail::NcclBackend* nccl_if_available(std::string* why) {
  const detail::CudaPlugin* cuda = detail::cuda_plugin(why);
  return cuda ? static_cast<const detail::NcclBackend*>(cuda->nccl) : nullptr;
}

const detail::NcclBackend& nccl(const char* what) {
  std::string why;
  const detail::NcclBackend* t = nccl_if_available(&why);
  MESHRT_CHECK(t != nullptr, what << ": " << why);
  return *t;
}

std::string nccl_refuses(const WorldPlan& plan) {
  if (plan.device_type != DeviceType::CUDA)
    return "it needs CUDA devices (" + plan.names.cuda_devices + ")";
  std::string why;
  return nccl_if_available(&why) ? "" : why;
}

WorldFactory nccl_prepare(const WorldPlan& plan) { return nccl("NCCL world").prepare(plan); }

}  // namespace

std::string nccl_version_string() { return nccl("NCCL version").version(); }

std::unique_ptr<Communicator> adopt_nccl_communicator(void* nccl_comm, int device,
                                                      const std::string& name, CommConfig config) {
  return nccl("adopting an NCCL communicator").adopt(nccl_comm, device, name, std::move(config));
}

namespace detail {
void register_nccl_backend(std::vector<CommBackend>& registry) {
  add_collective_backend(registry, {"nccl", 30, nccl_refuses, nccl_prepare});
}
}  // namespace detail

}  // namespace meshrt
