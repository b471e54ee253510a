// The C API's failures, case by case: each returns its status (never throws or aborts) and
// meshrt_last_error() says what to change. Also versions, logging and DLPack ownership / export.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <set>
#include <sstream>

#include "capi/dlpack_versioned.h"
#include "capi_test_util.h"
#include "runtime/logging.h"
#include "tests/common/env.h"

using namespace capi_test;

namespace {
// A handle as meshrt's messages print it.
std::string ptr(const void* h) {
  std::ostringstream os;
  os << h;
  return os.str();
}
}  // namespace

TEST_CASE("capi: status strings, versions and init", "[capi]") {
  const meshrt_status_t all[] = {
      MESHRT_SUCCESS,           MESHRT_ERROR_INVALID_ARGUMENT, MESHRT_ERROR_INVALID_USAGE,
      MESHRT_ERROR_UNSUPPORTED, MESHRT_ERROR_SYSTEM,           MESHRT_ERROR_INTERNAL,
      MESHRT_ERROR_COMM,        MESHRT_ERROR_TIMEOUT,          MESHRT_ERROR_OUT_OF_MEMORY};
  std::set<std::string> names;
  for (meshrt_status_t s : all) names.insert(meshrt_status_string(s));
  CHECK(names.size() == std::size(all));
  CHECK(std::string(meshrt_status_string(static_cast<meshrt_status_t>(99))) == "unknown status");

  int major = -1, minor = -1, patch = -1;
  CAPI_REQUIRE_OK(meshrt_get_version(&major, &minor, &patch));
  CHECK(major == 0);
  CHECK(minor >= 0);
  CHECK(patch >= 0);
  CHECK(meshrt_get_api_version() == MESHRT_API_VERSION);

  require_status(meshrt_init(MESHRT_API_VERSION + 1), MESHRT_ERROR_INVALID_USAGE,
                 {"version " + std::to_string(MESHRT_API_VERSION + 1),
                  "implements version " + std::to_string(MESHRT_API_VERSION), "rebuild"});
  CAPI_REQUIRE_OK(meshrt_init(MESHRT_API_VERSION));
}

TEST_CASE("capi: a bad MESHRT_ variable is refused by meshrt_init and every comm init", "[capi]") {
  // These were accepted by meshrt_init: a bad poll window then ended the process from a stream's
  // worker thread ("terminate called ...", exit 134) and the others were ignored silently.
  struct Bad {
    const char* name;
    const char* value;
    const char* says;
  };
  const Bad cases[] = {
      {"MESHRT_HOST_POLL_US", "-1", "is not a whole number in [0, 1000000]"},
      {"MESHRT_HOST_POLL_US", "2000000", "is not a whole number in [0, 1000000]"},
      {"MESHRT_LOG_LEVEL", "loud", "is not a log level: use trace, debug, info, warn, error"},
      {"MESHRT_HOST_BIND", "all", "is not accepted: use auto or none, or unset it (auto)"},
      {"MESHRT_FLIGHT_ON_EXIT", "x", "is not a switch: use 1 (or true, on, yes) or 0"},
      {"MESHRT_HOST_ISA", "sse9", "is not an instruction set of the host kernels"},
      {"MESHRT_RENDEZVOUS", "http://h:1", "is not supported: use file:///"},
      {"MESHRT_COMM_TIMEOUT", "soon", "is not a number of seconds >= 0"},
      {"MESHRT_FAULT", "crash@rank=x", "MESHRT_FAULT"},
  };
  CAPI_REQUIRE_OK(meshrt_init(MESHRT_API_VERSION));
  const meshrt_comm_config_t cfg = test_config();
  for (const Bad& b : cases) {
    INFO(b.name << "=" << b.value);
    meshrt::test::ScopedEnv env(b.name, b.value);
    const std::vector<std::string> parts = {b.name, b.value, b.says};
    require_status(meshrt_init(MESHRT_API_VERSION), MESHRT_ERROR_INVALID_ARGUMENT, parts);
    meshrt_comm_t comms[2] = {nullptr, nullptr};
    require_status(meshrt_comm_init_all(comms, 2, nullptr, &cfg), MESHRT_ERROR_INVALID_ARGUMENT,
                   parts);
    CHECK(comms[0] == nullptr);
    meshrt_comm_t c = nullptr;
    require_status(meshrt_comm_init_tcp(&c, "127.0.0.1", 1, 1, 0, &cfg),
                   MESHRT_ERROR_INVALID_ARGUMENT, parts);
    CHECK(c == nullptr);
  }
  // With the environment put back, the ranks run (the poll window was read by no thread).
  CAPI_REQUIRE_OK(meshrt_init(MESHRT_API_VERSION));
  World w(2, 60);
  run_ranks(2, [&](int r) {
    meshrt_event_t e = nullptr;
    CAPI_THROW_UNLESS_OK(meshrt_barrier(w.comms[static_cast<size_t>(r)], nullptr, &e));
    CAPI_THROW_UNLESS_OK(meshrt_event_synchronize(e));
    CAPI_THROW_UNLESS_OK(meshrt_event_destroy(e));
  });
}

