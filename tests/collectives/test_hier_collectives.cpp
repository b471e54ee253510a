// The two-level backend (shm inside nodes, MPI between them) on one machine: run by ctest under
// mpirun with -np 4 (two simulated nodes of two ranks) and -np 3 (nodes of two and one). Each
// rank's node is MESHRT_NODE_ID = its MPI rank % 2, set before anything reads it, so the nodes
// interleave ranks (0, 2 | 1, 3) and the blocks' reordering is exercised.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <mpi.h>

#include <cstdlib>
#include <random>
#include <string>

#include "backends/mpi/mpi_comm.h"
#include "backends/mpi/mpi_runtime.h"
#include "coll_matrix.h"
#include "coll_test_util.h"
#include "collectives/bootstrap.h"
#include "runtime/stream.h"

using namespace meshrt;
using namespace meshrt::test;

namespace {

CommConfig hier_test_config() {
  CommConfig c;
  c.timeout_s = 60;
  return c;
}

// The two-level world (bootstrap's choice) and the flat MPI world of the same processes.
struct HierWorlds {
  std::unique_ptr<Launch> launch;
  std::unique_ptr<Communicator> hier, flat;
};

HierWorlds& hier_worlds() {
  static HierWorlds w = [] {
    HierWorlds h;
    h.launch = bootstrap(LaunchOptions{});
    h.hier = h.launch->world(0);
    h.flat = make_mpi_world_communicator(hier_test_config());
    return h;
  }();
  return w;
}

// Random data no reduction order changes for integers (sums wrap exactly), and general floats.
void hier_fill_random(const Tensor& t, uint64_t seed) {
  std::mt19937_64 g(seed);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint64_t x = g();
    switch (t.dtype()) {
      case DType::i32:
        static_cast<int32_t*>(t.data_ptr())[i] = static_cast<int32_t>(x);
        break;
      case DType::i64:
        static_cast<int64_t*>(t.data_ptr())[i] = static_cast<int64_t>(x);
        break;
      default:
        store(t.data_ptr(), t.dtype(), i, static_cast<double>(x % 100000) / 977.0 - 50.0);
    }
  }
}

// Integers: bit for bit. Floats: the inputs lie within +-51 and every partial sum within +-256,
// where one rounding to the dtype is at most half a unit in the last place (bf16 0.5, f16 0.0625,
// f32 ~1e-5); two levels round once more per level than the flat path, and f32 sums in another
// order: a few such units apart.
void hier_compare(Failures& f, const std::string& what, const Tensor& got, const Tensor& want) {
  const DType dt = got.dtype();
  const double tol = dt == DType::f32 ? 1e-4 : dt == DType::bf16 ? 2.0 : 0.25;
  int bad = 0;
  for (int64_t i = 0; i < got.numel() && bad < 3; ++i) {
    const double a = load(got.data_ptr(), dt, i), b = load(want.data_ptr(), dt, i);
    const bool ok = is_floating(dt) ? std::abs(a - b) <= tol : a == b;
    if (!ok) {
      ++bad;
      f.add(what + ": element " + std::to_string(i) + " = " + std::to_string(a) + ", flat " +
            std::to_string(b));
    }
  }
}

}  // namespace

TEST_CASE("hier: simulated nodes pick the two-level backend, --backend mpi stays flat", "[mpi]") {
  HierWorlds& w = hier_worlds();
  CHECK(w.launch->backend() == "hier");
  CHECK(w.hier->backend() == "hier");
  const RankPlacement& p = w.launch->local()[0];
  CHECK(p.local_size == (w.hier->size() + (p.rank % 2 == 0 ? 1 : 0)) / 2);
  LaunchOptions mpi_opts;
  mpi_opts.backend = "mpi";
  CHECK(bootstrap(mpi_opts)->backend() == "mpi");
}

