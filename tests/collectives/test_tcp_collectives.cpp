// The tcp backend and hier over it (ranks = processes bootstrapped over TCP, no MPI): the suite
// starts its own torchrun-style rank processes (fork + exec of this binary with --tcp-rank),
// which meet through MESHRT_RENDEZVOUS=tcp://127.0.0.1:<port>. MESHRT_NODE_ID simulates nodes.
// Every op x dtype x in place / out of place against exact values on hier over 2 simulated
// nodes (equal and unequal) and on a flat tcp world; split groups and send / recv; a SIGKILLed
// peer named by every other rank within the timeout; broadcasts of odd sizes from every root
// under each broadcast algorithm; the published address's choice and MESHRT_SOCKET_IFNAME.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

#include "coll_matrix.h"
#include "coll_test_util.h"
#include "collectives/bootstrap.h"
#include "collectives/tcp_comm.h"
#include "runtime/stream.h"
#include "tests/common/env.h"
#include "tests/common/files.h"
#include "tests/common/net.h"

using namespace meshrt;
using namespace meshrt::test;
namespace fs = std::filesystem;

namespace {

constexpr double kKillTimeout = 20;

// Splits into even / odd ranks and all-reduces on both at once, then a ring of send / recv on
// the world (0, 5 and 200001 elements).
void split_and_ring(Communicator& w, Stream& s, Failures& f) {
  const int n = w.size(), r = w.rank();
  auto half = w.split(r % 2, r, "half");
  if (w.split(kNoColor, 0)) f.add("split with kNoColor returned a communicator");
  if (!half || half->size() != (n + 1 - r % 2) / 2 || half->rank() != r / 2) {
    f.add("split: wrong group");
    return;
  }
  Tensor a = host_tensor(100003, DType::f32);
  fill_pattern(a, 70, half->rank());
  half->all_reduce(a, ReduceOp::Sum, s).synchronize();
  check_values(f, "half all_reduce", a, 0, a.numel(),
               [&](int64_t i) { return reduced(DType::f32, ReduceOp::Sum, 70, half->size(), i); });
  check_ring_send_recv(w, f);
  w.barrier(s).synchronize();
}

// Mismatched calls on a flat tcp world: a collective whose counts differ fails on every rank
// (the ranks compare their calls before every collective), a receive of fewer elements than
// were sent fails naming both sides; the connections stay in step, so the next call works.
void mismatches(Communicator& w, Failures& f) {
  const int r = w.rank();
  // Each failing call on a stream of its own: a stream stays failed after an error.
  auto expect_error = [&](const std::string& what, const std::function<void(Stream&)>& fn,
                          const std::string& want) {
    auto s = make_host_stream("mismatch");
    try {
      fn(*s);
      f.add(what + ": no error");
    } catch (const std::exception& e) {
      if (std::string(e.what()).find(want) == std::string::npos) f.add(what + ": " + e.what());
    }
  };
  Tensor a = host_tensor(r == 0 ? 5 : 6, DType::f32);
  fill_value(a, 1);
  expect_error(
      "all_reduce of 5 / 6 elements",
      [&](Stream& s) { w.all_reduce(a, ReduceOp::Sum, s).synchronize(); },
      "collective mismatch on group 'world'");
  Tensor m = host_tensor(r == 0 ? 5 : 3, DType::i32);
  fill_value(m, 2);
  auto s = make_host_stream("after");
  if (r == 0) w.send(m, 1, *s).synchronize();
  if (r == 1) {
    expect_error(
        "recv of 3 after a send of 5", [&](Stream& rs) { w.recv(m, 0, rs).synchronize(); },
        "send/recv mismatch on group 'world': rank 0 sent 5 elements of i32 but rank 1 receives "
        "i32 count=3 (message #4 between them)");
  }
  Tensor b = host_tensor(4, DType::i64);
  fill_value(b, 1);
  w.all_reduce(b, ReduceOp::Sum, *s).synchronize();
  check_values(f, "all_reduce after the mismatches", b, 0, 4, [&](int64_t) { return w.size(); });
}

// Rank 1 dies (SIGKILL) before its 4th all-reduce; the others are inside it, waiting.
int kill_main(Communicator& w, Stream& s, int rank) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    for (int i = 0; i < 1000; ++i) {
      if (rank == 1 && i == 3) raise(SIGKILL);
      Tensor t = host_tensor(1000, DType::f32);
      fill_value(t, 1);
      w.all_reduce(t, ReduceOp::Sum, s).synchronize();
    }
  } catch (const CommError& e) {
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("TCP FAILED rank %d after %.1f s: %s\n", rank, dt, e.what());
    return 3;
  }
  std::printf("TCP FAIL rank %d: no error\n", rank);
  return 1;
}