TEST_CASE("capi: bad configs are refused naming the field", "[capi]") {
  init_api();
  meshrt_comm_t comms[2] = {nullptr, nullptr};
  meshrt_comm_config_t cfg = MESHRT_COMM_CONFIG_INITIALIZER;
  cfg.magic = 0;
  require_status(meshrt_comm_init_all(comms, 2, nullptr, &cfg), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"meshrt_comm_config.magic", "MESHRT_COMM_CONFIG_INITIALIZER"});
  cfg = MESHRT_COMM_CONFIG_INITIALIZER;
  cfg.size = 8;
  require_status(meshrt_comm_init_all(comms, 2, nullptr, &cfg), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"meshrt_comm_config.size is 8"});
  cfg = MESHRT_COMM_CONFIG_INITIALIZER;
  cfg.version = 77;
  // A config field like magic and size (meshrt.h's rule): it was INVALID_USAGE.
  require_status(meshrt_comm_init_all(comms, 2, nullptr, &cfg), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"meshrt_comm_config.version is 77"});
  cfg = MESHRT_COMM_CONFIG_INITIALIZER;
  cfg.device_type = 5;
  require_status(meshrt_comm_init_all(comms, 2, nullptr, &cfg), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"device_type is 5"});
  cfg = MESHRT_COMM_CONFIG_INITIALIZER;
  cfg.timeout_s = NAN;
  require_status(meshrt_comm_init_all(comms, 2, nullptr, &cfg), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"timeout_s"});
  cfg = MESHRT_COMM_CONFIG_INITIALIZER;
  cfg.backend = "carrier-pigeon";
  require_status(meshrt_comm_init_all(comms, 2, nullptr, &cfg), MESHRT_ERROR_UNSUPPORTED,
                 {"carrier-pigeon", "host"});
#if !defined(MESHRT_WITH_CUDA)
  cfg = MESHRT_COMM_CONFIG_INITIALIZER;
  cfg.device_type = MESHRT_DEVICE_CUDA;
  require_status(meshrt_comm_init_all(comms, 2, nullptr, &cfg), MESHRT_ERROR_UNSUPPORTED,
                 {"without CUDA"});
  int fake_nccl = 0;
  require_status(meshrt_comm_adopt_nccl(comms, &fake_nccl, 0, nullptr), MESHRT_ERROR_UNSUPPORTED,
                 {"without CUDA", "NCCL"});
#endif
  CHECK(comms[0] == nullptr);
  require_status(meshrt_comm_init_all(comms, 0, nullptr, nullptr), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"n is 0"});
  require_status(meshrt_comm_init_all(nullptr, 2, nullptr, nullptr), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"comms is NULL"});
}

TEST_CASE("capi: init_rank mistakes: bad id, nranks mismatch, rank range, a rank never joins",
          "[capi]") {
  init_api();
  meshrt_comm_t comm = nullptr;
  meshrt_unique_id_t bogus;
  std::memset(&bogus, 'x', sizeof(bogus));
  require_status(meshrt_comm_init_rank(&comm, 2, bogus, 0, nullptr), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"not made by meshrt_get_unique_id"});
  meshrt_unique_id_t id;
  CAPI_REQUIRE_OK(meshrt_get_unique_id(&id));
  require_status(meshrt_comm_init_rank(&comm, 2, id, 2, nullptr), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"rank 2 is outside [0, 2)"});
  require_status(meshrt_comm_init_rank(nullptr, 2, id, 0, nullptr), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"comm is NULL"});

  // Rank 1 of 2 never arrives: rank 0 gets a timeout naming it, and so does a late rank 1.
  meshrt_comm_config_t cfg = test_config(30);
  cfg.init_timeout_s = 0.3;
  require_status(meshrt_comm_init_rank(&comm, 2, id, 0, &cfg), MESHRT_ERROR_TIMEOUT,
                 {"rank 1 never arrived within 0.3 s", "init_timeout_s"});
  CHECK(comm == nullptr);
  require_status(meshrt_comm_init_rank(&comm, 2, id, 1, &cfg), MESHRT_ERROR_TIMEOUT,
                 {"rank 1 never arrived"});

  // Ranks disagreeing on nranks.
  meshrt_unique_id_t id2;
  CAPI_REQUIRE_OK(meshrt_get_unique_id(&id2));
  std::atomic<int> st0{-1};
  std::thread t([&] {
    meshrt_comm_t c = nullptr;
    meshrt_comm_config_t c2 = test_config(30);
    c2.init_timeout_s = 2;
    st0 = meshrt_comm_init_rank(&c, 2, id2, 0, &c2);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  require_status(meshrt_comm_init_rank(&comm, 3, id2, 1, &cfg), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"passed nranks 3", "first rank to join this id passed 2"});
  t.join();
  CHECK(st0.load() == MESHRT_ERROR_TIMEOUT);
}

