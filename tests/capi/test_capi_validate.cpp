// Inputs checked where they enter the C API, with the exact message each gets: ranks passing
// different mesh specs (every rank fails at once, naming the specs and ranks), every field of the
// block and communicator configs, DLPack devices, and shared checks naming the C API's fields
// and arguments instead of the command line's flags or a launch's variables.
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "capi_test_util.h"
#include "runtime/thread.h"

using namespace capi_test;

namespace {

// Status and message of one call per rank, made on the rank's thread and checked afterwards on
// the main thread (Catch assertions are not thread-safe).
struct RankResult {
  meshrt_status_t status = MESHRT_SUCCESS;
  std::string message;
  bool mesh_null = false;
};

std::vector<RankResult> mesh_create_each(World& w, const std::vector<const char*>& specs) {
  std::vector<RankResult> out(specs.size());
  run_ranks(static_cast<int>(specs.size()), [&](int r) {
    const auto k = static_cast<size_t>(r);
    meshrt_mesh_t mesh = reinterpret_cast<meshrt_mesh_t>(&out);  // must be reset to NULL
    out[k].status = meshrt_mesh_create(&mesh, w.comms[k], specs[k]);
    out[k].message = out[k].status == MESHRT_SUCCESS ? "" : meshrt_last_error();
    out[k].mesh_null = mesh == nullptr;
    if (mesh != nullptr) meshrt_mesh_destroy(mesh);
  });
  return out;
}

void require_all(const std::vector<RankResult>& got, meshrt_status_t status,
                 const std::string& message) {
  for (size_t r = 0; r < got.size(); ++r) {
    INFO("rank " << r << ": " << meshrt_status_string(got[r].status) << ": " << got[r].message);
    CHECK(got[r].status == status);
    CHECK(got[r].message == message);
    CHECK(got[r].mesh_null);
  }
}

// The world still works after a refused create: the same spec on every rank makes the mesh.
void require_mesh_works(World& w, const char* spec) {
  std::vector<const char*> specs(w.comms.size(), spec);
  for (const RankResult& r : mesh_create_each(w, specs)) {
    INFO(r.message);
    CHECK(r.status == MESHRT_SUCCESS);
  }
}

std::string last_error() { return meshrt_last_error(); }

// The status of `call` is `status` and its message is exactly `message`.
#define REQUIRE_EXACT(call, status, message)                                    \
  do {                                                                          \
    const meshrt_status_t st_ = (call);                                         \
    INFO(#call << " -> " << meshrt_status_string(st_) << ": " << last_error()); \
    CHECK(st_ == (status));                                                     \
    CHECK(last_error() == std::string(message));                                \
  } while (0)

meshrt_mlp_config_t small_mlp() {
  meshrt_mlp_config_t c = MESHRT_MLP_CONFIG_INITIALIZER;
  c.hidden = 8;
  c.ffn = 6;
  return c;
}

meshrt_attn_config_t small_attn() {
  meshrt_attn_config_t c = MESHRT_ATTN_CONFIG_INITIALIZER;
  c.hidden = 8;
  c.heads = 2;
  return c;
}

}  // namespace

TEST_CASE("capi validate: ranks passing different mesh specs all fail at once, naming them",
          "[capi][multirank]") {
  World w(2);
  SECTION("two valid specs") {
    require_all(mesh_create_each(w, {"dp=2", "tp=2"}), MESHRT_ERROR_INVALID_ARGUMENT,
                "meshrt_mesh_create: the ranks of communicator 'world' passed different mesh "
                "specs (rank 0 passed 'dp=2'; rank 1 passed 'tp=2'), so no rank creates the "
                "mesh: pass the same spec on every rank");
  }
  SECTION("one rank's spec is bad: the mismatch, not a timeout") {
    require_all(mesh_create_each(w, {"tp=2", "tp=3"}), MESHRT_ERROR_INVALID_ARGUMENT,
                "meshrt_mesh_create: the ranks of communicator 'world' passed different mesh "
                "specs (rank 0 passed 'tp=2'; rank 1 passed 'tp=3'), so no rank creates the "
                "mesh: pass the same spec on every rank");
  }
  SECTION("one rank passes spec NULL") {
    const auto got = mesh_create_each(w, {"tp=2", nullptr});
    CHECK(got[0].status == MESHRT_ERROR_INVALID_ARGUMENT);
    CHECK(got[0].message ==
          "meshrt_mesh_create: rank 1 of communicator 'world' passed spec NULL to "
          "meshrt_mesh_create, so no rank creates the mesh: fix rank 1's call");
    CHECK(got[1].status == MESHRT_ERROR_INVALID_ARGUMENT);
    CHECK(got[1].message ==
          "meshrt_mesh_create: spec is NULL: pass the mesh's dims, e.g. \"dp=2,tp=2\"");
  }
  require_mesh_works(w, "dp=1,tp=2");
}

TEST_CASE("capi validate: a too-long spec on one rank fails every rank", "[capi][multirank]") {
  World w(2);
  const std::string long_spec(5000, 'x');
  const auto got = mesh_create_each(w, {"tp=2", long_spec.c_str()});
  CHECK(got[0].status == MESHRT_ERROR_INVALID_ARGUMENT);
  CHECK(got[0].message ==
        "meshrt_mesh_create: rank 1's spec has 5000 bytes: a mesh spec is at most 4096 bytes "
        "(\"name=size\" pairs such as \"dp=2,tp=2\")");
  CHECK(got[1].status == MESHRT_ERROR_INVALID_ARGUMENT);
  CHECK(got[1].message ==
        "meshrt_mesh_create: spec has 5000 bytes: a mesh spec is at most 4096 bytes "
        "(\"name=size\" pairs such as \"dp=2,tp=2\")");
  require_mesh_works(w, "tp=2");
}

TEST_CASE("capi validate: four ranks, three specs: the message groups the ranks",
          "[capi][multirank]") {
  World w(4);
  require_all(mesh_create_each(w, {"dp=2,tp=2", "tp=4", "dp=2,tp=2", "dp=4"}),
              MESHRT_ERROR_INVALID_ARGUMENT,
              "meshrt_mesh_create: the ranks of communicator 'world' passed different mesh specs "
              "(ranks 0, 2 passed 'dp=2,tp=2'; rank 1 passed 'tp=4'; rank 3 passed 'dp=4'), so "
              "no rank creates the mesh: pass the same spec on every rank");
  require_mesh_works(w, "dp=2,tp=2");
}

TEST_CASE("capi validate: every field of meshrt_mlp_config_t", "[capi]") {
  World w(1);
  meshrt_mesh_t mesh = nullptr;
  CAPI_REQUIRE_OK(meshrt_mesh_create(&mesh, w.comms[0], "tp=1"));
  meshrt_mlp_t mlp = nullptr;
  struct Case {
    void (*set)(meshrt_mlp_config_t&);
    const char* message;
  };
  const Case cases[] = {
      {[](meshrt_mlp_config_t& c) { c.bias = 5; },
       "meshrt_mlp_config.bias is 5: it is a flag, pass 1 (fc1 and fc2 have biases) or 0 (none)"},
      {[](meshrt_mlp_config_t& c) { c.bias = -1; },
       "meshrt_mlp_config.bias is -1: it is a flag, pass 1 (fc1 and fc2 have biases) or 0 "
       "(none)"},
      {[](meshrt_mlp_config_t& c) { c.sequence_parallel = 2; },
       "meshrt_mlp_config.sequence_parallel is 2: it is a flag, pass 1 (activations are sequence "
       "shards over tp) or 0 (whole)"},
      {[](meshrt_mlp_config_t& c) { c.eps = std::numeric_limits<float>::infinity(); },
       "meshrt_mlp_config.eps is inf: the norm epsilon must be a finite number in (0, 1], e.g. "
       "1e-5"},
      {[](meshrt_mlp_config_t& c) { c.eps = std::numeric_limits<float>::quiet_NaN(); },
       "meshrt_mlp_config.eps is nan: the norm epsilon must be a finite number in (0, 1], e.g. "
       "1e-5"},
      {[](meshrt_mlp_config_t& c) { c.eps = 0; },
       "meshrt_mlp_config.eps is 0: the norm epsilon must be a finite number in (0, 1], e.g. "
       "1e-5"},
      {[](meshrt_mlp_config_t& c) { c.eps = -1e-5f; },
       "meshrt_mlp_config.eps is -1e-05: the norm epsilon must be a finite number in (0, 1], "
       "e.g. 1e-5"},
      {[](meshrt_mlp_config_t& c) { c.eps = 2; },
       "meshrt_mlp_config.eps is 2: the norm epsilon must be a finite number in (0, 1], e.g. "
       "1e-5"},
      {[](meshrt_mlp_config_t& c) { c.hidden = 0; },
       "meshrt_mlp_config.hidden is 0: the model width must be at least 1"},
      {[](meshrt_mlp_config_t& c) { c.ffn = -3; },
       "meshrt_mlp_config.ffn is -3: the inner width must be at least 1"},
      {[](meshrt_mlp_config_t& c) { c.hidden = c.ffn = int64_t{1} << 40; },
       "meshrt_mlp_config.hidden 1099511627776 x meshrt_mlp_config.ffn 1099511627776 x 4 bytes "
       "(the fc1 weight) overflows a 64-bit byte count: pass the model's real sizes"},
      {[](meshrt_mlp_config_t& c) { c.norm = 2; },
       "meshrt_mlp_config.norm is 2, not a meshrt_norm_kind_t: use MESHRT_NORM_LAYERNORM (0) or "
       "MESHRT_NORM_RMSNORM (1)"},
      {[](meshrt_mlp_config_t& c) { c.gelu = -1; },
       "meshrt_mlp_config.gelu is -1, not a meshrt_gelu_kind_t: use MESHRT_GELU_TANH (0) or "
       "MESHRT_GELU_ERF (1)"},
      {[](meshrt_mlp_config_t& c) { c.weight_layout = 7; },
       "meshrt_mlp_config.weight_layout is 7, not a meshrt_weight_layout_t: use "
       "MESHRT_WEIGHT_LAYOUT_IN_OUT (0) or MESHRT_WEIGHT_LAYOUT_OUT_IN (1)"},
      {[](meshrt_mlp_config_t& c) { c.dtype = dl_dtype(kDLInt, 32); },
       "meshrt_mlp_config.dtype (code 0, bits 32, lanes 1) is not a block dtype: use float32 "
       "{kDLFloat, 32, 1}, bfloat16 {kDLBfloat, 16, 1} or float16 {kDLFloat, 16, 1}"},
  };
  for (const Case& k : cases) {
    meshrt_mlp_config_t c = small_mlp();
    k.set(c);
    REQUIRE_EXACT(meshrt_mlp_create(&mlp, mesh, &c), MESHRT_ERROR_INVALID_ARGUMENT,
                  std::string("meshrt_mlp_create: ") + k.message);
    CHECK(mlp == nullptr);
  }
  // A size inside a field would leave it half read; a size at a field's end (an older caller's
  // struct) gets the defaults for the rest.
  meshrt_mlp_config_t c = small_mlp();
  c.size = offsetof(meshrt_mlp_config_t, ffn) + 4;
  REQUIRE_EXACT(meshrt_mlp_create(&mlp, mesh, &c), MESHRT_ERROR_INVALID_ARGUMENT,
                "meshrt_mlp_create: meshrt_mlp_config.size is " + std::to_string(c.size) +
                    ", expected sizeof(meshrt_mlp_config_t) = " +
                    std::to_string(sizeof(meshrt_mlp_config_t)) +
                    ": initialise it with MESHRT_MLP_CONFIG_INITIALIZER");
  c.size = offsetof(meshrt_mlp_config_t, ffn) + sizeof(c.ffn);
  CAPI_REQUIRE_OK(meshrt_mlp_create(&mlp, mesh, &c));
  CAPI_REQUIRE_OK(meshrt_mlp_destroy(mlp));
  CAPI_REQUIRE_OK(meshrt_mesh_destroy(mesh));
}

TEST_CASE("capi validate: every field of meshrt_attn_config_t", "[capi]") {
  World w(1);
  meshrt_mesh_t mesh = nullptr;
  CAPI_REQUIRE_OK(meshrt_mesh_create(&mesh, w.comms[0], "tp=1"));
  meshrt_attn_t attn = nullptr;
  struct Case {
    void (*set)(meshrt_attn_config_t&);
    const char* message;
  };
  const Case cases[] = {
      {[](meshrt_attn_config_t& c) { c.bias = 2; },
       "meshrt_attn_config.bias is 2: it is a flag, pass 1 (qkv and proj have biases) or 0 "
       "(none)"},
      {[](meshrt_attn_config_t& c) { c.causal = 5; },
       "meshrt_attn_config.causal is 5: it is a flag, pass 1 (causal) or 0 (every position)"},
      {[](meshrt_attn_config_t& c) { c.sequence_parallel = -1; },
       "meshrt_attn_config.sequence_parallel is -1: it is a flag, pass 1 (activations are "
       "sequence shards over tp) or 0 (whole)"},
      {[](meshrt_attn_config_t& c) { c.eps = -std::numeric_limits<float>::infinity(); },
       "meshrt_attn_config.eps is -inf: the norm epsilon must be a finite number in (0, 1], e.g. "
       "1e-5"},
      {[](meshrt_attn_config_t& c) { c.heads = 0; },
       "meshrt_attn_config.heads is 0: the number of attention heads must be at least 1"},
      {[](meshrt_attn_config_t& c) { c.hidden = -8; },
       "meshrt_attn_config.hidden is -8: the model width must be at least 1"},
      {[](meshrt_attn_config_t& c) { c.hidden = int64_t{1} << 31; },
       "meshrt_attn_config.hidden 2147483648 x meshrt_attn_config.hidden 2147483648 x 12 bytes "
       "(the qkv weight, 3 x hidden x hidden) overflows a 64-bit byte count: pass the model's "
       "real sizes"},
      {[](meshrt_attn_config_t& c) { c.heads = 3; },
       "block: meshrt_attn_config.hidden 8 does not divide by meshrt_attn_config.heads 3; pick "
       "meshrt_attn_config.heads that divide it"},
      {[](meshrt_attn_config_t& c) { c.qkv_layout = 3; },
       "meshrt_attn_config.qkv_layout is 3, not a meshrt_qkv_layout_t: use "
       "MESHRT_QKV_LAYOUT_PER_HEAD (0) or MESHRT_QKV_LAYOUT_BLOCKED (1)"},
      {[](meshrt_attn_config_t& c) { c.norm = 9; },
       "meshrt_attn_config.norm is 9, not a meshrt_norm_kind_t: use MESHRT_NORM_LAYERNORM (0) or "
       "MESHRT_NORM_RMSNORM (1)"},
  };
  for (const Case& k : cases) {
    meshrt_attn_config_t c = small_attn();
    k.set(c);
    REQUIRE_EXACT(meshrt_attn_create(&attn, mesh, &c), MESHRT_ERROR_INVALID_ARGUMENT,
                  std::string("meshrt_attn_create: ") + k.message);
    CHECK(attn == nullptr);
  }
  meshrt_attn_config_t c = small_attn();
  c.size = 0;
  REQUIRE_EXACT(meshrt_attn_create(&attn, mesh, &c), MESHRT_ERROR_INVALID_ARGUMENT,
                "meshrt_attn_create: meshrt_attn_config.size is 0, expected "
                "sizeof(meshrt_attn_config_t) = " +
                    std::to_string(sizeof(meshrt_attn_config_t)) +
                    ": initialise it with MESHRT_ATTN_CONFIG_INITIALIZER");
  CAPI_REQUIRE_OK(meshrt_mesh_destroy(mesh));
}

TEST_CASE("capi validate: the blocks' sharding checks name the C fields, not flags",
          "[capi][multirank]") {
  World w(2);
  std::vector<std::string> msgs(4);
  std::vector<meshrt_status_t> sts(4, MESHRT_SUCCESS);
  run_ranks(2, [&](int r) {
    meshrt_mesh_t mesh = nullptr;
    CAPI_THROW_UNLESS_OK(meshrt_mesh_create(&mesh, w.comms[static_cast<size_t>(r)], "tp=2"));
    if (r == 0) {
      meshrt_mlp_t mlp = nullptr;
      meshrt_mlp_config_t c = small_mlp();
      c.hidden = 7;
      sts[0] = meshrt_mlp_create(&mlp, mesh, &c);
      msgs[0] = meshrt_last_error();
      c = small_mlp();
      c.ffn = 1;
      sts[1] = meshrt_mlp_create(&mlp, mesh, &c);
      msgs[1] = meshrt_last_error();
      meshrt_attn_t attn = nullptr;
      meshrt_attn_config_t a = small_attn();
      a.heads = 1;
      sts[2] = meshrt_attn_create(&attn, mesh, &a);
      msgs[2] = meshrt_last_error();
      a = small_attn();
      a.hidden = 6;
      a.heads = 3;
      sts[3] = meshrt_attn_create(&attn, mesh, &a);
      msgs[3] = meshrt_last_error();
    }
    CAPI_THROW_UNLESS_OK(meshrt_mesh_destroy(mesh));
  });
  const char* want[] = {
      "meshrt_mlp_create: block: meshrt_mlp_config.hidden 7 does not divide by tp=2; change it "
      "or the mesh",
      "meshrt_mlp_create: block: meshrt_mlp_config.ffn 1 is smaller than tp=2: every rank needs "
      "at least one column; change it or the mesh",
      "meshrt_attn_create: block: meshrt_attn_config.heads 1 do not divide by tp=2; change it or "
      "the mesh",
      "meshrt_attn_create: block: meshrt_attn_config.heads 3 do not divide by tp=2; change it or "
      "the mesh",
  };
  for (size_t i = 0; i < 4; ++i) {
    CHECK(sts[i] == MESHRT_ERROR_INVALID_ARGUMENT);
    CHECK(msgs[i] == want[i]);
    CHECK(msgs[i].find("--") == std::string::npos);
  }
}

TEST_CASE("capi validate: meshrt_comm_config_t's numbers and flags, init_all's devices", "[capi]") {
  init_api();
  meshrt_comm_t comms[2] = {nullptr, nullptr};
  meshrt_comm_config_t cfg = MESHRT_COMM_CONFIG_INITIALIZER;
  cfg.timeout_s = std::numeric_limits<double>::infinity();
  REQUIRE_EXACT(meshrt_comm_init_all(comms, 2, nullptr, &cfg), MESHRT_ERROR_INVALID_ARGUMENT,
                "meshrt_comm_init_all: meshrt_comm_config.timeout_s is inf: pass seconds up to "
                "1e9, 0 for no limit or -1 for the default");
  cfg = MESHRT_COMM_CONFIG_INITIALIZER;
  cfg.init_timeout_s = std::nan("");
  REQUIRE_EXACT(meshrt_comm_init_all(comms, 2, nullptr, &cfg), MESHRT_ERROR_INVALID_ARGUMENT,
                "meshrt_comm_init_all: meshrt_comm_config.init_timeout_s is nan: pass seconds up "
                "to 1e9, 0 for no limit or -1 for the default");
  cfg = MESHRT_COMM_CONFIG_INITIALIZER;
  cfg.init_timeout_s = 1e300;
  REQUIRE_EXACT(meshrt_comm_init_all(comms, 2, nullptr, &cfg), MESHRT_ERROR_INVALID_ARGUMENT,
                "meshrt_comm_init_all: meshrt_comm_config.init_timeout_s is 1e+300: pass seconds "
                "up to 1e9, 0 for no limit or -1 for the default");
  cfg = MESHRT_COMM_CONFIG_INITIALIZER;
  cfg.debug = 7;
  REQUIRE_EXACT(meshrt_comm_init_all(comms, 2, nullptr, &cfg), MESHRT_ERROR_INVALID_ARGUMENT,
                "meshrt_comm_init_all: meshrt_comm_config.debug is 7: pass 1 (ranks compare each "
                "call first), 0 (no) or -1 (MESHRT_COMM_DEBUG)");
  const int devices[2] = {0, 1};
  REQUIRE_EXACT(meshrt_comm_init_all(comms, 2, devices, nullptr), MESHRT_ERROR_INVALID_ARGUMENT,
                "meshrt_comm_init_all: devices is set but meshrt_comm_config.device_type is "
                "MESHRT_DEVICE_CPU: pass NULL for CPU ranks, or MESHRT_DEVICE_CUDA for GPUs");
  CHECK(comms[0] == nullptr);
  CHECK(comms[1] == nullptr);
}

// n and nranks are bounded (1..1024, as --devices cpu:N) and n is checked before comms[0..n) is
// written: a garbage n used to write NULLs far past the engine's array before any check.
TEST_CASE("capi validate: init_all's n and init_rank's nranks are bounded before use", "[capi]") {
  init_api();
  meshrt_comm_t sentinel = reinterpret_cast<meshrt_comm_t>(&sentinel);
  meshrt_comm_t comms[2] = {sentinel, sentinel};
  for (int n : {1025, std::numeric_limits<int>::max(), -1}) {
    REQUIRE_EXACT(meshrt_comm_init_all(comms, n, nullptr, nullptr), MESHRT_ERROR_INVALID_ARGUMENT,
                  "meshrt_comm_init_all: n is " + std::to_string(n) +
                      ": pass 1..1024 (the ranks of one process, each a thread)");
    CHECK(comms[0] == sentinel);
    CHECK(comms[1] == sentinel);
  }
  meshrt_unique_id_t id;
  CAPI_REQUIRE_OK(meshrt_get_unique_id(&id));
  meshrt_comm_t c = nullptr;
  REQUIRE_EXACT(meshrt_comm_init_rank(&c, std::numeric_limits<int>::max(), id, 0, nullptr),
                MESHRT_ERROR_INVALID_ARGUMENT,
                "meshrt_comm_init_rank: nranks is 2147483647: pass 1..1024 (the ranks of one "
                "process, each a thread)");
  CHECK(c == nullptr);
}

// A process world's nranks is bounded before its transport sizes tables by it: INT_MAX used to
// end in MESHRT_ERROR_OUT_OF_MEMORY (std::bad_alloc) instead of naming the argument.
TEST_CASE("capi validate: init_file and init_tcp refuse nranks past 2^20 before allocating",
          "[capi]") {
  init_api();
  meshrt_comm_t c = nullptr;
  const std::string dir = std::filesystem::temp_directory_path().string();
  REQUIRE_EXACT(meshrt_comm_init_file(&c, dir.c_str(), std::numeric_limits<int>::max(), 0, nullptr),
                MESHRT_ERROR_INVALID_ARGUMENT,
                "meshrt_comm_init_file: nranks is 2147483647: pass 1..1048576 (the processes of "
                "the world)");
  REQUIRE_EXACT(meshrt_comm_init_tcp(&c, "127.0.0.1", 1, (1 << 20) + 1, 0, nullptr),
                MESHRT_ERROR_INVALID_ARGUMENT,
                "meshrt_comm_init_tcp: nranks is 1048577: pass 1..1048576 (the processes of the "
                "world)");
  REQUIRE_EXACT(meshrt_comm_init_file(&c, dir.c_str(), 0, 0, nullptr),
                MESHRT_ERROR_INVALID_ARGUMENT,
                "meshrt_comm_init_file: nranks is 0: pass 1..1048576 (the processes of the world)");
  CHECK(c == nullptr);
}

// Found by probing every call with bad input: each handle kind destroyed twice, and handles
// used after the communicator that made them was destroyed, get a status, never a crash.
TEST_CASE("capi validate: double destroys and use after the communicator's destroy", "[capi]") {
  init_api();
  meshrt_comm_t comm = nullptr;
  CAPI_REQUIRE_OK(meshrt_comm_init_all(&comm, 1, nullptr, nullptr));
  meshrt_stream_t s = nullptr, ds = nullptr;
  CAPI_REQUIRE_OK(meshrt_stream_create(comm, &s));
  CAPI_REQUIRE_OK(meshrt_comm_default_stream(comm, &ds));
  const int64_t shape[1] = {4};
  meshrt_tensor_t t = nullptr;
  DLDataType f32;
  f32.code = kDLFloat;
  f32.bits = 32;
  f32.lanes = 1;
  CAPI_REQUIRE_OK(meshrt_tensor_empty(comm, 1, shape, f32, &t));
  meshrt_event_t ev = nullptr;
  CAPI_REQUIRE_OK(meshrt_all_reduce(comm, t, t, MESHRT_SUM, s, &ev));
  meshrt_mesh_t mesh = nullptr;
  CAPI_REQUIRE_OK(meshrt_mesh_create(&mesh, comm, "dp=1"));
  meshrt_comm_t dp = nullptr;
  CAPI_REQUIRE_OK(meshrt_mesh_comm(mesh, "dp", &dp));
  CHECK(meshrt_stream_destroy(ds) == MESHRT_ERROR_INVALID_USAGE);
  CHECK(meshrt_comm_destroy(dp) == MESHRT_ERROR_INVALID_USAGE);
  CAPI_REQUIRE_OK(meshrt_comm_destroy(comm));
  CHECK(meshrt_comm_destroy(comm) == MESHRT_ERROR_INVALID_USAGE);
  // What the engine created from the communicator lives on until it destroys it.
  CAPI_REQUIRE_OK(meshrt_stream_synchronize(s));
  CAPI_REQUIRE_OK(meshrt_event_synchronize(ev));
  CAPI_REQUIRE_OK(meshrt_barrier(dp, nullptr, nullptr));
  // The default stream went with the communicator.
  CHECK(meshrt_stream_synchronize(ds) == MESHRT_ERROR_INVALID_USAGE);
  CAPI_REQUIRE_OK(meshrt_event_destroy(ev));
  CHECK(meshrt_event_destroy(ev) == MESHRT_ERROR_INVALID_USAGE);
  CAPI_REQUIRE_OK(meshrt_stream_destroy(s));
  CHECK(meshrt_stream_destroy(s) == MESHRT_ERROR_INVALID_USAGE);
  CAPI_REQUIRE_OK(meshrt_mesh_destroy(mesh));
  CHECK(meshrt_mesh_destroy(mesh) == MESHRT_ERROR_INVALID_USAGE);
  CHECK(meshrt_barrier(dp, nullptr, nullptr) == MESHRT_ERROR_INVALID_USAGE);
  CAPI_REQUIRE_OK(meshrt_tensor_destroy(t));
  CHECK(meshrt_tensor_destroy(t) == MESHRT_ERROR_INVALID_USAGE);
}

// A rank thread the system refuses (ulimit -u, ulimit -v) is MESHRT_ERROR_SYSTEM with the
// reason, not std::terminate; the threads already started are joined and no handle is left.
TEST_CASE("capi validate: init_all whose rank thread cannot start fails with a status", "[capi]") {
  init_api();
  meshrt_comm_t comms[4] = {nullptr, nullptr, nullptr, nullptr};
  meshrt::detail::fail_thread_start("meshrt_comm_init_all", 2);
  const meshrt_status_t st = meshrt_comm_init_all(comms, 4, nullptr, nullptr);
  meshrt::detail::fail_thread_start("", -1);
  REQUIRE_EXACT(st, MESHRT_ERROR_SYSTEM,
                "meshrt_comm_init_all: could not start thread 3 of 4 for the ranks of "
                "meshrt_comm_init_all: Resource temporarily unavailable; lower n or raise "
                "ulimit -u / ulimit -v");
  for (meshrt_comm_t c : comms) CHECK(c == nullptr);
  // The next call starts its threads.
  CAPI_REQUIRE_OK(meshrt_comm_init_all(comms, 4, nullptr, nullptr));
  for (meshrt_comm_t c : comms) CAPI_REQUIRE_OK(meshrt_comm_destroy(c));
}

TEST_CASE("capi validate: backend refusals name meshrt_comm_config's fields", "[capi]") {
  init_api();
  meshrt_comm_t comms[2] = {nullptr, nullptr};
  meshrt_comm_config_t cfg = MESHRT_COMM_CONFIG_INITIALIZER;
  cfg.backend = "shm";
  REQUIRE_EXACT(meshrt_comm_init_all(comms, 2, nullptr, &cfg), MESHRT_ERROR_UNSUPPORTED,
                "meshrt_comm_init_all: meshrt_comm_config.backend shm cannot run 2 ranks as "
                "threads on cpu: its ranks are processes; ranks that are threads of one process "
                "share memory already (host backend)");
}

TEST_CASE("capi validate: DLPack devices: kDLCPU is device 0, kDLCUDA ids are checked", "[capi]") {
  init_api();
  meshrt_tensor_t t = nullptr;
  Buf cpu1(dl_dtype(kDLFloat, 32), 4);
  cpu1.dl()->device.device_id = 1;
  REQUIRE_EXACT(meshrt_tensor_from_dltensor(cpu1.dl(), &t), MESHRT_ERROR_INVALID_ARGUMENT,
                "meshrt_tensor_from_dltensor: DLTensor device is kDLCPU with device_id 1: DLPack "
                "has one CPU device, whose device_id is 0; pass 0");
  CHECK(t == nullptr);
  cpu1.dl()->device.device_id = -3;
  REQUIRE_EXACT(meshrt_tensor_from_dltensor(cpu1.dl(), &t), MESHRT_ERROR_INVALID_ARGUMENT,
                "meshrt_tensor_from_dltensor: DLTensor device is kDLCPU with device_id -3: DLPack "
                "has one CPU device, whose device_id is 0; pass 0");
  // The managed forms take the same path (and leave the tensor to the caller on failure).
  DLManagedTensor m{};
  m.dl_tensor = *cpu1.dl();
  REQUIRE_EXACT(meshrt_tensor_from_dlpack(&m, &t), MESHRT_ERROR_INVALID_ARGUMENT,
                "meshrt_tensor_from_dlpack: DLTensor device is kDLCPU with device_id -3: DLPack "
                "has one CPU device, whose device_id is 0; pass 0");
  Buf cuda(dl_dtype(kDLFloat, 32), 4);
  cuda.dl()->device.device_type = kDLCUDA;
  cuda.dl()->device.device_id = -1;
  REQUIRE_EXACT(meshrt_tensor_from_dltensor(cuda.dl(), &t), MESHRT_ERROR_INVALID_ARGUMENT,
                "meshrt_tensor_from_dltensor: DLTensor device is kDLCUDA with device_id -1: pass "
                "the index of the GPU holding the memory (>= 0)");
#if !defined(MESHRT_WITH_CUDA)
  // Without a CUDA backend the id is checked where the tensor is used, against the
  // communicator's device.
  World w(1);
  cuda.dl()->device.device_id = 7;
  CAPI_REQUIRE_OK(meshrt_tensor_from_dltensor(cuda.dl(), &t));
  require_status(meshrt_all_reduce(w.comms[0], t, t, MESHRT_SUM, nullptr, nullptr),
                 MESHRT_ERROR_INVALID_ARGUMENT, {"is on cuda:7", "runs on cpu:0"});
  CAPI_REQUIRE_OK(meshrt_tensor_destroy(t));
#endif
}