// Broadcasts of 0, 1, 37, 65537 and 3 MiB + 5 bytes (odd; under and over the tree / ring
// threshold, the ring's last chunk partial) from every root, in place and out of place: every
// rank's bytes equal the root's. Prints one line per failure, then "BCAST OK rank r: N".
int bcast_main(Communicator& w, Stream& s, int rank) {
  int64_t ok = 0, bad = 0;
  auto expected = [](int64_t n, int root, int64_t i) {
    return static_cast<uint8_t>((i * 131 + root * 17 + n) % 251);
  };
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{37}, int64_t{65537}, (int64_t{3} << 20) + 5}) {
    for (int root = 0; root < w.size(); ++root) {
      for (bool in_place : {true, false}) {
        Tensor in = host_tensor(n, DType::u8), out = host_tensor(n, DType::u8);
        auto* ip = static_cast<uint8_t*>(in.data_ptr());
        auto* op = static_cast<uint8_t*>(out.data_ptr());
        for (int64_t i = 0; i < n; ++i) {
          ip[i] = rank == root ? expected(n, root, i) : 0xAB;
          op[i] = 0xCD;
        }
        if (in_place) {
          w.broadcast(in, root, s).synchronize();
        } else {
          w.broadcast(in, out, root, s).synchronize();
        }
        const uint8_t* got = in_place ? ip : op;
        int64_t wrong = 0;
        for (int64_t i = 0; i < n; ++i) wrong += got[i] != expected(n, root, i);
        if (wrong == 0) {
          ++ok;
        } else {
          ++bad;
          std::printf("BCAST WRONG rank %d: %lld of %lld bytes from root %d (%s)\n", rank,
                      static_cast<long long>(wrong), static_cast<long long>(n), root,
                      in_place ? "in place" : "out of place");
        }
      }
    }
  }
  std::printf("BCAST %s rank %d: %lld right, %lld wrong\n", bad == 0 ? "OK" : "FAIL", rank,
              static_cast<long long>(ok), static_cast<long long>(bad));
  return bad == 0 ? 0 : 1;
}

// A rank process: torchrun's variables, bootstrap (backend "auto" or `backend`), then `mode`.
int tcp_rank_main(const std::string& mode, const std::string& backend, int rank, int world,
                  int port) {
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  setenv("MESHRT_RENDEZVOUS", ("tcp://127.0.0.1:" + std::to_string(port)).c_str(), 1);
  LaunchOptions lo;
  lo.backend = backend;
  lo.config.timeout_s = mode == "kill" ? kKillTimeout : 120;
  auto launch = bootstrap(lo);
  std::printf("backend %s\n", launch->backend().c_str());
  std::unique_ptr<Communicator> w = launch->world(0);
  auto s = make_host_stream("comm");
  if (mode == "kill") return kill_main(*w, *s, rank);
  if (mode == "bcast") return bcast_main(*w, *s, rank);
  Failures f;
  const int64_t ops = run_matrix(*w, *s, {0, 1, 37, 20001}, f, 7 + world);
  split_and_ring(*w, *s, f);
  if (w->backend() == "tcp") mismatches(*w, f);
  std::printf("%s rank %d on %s: %lld collectives, %zu failures\n%s",
              f.count() == 0 ? "TCP OK" : "TCP FAIL", rank, std::string(w->backend()).c_str(),
              static_cast<long long>(ops), f.count(), f.str().c_str());
  return f.count() == 0 ? 0 : 1;
}

struct Ranks {
  std::vector<pid_t> pids;
  std::vector<int> status;  // exit code, or 128 + signal
  std::vector<std::string> out;
};