TEST_CASE("capi: dead, NULL and wrong-kind handles get a status, not a crash", "[capi]") {
  World w(2, 30);
  meshrt_comm_t dead = nullptr;
  {
    World tmp(1);
    dead = tmp.comms[0];
    CAPI_REQUIRE_OK(meshrt_comm_destroy(tmp.comms[0]));
    tmp.comms[0] = nullptr;
  }
  int rank = 0;
  require_status(meshrt_comm_rank(dead, &rank), MESHRT_ERROR_INVALID_USAGE,
                 {"not a live communicator handle", "destroyed"});
  require_status(meshrt_comm_destroy(dead), MESHRT_ERROR_INVALID_USAGE, {"destroyed already"});
  require_status(meshrt_comm_rank(nullptr, &rank), MESHRT_ERROR_INVALID_ARGUMENT, {"comm is NULL"});
  require_status(meshrt_comm_rank(w.comms[0], nullptr), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"rank is NULL"});
  Buf b(dl_dtype(kDLFloat, 32), 4);
  require_status(meshrt_barrier(reinterpret_cast<meshrt_comm_t>(b.handle()), nullptr, nullptr),
                 MESHRT_ERROR_INVALID_USAGE, {"is a tensor handle, not a communicator handle"});
  require_status(meshrt_all_reduce(w.comms[0], b.handle(), nullptr, MESHRT_SUM, nullptr, nullptr),
                 MESHRT_ERROR_INVALID_ARGUMENT, {"recv is NULL"});
  meshrt_tensor_t t = nullptr;
  CAPI_REQUIRE_OK(meshrt_tensor_from_dltensor(b.dl(), &t));
  CAPI_REQUIRE_OK(meshrt_tensor_destroy(t));
  require_status(meshrt_all_reduce(w.comms[0], t, t, MESHRT_SUM, nullptr, nullptr),
                 MESHRT_ERROR_INVALID_USAGE, {"not a live tensor handle"});
  require_status(meshrt_event_synchronize(nullptr), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"event is NULL"});
  require_status(meshrt_stream_synchronize(reinterpret_cast<meshrt_stream_t>(&rank)),
                 MESHRT_ERROR_INVALID_USAGE, {"not a live stream handle"});
  require_status(meshrt_all_reduce(w.comms[0], b.handle(), b.handle(),
                                   static_cast<meshrt_reduce_op_t>(9), nullptr, nullptr),
                 MESHRT_ERROR_INVALID_ARGUMENT, {"op 9", "MESHRT_SUM"});
  require_status(meshrt_broadcast(w.comms[0], nullptr, b.handle(), 5, nullptr, nullptr),
                 MESHRT_ERROR_INVALID_ARGUMENT, {"root 5 is outside [0, 2)"});
  require_status(meshrt_send(w.comms[0], b.handle(), 0, nullptr, nullptr),
                 MESHRT_ERROR_INVALID_ARGUMENT, {"peer 0 is not another rank"});
  require_status(meshrt_stream_wrap(w.comms[0], nullptr, nullptr), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"stream is NULL"});
  meshrt_stream_t s = nullptr;
  require_status(meshrt_stream_wrap(w.comms[0], &rank, &s), MESHRT_ERROR_UNSUPPORTED,
                 {"cudaStream_t", "meshrt_stream_create"});
}

