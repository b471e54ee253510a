// NVTX ranges for runtime/ranges.h (the CUDA backend's table, runtime/cuda_plugin.h). NVTX 3 is
// header-only: without a profiler attached every call returns after one check; under Nsight Systems
// (`nsys profile -t cuda,nvtx,...`) the ranges appear in the "meshrt" domain.
#include <nvtx3/nvToolsExt.h>

#include "backends/cuda/runtime/cuda_device.h"

namespace meshrt::cuda_detail {
namespace {

nvtxDomainHandle_t domain() {
  static const nvtxDomainHandle_t d = nvtxDomainCreateA("meshrt");
  return d;
}

}  // namespace

void nvtx_push(const std::string& name, uint64_t payload) {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = name.c_str();
  if (payload != 0) {
    a.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
    a.payload.ullValue = payload;
  }
  nvtxDomainRangePushEx(domain(), &a);
}

void nvtx_pop() { nvtxDomainRangePop(domain()); }

}  // namespace meshrt::cuda_detail
