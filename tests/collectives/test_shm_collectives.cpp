// Shared-memory communicator (ranks = processes of one node): the suite starts its own rank
// processes (fork + exec of this binary with --shm-rank or --shm-torchrun), which meet through a
// file rendezvous or TCP.
// Every op x dtype x in place / out of place on 2, 3 and 4 processes with odd counts (exact
// values, the threads backend's expectations) and bit-identical to the threads backend on random
// floats; split groups, send / recv; a SIGKILLed peer named within the timeout; no segment left
// in /dev/shm; stale segments of dead jobs removed; a /dev/shm without room for the segment one
// error on every rank (a private mount namespace with a small tmpfs, where root may make one).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "coll_matrix.h"
#include "coll_test_util.h"
#include "collectives/bootstrap.h"
#include "collectives/bootstrap_transport.h"
#include "collectives/host_comm.h"
#include "collectives/shm_comm.h"
#include "runtime/env.h"
#include "runtime/shared_host_memory.h"
#include "runtime/stream.h"
#include "tests/common/files.h"

using namespace meshrt;
using namespace meshrt::test;
namespace fs = std::filesystem;

namespace {

CommConfig shm_test_config(double timeout_s) {
  CommConfig c;
  c.timeout_s = timeout_s;
  return c;
}

// Random floats (not exact sums): the shm result must equal the threads backend's bit for bit.
Tensor random_tensor(int64_t n, DType dt, uint64_t seed) {
  Tensor t = host_tensor(n, dt);
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < n; ++i) store(t.data_ptr(), dt, i, u(g));
  return t;
}

// All-reduce and reduce-scatter of random floats on shm against the same calls on `n` host
// (thread) ranks given the same inputs; the number of differing results.
int64_t diff_against_threads(Communicator& w, Stream& s, Failures& f) {
  const int n = w.size(), r = w.rank();
  int64_t calls = 0;
  // One-step (small) and zero-copy all-reduces (blocks of 4 KiB and more are shared: every size
  // here but the 16-bit 1001; MESHRT_SHM_ZERO_COPY=0 runs copy through the segment, chunked).
  for (int64_t N : {int64_t{1001}, int64_t{100003}, int64_t{400003}})
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
        const uint64_t seed = 1000 + 10 * static_cast<uint64_t>(dt) + static_cast<uint64_t>(op);
        Tensor mine = random_tensor(N, dt, seed + static_cast<uint64_t>(r) * 7919);
        Tensor got = host_tensor(N, dt);
        w.all_reduce(mine, got, op, s).synchronize();
        Tensor rs_in = random_tensor(N * n, dt, seed + 55 + static_cast<uint64_t>(r) * 7919);
        Tensor rs_got = host_tensor(N, dt);
        w.reduce_scatter(rs_in, rs_got, op, s).synchronize();
        // The same calls on threads, with every rank's inputs regenerated here.
        auto comms = make_host_communicators(n, "threads", shm_test_config(60));
        std::vector<Tensor> want(static_cast<size_t>(n)), rs_want(static_cast<size_t>(n));
        run_ranks(comms, [&](int j) {
          auto ts = make_host_stream("t" + std::to_string(j));
          Tensor in = random_tensor(N, dt, seed + static_cast<uint64_t>(j) * 7919);
          want[static_cast<size_t>(j)] = host_tensor(N, dt);
          comms[static_cast<size_t>(j)]->all_reduce(in, want[static_cast<size_t>(j)], op, *ts);
          Tensor rin = random_tensor(N * n, dt, seed + 55 + static_cast<uint64_t>(j) * 7919);
          rs_want[static_cast<size_t>(j)] = host_tensor(N, dt);
          comms[static_cast<size_t>(j)]->reduce_scatter(rin, rs_want[static_cast<size_t>(j)], op,
                                                        *ts);
          ts->synchronize();
        });
        const std::string what = std::string(dtype_name(dt)) + " " + reduce_op_name(op);
        if (std::memcmp(got.data_ptr(), want[static_cast<size_t>(r)].data_ptr(), got.nbytes()) != 0)
          f.add("all_reduce " + what + " differs from the threads backend");
        if (std::memcmp(rs_got.data_ptr(), rs_want[static_cast<size_t>(r)].data_ptr(),
                        rs_got.nbytes()) != 0)
          f.add("reduce_scatter " + what + " differs from the threads backend");
        calls += 2;
      }
    }
  return calls;
}