TEST_CASE("capi: DLPack tensors meshrt refuses, case by case", "[capi]") {
  World w(1);
  meshrt_tensor_t t = nullptr;
  Buf f64(dl_dtype(kDLFloat, 64), 4);
  // A tensor meshrt never takes (meshrt.h's rule): it was UNSUPPORTED.
  require_status(meshrt_tensor_from_dltensor(f64.dl(), &t), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"code 2, bits 64, lanes 1", "float32, bfloat16"});
  Buf vec(dl_dtype(kDLFloat, 32), 4);
  vec.dl()->dtype.lanes = 4;
  require_status(meshrt_tensor_from_dltensor(vec.dl(), &t), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"lanes 4", "lanes 1"});
  Buf gpu(dl_dtype(kDLFloat, 32), 4);
  gpu.dl()->device.device_type = kDLOpenCL;
  require_status(meshrt_tensor_from_dltensor(gpu.dl(), &t), MESHRT_ERROR_UNSUPPORTED,
                 {"device_type 4", "kDLCPU (1) and kDLCUDA (2)"});
  // A 2 x 3 tensor viewed transposed (strides 1, 2): not row-major.
  Buf nc(dl_dtype(kDLFloat, 32), 6);
  int64_t shape[2] = {3, 2}, strides[2] = {1, 3};
  nc.dl()->ndim = 2;
  nc.dl()->shape = shape;
  nc.dl()->strides = strides;
  require_status(meshrt_tensor_from_dltensor(nc.dl(), &t), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"shape [3, 2] has strides [1, 3]", "contiguous"});
  int64_t ok_strides[2] = {2, 1};
  nc.dl()->strides = ok_strides;
  CAPI_REQUIRE_OK(meshrt_tensor_from_dltensor(nc.dl(), &t));  // explicit row-major strides
  CAPI_REQUIRE_OK(meshrt_tensor_destroy(t));
  Buf nul(dl_dtype(kDLFloat, 32), 4);
  nul.dl()->data = nullptr;
  require_status(meshrt_tensor_from_dltensor(nul.dl(), &t), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"data is NULL"});
  Buf neg(dl_dtype(kDLFloat, 32), 4);
  neg.dl()->shape[0] = -4;
  require_status(meshrt_tensor_from_dltensor(neg.dl(), &t), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"negative extent"});
  neg.dl()->shape[0] = 4;
  // Offsets that wrap the pointer around (-64 as unsigned) or leave the address space.
  Buf off(dl_dtype(kDLFloat, 32), 4);
  for (uint64_t bad : {~uint64_t{63}, uint64_t{1} << 62}) {
    off.dl()->byte_offset = bad;
    require_status(meshrt_tensor_from_dltensor(off.dl(), &t), MESHRT_ERROR_INVALID_ARGUMENT,
                   {"byte_offset " + std::to_string(bad), "runs past the address space"});
  }
  off.dl()->byte_offset = 0;
  int64_t huge[2] = {int64_t{1} << 40, int64_t{1} << 40};
  neg.dl()->ndim = 2;
  neg.dl()->shape = huge;
  require_status(meshrt_tensor_from_dltensor(neg.dl(), &t), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"more elements than int64"});
  // A CUDA tensor (never dereferenced) on a CPU communicator.
  Buf cuda(dl_dtype(kDLFloat, 32), 4);
  cuda.dl()->device.device_type = kDLCUDA;
  meshrt_tensor_t ct = nullptr;
  CAPI_REQUIRE_OK(meshrt_tensor_from_dltensor(cuda.dl(), &ct));
  require_status(meshrt_all_reduce(w.comms[0], ct, ct, MESHRT_SUM, nullptr, nullptr),
                 MESHRT_ERROR_INVALID_ARGUMENT, {"is on cuda:0", "runs on cpu:0"});
  CAPI_REQUIRE_OK(meshrt_tensor_destroy(ct));
  // Shapes the communicator refuses: its C++ check's message comes through, with the status of
  // meshrt.h's rule (tensors that do not fit the call; these were INVALID_USAGE).
  Buf a(dl_dtype(kDLFloat, 32), 4), b(dl_dtype(kDLFloat, 32), 5), i32(dl_dtype(kDLInt, 32), 4);
  require_status(
      meshrt_all_reduce(w.comms[0], a.handle(), b.handle(), MESHRT_SUM, nullptr, nullptr),
      MESHRT_ERROR_INVALID_ARGUMENT, {"input has 4 elements but output has 5"});
  require_status(
      meshrt_all_reduce(w.comms[0], a.handle(), i32.handle(), MESHRT_SUM, nullptr, nullptr),
      MESHRT_ERROR_INVALID_ARGUMENT, {"differ in dtype"});
  // uint8 moves but does not reduce.
  Buf u8(dl_dtype(kDLUInt, 8), 4);
  require_status(
      meshrt_all_reduce(w.comms[0], u8.handle(), u8.handle(), MESHRT_SUM, nullptr, nullptr),
      MESHRT_ERROR_INVALID_ARGUMENT, {"not supported for reductions"});
  // A shape whose size overflows: the same status from meshrt_tensor_empty as from a DLTensor
  // (it was INVALID_USAGE from empty, INVALID_ARGUMENT from from_dltensor).
  meshrt_tensor_t e = nullptr;
  require_status(meshrt_tensor_empty(w.comms[0], 2, huge, dl_dtype(kDLFloat, 32), &e),
                 MESHRT_ERROR_INVALID_ARGUMENT,
                 {"shape [1099511627776, 1099511627776] has more elements than int64"});
  CHECK(e == nullptr);
}

