// Bootstrap: launch decisions from the environment, Launch::run, the backend registry and the
// file rendezvous transport.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include "coll_test_util.h"
#include "collectives/bootstrap.h"
#include "collectives/bootstrap_transport.h"
#include "runtime/affinity.h"
#include "runtime/backend.h"
#include "runtime/logging.h"
#include "runtime/stop.h"
#include "runtime/stream.h"
#include "runtime/thread.h"
#include "tests/common/env.h"
#include "tests/common/net.h"

using namespace meshrt;
using namespace meshrt::test;
namespace fs = std::filesystem;

namespace {

using meshrt::test::ScopedEnv;

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() /
               ("meshrt-test-" + name + "-" + std::to_string(getpid()) + "-" +
                std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST_CASE("bootstrap: --devices cpu:3 runs three host ranks as threads", "[multirank]") {
  LaunchOptions lo;
  lo.devices = "cpu:3";
  auto launch = bootstrap(lo);
  CHECK(launch->kind() == LaunchKind::Threads);
  CHECK(launch->backend() == "host");
  CHECK(launch->world_size() == 3);
  REQUIRE(launch->local().size() == 3);
  CHECK(launch->local()[2].device == Device::cpu(2));
  CHECK(launch->describe() == "3 ranks as threads of this process, host backend");
  Failures f;
  std::atomic<int> ran{0};
  launch->run([&](const RankPlacement& p, Communicator& c) {
    if (c.rank() != p.rank || c.size() != 3 || p.local_rank != p.rank) f.add("placement");
    auto s = make_host_stream("comm");
    Tensor t = host_tensor(10, DType::i32);
    fill_pattern(t, 4, p.rank);
    c.all_reduce(t, ReduceOp::Sum, *s).synchronize();
    check_values(f, "sum", t, 0, 10,
                 [&](int64_t i) { return reduced(DType::i32, ReduceOp::Sum, 4, 3, i); });
    ++ran;
  });
  CHECK(ran == 3);
  INFO(f.str());
  CHECK(f.count() == 0);
}

TEST_CASE("bootstrap: a failing rank aborts the others and its error is rethrown", "[multirank]") {
  LaunchOptions lo;
  lo.devices = "cpu:3";
  lo.config.timeout_s = 300;  // the others must not wait for the watchdog
  auto launch = bootstrap(lo);
  auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(launch->run([&](const RankPlacement& p, Communicator& c) {
    if (p.rank == 1) throw Error("rank one broke");
    auto s = make_host_stream("comm");
    Tensor t = host_tensor(4, DType::f32);
    c.all_reduce(t, ReduceOp::Sum, *s).synchronize();
  }),
                    Catch::Contains("rank one broke"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

// A rank thread the system refuses (--devices cpu:64 under a low ulimit -u) ends the launch with
// that error; no rank ran, and the threads started are joined (no std::terminate, no hang). A
// stream worker a rank cannot start fails that rank like any error: the others are aborted.
TEST_CASE("bootstrap: a rank or stream thread that cannot start is a clear error", "[multirank]") {
  LaunchOptions lo;
  lo.devices = "cpu:4";
  lo.config.timeout_s = 300;
  auto launch = bootstrap(lo);
  std::atomic<int> ran{0};
  detail::fail_thread_start("the ranks", 2);
  try {
    launch->run([&](const RankPlacement&, Communicator&) { ++ran; });
    FAIL("no error");
  } catch (const SystemError& e) {
    CHECK(e.message() ==
          "could not start thread 3 of 4 for the ranks: Resource temporarily unavailable; lower "
          "--devices or raise ulimit -u / ulimit -v");
  }
  detail::fail_thread_start("", -1);
  CHECK(ran == 0);
  auto again = bootstrap(lo);
  detail::fail_thread_start("stream 'rank2'", 0);
  try {
    again->run([&](const RankPlacement& p, Communicator& c) {
      auto s = make_host_stream("rank" + std::to_string(p.rank));
      Tensor t = host_tensor(4, DType::f32);
      c.all_reduce(t, ReduceOp::Sum, *s).synchronize();
    });
    FAIL("no error");
  } catch (const SystemError& e) {
    CHECK(e.message() ==
          "could not start the worker thread of stream 'rank2': Resource temporarily "
          "unavailable; run fewer ranks or raise ulimit -u / ulimit -v");
  }
  detail::fail_thread_start("", -1);
}

TEST_CASE("bootstrap: backends that cannot work are refused with what to change", "[multirank]") {
  LaunchOptions lo;
  lo.devices = "cpu:2";
  lo.backend = "mpi";
  CHECK_THROWS_WITH(bootstrap(lo), Catch::Contains("launch with mpirun"));
  lo.backend = "nccl";
#if defined(MESHRT_WITH_CUDA)
  CHECK_THROWS_WITH(bootstrap(lo), Catch::Contains("needs CUDA devices"));
#else
  CHECK_THROWS_WITH(bootstrap(lo),
                    Catch::Contains("unknown collective backend 'nccl'") &&
                        Catch::Contains("this build has host, mpi, shm, tcp, hier (or auto)"));
#endif
  lo.backend = "gloo";
  CHECK_THROWS_WITH(bootstrap(lo), Catch::Contains("unknown collective backend 'gloo'") &&
                                       Catch::Contains("this build has host, mpi"));
  lo.backend = "auto";
  lo.devices = "tpu:4";
  CHECK_THROWS_WITH(bootstrap(lo), Catch::Contains("unknown device kind"));
  std::string why;
  if (!cuda_available(&why)) {
    lo.devices = "cuda:0-1";
    CHECK_THROWS_WITH(bootstrap(lo), Catch::Contains("CUDA is unavailable") &&
                                         Catch::Contains("use --devices cpu:N"));
  }
}

TEST_CASE("bootstrap: torchrun-style RANK / WORLD_SIZE", "[multirank]") {
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MESHRT_RENDEZVOUS", nullptr}});
    auto launch = bootstrap(LaunchOptions{});
    CHECK(launch->kind() == LaunchKind::EnvProcesses);
    CHECK(launch->world_size() == 1);
    CHECK(launch->backend() == "host");
    launch->run([](const RankPlacement&, Communicator& c) {
      auto s = make_host_stream("comm");
      Tensor t = host_tensor(3, DType::f32);
      c.all_reduce(t, ReduceOp::Sum, *s).synchronize();
    });
  }
  {
    ScopedEnv env({{"RANK", "1"},
                   {"WORLD_SIZE", "2"},
                   {"MESHRT_RENDEZVOUS", nullptr},
                   {"MASTER_ADDR", nullptr},
                   {"MASTER_PORT", nullptr}});
    CHECK_THROWS_WITH(bootstrap(LaunchOptions{}),
                      Catch::Contains("set MASTER_ADDR and MASTER_PORT") &&
                          Catch::Contains("MESHRT_RENDEZVOUS=file:///shared/dir"));
  }
  {
    // Refused before the rendezvous sizes its tables by the world (2^30 ran out of memory).
    fs::path d = fresh_dir("torchrun_huge");
    std::string uri = "file://" + d.string();
    const std::string huge = std::to_string(kMaxProcessRanks + 1);
    ScopedEnv env(
        {{"RANK", "0"}, {"WORLD_SIZE", huge.c_str()}, {"MESHRT_RENDEZVOUS", uri.c_str()}});
    CHECK_THROWS_WITH(bootstrap(LaunchOptions{}),
                      Catch::Contains("WORLD_SIZE=" + huge + " is outside 1.." +
                                      std::to_string(kMaxProcessRanks)));
    CHECK(fs::is_empty(d));
    fs::remove_all(d);
  }
  {
    ScopedEnv env({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MESHRT_RENDEZVOUS", nullptr}});
    CHECK_THROWS_WITH(
        bootstrap(LaunchOptions{}),
        Catch::Contains("RANK=2 is outside WORLD_SIZE=2") && Catch::Contains("0 .. WORLD_SIZE-1"));
  }
  {
    fs::path d = fresh_dir("torchrun");
    std::string uri = "file://" + d.string();
    ScopedEnv env({{"RANK", "1"},
                   {"WORLD_SIZE", "2"},
                   {"LOCAL_RANK", "1"},
                   {"MESHRT_RENDEZVOUS", uri.c_str()}});
    CHECK(rendezvous_dir_from_env() == d.string());
    std::string host;
    int port = 0;
    CHECK_FALSE(rendezvous_tcp_from_env(&host, &port));  // file:// wins over MASTER_*
    fs::remove_all(d);
  }
  {
    ScopedEnv env({{"MESHRT_RENDEZVOUS", "tcp://127.0.0.1:29500"}});
    CHECK(rendezvous_dir_from_env().empty());
    std::string host;
    int port = 0;
    REQUIRE(rendezvous_tcp_from_env(&host, &port));
    CHECK(host == "127.0.0.1");
    CHECK(port == 29500);
  }
  {
    // torchrun's variables: MASTER_PORT is torch's store, meshrt listens on the next port.
    ScopedEnv env(
        {{"MESHRT_RENDEZVOUS", nullptr}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}});
    std::string host;
    int port = 0;
    REQUIRE(rendezvous_tcp_from_env(&host, &port));
    CHECK(host == "127.0.0.1");
    CHECK(port == 29501);
  }
  for (const char* bad : {"0", "x", "65535", "70000"}) {
    ScopedEnv env(
        {{"MESHRT_RENDEZVOUS", nullptr}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", bad}});
    std::string host;
    int port = 0;
    CHECK_THROWS_WITH(rendezvous_tcp_from_env(&host, &port), Catch::Contains("MASTER_PORT"));
  }
  {
    ScopedEnv env({{"MESHRT_RENDEZVOUS", "udp://host:29500"}});
    CHECK_THROWS_WITH(rendezvous_dir_from_env(),
                      Catch::Contains("use file:///") && Catch::Contains("tcp://host:port"));
  }
  {
    ScopedEnv env({{"MESHRT_RENDEZVOUS", "tcp://nohost"}});
    std::string host;
    int port = 0;
    CHECK_THROWS_WITH(rendezvous_tcp_from_env(&host, &port), Catch::Contains("tcp://host:port"));
  }
}

TEST_CASE("file rendezvous: every rank gets every blob, stale files and missing ranks are named",
          "[multirank]") {
  fs::path d = fresh_dir("rdzv");
  const int n = 4;
  std::vector<std::vector<std::string>> got(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      // Ranks arrive at different times.
      std::this_thread::sleep_for(std::chrono::milliseconds(15 * r));
      got[static_cast<size_t>(r)] =
          make_file_transport(d.string(), r, n, 10, "run1")
              ->all_gather("blob", "payload-" + std::to_string(r) + std::string(3, '\0'));
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) {
    REQUIRE(got[static_cast<size_t>(r)].size() == static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      CHECK(got[static_cast<size_t>(r)][static_cast<size_t>(j)] ==
            "payload-" + std::to_string(j) + std::string(3, '\0'));
    }
  }
  // Nothing is left behind: the next launch in this directory with the same run id works.
  CHECK(fs::is_empty(d));
  {
    std::vector<std::thread> again;
    std::vector<std::string> first(n);
    for (int r = 0; r < n; ++r) {
      again.emplace_back([&, r] {
        first[static_cast<size_t>(r)] =
            make_file_transport(d.string(), r, n, 10, "run1")->all_gather("blob", "b").at(0);
      });
    }
    for (auto& t : again) t.join();
    for (auto& f : first) CHECK(f == "b");
    CHECK(fs::is_empty(d));
  }
  // A file a killed job really left behind is still refused.
  { std::ofstream(d / "meshrt.run1.blob.0") << "stale"; }
  CHECK_THROWS_WITH(make_file_transport(d.string(), 0, n, 1, "run1")->all_gather("blob", "x"),
                    Catch::Contains("left by an earlier job"));
  fs::remove(d / "meshrt.run1.blob.0");
  // Ranks 2 and 3 never come: rank 0 gives up at the deadline, naming them.
  std::vector<std::string> errs(2);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> late;
  for (int r = 0; r < 2; ++r) {
    late.emplace_back([&, r] {
      try {
        make_file_transport(d.string(), r, n, 0.5, "run2")->all_gather("lonely", "x");
      } catch (const CommError& e) {
        errs[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : late) t.join();
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(dt < 3.0);
  for (auto& e : errs) CHECK_THAT(e, Catch::Contains("ranks 2, 3 never wrote"));
  // The ranks that gave up removed their files too.
  CHECK(fs::is_empty(d));
  CHECK_THROWS_WITH(make_file_transport((d / "nope").string(), 0, 1, 1)->all_gather("k", "x"),
                    Catch::Contains("does not exist"));
  std::ofstream(d / "file") << "x";
  CHECK_THROWS_WITH(make_file_transport((d / "file").string(), 0, 1, 1)->all_gather("k", "x"),
                    Catch::Contains("' is not a directory"));
  fs::remove_all(d);
}

TEST_CASE("tcp rendezvous: a stop request (SIGINT / SIGTERM) ends the accept and connect waits",
          "[multirank]") {
  // Before, both waits ignored it and ran until the timeout (then named the missing ranks).
  struct Clear {
    ~Clear() { clear_stop_request(); }
  } clear;
  const int port = unused_port();
  REQUIRE(port > 0);
  const std::string at = "127.0.0.1:" + std::to_string(port);
  // Rank 0 of 2 listening (rank 1 never comes): the request arrives while it waits.
  std::string err0;
  std::thread rank0([&] {
    try {
      make_tcp_transport("127.0.0.1", port, 0, 2, 30);
    } catch (const CommError& e) {
      err0 = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  request_stop(SIGTERM);
  rank0.join();
  CHECK_THAT(err0, Catch::Contains("rendezvous: stopped by signal 15 (Terminated) while waiting "
                                   "for rank 1 to connect to " +
                                   at));
  clear_stop_request();
  // Rank 1 of 2 connecting to a port nothing listens on: it retries until the request.
  std::string err1;
  std::thread rank1([&] {
    try {
      make_tcp_transport("127.0.0.1", unused_port(), 1, 2, 30);
    } catch (const CommError& e) {
      err1 = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  request_stop(SIGINT);
  rank1.join();
  CHECK_THAT(err1, Catch::Contains("rendezvous: stopped by signal 2 (Interrupt) while waiting for "
                                   "rank 0 at 127.0.0.1:"));
}

TEST_CASE("backend registry: exactly the backends this build compiles, in order", "[unit]") {
  std::vector<std::string> names;
  for (const CommBackend& b : collective_backends()) names.push_back(b.name);
#if defined(MESHRT_WITH_CUDA)
  const std::vector<std::string> expected = {"host", "mpi", "shm", "tcp", "hier", "nccl"};
#else
  const std::vector<std::string> expected = {"host", "mpi", "shm", "tcp", "hier"};
#endif
  CHECK(names == expected);
  CHECK(collective_backend_names() ==
        (expected.size() == 6 ? "host, mpi, shm, tcp, hier, nccl" : "host, mpi, shm, tcp, hier"));
  for (const std::string& n : expected) CHECK(find_collective_backend(n).name == n);
  CHECK_THROWS_WITH(find_collective_backend("gloo"),
                    Catch::Contains("unknown collective backend 'gloo'") &&
                        Catch::Contains("this build has " + collective_backend_names()));
}

TEST_CASE("backend registry: auto picks the highest-priority backend that serves the launch",
          "[unit]") {
  auto plan_of = [](LaunchKind kind, DeviceType dt, int world) {
    WorldPlan p;
    p.kind = kind;
    p.device_type = dt;
    p.world_size = world;
    RankPlacement r;
    r.world_size = world;
    r.device = dt == DeviceType::CPU ? Device::cpu(0) : Device::cuda(0);
    p.local.push_back(r);
    return p;
  };
  CHECK(choose_collective_backend("auto", plan_of(LaunchKind::Threads, DeviceType::CPU, 4)).name ==
        "host");
  CHECK(choose_collective_backend("", plan_of(LaunchKind::MpiProcesses, DeviceType::CPU, 1)).name ==
        "mpi");
  CHECK(choose_collective_backend("auto", plan_of(LaunchKind::EnvProcesses, DeviceType::CPU, 1))
            .name == "host");
  // CPU processes of one node (torchrun-style or under mpirun) share memory: the shm backend.
  auto on_one_node = [&](LaunchKind kind, int world) {
    WorldPlan p = plan_of(kind, DeviceType::CPU, world);
    p.local[0].local_size = world;
    return p;
  };
  CHECK(choose_collective_backend("auto", on_one_node(LaunchKind::EnvProcesses, 3)).name == "shm");
  CHECK(choose_collective_backend("auto", on_one_node(LaunchKind::MpiProcesses, 2)).name == "shm");
  CHECK(choose_collective_backend("mpi", on_one_node(LaunchKind::MpiProcesses, 2)).name == "mpi");
  // Under mpirun across nodes: two levels (shm in each node, MPI between them); --backend mpi
  // keeps the flat MPI path. One node is the shm backend's, not two levels'.
  CHECK(choose_collective_backend("auto", plan_of(LaunchKind::MpiProcesses, DeviceType::CPU, 2))
            .name == "hier");
  CHECK(choose_collective_backend("mpi", plan_of(LaunchKind::MpiProcesses, DeviceType::CPU, 2))
            .name == "mpi");
  CHECK_THROWS_WITH(choose_collective_backend("hier", on_one_node(LaunchKind::MpiProcesses, 2)),
                    Catch::Contains("hier cannot run rank 0 of 2 as mpi-processes") &&
                        Catch::Contains("the shm backend serves one node") &&
                        Catch::Contains("MESHRT_NODE_ID"));
  CHECK_THROWS_WITH(choose_collective_backend("shm", on_one_node(LaunchKind::Threads, 2)),
                    Catch::Contains("--backend shm cannot run 2 ranks as threads on cpu") &&
                        Catch::Contains("share memory already (host backend)"));
  // Torchrun-style processes across nodes (met over TCP or files, no MPI): two levels, shm in
  // each node and the tcp backend between them; forced, tcp runs them flat, and shm refuses
  // naming the backend that serves several nodes.
  CHECK(choose_collective_backend("auto", plan_of(LaunchKind::EnvProcesses, DeviceType::CPU, 3))
            .name == "hier");
  CHECK(choose_collective_backend("tcp", plan_of(LaunchKind::EnvProcesses, DeviceType::CPU, 3))
            .name == "tcp");
  CHECK_THROWS_WITH(
      choose_collective_backend("shm", plan_of(LaunchKind::EnvProcesses, DeviceType::CPU, 3)),
      Catch::Contains("shm cannot run rank 0 of 3 as env-processes") &&
          Catch::Contains("its ranks share one node's memory, but only 1 of the 3 processes "
                          "run on this node: the hier backend serves several nodes"));
  CHECK_THROWS_WITH(choose_collective_backend("hier", on_one_node(LaunchKind::EnvProcesses, 3)),
                    Catch::Contains("the shm backend serves one node"));
  CHECK_THROWS_WITH(
      choose_collective_backend("hier", plan_of(LaunchKind::Threads, DeviceType::CPU, 2)),
      Catch::Contains("hier cannot run") && Catch::Contains("share memory already (host backend)"));
  CHECK_THROWS_WITH(
      choose_collective_backend("host", plan_of(LaunchKind::MpiProcesses, DeviceType::CPU, 2)),
      Catch::Contains("--backend host cannot run rank 0 of 2 as mpi-processes on cpu") &&
          Catch::Contains("launch them with mpirun / srun (mpi backend)"));
  {
    // Under mpirun, processes that met through a file rendezvous (meshrt_comm_init_file) are
    // told so, not that no MPI launcher started them (issue 25, item 12).
    const char* old = std::getenv("OMPI_COMM_WORLD_SIZE");
    const std::string saved = old ? old : "";
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    const std::string why = find_collective_backend("mpi").refuses(
        plan_of(LaunchKind::EnvProcesses, DeviceType::CPU, 2));
    if (old) {
      setenv("OMPI_COMM_WORLD_SIZE", saved.c_str(), 1);
    } else {
      unsetenv("OMPI_COMM_WORLD_SIZE");
    }
    CHECK_THAT(why, Catch::Contains("these processes met through a rendezvous") &&
                        Catch::Contains("use meshrt_comm_init_mpi under mpirun") &&
                        !Catch::Contains("not started by an MPI launcher"));
  }
#if defined(MESHRT_WITH_CUDA)
  CHECK(choose_collective_backend("auto", plan_of(LaunchKind::Threads, DeviceType::CUDA, 2)).name ==
        "nccl");
#endif
  CHECK_THROWS_WITH(
      choose_collective_backend("mpi", plan_of(LaunchKind::MpiProcesses, DeviceType::CUDA, 2)),
      Catch::Contains("it moves CPU tensors"));
}

TEST_CASE("file transport: blobs of different lengths, and each key is one exchange",
          "[multirank]") {
  fs::path d = fresh_dir("rdzv-len");
  const int n = 3;
  std::vector<std::vector<std::string>> got(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      auto t = make_file_transport(d.string(), r, n, 10, "run3");
      CHECK(t->rank() == r);
      CHECK(t->size() == n);
      auto first = t->all_gather("a", std::string(static_cast<size_t>(r) * 5, 'x'));
      auto second = t->all_gather("b", std::to_string(r * r));
      for (int j = 0; j < n; ++j) {
        got[static_cast<size_t>(r)].push_back(first[static_cast<size_t>(j)] + "|" +
                                              second[static_cast<size_t>(j)]);
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) {
    CHECK(got[static_cast<size_t>(r)] == std::vector<std::string>{"|0", "xxxxx|1", "xxxxxxxxxx|4"});
  }
  fs::remove_all(d);
}

namespace {
// This thread's cores and those of a task on a host stream it starts.
struct RankCores {
  std::vector<int> thread, stream;
};

std::vector<int> my_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof(set), &set) == 0);
  std::vector<int> v;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) v.push_back(c);
  return v;
}

std::vector<RankCores> launch_cpu2_cores() {
  LaunchOptions lo;
  lo.devices = "cpu:2";
  auto launch = bootstrap(lo);
  std::vector<RankCores> seen(2);
  launch->run([&](const RankPlacement& p, Communicator&) {
    RankCores& rc = seen[static_cast<size_t>(p.rank)];
    rc.thread = my_cores();
    auto s = make_host_stream("probe");
    s->enqueue([&rc] { rc.stream = my_cores(); });
    s->synchronize();
  });
  return seen;
}
}  // namespace

TEST_CASE("bootstrap: rank threads and their streams run on disjoint cores (MESHRT_HOST_BIND)",
          "[multirank]") {
  const std::vector<int> all = process_cores();
  REQUIRE(!all.empty());
  SECTION("auto binds each rank to its share of the cores, when there is one") {
    ScopedEnv env({{"MESHRT_HOST_BIND", nullptr}});
    const std::vector<RankCores> seen = launch_cpu2_cores();
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r);
      CHECK(seen[static_cast<size_t>(r)].stream == seen[static_cast<size_t>(r)].thread);
    }
    if (all.size() < 2) {
      CHECK(seen[0].thread == all);  // more ranks than cores: not bound
      CHECK(rank_core_sets(2).empty());
    } else {
      const size_t half = all.size() / 2;
      CHECK(seen[0].thread == std::vector<int>(all.begin(), all.begin() + half));
      CHECK(seen[1].thread == std::vector<int>(all.begin() + half, all.begin() + 2 * half));
    }
    CHECK(rank_core_sets(1).empty());
    CHECK(rank_core_sets(static_cast<int>(all.size()) + 1).empty());
  }
  SECTION("none leaves every rank on all of the process's cores") {
    ScopedEnv env({{"MESHRT_HOST_BIND", "none"}});
    const std::vector<RankCores> seen = launch_cpu2_cores();
    for (const RankCores& rc : seen) {
      CHECK(rc.thread == all);
      CHECK(rc.stream == all);
    }
    CHECK(rank_core_sets(2).empty());
  }
  SECTION("a core set the OS refuses leaves the thread unbound, with a warning") {
    std::vector<std::string> warned;
    std::mutex mu;
    set_log_sink([&](LogLevel level, int, int, const std::string& msg) {
      std::lock_guard<std::mutex> lk(mu);
      if (level == LogLevel::Warn) warned.push_back(msg);
    });
    std::vector<int> after;
    std::thread t([&] {
      cpu_set_t none;
      CPU_ZERO(&none);
      CPU_SET(CPU_SETSIZE - 1, &none);  // no such core here
      bind_this_thread(none, 7);
      after = my_cores();
    });
    t.join();
    set_log_sink(nullptr);
    CHECK(after == all);
    REQUIRE(warned.size() == 1);
    CHECK(warned[0].find("rank 7: binding its threads to 1 core(s) failed (") == 0);
    CHECK(warned[0].find("it runs unbound (MESHRT_HOST_BIND=none skips binding)") !=
          std::string::npos);
  }
  SECTION("a value that is not auto or none is refused, naming it") {
    ScopedEnv env({{"MESHRT_HOST_BIND", "cores"}});
    try {
      (void)rank_core_sets(2);
      FAIL("MESHRT_HOST_BIND=cores was accepted");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("MESHRT_HOST_BIND='cores' is not accepted: use auto or "
                                       "none") != std::string::npos);
    }
  }
}