// Starts `world` rank processes of this binary; rank r runs with MESHRT_NODE_ID=nodes[r] (none
// when `nodes` is empty). Waits for all (at most 600 s, then they are killed and the test fails).
Ranks spawn_ranks(const std::string& mode, const std::string& backend, int world,
                  const std::vector<int>& nodes) {
  const fs::path dir = scratch_dir("tcp-" + mode);
  const int port = unused_port();
  REQUIRE(port > 0);
  Ranks rs;
  for (int r = 0; r < world; ++r) {
    const fs::path log = dir / ("rank" + std::to_string(r) + ".txt");
    const pid_t pid = fork();
    if (pid == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(fd, 1);
      dup2(fd, 2);
      if (nodes.empty()) {
        unsetenv("MESHRT_NODE_ID");
      } else {
        setenv("MESHRT_NODE_ID", std::to_string(nodes[static_cast<size_t>(r)]).c_str(), 1);
      }
      setenv("MESHRT_FLIGHT_DIR", dir.c_str(), 1);
      const std::string rk = std::to_string(r), ws = std::to_string(world),
                        pt = std::to_string(port);
      execl("/proc/self/exe", "test_collectives_tcp", "--tcp-rank", mode.c_str(), backend.c_str(),
            rk.c_str(), ws.c_str(), pt.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    rs.pids.push_back(pid);
  }
  rs.status.assign(static_cast<size_t>(world), -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(600);
  for (int left = world; left > 0;) {
    for (int r = 0; r < world; ++r) {
      int st = 0;
      if (rs.status[static_cast<size_t>(r)] != -1 ||
          waitpid(rs.pids[static_cast<size_t>(r)], &st, WNOHANG) <= 0)
        continue;
      rs.status[static_cast<size_t>(r)] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      --left;
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (pid_t p : rs.pids) kill(p, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < world; ++r)
    rs.out.push_back(slurp(dir / ("rank" + std::to_string(r) + ".txt")));
  fs::remove_all(dir);
  return rs;
}

void check_matrix(const Ranks& rs, const std::string& backend) {
  for (size_t r = 0; r < rs.out.size(); ++r) {
    INFO("rank " << r << ":\n" << rs.out[r]);
    CHECK(rs.status[r] == 0);
    CHECK_THAT(rs.out[r], Catch::Contains("backend " + backend + "\n"));
    CHECK_THAT(rs.out[r], Catch::Contains("TCP OK rank " + std::to_string(r) + " on " + backend +
                                          ": 440 collectives, 0 failures"));
  }
}

}  // namespace

TEST_CASE("tcp: 4 processes on 2 simulated nodes pick hier (shm + tcp), every op exact",
          "[multirank]") {
  check_matrix(spawn_ranks("matrix", "auto", 4, {0, 0, 1, 1}), "hier");
}

TEST_CASE("tcp: 3 processes on unequal simulated nodes run hier (shm + tcp), every op exact",
          "[multirank]") {
  check_matrix(spawn_ranks("matrix", "auto", 3, {5, 5, 9}), "hier");
}

TEST_CASE("tcp: a flat tcp world of 3 processes, every op exact", "[multirank]") {
  check_matrix(spawn_ranks("matrix", "tcp", 3, {}), "tcp");
}

TEST_CASE("tcp: a SIGKILLed peer fails every other rank naming it, within the timeout",
          "[multirank]") {
  const Ranks rs = spawn_ranks("kill", "tcp", 4, {});
  CHECK(rs.status[1] == 128 + SIGKILL);
  for (int r : {0, 2, 3}) {
    const std::string& out = rs.out[static_cast<size_t>(r)];
    INFO("rank " << r << ":\n" << out);
    CHECK(rs.status[static_cast<size_t>(r)] == 3);
    CHECK_THAT(out, Catch::Contains("TCP FAILED rank " + std::to_string(r)) &&
                        Catch::Contains("rank 1 at 127.0.0.1:") &&
                        Catch::Contains("closed its connection (its process failed or exited)"));
    const size_t at = out.find(" after ");
    REQUIRE(at != std::string::npos);
    CHECK(std::strtod(out.c_str() + at + 7, nullptr) < kKillTimeout);
  }
}

TEST_CASE("tcp: a SIGKILLed peer of hier over tcp fails every other rank naming it",
          "[multirank]") {
  // Its node peer sees it gone through shm, its rail peer through its closed connection, the
  // others through the first rank's abort, which carries that reason.
  const Ranks rs = spawn_ranks("kill", "auto", 4, {0, 0, 1, 1});
  CHECK(rs.status[1] == 128 + SIGKILL);
  for (int r : {0, 2, 3}) {
    const std::string& out = rs.out[static_cast<size_t>(r)];
    INFO("rank " << r << ":\n" << out);
    CHECK(rs.status[static_cast<size_t>(r)] == 3);
    CHECK_THAT(out, Catch::Contains("backend hier\n") &&
                        Catch::Contains("TCP FAILED rank " + std::to_string(r)) &&
                        (Catch::Contains("rank 1 [group rank 1] (pid " +
                                         std::to_string(rs.pids[1]) + ") is gone") ||
                         Catch::Contains("rank 1 [group rank 0] at 127.0.0.1:") ||
                         Catch::Contains("rank 1 at 127.0.0.1:")));
    const size_t at = out.find(" after ");
    REQUIRE(at != std::string::npos);
    CHECK(std::strtod(out.c_str() + at + 7, nullptr) < kKillTimeout);
  }
}

TEST_CASE("tcp: broadcasts of odd sizes from every root equal the root's bytes (3, 4 ranks)",
          "[multirank]") {
  // The table's choice (tree up to 256 KiB, ring beyond), then each algorithm at every size.
  for (const char* algo : {"", "broadcast:ring_pipeline", "broadcast:binomial"}) {
    for (int n : {3, 4}) {
      ScopedEnv env("MESHRT_ALGO", algo);
      const Ranks rs = spawn_ranks("bcast", "tcp", n, {});
      for (int r = 0; r < n; ++r) {
        INFO("MESHRT_ALGO='" << algo << "', rank " << r << " of " << n << ":\n"
                             << rs.out[static_cast<size_t>(r)]);
        CHECK(rs.status[static_cast<size_t>(r)] == 0);
        CHECK_THAT(rs.out[static_cast<size_t>(r)],
                   Catch::Contains("BCAST OK rank " + std::to_string(r) + ": " +
                                   std::to_string(5 * n * 2) + " right, 0 wrong"));
      }
    }
  }
}

namespace {

using detail::choose_socket_address;
using detail::NetInterface;

// A Debian-style host: its name resolves to 127.0.1.1 on lo; docker's bridge before the NIC.
const std::vector<NetInterface> kHost = {
    {"lo", "127.0.0.1", true, true},
    {"lo", "127.0.1.1", true, true},
    {"docker0", "172.17.0.1", true, false},
    {"eth0", "192.0.2.2", true, false},
    {"ib0", "10.0.0.5", true, false},
    {"eth1", "10.9.0.1", false, false},
    {"wlan0", "", true, false},
};

std::string picked(const std::vector<NetInterface>& ifs, const std::string& ifname,
                   const std::string& rendezvous = "") {
  const detail::SocketAddress a = choose_socket_address(ifs, ifname, rendezvous);
  return a.interface + " " + a.address + (a.loopback_only ? " loopback only" : "");
}

std::string refusal(const std::vector<NetInterface>& ifs, const std::string& ifname) {
  try {
    (void)choose_socket_address(ifs, ifname, "");
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("tcp: the published address is a non-loopback interface's, or MESHRT_SOCKET_IFNAME's",
          "[unit]") {
  // Unset: the first interface up with an IPv4 address, neither loopback nor docker's.
  CHECK(picked(kHost, "") == "eth0 192.0.2.2");
  // A TCP rendezvous tells the address it was reached from: its interface, even loopback (then
  // every rank is on this machine).
  CHECK(picked(kHost, "", "10.0.0.5") == "ib0 10.0.0.5");
  CHECK(picked(kHost, "", "127.0.0.1") == "lo 127.0.0.1 loopback only");
  // Nothing but docker's and loopback: docker's; nothing but loopback (or a NIC that is down):
  // loopback, said so.
  CHECK(picked({kHost[0], kHost[2]}, "") == "docker0 172.17.0.1");
  CHECK(picked({kHost[0], kHost[5], kHost[6]}, "") == "lo 127.0.0.1 loopback only");
  CHECK(picked({}, "") == " 127.0.0.1 loopback only");
  // Set: prefixes, exact names, exclusions; the rendezvous' interface among those it names.
  CHECK(picked(kHost, "ib") == "ib0 10.0.0.5");
  CHECK(picked(kHost, "eth,ib") == "eth0 192.0.2.2");
  CHECK(picked(kHost, "eth,ib", "10.0.0.5") == "ib0 10.0.0.5");
  CHECK(picked(kHost, "=ib0") == "ib0 10.0.0.5");
  CHECK(picked(kHost, "^docker,eth") == "ib0 10.0.0.5");
  CHECK(picked(kHost, "^eth,ib,wlan") == "docker0 172.17.0.1");
  CHECK(picked(kHost, "lo") == "lo 127.0.0.1 loopback only");
  CHECK(picked(kHost, "docker0", "192.0.2.2") == "docker0 172.17.0.1");
}

TEST_CASE("tcp: MESHRT_SOCKET_IFNAME naming no usable interface is refused, listing them",
          "[unit]") {
  const std::string list =
      "this host's interfaces: lo (127.0.0.1, 127.0.1.1), docker0 (172.17.0.1), eth0 "
      "(192.0.2.2), ib0 (10.0.0.5), eth1 (down, 10.9.0.1), wlan0 (no IPv4). Name one of those "
      "that has an IPv4 address, or unset it (docs/environment.md)";
  CHECK(refusal(kHost, "eth5") ==
        "MESHRT_SOCKET_IFNAME='eth5': no interface named by it is up with an IPv4 address; " +
            list);
  // Down, or without an IPv4 address: named, but not usable.
  CHECK(refusal(kHost, "eth1") ==
        "MESHRT_SOCKET_IFNAME='eth1': no interface named by it is up with an IPv4 address; " +
            list);
  CHECK(refusal(kHost, "=wlan0") ==
        "MESHRT_SOCKET_IFNAME='=wlan0': no interface named by it is up with an IPv4 address; " +
            list);
  CHECK(refusal(kHost, "=eth") ==
        "MESHRT_SOCKET_IFNAME='=eth': no interface named by it is up with an IPv4 address; " +
            list);
  CHECK(refusal(kHost, "^lo,docker,eth,ib") ==
        "MESHRT_SOCKET_IFNAME='^lo,docker,eth,ib': no interface outside it is up with an IPv4 "
        "address; " +
            list);
  CHECK(refusal({}, "eth0") ==
        "MESHRT_SOCKET_IFNAME='eth0': no interface named by it is up with an IPv4 address; "
        "this host's interfaces: none. Name one of those that has an IPv4 address, or unset it "
        "(docs/environment.md)");
  const std::string form =
      "': an empty interface name (form: interface name prefixes separated by commas, '=name' "
      "for an exact name, '^' before the list to exclude those; docs/environment.md)";
  for (const char* bad : {"eth0,", ",eth0", "^", "eth0,=", "eth0,,ib0"})
    CHECK(refusal(kHost, bad) == "MESHRT_SOCKET_IFNAME='" + std::string(bad) + form);
  // This machine lists its loopback, up.
  bool lo = false;
  for (const NetInterface& i : detail::host_interfaces())
    lo = lo || (i.loopback && i.up && i.ipv4 == "127.0.0.1");
  CHECK(lo);
}

TEST_CASE("tcp: every rank refuses a MESHRT_SOCKET_IFNAME no interface matches", "[multirank]") {
  ScopedEnv env("MESHRT_SOCKET_IFNAME", "nosuchif0");
  const Ranks rs = spawn_ranks("matrix", "tcp", 2, {});
  for (size_t r = 0; r < rs.out.size(); ++r) {
    INFO("rank " << r << ":\n" << rs.out[r]);
    CHECK(rs.status[r] == 2);
    CHECK_THAT(rs.out[r], Catch::Contains("TCP FAIL: MESHRT_SOCKET_IFNAME='nosuchif0': no "
                                          "interface named by it is up with an IPv4 address; "
                                          "this host's interfaces: ") &&
                              Catch::Contains("lo (127.0.0.1"));
  }
}

int main(int argc, char** argv) {
  if (argc == 7 && std::string(argv[1]) == "--tcp-rank") {
    try {
      return tcp_rank_main(argv[2], argv[3], std::atoi(argv[4]), std::atoi(argv[5]),
                           std::atoi(argv[6]));
    } catch (const std::exception& e) {
      std::printf("TCP FAIL: %s\n", e.what());
      return 2;
    }
  }
  return Catch::Session().run(argc, argv);
}
