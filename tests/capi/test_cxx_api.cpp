// The public C++ API (include/meshrt/*.hpp) over the C API: what an engine needs from it (point to
// point, abort, the device, the default stream, the process inits, stream wrapping, the mesh's
// shape, DLPack 1.0), borrowed communicators (Mesh::comm), release() and explicit destroy, and
// errors naming the C call. This file includes only the installed headers (plus Catch2 and the
// tests' helpers), as an engine would.
#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "meshrt/meshrt.hpp"
#include "tests/common/env.h"
#include "tests/common/files.h"

namespace {

// Runs fn(rank) on one thread per communicator; returns the first error's text ("" when none).
template <class F>
std::string on_ranks(std::vector<meshrt::Comm>& comms, F fn) {
  std::vector<std::string> errs(comms.size());
  std::vector<std::thread> ts;
  for (size_t r = 0; r < comms.size(); ++r) {
    ts.emplace_back([&, r] {
      try {
        fn(static_cast<int>(r), comms[r]);
      } catch (const std::exception& e) {
        errs[r] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  for (const auto& e : errs)
    if (!e.empty()) return e;
  return "";
}

meshrt_status_t status_of(const std::function<void()>& f, std::string* what = nullptr) {
  try {
    f();
  } catch (const meshrt::Error& e) {
    if (what) *what = e.what();
    return e.status();
  }
  return MESHRT_SUCCESS;
}

}  // namespace

TEST_CASE("cxx api: send / recv, the device, the default stream and abort", "[capi]") {
  std::vector<meshrt::Comm> comms = meshrt::Comm::init_all(2);
  REQUIRE(comms.size() == 2);
  std::vector<float> got(4, 0.0f);
  const std::string err = on_ranks(comms, [&](int r, meshrt::Comm& c) {
    const meshrt::Device d = c.device();
    if (d.type != MESHRT_DEVICE_CPU || d.index != r) throw std::runtime_error("device");
    std::vector<float> mine = {1.0f + r, 2.0f + r, 3.0f + r, 4.0f + r};
    meshrt::Tensor t = meshrt::Tensor::borrow_cpu(r == 0 ? mine.data() : got.data(), {4});
    if (r == 0) c.send(t, 1).synchronize();
    if (r == 1) c.recv(t, 0).synchronize();
    // The default stream is borrowed: usable, never destroyed by the object.
    meshrt::Stream ds = c.default_stream();
    if (ds.owned() || !ds) throw std::runtime_error("default stream owned");
    meshrt::Tensor x = meshrt::Tensor::borrow_cpu(mine.data(), {4});
    c.all_reduce(x, x, MESHRT_SUM, &ds).synchronize();
    if (mine[0] != 3.0f) throw std::runtime_error("all_reduce on the default stream");
  });
  REQUIRE(err == "");
  CHECK(got == std::vector<float>{1, 2, 3, 4});
  // The default stream outlived the Stream objects above (borrowed, never destroyed).
  comms[0].default_stream().synchronize();

  // abort: rank 0's pending and later work fails with a comm status.
  comms[0].abort();
  std::vector<float> v(4, 1.0f);
  meshrt::Tensor t = meshrt::Tensor::borrow_cpu(v.data(), {4});
  std::string what;
  const meshrt_status_t st = status_of([&] { comms[0].all_reduce(t, t).synchronize(); }, &what);
  CHECK(st == MESHRT_ERROR_COMM);
  CHECK(what.find("meshrt_all_reduce") == 0);
  CHECK(what.find("aborted by the application") != std::string::npos);
}

TEST_CASE("cxx api: Mesh::comm is a borrowed Comm that runs collectives", "[capi]") {
  std::vector<meshrt::Comm> comms = meshrt::Comm::init_all(2);
  std::vector<meshrt::Mesh> meshes(2);
  const std::string err = on_ranks(comms, [&](int r, meshrt::Comm& c) {
    meshes[static_cast<size_t>(r)] = meshrt::Mesh(c, "dp=1,tp=2");
    const meshrt::Mesh& m = meshes[static_cast<size_t>(r)];
    if (m.ndim() != 2 || m.world_size() != 2) throw std::runtime_error("mesh shape");
    std::vector<int32_t> v = {r + 1, 10 * (r + 1)};
    meshrt::Tensor t = meshrt::Tensor::borrow_cpu(v.data(), {2});
    {
      meshrt::Comm tp = m.comm("tp");  // no wrapping: collectives run on it
      if (tp.owned() || tp.size() != 2) throw std::runtime_error("tp comm");
      tp.all_reduce(t, t).synchronize();
    }  // the borrowed Comm is let go, not destroyed (the mesh owns it)
    // Still the mesh's live communicator: the same handle, usable.
    meshrt::Comm again = m.comm("tp");
    again.all_reduce(t, t).synchronize();
    if (v != std::vector<int32_t>{6, 60}) throw std::runtime_error("values");
  });
  REQUIRE(err == "");
}

TEST_CASE("cxx api: release gives the handle up, destroy throws meshrt's refusal", "[capi]") {
  std::vector<meshrt::Comm> comms = meshrt::Comm::init_all(1);
  meshrt_comm_t h = comms[0].release();
  CHECK(!comms[0]);
  int size = 0;
  REQUIRE(meshrt_comm_size(h, &size) == MESHRT_SUCCESS);  // still live: the caller owns it
  CHECK(size == 1);
  meshrt::Comm owner(h);
  meshrt::Mesh mesh(owner, "tp=1");
  // Wrapping the mesh's communicator in an owning Comm: destroy() reports the refusal that the
  // destructor had to ignore silently.
  meshrt_comm_t tp = mesh.comm("tp").get();
  meshrt::Comm wrong(tp);
  std::string what;
  CHECK(status_of([&] { wrong.destroy(); }, &what) == MESHRT_ERROR_INVALID_USAGE);
  CHECK(what.find("meshrt_comm_destroy: invalid usage:") == 0);
  CHECK(what.find("owned by the mesh") != std::string::npos);
  CHECK(!wrong);
  owner.destroy();  // an owned one: destroyed now, without error
  CHECK(!owner);
}

TEST_CASE("cxx api: file and launcher-variable inits, a world of one", "[capi]") {
  const std::string dir = meshrt::test::scratch_dir("cxx-init").string();
  meshrt::Comm f = meshrt::Comm::init_file(dir, 1, 0);
  CHECK(f.size() == 1);
  {
    meshrt::test::ScopedEnv env({{"RANK", "0"},
                                 {"WORLD_SIZE", "1"},
                                 {"MASTER_ADDR", nullptr},
                                 {"MESHRT_RENDEZVOUS", ("file://" + dir).c_str()}});
    meshrt::Comm e = meshrt::Comm::init_env();
    CHECK(e.rank() == 0);
    CHECK(e.size() == 1);
  }
  std::string what;
  {
    meshrt::test::ScopedEnv env({{"RANK", nullptr}, {"WORLD_SIZE", nullptr}});
    CHECK(status_of([&] { meshrt::Comm::init_env(); }, &what) == MESHRT_ERROR_INVALID_USAGE);
    INFO(what);
    CHECK(what.find("meshrt_comm_init_env: invalid usage: meshrt_comm_init_env: no launcher "
                    "started this process") == 0);
  }
  {
    meshrt::test::ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "x"}});
    CHECK(status_of([&] { meshrt::Comm::init_env(); }, &what) == MESHRT_ERROR_INVALID_ARGUMENT);
    CHECK(what.find("WORLD_SIZE='x' is not a whole number in [1, 1048576]") != std::string::npos);
  }
  {
    meshrt::test::ScopedEnv env({{"RANK", "0"},
                                 {"WORLD_SIZE", "2"},
                                 {"MESHRT_RENDEZVOUS", nullptr},
                                 {"MASTER_ADDR", "127.0.0.1"},
                                 {"MASTER_PORT", "70000"}});
    CHECK(status_of([&] { meshrt::Comm::init_env(); }, &what) == MESHRT_ERROR_INVALID_ARGUMENT);
    CHECK(what.find("MASTER_PORT: '70000' is not a TCP port") != std::string::npos);
  }
  // init_tcp passes its arguments through (the C API checks them; two processes over TCP are
  // test_capi_file.cpp's).
  CHECK(status_of([&] { meshrt::Comm::init_tcp("127.0.0.1", 0, 2, 0); }, &what) ==
        MESHRT_ERROR_INVALID_ARGUMENT);
  CHECK(what.find("meshrt_comm_init_tcp: invalid argument: meshrt_comm_init_tcp: port is 0") == 0);
  // A CPU communicator has no native stream to wrap.
  CHECK(status_of([&] { f.wrap_stream(nullptr); }, &what) == MESHRT_ERROR_UNSUPPORTED);
  CHECK(what.find("meshrt_stream_wrap: unsupported:") == 0);
}

TEST_CASE("cxx api: DLPack 1.0 out and back in, block errors name the C call", "[capi]") {
  std::vector<meshrt::Comm> comms = meshrt::Comm::init_all(1);
  meshrt::Tensor t = comms[0].empty({3}, DLDataType{kDLFloat, 32, 1});
  ::DLManagedTensorVersioned* v = t.to_dlpack_versioned();
  REQUIRE(v != nullptr);
  meshrt::Tensor back = meshrt::Tensor::adopt(v);  // its deleter runs when meshrt lets go
  CHECK(static_cast<bool>(back));

  meshrt::Mesh mesh(comms[0], "tp=1");
  meshrt_mlp_config_t cfg = meshrt::mlp_config();
  cfg.bias = 5;
  std::string what;
  CHECK(status_of([&] { meshrt::Mlp mlp(mesh, cfg); }, &what) == MESHRT_ERROR_INVALID_ARGUMENT);
  // It said "meshrt block create: ...".
  CHECK(what.find("meshrt_mlp_create: invalid argument: ") == 0);
  meshrt_attn_config_t acfg = meshrt::attn_config();
  acfg.causal = 3;
  CHECK(status_of([&] { meshrt::Attention a(mesh, acfg); }, &what) ==
        MESHRT_ERROR_INVALID_ARGUMENT);
  CHECK(what.find("meshrt_attn_create: invalid argument: ") == 0);
}