namespace {
std::atomic<int> g_deleted{0};
void count_delete(DLManagedTensor* self) {
  ++g_deleted;
  delete[] static_cast<float*>(self->dl_tensor.data);
  delete self;
}
void count_delete_v(DLManagedTensorVersioned* self) {
  ++g_deleted;
  delete[] static_cast<float*>(self->dl_tensor.data);
  delete self;
}
int64_t g_shape4[1] = {4};
template <class M>
M* managed(void (*del)(M*)) {
  auto* m = new M();
  m->dl_tensor.data = new float[4]{1, 2, 3, 4};
  m->dl_tensor.device = {kDLCPU, 0};
  m->dl_tensor.ndim = 1;
  m->dl_tensor.dtype = dl_dtype(kDLFloat, 32);
  m->dl_tensor.shape = g_shape4;
  m->deleter = del;
  return m;
}
}  // namespace

TEST_CASE("capi: send and recv overlapping other than in place are an invalid argument", "[capi]") {
  // meshrt.h says INVALID_ARGUMENT; they were INVALID_USAGE. Rank 0 alone calls: the check
  // refuses the call before anything is enqueued, so rank 1 waits for nothing.
  World w(2, 5);
  std::vector<float> mem(8, 1.0f);
  auto view = [&](int64_t off, int64_t n) {
    DLTensor d{};
    d.data = mem.data() + off;
    d.device.device_type = kDLCPU;
    d.ndim = 1;
    d.dtype = dl_dtype(kDLFloat, 32);
    int64_t shape[1] = {n};  // the tensor copies its metadata (meshrt.h)
    d.shape = shape;
    meshrt_tensor_t h = nullptr;
    CAPI_REQUIRE_OK(meshrt_tensor_from_dltensor(&d, &h));
    return h;
  };
  // An all-reduce shifted by one element.
  meshrt_tensor_t a0 = view(0, 4), a1 = view(1, 4);
  require_status(meshrt_all_reduce(w.comms[0], a0, a1, MESHRT_SUM, nullptr, nullptr),
                 MESHRT_ERROR_INVALID_ARGUMENT, {"input and output overlap"});
  // All-gather on rank 0 with send = rank 1's block of recv (elements [2, 4) of [0, 4)).
  meshrt_tensor_t recv = view(0, 4), blk1 = view(2, 2);
  require_status(meshrt_all_gather(w.comms[0], blk1, recv, nullptr, nullptr),
                 MESHRT_ERROR_INVALID_ARGUMENT, {"overlap"});
  // Reduce-scatter on rank 0 with recv = rank 1's block of send.
  require_status(meshrt_reduce_scatter(w.comms[0], recv, blk1, MESHRT_SUM, nullptr, nullptr),
                 MESHRT_ERROR_INVALID_ARGUMENT, {"overlap"});
  for (meshrt_tensor_t h : {a0, a1, recv, blk1}) CAPI_REQUIRE_OK(meshrt_tensor_destroy(h));
}