// Splits into even / odd ranks and runs collectives on both groups at once, then a ring of
// send / recv (chunked: larger than a mailbox) on the world.
void split_and_ring(Communicator& w, Stream& s, Failures& f) {
  const int n = w.size(), r = w.rank();
  auto half = w.split(r % 2, r, "half");
  auto none = w.split(kNoColor, 0);
  if (none) f.add("split with kNoColor returned a communicator");
  if (!half || half->size() != (n + 1 - r % 2) / 2 || half->rank() != r / 2) {
    f.add("split: wrong group");
    return;
  }
  for (int it = 0; it < 3; ++it) {
    const uint64_t seed = 70 + static_cast<uint64_t>(it);
    Tensor a = host_tensor(100003, DType::f32);
    fill_pattern(a, seed, half->rank());
    half->all_reduce(a, ReduceOp::Sum, s).synchronize();
    check_values(f, "half all_reduce", a, 0, a.numel(), [&](int64_t i) {
      return reduced(DType::f32, ReduceOp::Sum, seed, half->size(), i);
    });
  }
  check_ring_send_recv(w, f);
  w.barrier(s).synchronize();
}

// The matrix's largest count: sanitizer builds (several times slower) use a smaller one, still
// more than one staging buffer of f32 and i64.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int64_t kShmLargest = 300007;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr int64_t kShmLargest = 300007;
#else
constexpr int64_t kShmLargest = 600001;
#endif
#else
constexpr int64_t kShmLargest = 600001;
#endif

