// The C API on a GPU: CUDA memory crossing as DLPack (kDLCUDA) without a copy, and an engine's own
// ncclComm_t and cudaStream_t adopted by meshrt (meshrt_comm_adopt_nccl, meshrt_stream_wrap) for a
// collective whose result lands in the engine's buffer, with the communicator left to the engine.
// Without a usable GPU every case prints why and the run exits 77 (ctest: Skipped).
#define CATCH_CONFIG_RUNNER
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <vector>

#include "capi_test_util.h"
#include "runtime/device.h"
#include "tests/common/cuda_skip.h"

using namespace capi_test;

namespace {

#define CUDA_OK(call) REQUIRE((call) == cudaSuccess)

// A float buffer in device memory with a borrowed kDLCUDA tensor over it.
struct DeviceBuf {
  explicit DeviceBuf(int64_t n) : n_(n) {
    CUDA_OK(cudaMalloc(&ptr, static_cast<size_t>(n) * sizeof(float)));
    dl.data = ptr;
    dl.device.device_type = kDLCUDA;
    dl.device.device_id = 0;
    dl.ndim = 1;
    dl.dtype = dl_dtype(kDLFloat, 32);
    dl.shape = &n_;
    CAPI_REQUIRE_OK(meshrt_tensor_from_dltensor(&dl, &h));
  }
  ~DeviceBuf() {
    meshrt_tensor_destroy(h);
    cudaFree(ptr);
  }
  void put(const std::vector<float>& v) {
    CUDA_OK(cudaMemcpy(ptr, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  std::vector<float> get() {
    std::vector<float> v(static_cast<size_t>(n_));
    CUDA_OK(cudaMemcpy(v.data(), ptr, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
  }
  int64_t n_;
  void* ptr = nullptr;
  DLTensor dl{};
  meshrt_tensor_t h = nullptr;
};

std::vector<float> ramp(int64_t n, float base) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = base + static_cast<float>(i % 1000);
  return v;
}

}  // namespace

TEST_CASE("capi cuda: a kDLCUDA tensor is read and written in place by an all-reduce", "[cuda]") {
  init_api();
  meshrt_comm_t comm = nullptr;
  const int dev = 0;
  meshrt_comm_config_t cfg = test_config(60);
  CAPI_REQUIRE_OK(meshrt_comm_init_all(&comm, 1, &dev, &cfg));
  meshrt_device_type_t type{};
  int index = -1;
  CAPI_REQUIRE_OK(meshrt_comm_device(comm, &type, &index));
  CHECK(type == MESHRT_DEVICE_CUDA);
  CHECK(index == 0);
  const int64_t n = 1 << 20;
  DeviceBuf send(n), recv(n);
  send.put(ramp(n, 3.f));
  recv.put(std::vector<float>(static_cast<size_t>(n), -1.f));
  meshrt_event_t ev = nullptr;
  CAPI_REQUIRE_OK(meshrt_all_reduce(comm, send.h, recv.h, MESHRT_SUM, nullptr, &ev));
  CAPI_REQUIRE_OK(meshrt_event_synchronize(ev));
  CAPI_REQUIRE_OK(meshrt_event_destroy(ev));
  CHECK(recv.get() == ramp(n, 3.f));  // one rank: the sum is the input, in the engine's buffer
  CAPI_REQUIRE_OK(meshrt_comm_destroy(comm));
}

TEST_CASE("capi cuda: an adopted ncclComm_t and wrapped cudaStream_t run a collective", "[cuda]") {
  init_api();
  CUDA_OK(cudaSetDevice(0));
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t nc = nullptr;
  REQUIRE(ncclCommInitRank(&nc, 1, id, 0) == ncclSuccess);
  cudaStream_t engine_stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&engine_stream, cudaStreamNonBlocking));
  meshrt_comm_t comm = nullptr;
  meshrt_comm_config_t cfg = test_config(60);
  CAPI_REQUIRE_OK(meshrt_comm_adopt_nccl(&comm, static_cast<void*>(nc), 0, &cfg));
  int size = 0;
  CAPI_REQUIRE_OK(meshrt_comm_size(comm, &size));
  CHECK(size == 1);
  meshrt_stream_t s = nullptr;
  CAPI_REQUIRE_OK(meshrt_stream_wrap(comm, static_cast<void*>(engine_stream), &s));
  const int64_t n = 4096;
  DeviceBuf send(n), recv(n);
  send.put(ramp(n, 7.f));
  meshrt_event_t ev = nullptr;
  CAPI_REQUIRE_OK(meshrt_all_reduce(comm, send.h, recv.h, MESHRT_SUM, s, &ev));
  // The collective is on the engine's stream: synchronizing that stream is enough.
  CUDA_OK(cudaStreamSynchronize(engine_stream));
  int done = 0;
  CAPI_REQUIRE_OK(meshrt_event_query(ev, &done));
  CHECK(done == 1);
  CAPI_REQUIRE_OK(meshrt_event_destroy(ev));
  CHECK(recv.get() == ramp(n, 7.f));
  CAPI_REQUIRE_OK(meshrt_stream_destroy(s));
  CAPI_REQUIRE_OK(meshrt_comm_destroy(comm));
  // Not owned by meshrt: still the engine's to use and destroy.
  int count = 0;
  CHECK(ncclCommCount(nc, &count) == ncclSuccess);
  CHECK(count == 1);
  CHECK(ncclCommDestroy(nc) == ncclSuccess);
  CUDA_OK(cudaStreamDestroy(engine_stream));
}

int main(int argc, char* argv[]) { return meshrt::test::run_catch_or_skip(argc, argv); }