TEST_CASE("capi: managed DLPack tensors: ownership, versions, read-only, export", "[capi]") {
  World w(1);
  meshrt_comm_t comm = w.comms[0];
  g_deleted = 0;
  // Legacy managed tensor: the deleter runs once the handle and the work using it are gone.
  DLManagedTensor* m = managed<DLManagedTensor>(count_delete);
  meshrt_tensor_t t = nullptr;
  CAPI_REQUIRE_OK(meshrt_tensor_from_dlpack(m, &t));
  meshrt_event_t e = nullptr;
  CAPI_REQUIRE_OK(meshrt_all_reduce(comm, t, t, MESHRT_SUM, nullptr, &e));
  CAPI_REQUIRE_OK(meshrt_tensor_destroy(t));
  CAPI_REQUIRE_OK(meshrt_event_synchronize(e));
  CAPI_REQUIRE_OK(meshrt_event_destroy(e));
  meshrt_stream_t def = nullptr;
  CAPI_REQUIRE_OK(meshrt_comm_default_stream(comm, &def));
  CAPI_REQUIRE_OK(meshrt_stream_synchronize(def));
  CHECK(g_deleted.load() == 1);

  // Failure leaves ownership with the caller: no deleter call.
  DLManagedTensor* bad = managed<DLManagedTensor>(count_delete);
  bad->dl_tensor.dtype = dl_dtype(kDLFloat, 64);
  require_status(meshrt_tensor_from_dlpack(bad, &t), MESHRT_ERROR_INVALID_ARGUMENT, {"bits 64"});
  CHECK(g_deleted.load() == 1);
  count_delete(bad);

  // Versioned (DLPack 1.0): accepted; read-only refused as an output; major 2 refused.
  DLManagedTensorVersioned* v = managed<DLManagedTensorVersioned>(count_delete_v);
  v->version = {1, 1};
  v->flags = meshrt::capi::kDLPackFlagReadOnly;
  CAPI_REQUIRE_OK(meshrt_tensor_from_dlpack_versioned(v, &t));
  Buf out(dl_dtype(kDLFloat, 32), 4);
  CAPI_REQUIRE_OK(meshrt_all_reduce(comm, t, out.handle(), MESHRT_MAX, nullptr, nullptr));
  require_status(meshrt_all_reduce(comm, t, t, MESHRT_SUM, nullptr, nullptr),
                 MESHRT_ERROR_INVALID_ARGUMENT, {"read-only", "writable"});
  CAPI_REQUIRE_OK(meshrt_stream_synchronize(def));
  CHECK(out.get(3) == 4.0);
  CAPI_REQUIRE_OK(meshrt_tensor_destroy(t));
  CHECK(g_deleted.load() == 3);  // the legacy one, `bad` (by the test) and this one
  DLManagedTensorVersioned* v2 = managed<DLManagedTensorVersioned>(count_delete_v);
  v2->version = {2, 0};
  require_status(meshrt_tensor_from_dlpack_versioned(v2, &t), MESHRT_ERROR_UNSUPPORTED,
                 {"version 2.0", "major 1"});
  count_delete_v(v2);

  // Export: meshrt-allocated tensor out as legacy and versioned DLPack; the memory outlives the
  // handle until the engine's deleter call.
  int64_t shape[2] = {2, 3};
  meshrt_tensor_t mine = nullptr;
  CAPI_REQUIRE_OK(meshrt_tensor_empty(comm, 2, shape, dl_dtype(kDLInt, 64), &mine));
  DLManagedTensor* ex = nullptr;
  DLManagedTensorVersioned* exv = nullptr;
  CAPI_REQUIRE_OK(meshrt_tensor_to_dlpack(mine, &ex));
  CAPI_REQUIRE_OK(meshrt_tensor_to_dlpack_versioned(mine, &exv));
  CAPI_REQUIRE_OK(meshrt_tensor_destroy(mine));
  REQUIRE(ex->dl_tensor.ndim == 2);
  CHECK(ex->dl_tensor.shape[0] == 2);
  CHECK(ex->dl_tensor.shape[1] == 3);
  CHECK(ex->dl_tensor.strides[0] == 3);
  CHECK(ex->dl_tensor.dtype.code == kDLInt);
  CHECK(ex->dl_tensor.dtype.bits == 64);
  CHECK(ex->dl_tensor.device.device_type == kDLCPU);
  CHECK(exv->version.major == 1);
  CHECK(exv->dl_tensor.data == ex->dl_tensor.data);
  auto* p = static_cast<int64_t*>(ex->dl_tensor.data);
  for (int i = 0; i < 6; ++i) p[i] = i;  // writable after the handle is gone
  // Re-import the export: zero copy, same memory.
  meshrt_tensor_t back = nullptr;
  CAPI_REQUIRE_OK(meshrt_tensor_from_dlpack(ex, &back));
  CAPI_REQUIRE_OK(meshrt_all_reduce(comm, back, back, MESHRT_SUM, nullptr, nullptr));
  CAPI_REQUIRE_OK(meshrt_stream_synchronize(def));
  CHECK(p[5] == 5);
  CAPI_REQUIRE_OK(meshrt_tensor_destroy(back));  // runs ex's deleter
  exv->deleter(exv);

  // A C++ exception deep inside (the shape's element count overflows int64) becomes a status.
  int64_t huge[2] = {int64_t(1) << 40, int64_t(1) << 40};
  const meshrt_status_t st = meshrt_tensor_empty(comm, 2, huge, dl_dtype(kDLFloat, 32), &mine);
  INFO(meshrt_last_error());
  CHECK(st != MESHRT_SUCCESS);
  CHECK(std::string(meshrt_last_error()).find("meshrt_tensor_empty") != std::string::npos);
  // An allocation failure is OUT_OF_MEMORY, as the header promises (1 TiB, and 4 PiB).
  for (int bits : {38, 50}) {
    int64_t big[1] = {int64_t(1) << bits};
    const meshrt_status_t st2 = meshrt_tensor_empty(comm, 1, big, dl_dtype(kDLFloat, 32), &mine);
    INFO(bits << ": " << meshrt_last_error());
    CHECK(st2 == MESHRT_ERROR_OUT_OF_MEMORY);
    CHECK(std::string(meshrt_last_error()).find("out of memory allocating") != std::string::npos);
    CHECK(mine == nullptr);
  }
}