// A rank process: meets the others through `dir`, then runs `mode`. Prints one verdict line.
int shm_rank_main(const std::string& mode, const std::string& dir, int rank, int world,
                  const std::string& run) {
  const double timeout_s = mode == "kill" ? 20 : 120;
  auto tr = make_file_transport(dir, rank, world, 60, run);
  if (mode == "nospace") {
    // /dev/shm has less room than the segment: every rank fails to make the communicator, with
    // rank 0's reason (a SIGBUS, before, at the first write to an unreserved page).
    try {
      std::unique_ptr<Communicator> w =
          make_shm_world_communicator(*tr, shm_test_config(timeout_s));
      auto s = make_host_stream("comm");
      Tensor t = host_tensor(kShmLargest, DType::f32);
      fill_value(t, 1);
      w->all_reduce(t, ReduceOp::Sum, *s).synchronize();
    } catch (const CommError& e) {
      std::printf("SHM NOSPACE rank %d: %s\n", rank, e.what());
      return 4;
    }
    std::printf("SHM FAIL rank %d: no error\n", rank);
    return 1;
  }
  CommConfig cfg = shm_test_config(timeout_s);
  if (mode == "algo") cfg.algo = env_or("MESHRT_ALGO");  // collectives/algorithms/
  if (mode == "fixed") cfg.algo = "all_reduce:fixed_order";
  std::unique_ptr<Communicator> w = make_shm_world_communicator(*tr, cfg);
  auto s = make_host_stream("comm");
  Failures f;
  if (mode == "algo") {
    // Small sizes, the largest (80 KiB of f32) in shared blocks: zero copy where forced.
    const int64_t ops = run_matrix(*w, *s, {0, 5, 1001, 20001}, f, 31 + world);
    std::printf("%s rank %d (MESHRT_ALGO=%s): %lld collectives, %zu failures\n%s",
                f.count() == 0 ? "SHM OK" : "SHM FAIL", rank, cfg.algo.c_str(),
                static_cast<long long>(ops), f.count(), f.str().c_str());
    return f.count() == 0 && ops == 11 * 5 * 2 * 4 ? 0 : 1;
  }
  if (mode == "fixed") {
    // 1e8, 1, -1e8, 1 rotated by the element: each sum depends on the order of its additions.
    // Whole and in two halves, the bits of the tree (x0 + x1) + (x2 + x3), as on threads.
    const float v[] = {1e8f, 1.f, -1e8f, 1.f};
    for (int64_t n : {int64_t{10}, int64_t{4096}}) {
      for (bool halves : {false, true}) {
        Tensor t = host_tensor(n, DType::f32);
        auto* p = static_cast<float*>(t.data_ptr());
        for (int64_t i = 0; i < n; ++i) p[i] = v[(rank + i) % 4];
        if (halves) w->all_reduce(t.narrow(0, 0, n / 2), ReduceOp::Sum, *s);
        w->all_reduce(halves ? t.narrow(0, n / 2, n - n / 2) : t, ReduceOp::Sum, *s).synchronize();
        for (int64_t i = 0; i < n; ++i) {
          const float want = (v[i % 4] + v[(1 + i) % 4]) + (v[(2 + i) % 4] + v[(3 + i) % 4]);
          if (std::memcmp(&p[i], &want, sizeof want) != 0) {
            f.add("n " + std::to_string(n) + (halves ? " in halves" : "") + ": element " +
                  std::to_string(i) + " is " + std::to_string(p[i]) + ", not " +
                  std::to_string(want));
            break;
          }
        }
      }
    }
    std::printf("%s rank %d: fixed_order tree bits, %zu failures\n%s",
                f.count() == 0 ? "SHM OK" : "SHM FAIL", rank, f.count(), f.str().c_str());
    return f.count() == 0 ? 0 : 1;
  }
  if (mode == "matrix") {
    // Large host blocks are shared memory (so all-reduce runs zero copy) unless
    // MESHRT_SHM_ZERO_COPY=0.
    const bool zero_copy = env_switch("MESHRT_SHM_ZERO_COPY");
    Tensor big = host_tensor(kShmLargest, DType::f32);
    if (find_shared_host_range(big.data_ptr(), big.nbytes(), nullptr) != zero_copy)
      f.add(std::string("a ") + std::to_string(big.nbytes()) + "-byte host block is " +
            (zero_copy ? "not " : "") + "shared memory");
    std::printf("zero copy %s\n", zero_copy ? "on" : "off");
    const int64_t ops = run_matrix(*w, *s, {0, 1, 37, 20001, kShmLargest}, f, 11 + world);
    const int64_t calls = diff_against_threads(*w, *s, f);
    split_and_ring(*w, *s, f);
    std::printf("%s rank %d: %lld collectives, %lld against threads, %zu failures\n%s",
                f.count() == 0 ? "SHM OK" : "SHM FAIL", rank, static_cast<long long>(ops),
                static_cast<long long>(calls), f.count(), f.str().c_str());
    return f.count() == 0 && ops == 11 * 5 * 2 * 5 ? 0 : 1;
  }
  if (mode == "kill") {
    // Rank 1 dies (SIGKILL) before its 4th all-reduce; the others are inside it, waiting.
    const auto t0 = std::chrono::steady_clock::now();
    try {
      for (int i = 0; i < 1000; ++i) {
        if (rank == 1 && i == 3) raise(SIGKILL);
        Tensor t = host_tensor(1000, DType::f32);
        fill_value(t, 1);
        w->all_reduce(t, ReduceOp::Sum, *s).synchronize();
        if (i == 2 && rank != 1) std::fflush(stdout);
      }
    } catch (const CommError& e) {
      const double dt =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("SHM FAILED rank %d after %.1f s: %s\n", rank, dt, e.what());
      return 3;
    }
    std::printf("SHM FAIL rank %d: no error\n", rank);
    return 1;
  }
  std::printf("SHM FAIL unknown mode %s\n", mode.c_str());
  return 1;
}

struct Ranks {
  std::vector<pid_t> pids;
  std::vector<int> status;  // exit code, or 128 + signal
  std::vector<std::string> out;
};