TEST_CASE("hier: every op x dtype x in/out-of-place x sizes 0, 1, odd, large, exactly", "[mpi]") {
  HierWorlds& w = hier_worlds();
  auto s = make_host_stream("comm");
  Failures f;
  const int64_t ops = run_matrix(*w.hier, *s, {0, 1, 37, 20001, 300007}, f, 31);
  INFO(f.str());
  CHECK(f.count() == 0);
  CHECK(ops == 11 * 5 * 2 * 5);
}

TEST_CASE("hier: all_reduce, reduce_scatter, all_gather equal the flat MPI path's", "[mpi]") {
  HierWorlds& w = hier_worlds();
  auto s = make_host_stream("comm");
  const int n = w.hier->size(), r = w.hier->rank();
  Failures f;
  for (DType dt : comm_dtypes()) {
    for (int64_t N : {int64_t{1}, int64_t{37}, int64_t{300007}}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg}) {
        const std::string what =
            std::string(dtype_name(dt)) + " N=" + std::to_string(N) + " " + reduce_op_name(op);
        Tensor in = host_tensor(N, dt), a = host_tensor(N, dt), b = host_tensor(N, dt);
        hier_fill_random(in, 1000 + static_cast<uint64_t>(r) * 77 + static_cast<uint64_t>(N));
        w.hier->all_reduce(in, a, op, *s).synchronize();
        w.flat->all_reduce(in, b, op, *s).synchronize();
        hier_compare(f, "all_reduce " + what, a, b);
        Tensor big = host_tensor(N * n, dt);
        hier_fill_random(big, 5000 + static_cast<uint64_t>(r) * 31 + static_cast<uint64_t>(N));
        w.hier->reduce_scatter(big, a, op, *s).synchronize();
        w.flat->reduce_scatter(big, b, op, *s).synchronize();
        hier_compare(f, "reduce_scatter " + what, a, b);
      }
      Tensor in = host_tensor(N, dt), a = host_tensor(N * n, dt), b = host_tensor(N * n, dt);
      hier_fill_random(in, 9000 + static_cast<uint64_t>(r));
      w.hier->all_gather(in, a, *s).synchronize();
      w.flat->all_gather(in, b, *s).synchronize();
      hier_compare(f, std::string("all_gather ") + dtype_name(dt), a, b);
    }
  }
  INFO(f.str());
  CHECK(f.count() == 0);
}

TEST_CASE("hier: send / recv, barrier and split work on the two-level world", "[mpi]") {
  HierWorlds& w = hier_worlds();
  Communicator& c = *w.hier;
  const int n = c.size(), r = c.rank();
  auto tx = make_host_stream("send"), rx = make_host_stream("recv");
  Tensor out = host_tensor(1001, DType::i64), in = host_tensor(1001, DType::i64);
  fill_value(out, r + 1);
  Event se = c.send(out, (r + 1) % n, *tx);
  Event re = c.recv(in, (r + n - 1) % n, *rx);
  se.synchronize();
  re.synchronize();
  CHECK(in.item(1000) == Approx(static_cast<double>((r + n - 1) % n + 1)));
  c.barrier(*tx).synchronize();
  auto half = c.split(r % 2, r, "half");
  REQUIRE(half);
  CHECK(half->size() == (n + (r % 2 == 0 ? 1 : 0)) / 2);
  Tensor t = host_tensor(5, DType::i32);
  fill_value(t, r);
  half->all_reduce(t, ReduceOp::Sum, *tx).synchronize();
  int64_t want = 0;
  for (int j = r % 2; j < n; j += 2) want += j;
  CHECK(t.item(4) == Approx(static_cast<double>(want)));
}

int main(int argc, char** argv) {
  // The simulated node of this rank, before bootstrap reads it.
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank == nullptr) rank = std::getenv("PMIX_RANK");
  if (rank != nullptr) setenv("MESHRT_NODE_ID", std::to_string(std::atoi(rank) % 2).c_str(), 1);
  mpi_init();
  int rc = Catch::Session().run(argc, argv);
  hier_worlds().flat.reset();
  hier_worlds().hier.reset();
  hier_worlds().launch.reset();
  // The job fails if any rank failed.
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  mpi_finalize();
  return worst;
}