TEST_CASE("capi: an aborted communicator fails its work with a comm status", "[capi]") {
  World w(2, 5);
  CAPI_REQUIRE_OK(meshrt_comm_abort(w.comms[0]));
  Buf a(dl_dtype(kDLFloat, 32), 4);
  meshrt_event_t e = nullptr;
  meshrt_status_t st =
      meshrt_all_reduce(w.comms[0], a.handle(), a.handle(), MESHRT_SUM, nullptr, &e);
  if (st == MESHRT_SUCCESS) st = meshrt_event_synchronize(e);
  require_status(st, MESHRT_ERROR_COMM, {"meshrt_comm_abort"});
  meshrt_event_destroy(e);
  // The peer's work fails too (the abort covers every communicator sharing the ranks).
  Buf b(dl_dtype(kDLFloat, 32), 4);
  e = nullptr;
  st = meshrt_all_reduce(w.comms[1], b.handle(), b.handle(), MESHRT_SUM, nullptr, &e);
  if (st == MESHRT_SUCCESS) st = meshrt_event_synchronize(e);
  CHECK((st == MESHRT_ERROR_COMM || st == MESHRT_ERROR_TIMEOUT));
  meshrt_event_destroy(e);
}

TEST_CASE("capi: a collective a peer never joins times out with a status", "[capi]") {
  World w(2, 0.5);
  Buf a(dl_dtype(kDLFloat, 32), 4);
  meshrt_event_t e = nullptr;
  CAPI_REQUIRE_OK(meshrt_all_reduce(w.comms[0], a.handle(), a.handle(), MESHRT_SUM, nullptr, &e));
  // The message names the setting the caller used (it said MESHRT_COMM_TIMEOUT).
  const meshrt_status_t st = meshrt_event_synchronize(e);
  require_status(st, MESHRT_ERROR_TIMEOUT,
                 {"did not complete within 0.5 s (meshrt_comm_config.timeout_s)", "rank 1"});
  CHECK(std::string(meshrt_last_error()).find("MESHRT_COMM_TIMEOUT") == std::string::npos);
  meshrt_event_destroy(e);
}

TEST_CASE("capi: a timeout from MESHRT_COMM_TIMEOUT names the variable", "[capi]") {
  meshrt::test::ScopedEnv env("MESHRT_COMM_TIMEOUT", "0.5");
  init_api();
  meshrt_comm_t comms[2] = {nullptr, nullptr};
  meshrt_comm_config_t cfg = MESHRT_COMM_CONFIG_INITIALIZER;  // timeout_s -1: the variable
  cfg.init_timeout_s = 60;
  CAPI_REQUIRE_OK(meshrt_comm_init_all(comms, 2, nullptr, &cfg));
  Buf a(dl_dtype(kDLFloat, 32), 4);
  meshrt_event_t e = nullptr;
  CAPI_REQUIRE_OK(meshrt_all_reduce(comms[0], a.handle(), a.handle(), MESHRT_SUM, nullptr, &e));
  require_status(meshrt_event_synchronize(e), MESHRT_ERROR_TIMEOUT,
                 {"did not complete within 0.5 s (MESHRT_COMM_TIMEOUT)"});
  meshrt_event_destroy(e);
  for (meshrt_comm_t c : comms) meshrt_comm_destroy(c);
}

namespace {
struct Captured {
  std::mutex mu;
  std::vector<std::string> lines;
  std::vector<int> ranks;
};
void capture_log(meshrt_log_level_t, int rank, const char* msg, void* user) {
  auto* c = static_cast<Captured*>(user);
  std::lock_guard<std::mutex> lk(c->mu);
  c->lines.push_back(msg);
  c->ranks.push_back(rank);
}
}  // namespace

TEST_CASE("capi: log lines go to the engine's callback", "[capi]") {
  Captured got;
  CAPI_REQUIRE_OK(meshrt_set_log_callback(capture_log, &got, MESHRT_LOG_INFO));
  meshrt::set_log_rank(3, 4);
  MESHRT_LOG_INFO("hello from meshrt");
  MESHRT_LOG_DEBUG("below the level");
  CAPI_REQUIRE_OK(meshrt_set_log_callback(nullptr, nullptr, MESHRT_LOG_WARN));
  MESHRT_LOG_WARN("to stderr again");
  REQUIRE(got.lines.size() == 1);
  CHECK(got.lines[0] == "hello from meshrt");
  CHECK(got.ranks[0] == 3);
  require_status(meshrt_set_log_callback(nullptr, nullptr, static_cast<meshrt_log_level_t>(17)),
                 MESHRT_ERROR_INVALID_ARGUMENT, {"level 17"});
  meshrt::set_log_rank(0, 1);
}