// Starts `world` rank processes of this binary in `mode` and waits for all (at most 900 s, the
// sanitizer builds' ctest timeout; then they are killed and the test fails). `ns_holder` > 0:
// they run in that process's mount namespace.
Ranks spawn_ranks(const std::string& mode, int world, const fs::path& dir, pid_t ns_holder = 0) {
  static int runs = 0;
  const std::string run = "t" + std::to_string(getpid()) + "-" + std::to_string(runs++);
  Ranks rs;
  // Into the namespace through nsenter (util-linux), which execs this binary there: setns() of
  // a mount namespace fails (EINVAL) in a process with other threads, as a forked child of a
  // ThreadSanitizer process has (its runtime's thread).
  const std::string ns_flag = "--mount=/proc/" + std::to_string(ns_holder) + "/ns/mnt";
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  for (int r = 0; r < world; ++r) {
    const fs::path log = dir / (run + "-rank" + std::to_string(r) + ".txt");
    const pid_t pid = fork();
    if (pid == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(fd, 1);
      dup2(fd, 2);
      const std::string rk = std::to_string(r), ws = std::to_string(world), d = dir.string();
      // Flight records of the ranks a fault aborts go to the test's scratch folder (removed
      // with it), not to a per-job folder under /tmp.
      setenv("MESHRT_FLIGHT_DIR", d.c_str(), 1);
      if (ns_holder > 0) {
        execlp("nsenter", "nsenter", ns_flag.c_str(), "--", self.c_str(), "--shm-rank",
               mode.c_str(), d.c_str(), rk.c_str(), ws.c_str(), run.c_str(),
               static_cast<char*>(nullptr));
        std::printf("SHM FAIL: cannot run nsenter %s: %s\n", ns_flag.c_str(), std::strerror(errno));
        _exit(126);
      }
      execl("/proc/self/exe", "test_collectives_shm", "--shm-rank", mode.c_str(), d.c_str(),
            rk.c_str(), ws.c_str(), run.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    rs.pids.push_back(pid);
  }
  rs.status.assign(static_cast<size_t>(world), -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(900);
  for (int left = world; left > 0;) {
    for (int r = 0; r < world; ++r) {
      if (rs.status[static_cast<size_t>(r)] != -1) continue;
      int st = 0;
      if (waitpid(rs.pids[static_cast<size_t>(r)], &st, WNOHANG) <= 0) continue;
      rs.status[static_cast<size_t>(r)] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      --left;
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (pid_t p : rs.pids) kill(p, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < world; ++r)
    rs.out.push_back(slurp(dir / (run + "-rank" + std::to_string(r) + ".txt")));
  return rs;
}

// The /dev/shm entries of meshrt segments created by any of `pids` (`shm`: where /dev/shm is).
std::vector<std::string> segments_of(const std::vector<pid_t>& pids,
                                     const std::string& shm = "/dev/shm") {
  std::vector<std::string> found;
  DIR* d = opendir(shm.c_str());
  if (d == nullptr) return found;
  while (const dirent* e = readdir(d)) {
    const std::string nm = e->d_name;
    for (pid_t p : pids) {
      if (nm.rfind("meshrt-shm-" + std::to_string(p) + "-", 0) == 0) found.push_back(nm);
    }
  }
  closedir(d);
  return found;
}

}  // namespace

namespace {

// Every op x dtype x place x size on `world` rank processes (one test case per world size, so
// each has its own ctest timeout).
// zero_copy false: the ranks run with MESHRT_SHM_ZERO_COPY=0 (every collective through the
// segment).
void shm_matrix_case(int world, bool zero_copy = true) {
  const fs::path dir = scratch_dir("shm-matrix");
  if (!zero_copy) setenv("MESHRT_SHM_ZERO_COPY", "0", 1);
  Ranks rs = spawn_ranks("matrix", world, dir);
  if (!zero_copy) unsetenv("MESHRT_SHM_ZERO_COPY");
  for (int r = 0; r < world; ++r) {
    INFO("world " << world << " rank " << r << ":\n" << rs.out[static_cast<size_t>(r)]);
    CHECK(rs.status[static_cast<size_t>(r)] == 0);
    CHECK_THAT(rs.out[static_cast<size_t>(r)],
               Catch::Contains(std::string("zero copy ") + (zero_copy ? "on" : "off")));
    CHECK_THAT(rs.out[static_cast<size_t>(r)], Catch::Contains("SHM OK rank " + std::to_string(r) +
                                                               ": 550 collectives, 72 "
                                                               "against threads, 0 failures"));
  }
  CHECK(segments_of(rs.pids).empty());
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("shm: every op x dtype x in/out-of-place on 2 processes, equal to threads",
          "[multirank]") {
  shm_matrix_case(2);
}

TEST_CASE("shm: every op x dtype x in/out-of-place on 2 processes through the segment only",
          "[multirank]") {
  shm_matrix_case(2, /*zero_copy=*/false);
}

TEST_CASE("shm: every op x dtype x in/out-of-place on 3 processes, equal to threads",
          "[multirank]") {
  shm_matrix_case(3);
}

TEST_CASE("shm: every op x dtype x in/out-of-place on 4 processes, equal to threads",
          "[multirank]") {
  shm_matrix_case(4);
}

TEST_CASE("shm: every algorithm forced with MESHRT_ALGO gives the default's exact results",
          "[multirank]") {
  for (const char* spec : {"one_step", "staged", "zero_copy", "all_gather:ring", "fixed_order"}) {
    const fs::path dir = scratch_dir("shm-algo");
    setenv("MESHRT_ALGO", spec, 1);
    Ranks rs = spawn_ranks("algo", 2, dir);
    unsetenv("MESHRT_ALGO");
    for (int r = 0; r < 2; ++r) {
      INFO(spec << " rank " << r << ":\n" << rs.out[static_cast<size_t>(r)]);
      CHECK(rs.status[static_cast<size_t>(r)] == 0);
      CHECK_THAT(rs.out[static_cast<size_t>(r)],
                 Catch::Contains("SHM OK rank " + std::to_string(r) + " (MESHRT_ALGO=" + spec +
                                 "): 440 collectives, 0 failures"));
    }
    CHECK(segments_of(rs.pids).empty());
    fs::remove_all(dir);
  }
}

TEST_CASE("shm: forced fixed_order all-reduce gives the threads' tree bits on 4 processes",
          "[multirank]") {
  const fs::path dir = scratch_dir("shm-fixed");
  Ranks rs = spawn_ranks("fixed", 4, dir);
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r << ":\n" << rs.out[static_cast<size_t>(r)]);
    CHECK(rs.status[static_cast<size_t>(r)] == 0);
    CHECK_THAT(rs.out[static_cast<size_t>(r)],
               Catch::Contains("SHM OK rank " + std::to_string(r) +
                               ": fixed_order tree bits, 0 failures"));
  }
  CHECK(segments_of(rs.pids).empty());
  fs::remove_all(dir);
}

namespace {

// A process holding a mount namespace of its own where /dev/shm is a tmpfs of `size` bytes,
// killed with this object; pid 0 (and why) where the system refuses one (needs root).
struct SmallDevShm {
  pid_t pid = 0;
  std::string why;
  explicit SmallDevShm(size_t size) {
    int p[2];
    REQUIRE(pipe(p) == 0);
    const std::string opt = "size=" + std::to_string(size);  // the child only makes system calls
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      close(p[0]);
      char ok = 'y';
      if (unshare(CLONE_NEWNS) != 0 ||
          mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
          mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, opt.c_str()) != 0)
        ok = static_cast<char>(errno);
      if (write(p[1], &ok, 1) != 1 || ok != 'y') _exit(0);
      pause();  // holds the namespace until killed
      _exit(0);
    }
    close(p[1]);
    char ok = 0;
    const bool got = read(p[0], &ok, 1) == 1;
    close(p[0]);
    if (got && ok == 'y') {
      pid = child;
      return;
    }
    why = got ? std::strerror(ok) : "no answer";
    waitpid(child, nullptr, 0);
  }
  ~SmallDevShm() {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  SmallDevShm(const SmallDevShm&) = delete;
  SmallDevShm& operator=(const SmallDevShm&) = delete;
};

}  // namespace

TEST_CASE("shm: a /dev/shm smaller than the segment fails every rank naming it, nothing left",
          "[multirank]") {
  // A private mount namespace with a 1 MiB /dev/shm (the segment of 2 ranks is about 5 MiB).
  const SmallDevShm shm(size_t{1} << 20);
  if (shm.pid == 0) {
    WARN("skipped: cannot mount a small tmpfs on /dev/shm in a private mount namespace ("
         << shm.why << "; needs root)");
    return;
  }
  const fs::path dir = scratch_dir("shm-nospace");
  setenv("MESHRT_SHM_ZERO_COPY", "0", 1);  // every byte through the segment
  Ranks rs = spawn_ranks("nospace", 2, dir, shm.pid);
  unsetenv("MESHRT_SHM_ZERO_COPY");
  const std::string reason = "shm: cannot reserve the ";
  const std::string room =
      " for 2 ranks: No space left on device; /dev/shm has 1048576 bytes "
      "(1.0 MiB) free: free space in /dev/shm (df -h /dev/shm) or make it "
      "larger";
  for (int r = 0; r < 2; ++r) {
    const std::string& out = rs.out[static_cast<size_t>(r)];
    INFO("rank " << r << ":\n" << out);
    CHECK(rs.status[static_cast<size_t>(r)] == 4);  // not 135 (SIGBUS)
    CHECK_THAT(out, Catch::Contains("SHM NOSPACE rank " + std::to_string(r) +
                                    ": shm: rank 0 could not create the job's shared-memory "
                                    "segment: " +
                                    reason) &&
                        Catch::Contains(" of the shared-memory segment /dev/shm/meshrt-shm-" +
                                        std::to_string(rs.pids[0]) + "-") &&
                        Catch::Contains(room));
  }
  CHECK(segments_of(rs.pids, "/proc/" + std::to_string(shm.pid) + "/root/dev/shm").empty());
  fs::remove_all(dir);
}

TEST_CASE("shm: a SIGKILLed peer fails the others at once, naming its global rank", "[multirank]") {
  const fs::path dir = scratch_dir("shm-kill");
  Ranks rs = spawn_ranks("kill", 3, dir);
  CHECK(rs.status[1] == 128 + SIGKILL);
  for (int r : {0, 2}) {
    const std::string& out = rs.out[static_cast<size_t>(r)];
    INFO("rank " << r << ":\n" << out);
    CHECK(rs.status[static_cast<size_t>(r)] == 3);
    CHECK_THAT(out, Catch::Contains("SHM FAILED rank " + std::to_string(r)) &&
                        Catch::Contains("rank 1 (pid " + std::to_string(rs.pids[1]) +
                                        ") is gone: its process ended"));
    // Found from the process itself, well before the 20 s watchdog.
    const size_t at = out.find(" after ");
    REQUIRE(at != std::string::npos);
    CHECK(std::strtod(out.c_str() + at + 7, nullptr) < 15.0);
  }
  CHECK(segments_of(rs.pids).empty());
  fs::remove_all(dir);
}

namespace {

// A port nothing listens on now (the kernel's pick for port 0).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return -1;
  }
  close(fd);
  return ntohs(a.sin_port);
}

// A torchrun-style rank (this binary run with --shm-torchrun): bootstrap from RANK /
// WORLD_SIZE / LOCAL_RANK and MASTER_ADDR / MASTER_PORT (or a file rendezvous), then an
// all-reduce and a barrier. Returns 0 when the shm backend served it and the sum is right.
int shm_torchrun_main(int rank, int world, const std::string& master_port, const std::string& dir) {
  int rc = 10;
  try {
    setenv("RANK", std::to_string(rank).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
    setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
    if (dir == "-") {
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", master_port.c_str(), 1);
      unsetenv("MESHRT_RENDEZVOUS");
    } else {
      setenv("MESHRT_RENDEZVOUS", ("file://" + dir).c_str(), 1);
    }
    LaunchOptions lo;
    lo.config.timeout_s = 60;
    auto launch = bootstrap(lo);
    rc = launch->backend() == "shm" ? 11 : 12;
    launch->run([&](const RankPlacement& p, Communicator& c) {
      auto s = make_host_stream("comm");
      Tensor t = host_tensor(5, DType::i64);
      fill_value(t, p.rank + 1);
      c.all_reduce(t, ReduceOp::Sum, *s).synchronize();
      c.barrier(*s).synchronize();
      if (rc == 11 && t.item(4) == world * (world + 1) / 2) rc = 0;
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    rc = 13;
  }
  std::fflush(stderr);
  return rc;
}

// Starts a torchrun-style rank: fork, then exec of this binary (a forked child of a process
// with threads must not start threads itself: ThreadSanitizer refuses that).
pid_t torchrun_rank(int rank, int world, const std::string& master_port, const std::string& dir) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  const std::string rk = std::to_string(rank), ws = std::to_string(world);
  execl("/proc/self/exe", "test_collectives_shm", "--shm-torchrun", rk.c_str(), ws.c_str(),
        master_port.c_str(), dir.empty() ? "-" : dir.c_str(), static_cast<char*>(nullptr));
  _exit(127);
}

}  // namespace

TEST_CASE("shm: torchrun-style processes meet over TCP (127.0.0.1) or files and run on shm",
          "[multirank]") {
  const fs::path dir = scratch_dir("shm-torchrun");
  for (const bool tcp : {true, false}) {
    const int world = 3;
    // meshrt listens on MASTER_PORT + 1.
    const int port = tcp ? free_port() : 0;
    REQUIRE(port != -1);
    std::vector<pid_t> pids;
    for (int r = 0; r < world; ++r)
      pids.push_back(torchrun_rank(r, world, std::to_string(port - 1), tcp ? "" : dir.string()));
    for (int r = 0; r < world; ++r) {
      int st = 0;
      waitpid(pids[static_cast<size_t>(r)], &st, 0);
      INFO((tcp ? "tcp" : "file") << " rank " << r);
      CHECK(WIFEXITED(st));
      CHECK(WEXITSTATUS(st) == 0);
    }
    CHECK(segments_of(pids).empty());
  }
  fs::remove_all(dir);
}

TEST_CASE("shm: stale segments of dead jobs are removed, live ones kept", "[unit]") {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int st = 0;
  waitpid(child, &st, 0);  // its pid now names no process
  const std::string dead = "/meshrt-shm-" + std::to_string(child) + "-deadbeef";
  const std::string live = "/meshrt-shm-" + std::to_string(getpid()) + "-cafe";
  for (const std::string& nm : {dead, live}) {
    const int fd = shm_open(nm.c_str(), O_CREAT | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    close(fd);
  }
  const std::vector<std::string> removed = detail::shm_remove_stale_segments();
  CHECK(std::find(removed.begin(), removed.end(), dead.substr(1)) != removed.end());
  CHECK(std::find(removed.begin(), removed.end(), live.substr(1)) == removed.end());
  CHECK(segments_of({child}).empty());
  CHECK(segments_of({getpid()}).size() == 1);
  shm_unlink(live.c_str());
}

int main(int argc, char** argv) {
  if (argc == 7 && std::string(argv[1]) == "--shm-rank") {
    try {
      return shm_rank_main(argv[2], argv[3], std::atoi(argv[4]), std::atoi(argv[5]), argv[6]);
    } catch (const std::exception& e) {
      std::printf("SHM FAIL: %s\n", e.what());
      return 2;
    }
  }
  if (argc == 6 && std::string(argv[1]) == "--shm-torchrun")
    return shm_torchrun_main(std::atoi(argv[2]), std::atoi(argv[3]), argv[4], argv[5]);
  return Catch::Session().run(argc, argv);
}
