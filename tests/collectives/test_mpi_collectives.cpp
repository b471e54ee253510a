// MPI communicator (ranks = processes): run under mpirun by ctest with -np 2 and -np 4.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <mpi.h>

#include "backends/mpi/mpi_comm.h"
#include "backends/mpi/mpi_runtime.h"
#include "coll_matrix.h"
#include "coll_test_util.h"
#include "collectives/bootstrap.h"
#include "collectives/bootstrap_transport.h"
#include "runtime/stream.h"

using namespace meshrt;
using namespace meshrt::test;

namespace {

CommConfig test_config() {
  CommConfig c;
  c.timeout_s = 60;
  return c;
}

Communicator& world() {
  static std::unique_ptr<Communicator> w = make_mpi_world_communicator(test_config());
  return *w;
}

void clear_error(Stream& s) {
  try {
    s.synchronize();
  } catch (const std::exception&) {
  }
}

// The CommError message `call()` (work on `s`, then synchronize) fails with; "" when it does not.
// Clears the stream's error so that later work on `s` runs.
template <class F>
std::string comm_error_of(F call, Stream& s) {
  try {
    call();
  } catch (const CommError& e) {
    clear_error(s);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("mpi: every op x dtype x in/out-of-place x sizes 0, 1, odd, large", "[mpi]") {
  Communicator& w = world();
  auto s = make_host_stream("comm");
  Failures f;
  int64_t ops = run_matrix(w, *s, {0, 1, 37, 20001}, f, 11);
  INFO(f.str());
  CHECK(f.count() == 0);
  CHECK(ops == 11 * 5 * 2 * 4);
}

TEST_CASE("mpi: bootstrap under mpirun gives one rank per process with its local rank", "[mpi]") {
  // One node: auto moves CPU data through shared memory, MPI only bootstraps; --backend mpi
  // keeps MPI's data path.
  LaunchOptions mpi_opts;
  mpi_opts.backend = "mpi";
  CHECK(bootstrap(mpi_opts)->backend() == "mpi");
  auto launch = bootstrap(LaunchOptions{});
  CHECK(launch->kind() == LaunchKind::MpiProcesses);
  CHECK(launch->backend() == "shm");
  REQUIRE(launch->local().size() == 1);
  const RankPlacement& p = launch->local()[0];
  CHECK(p.rank == world().rank());
  CHECK(p.world_size == world().size());
  CHECK(p.local_rank == p.rank);  // one node: the host name hashes all match
  CHECK(p.local_size == p.world_size);
  int64_t total = 0;
  launch->run([&](const RankPlacement& rp, Communicator& c) {
    auto s = make_host_stream("comm");
    Tensor t = host_tensor(1, DType::i64);
    fill_value(t, rp.rank + 1);
    c.all_reduce(t, ReduceOp::Sum, *s).synchronize();
    total = static_cast<int64_t>(t.item(0));
  });
  CHECK(total == int64_t{world().size()} * (world().size() + 1) / 2);
}

TEST_CASE("mpi: large in-place and out-of-place all_reduce (staged path)", "[mpi]") {
  Communicator& w = world();
  auto s = make_host_stream("comm");
  Failures f;
  const int64_t N = 300007;  // > 1 MiB of f32: the staged in-place path
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    Tensor t = host_tensor(N, DType::f32);
    fill_pattern(t, 21, w.rank());
    w.all_reduce(t, op, *s).synchronize();
    check_values(f, "in-place", t, 0, N,
                 [&](int64_t i) { return reduced(DType::f32, op, 21, w.size(), i); });
    Tensor in = host_tensor(N, DType::i64), out = host_tensor(N, DType::i64);
    fill_pattern(in, 22, w.rank());
    w.all_reduce(in, out, op, *s).synchronize();
    check_values(f, "out-of-place", out, 0, N,
                 [&](int64_t i) { return reduced(DType::i64, op, 22, w.size(), i); });
  }
  INFO(f.str());
  CHECK(f.count() == 0);
}

TEST_CASE("mpi: split into grid rows and columns with collectives on two streams at once",
          "[mpi]") {
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  const int cols_n = n % 2 == 0 ? n / 2 : n;  // a 2 x n/2 grid (1 x n when n is odd)
  const int row = r / cols_n, col = r % cols_n;
  auto rows = w.split(row, col, "row");
  auto cols = w.split(col, row, "col");
  REQUIRE(rows);
  REQUIRE(cols);
  CHECK(rows->size() == cols_n);
  CHECK(rows->rank() == col);
  CHECK(cols->rank() == row);
  auto none = w.split(kNoColor, 0);
  CHECK(none == nullptr);
  auto sa = make_host_stream("row");
  auto sb = make_host_stream("col");
  Failures f;
  for (int it = 0; it < 10; ++it) {
    const uint64_t seed = 40 + static_cast<uint64_t>(it);
    Tensor a = host_tensor(3001, DType::f32);
    Tensor b = host_tensor(3001, DType::bf16);
    fill_pattern(a, seed, rows->rank());
    fill_pattern(b, seed + 1, cols->rank());
    Event ea = rows->all_reduce(a, ReduceOp::Sum, *sa);
    Event eb = cols->all_reduce(b, ReduceOp::Min, *sb);
    ea.synchronize();
    eb.synchronize();
    check_values(f, "rows", a, 0, a.numel(), [&](int64_t i) {
      return reduced(DType::f32, ReduceOp::Sum, seed, rows->size(), i);
    });
    check_values(f, "cols", b, 0, b.numel(), [&](int64_t i) {
      return reduced(DType::bf16, ReduceOp::Min, seed + 1, cols->size(), i);
    });
  }
  INFO(f.str());
  CHECK(f.count() == 0);
}

TEST_CASE("mpi: send/recv around the ring", "[mpi]") {
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  auto ss = make_host_stream("send");
  auto sr = make_host_stream("recv");
  Failures f;
  for (int it = 0; it < 4; ++it) {
    Tensor out = host_tensor(500 + it, DType::i32);
    Tensor in = host_tensor(500 + it, DType::i32);
    fill_pattern(out, static_cast<uint64_t>(it), r);
    Event es = w.send(out, (r + 1) % n, *ss);
    Event er = w.recv(in, (r + n - 1) % n, *sr);
    es.synchronize();
    er.synchronize();
    check_values(f, "ring", in, 0, in.numel(),
                 [&](int64_t i) { return pattern(static_cast<uint64_t>(it), (r + n - 1) % n, i); });
  }
  INFO(f.str());
  CHECK(f.count() == 0);
}

TEST_CASE("mpi: unequal all_gather counts and (debug) mismatched calls name the ranks", "[mpi]") {
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  auto s = make_host_stream("comm");
  // all_gather counts are always compared on MPI.
  Tensor gin = host_tensor(r == n - 1 ? 3 : 2, DType::i64);
  Tensor gout = host_tensor(gin.numel() * n, DType::i64);
  const std::string m1 = comm_error_of([&] { w.all_gather(gin, gout, *s).synchronize(); }, *s);
  INFO(m1);
  CHECK_THAT(m1, Catch::Contains("collective mismatch on group 'world'") &&
                     Catch::Contains("rank " + std::to_string(n - 1) +
                                     " called all_gather(i64, count=3)") &&
                     Catch::Contains("called all_gather(i64, count=2)") &&
                     Catch::Contains("element counts differ"));
  // Every collective is compared under MESHRT_COMM_DEBUG=1.
  setenv("MESHRT_COMM_DEBUG", "1", 1);
  CommConfig dbg = CommConfig::from_env();
  unsetenv("MESHRT_COMM_DEBUG");
  REQUIRE(dbg.debug);
  auto dbg_world = make_mpi_world_communicator(dbg);
  Tensor t = host_tensor(r == 0 ? 5 : 4, DType::f32);
  const std::string m2 =
      comm_error_of([&] { dbg_world->all_reduce(t, ReduceOp::Sum, *s).synchronize(); }, *s);
  INFO(m2);
  CHECK_THAT(m2, Catch::Contains("rank 0 called all_reduce(f32, count=5, sum)") &&
                     Catch::Contains("called all_reduce(f32, count=4, sum)"));
  // Both communicators still work afterwards.
  Tensor ok = host_tensor(4, DType::f32);
  fill_pattern(ok, 9, r);
  dbg_world->all_reduce(ok, ReduceOp::Sum, *s).synchronize();
  Failures f;
  check_values(f, "after mismatch", ok, 0, 4,
               [&](int64_t i) { return reduced(DType::f32, ReduceOp::Sum, 9, n, i); });
  CHECK(f.count() == 0);
}

TEST_CASE("mpi: (debug) the data check passes every op and names a corrupted rank", "[mpi]") {
  const int n = world().size(), r = world().rank();
  auto s = make_host_stream("comm");
  CommConfig dbg = test_config();
  dbg.debug = true;
  // No false alarm over the whole matrix (every op, dtype, placement and size).
  auto checked = make_mpi_world_communicator(dbg);
  Failures f;
  run_matrix(*checked, *s, {1, 37, 20001}, f, 12);
  INFO(f.str());
  CHECK(f.count() == 0);
  // The last rank's result of its first collective is corrupted: every rank names it.
  dbg.fault = "corrupt@rank=" + std::to_string(n - 1) + ",step=1";
  auto faulty = make_mpi_world_communicator(dbg);
  Tensor t = host_tensor(1000, DType::f32);
  fill_pattern(t, 3, r);
  const std::string m =
      comm_error_of([&] { faulty->all_reduce(t, ReduceOp::Sum, *s).synchronize(); }, *s);
  INFO(m);
  CHECK_THAT(m, Catch::Contains("data check (MESHRT_COMM_DEBUG=1): all_reduce(f32, count=1000, "
                                "sum) on group 'world' (seq 1)") &&
                    Catch::Contains("culprit: rank " + std::to_string(n - 1) + " ("));
  // The communicator still works afterwards.
  fill_pattern(t, 4, r);
  faulty->all_reduce(t, ReduceOp::Sum, *s).synchronize();
  Failures g;
  check_values(g, "after the data check", t, 0, 1000,
               [&](int64_t i) { return reduced(DType::f32, ReduceOp::Sum, 4, n, i); });
  CHECK(g.count() == 0);
}

TEST_CASE("mpi: the bootstrap transport gathers blobs of any length in rank order", "[mpi]") {
  auto t = make_mpi_transport(60, "MESHRT_COMM_TIMEOUT");
  const int r = world().rank(), n = world().size();
  CHECK(t->rank() == r);
  CHECK(t->size() == n);
  std::vector<std::string> all =
      t->all_gather("test", std::string(static_cast<size_t>(r) * 3, static_cast<char>('a' + r)));
  REQUIRE(all.size() == static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    CHECK(all[static_cast<size_t>(j)] ==
          std::string(static_cast<size_t>(j) * 3, static_cast<char>('a' + j)));
  }
}

int main(int argc, char* argv[]) {
  mpi_init();
  int rc = Catch::Session().run(argc, argv);
  // The job fails if any rank failed.
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  mpi_finalize();
  return worst;
}