TEST_CASE("capi: the log callback gets each line's own rank", "[capi]") {
  World w(4);
  Captured got;
  CAPI_REQUIRE_OK(meshrt_set_log_callback(capture_log, &got, MESHRT_LOG_TRACE));
  std::vector<std::unique_ptr<Buf>> bufs;
  std::vector<meshrt_event_t> events(4, nullptr);
  for (int r = 0; r < 4; ++r) {  // one thread drives every rank
    bufs.push_back(std::make_unique<Buf>(dl_dtype(kDLFloat, 32), 4));
    CAPI_REQUIRE_OK(meshrt_all_reduce(w.comms[static_cast<size_t>(r)], bufs.back()->handle(),
                                      bufs.back()->handle(), MESHRT_SUM, nullptr,
                                      &events[static_cast<size_t>(r)]));
  }
  for (meshrt_event_t e : events) {
    CAPI_REQUIRE_OK(meshrt_event_synchronize(e));
    meshrt_event_destroy(e);
  }
  CAPI_REQUIRE_OK(meshrt_set_log_callback(nullptr, nullptr, MESHRT_LOG_WARN));
  std::set<int> issued;  // ranks of the "issue" lines: one per rank
  for (size_t i = 0; i < got.lines.size(); ++i)
    if (got.lines[i].find("issue seq") != std::string::npos) issued.insert(got.ranks[i]);
  CHECK(issued == std::set<int>{0, 1, 2, 3});
  meshrt::set_log_rank(0, 1);
}

TEST_CASE("capi: a stream of another rank is refused, naming both ranks", "[capi]") {
  World w(2, 5);
  meshrt_stream_t s0 = nullptr, d0 = nullptr;
  CAPI_REQUIRE_OK(meshrt_stream_create(w.comms[0], &s0));
  CAPI_REQUIRE_OK(meshrt_comm_default_stream(w.comms[0], &d0));
  Buf a(dl_dtype(kDLFloat, 32), 4);
  for (meshrt_stream_t s : {s0, d0}) {
    meshrt_event_t e = nullptr;
    require_status(meshrt_all_reduce(w.comms[1], a.handle(), a.handle(), MESHRT_SUM, s, &e),
                   MESHRT_ERROR_INVALID_ARGUMENT,
                   {"belongs to rank 0 of communicator 'world' (" + ptr(w.comms[0]) + ")",
                    "not to this call's rank 1 of communicator 'world' (" + ptr(w.comms[1]) + ")",
                    "pass a stream created from this rank's communicator"});
    CHECK(e == nullptr);
  }
  CAPI_REQUIRE_OK(meshrt_stream_destroy(s0));
}

TEST_CASE("capi: a stream of the same rank of another world named alike is refused, by handle",
          "[capi]") {
  // Both worlds are 'world' and both ranks are 0: the handles tell them apart (the message said
  // "created for rank 0 of communicator 'world' but this call is rank 0's (communicator 'world')").
  World a(1, 5), b(1, 5);
  meshrt_stream_t s = nullptr;
  CAPI_REQUIRE_OK(meshrt_stream_create(a.comms[0], &s));
  Buf x(dl_dtype(kDLFloat, 32), 4);
  require_status(meshrt_all_reduce(b.comms[0], x.handle(), x.handle(), MESHRT_SUM, s, nullptr),
                 MESHRT_ERROR_INVALID_ARGUMENT,
                 {"belongs to rank 0 of communicator 'world' (" + ptr(a.comms[0]) + ")",
                  "not to this call's rank 0 of communicator 'world' (" + ptr(b.comms[0]) + ")"});
  CAPI_REQUIRE_OK(meshrt_stream_destroy(s));
}

TEST_CASE("capi: a stream that outlived its communicator is refused by every communicator",
          "[capi]") {
  // It was accepted by a later communicator (whose context could reuse the destroyed one's
  // address) and ran work there.
  meshrt_stream_t s = nullptr;
  std::string old_handle;
  {
    World a(1, 5);
    CAPI_REQUIRE_OK(meshrt_stream_create(a.comms[0], &s));
    old_handle = ptr(a.comms[0]);
  }
  for (int i = 0; i < 3; ++i) {
    World b(1, 5);
    Buf x(dl_dtype(kDLFloat, 32), 4);
    meshrt_event_t e = nullptr;
    require_status(meshrt_all_reduce(b.comms[0], x.handle(), x.handle(), MESHRT_SUM, s, &e),
                   MESHRT_ERROR_INVALID_USAGE,
                   {"stream 'capi' was created for rank 0 of communicator 'world' (" + old_handle +
                        "), which was destroyed",
                    "destroy the stream and pass one created from this call's communicator"});
    CHECK(e == nullptr);
  }
  CAPI_REQUIRE_OK(meshrt_stream_synchronize(s));  // the stream itself is still a live handle
  CAPI_REQUIRE_OK(meshrt_stream_destroy(s));
}
