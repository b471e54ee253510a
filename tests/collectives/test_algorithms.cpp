// The collective algorithm layer (collectives/algorithms/): the table's choice for given
// (op, size, world), MESHRT_ALGO's parser and its refusals, and every algorithm the threads
// backend offers, forced, giving the exact results of the default choice.
#include <catch2/catch.hpp>

#include <cstring>

#include "coll_matrix.h"
#include "coll_test_util.h"
#include "collectives/algorithms/algorithm.h"
#include "collectives/algorithms/host_transport.h"
#include "collectives/host_comm.h"
#include "runtime/stream.h"
#include "tests/common/env.h"

using namespace meshrt;
using namespace meshrt::test;
using detail::AlgoPlan;
using detail::AlgoWorld;
namespace algos = detail::algos;

namespace {

std::string pick(const AlgoWorld& w, CommOp op, int64_t bytes, const std::string& spec = "") {
  return AlgoPlan(w, spec).pick(op, bytes)->name;
}

// The message of parse_algo_override's refusal of `spec` ("" when it accepts it).
std::string refusal(const std::string& spec) {
  try {
    (void)detail::parse_algo_override(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("algorithms: the table's defaults are the engines' former thresholds", "[unit]") {
  const AlgoWorld host{"host", 4, 1}, shm2{"shm", 2, 1}, shm4{"shm", 4, 1};
  // threads: eager up to 4 KiB (the slots' buffers), flat above and for every other op.
  CHECK(pick(host, CommOp::AllReduce, 8) == "eager");
  CHECK(pick(host, CommOp::AllReduce, 4096) == "eager");
  CHECK(pick(host, CommOp::AllReduce, 4097) == "flat");
  CHECK(pick(host, CommOp::AllGather, 8) == "flat");
  CHECK(pick(host, CommOp::AllToAll, 64 << 20) == "flat");
  // shm: one step while bytes x ranks <= 8 KiB, zero copy above; reduce-scatter and all-gather
  // (bytes: the whole buffer) staged up to 8 KiB; broadcast and all-to-all always staged.
  CHECK(pick(shm2, CommOp::AllReduce, 4096) == "one_step");
  CHECK(pick(shm2, CommOp::AllReduce, 4097) == "zero_copy");
  CHECK(pick(shm4, CommOp::AllReduce, 2048) == "one_step");
  CHECK(pick(shm4, CommOp::AllReduce, 2049) == "zero_copy");
  CHECK(pick(shm4, CommOp::AllGather, 8192) == "staged");
  CHECK(pick(shm4, CommOp::AllGather, 8193) == "zero_copy");
  CHECK(pick(shm2, CommOp::ReduceScatter, 8193) == "zero_copy");
  CHECK(pick(shm2, CommOp::Broadcast, 64 << 20) == "staged");
  CHECK(pick(shm2, CommOp::AllToAll, 8) == "staged");
  // two nodes: two levels for the reductions and all-gather, flat MPI for the rest.
  CHECK(pick({"hier", 4, 2}, CommOp::AllReduce, 8) == "two_level");
  CHECK(pick({"hier", 4, 2}, CommOp::AllGather, 64 << 20) == "two_level");
  CHECK(pick({"hier", 4, 2}, CommOp::Broadcast, 8) == "flat");
  CHECK(pick({"mpi", 4, 1}, CommOp::AllReduce, 64 << 20) == "native");
  CHECK(pick({"tcp", 4, 1}, CommOp::AllReduce, 8) == "socket_ring");
  CHECK(pick({"tcp", 4, 1}, CommOp::AllToAll, 64 << 20) == "pairwise");
  // tcp's broadcast: the tree up to 256 KiB, the pipelined ring beyond; linear only forced.
  CHECK(pick({"tcp", 4, 1}, CommOp::Broadcast, 256 << 10) == "binomial");
  CHECK(pick({"tcp", 4, 1}, CommOp::Broadcast, (256 << 10) + 1) == "ring_pipeline");
  CHECK(pick({"tcp", 4, 1}, CommOp::Broadcast, 8, "broadcast:linear") == "linear");
  CHECK(pick({"tcp", 4, 1}, CommOp::Broadcast, 64 << 20, "broadcast:binomial") == "binomial");
  CHECK(pick({"host", 4, 1}, CommOp::Broadcast, 8, "broadcast:linear") == "flat");
  CHECK(pick({"nccl", 8, 1}, CommOp::AllGather, 8) == "native");
  // Composed algorithms are never a default.
  CHECK_FALSE(AlgoPlan(host, "").any_composed());
  CHECK_FALSE(AlgoPlan({"nccl", 8, 1}, "").any_composed());
}

TEST_CASE("algorithms: MESHRT_ALGO forces an algorithm where the backend offers it", "[unit]") {
  const AlgoWorld host{"host", 2, 1}, shm{"shm", 2, 1};
  CHECK(pick(host, CommOp::AllReduce, 8, "all_reduce:flat") == "flat");
  CHECK(pick(host, CommOp::AllReduce, 8, "flat") == "flat");
  // eager holds 4 KiB at most: larger messages keep the table's choice.
  CHECK(pick(host, CommOp::AllReduce, 4096, "all_reduce:eager") == "eager");
  CHECK(pick(host, CommOp::AllReduce, 4097, "all_reduce:eager") == "flat");
  CHECK(pick(shm, CommOp::AllReduce, 64 << 20, "staged") == "staged");
  CHECK(pick(shm, CommOp::AllGather, 8, "zero_copy") == "zero_copy");
  CHECK(pick(shm, CommOp::Broadcast, 8, "zero_copy") == "staged");  // no zero-copy broadcast
  CHECK(pick(shm, CommOp::AllReduce, 8, "one_step") == "one_step");
  CHECK(pick(shm, CommOp::AllReduce, (1 << 20) + 1, "one_step") == "zero_copy");
  // A backend without the algorithm keeps its own: staged is shm's, eager the threads'.
  CHECK(pick(host, CommOp::AllReduce, 64 << 20, "staged") == "flat");
  CHECK(pick({"mpi", 2, 1}, CommOp::AllReduce, 8, "eager") == "native");
  // The ring is composed: on every backend, NCCL included, for all_gather only.
  for (const char* b : {"host", "shm", "mpi", "tcp", "hier", "nccl"}) {
    const AlgoPlan p({b, 4, 1}, "all_gather:ring");
    CHECK(p.pick(CommOp::AllGather, 64 << 20)->name == std::string("ring"));
    CHECK(p.pick(CommOp::AllGather, 64 << 20)->run != nullptr);
    CHECK(p.composed(CommOp::AllGather));
    CHECK_FALSE(p.composed(CommOp::AllReduce));
  }
  CHECK(pick(host, CommOp::AllReduce, 8, "all_gather:ring,all_reduce:flat") == "flat");
  CHECK(pick(host, CommOp::AllGather, 8, "all_gather:ring,all_reduce:flat") == "ring");
}

TEST_CASE("algorithms: a bad MESHRT_ALGO is refused naming the value and the valid names",
          "[unit]") {
  CHECK(refusal("") == "");
  CHECK(refusal("all_reduce:ring") ==
        "MESHRT_ALGO='all_reduce:ring': 'ring' is not an algorithm of all_reduce; use eager, "
        "fixed_order, flat, native, one_step, socket_ring, staged, two_level or zero_copy (form: "
        "op:algorithm[,op:algorithm...], or one algorithm for every op that has it; "
        "docs/environment.md)");
  CHECK_THAT(refusal("rign"),
             Catch::StartsWith("MESHRT_ALGO='rign': unknown algorithm 'rign'; "
                               "use binomial, eager, fixed_order, flat, linear, native, "
                               "one_step, pairwise, ring, ring_pipeline, socket_ring, staged, "
                               "two_level or zero_copy"));
  CHECK_THAT(refusal("allreduce:flat,gather:ring"),
             Catch::StartsWith("MESHRT_ALGO='allreduce:flat,gather:ring': unknown op 'gather'; "
                               "use all_reduce, all_gather, reduce_scatter, broadcast or "
                               "all_to_all"));
  CHECK_THAT(refusal("flat,"), Catch::StartsWith("MESHRT_ALGO='flat,': an empty entry"));
  CHECK_THAT(refusal("send:flat"), Catch::Contains("unknown op 'send'"));
  // It enters through CommConfig::from_env, which the one environment check runs.
  ScopedEnv env("MESHRT_ALGO", "all_gather:eager");
  try {
    (void)CommConfig::from_env();
    FAIL("MESHRT_ALGO=all_gather:eager was accepted");
  } catch (const Error& e) {
    CHECK_THAT(std::string(e.what()),
               Catch::StartsWith("MESHRT_ALGO='all_gather:eager': 'eager' is not an algorithm "
                                 "of all_gather; use flat, native, ring, socket_ring, staged, "
                                 "two_level or zero_copy"));
  }
}

TEST_CASE("algorithms: meshrt info's table, op x size, for one backend", "[unit]") {
  CHECK(detail::algo_table_text({"host", 2, 1}, "") ==
        "  host (2 ranks, 1 node)\n"
        "    op \\ bytes      8 B        4 KiB      256 KiB    64 MiB\n"
        "    all_reduce      eager      eager      flat       flat\n"
        "    all_gather      flat       flat       flat       flat\n"
        "    reduce_scatter  flat       flat       flat       flat\n"
        "    broadcast       flat       flat       flat       flat\n"
        "    all_to_all      flat       flat       flat       flat\n");
  CHECK(detail::algo_table_text({"mpi", 4, 1}, "") ==
        "  mpi (4 ranks, 1 node): native for every op and size\n");
  CHECK(detail::algo_table_text({"tcp", 4, 1}, "") ==
        "  tcp (4 ranks, 1 node)\n"
        "    op \\ bytes      8 B           4 KiB         256 KiB       64 MiB\n"
        "    all_reduce      socket_ring   socket_ring   socket_ring   socket_ring\n"
        "    all_gather      socket_ring   socket_ring   socket_ring   socket_ring\n"
        "    reduce_scatter  socket_ring   socket_ring   socket_ring   socket_ring\n"
        "    broadcast       binomial      binomial      binomial      ring_pipeline\n"
        "    all_to_all      pairwise      pairwise      pairwise      pairwise\n");
  // A longer name widens the columns.
  CHECK(detail::algo_table_text({"host", 2, 1}, "all_reduce:fixed_order") ==
        "  host (2 ranks, 1 node)\n"
        "    op \\ bytes      8 B         4 KiB       256 KiB     64 MiB\n"
        "    all_reduce      fixed_order fixed_order fixed_order fixed_order\n"
        "    all_gather      flat        flat        flat        flat\n"
        "    reduce_scatter  flat        flat        flat        flat\n"
        "    broadcast       flat        flat        flat        flat\n"
        "    all_to_all      flat        flat        flat        flat\n");
}

TEST_CASE("algorithms: every algorithm forced on threads gives the default's exact results",
          "[multirank]") {
  // Small sizes: eager's (<= 4 KiB) and flat's; the ring runs through send / recv.
  for (const char* spec :
       {"all_reduce:eager", "all_reduce:flat", "flat", "all_gather:ring", "fixed_order"}) {
    for (int n : {2, 3}) {
      CommConfig cfg;
      cfg.timeout_s = 60;
      cfg.algo = spec;
      auto comms = make_host_communicators(n, "world", cfg);
      Failures f;
      std::vector<int64_t> ops(static_cast<size_t>(n));
      const auto errs = run_ranks(comms, [&](int r) {
        auto s = make_host_stream("algo" + std::to_string(r));
        ops[static_cast<size_t>(r)] =
            run_matrix(*comms[static_cast<size_t>(r)], *s, {0, 5, 1001}, f);
      });
      INFO(spec << " on " << n << " ranks: " << join_errors(errs) << f.str());
      CHECK(join_errors(errs).empty());
      CHECK(f.count() == 0);
      CHECK(ops[0] == 11 * 5 * 2 * 3);
    }
  }
}

TEST_CASE("algorithms: a composed algorithm runs as the communicator's own primitives",
          "[multirank]") {
  // The ring all-gather is send / recv: no collective is numbered, and the result is exact.
  CommConfig cfg;
  cfg.timeout_s = 60;
  cfg.algo = "all_gather:ring";
  auto comms = make_host_communicators(3, "world", cfg);
  Failures f;
  const auto errs = run_ranks(comms, [&](int r) {
    Communicator& c = *comms[static_cast<size_t>(r)];
    auto s = make_host_stream("ring" + std::to_string(r));
    Tensor in = host_tensor(7, DType::i32), out = host_tensor(21, DType::i32);
    fill_pattern(in, 5, r);
    c.all_gather(in, out, *s).synchronize();
    if (c.next_seq() != 1) f.add("rank " + std::to_string(r) + ": the all-gather was numbered");
    check_values(f, "ring", out, 0, 21, [](int64_t i) { return pattern(5, int(i / 7), i % 7); });
  });
  INFO(join_errors(errs) << f.str());
  CHECK(join_errors(errs).empty());
  CHECK(f.count() == 0);
}

namespace {

// The sum over ranks in the fixed tree over rank index: (x0 + x1) + x2, (x0 + x1) + (x2 + x3).
float tree_sum(const std::vector<float>& x) {
  return x.size() == 3 ? (x[0] + x[1]) + x[2] : (x[0] + x[1]) + (x[2] + x[3]);
}

// Rank r's element i: values whose sum depends on the order of the additions, rotated by i.
float order_value(int ranks, int r, int64_t i) {
  const float v4[] = {1e8f, 1.f, -1e8f, 1.f}, v3[] = {1e8f, 1.f, -1e8f};
  return ranks == 4 ? v4[(r + i) % 4] : v3[(r + i) % 3];
}

// Every rank's result of an all-reduce of 10 f32 elements under MESHRT_ALGO=`spec`, in one call
// (halves = false) or as two calls on its two halves.
std::vector<std::vector<float>> all_reduce_bits(int ranks, const std::string& spec, bool halves) {
  CommConfig cfg;
  cfg.timeout_s = 60;
  cfg.algo = spec;
  auto comms = make_host_communicators(ranks, "world", cfg);
  const int64_t n = 10;
  std::vector<std::vector<float>> got(static_cast<size_t>(ranks));
  const auto errs = run_ranks(comms, [&](int r) {
    Communicator& c = *comms[static_cast<size_t>(r)];
    auto s = make_host_stream("fo" + std::to_string(r));
    Tensor t = host_tensor(n, DType::f32);
    auto* p = static_cast<float*>(t.data_ptr());
    for (int64_t i = 0; i < n; ++i) p[i] = order_value(ranks, r, i);
    if (halves) {
      c.all_reduce(t.narrow(0, 0, n / 2), ReduceOp::Sum, *s);
      c.all_reduce(t.narrow(0, n / 2, n - n / 2), ReduceOp::Sum, *s).synchronize();
    } else {
      c.all_reduce(t, ReduceOp::Sum, *s).synchronize();
    }
    got[static_cast<size_t>(r)].assign(p, p + n);
  });
  INFO(join_errors(errs));
  CHECK(join_errors(errs).empty());
  return got;
}

std::vector<float> expected_tree(int ranks) {
  std::vector<float> want;
  for (int64_t i = 0; i < 10; ++i) {
    std::vector<float> x;
    for (int r = 0; r < ranks; ++r) x.push_back(order_value(ranks, r, i));
    want.push_back(tree_sum(x));
  }
  return want;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("algorithms: forced fixed_order all-reduce sums in the tree over rank index",
          "[multirank]") {
  for (int ranks : {3, 4}) {
    const std::vector<float> want = expected_tree(ranks);
    const auto one = all_reduce_bits(ranks, "all_reduce:fixed_order", false);
    const auto two = all_reduce_bits(ranks, "all_reduce:fixed_order", true);
    for (int r = 0; r < ranks; ++r) {
      INFO(ranks << " ranks, rank " << r);
      CHECK(same_bits(one[static_cast<size_t>(r)], want));
      CHECK(same_bits(two[static_cast<size_t>(r)], want));
    }
  }
  // The negative control: on 4 ranks the default (rank-order sums) differs from the tree; on 3
  // ranks the tree (x0 + x1) + x2 is the rank order, so no data can tell them apart.
  const auto dflt = all_reduce_bits(4, "", false);
  CHECK_FALSE(same_bits(dflt[0], expected_tree(4)));
}

TEST_CASE("algorithms: forced fixed_order reduce-scatter sums in the tree over rank index",
          "[multirank]") {
  const int ranks = 4;
  const int64_t count = 3;
  CommConfig cfg;
  cfg.timeout_s = 60;
  cfg.algo = "reduce_scatter:fixed_order";
  auto comms = make_host_communicators(ranks, "world", cfg);
  std::vector<std::vector<float>> got(ranks);
  const auto errs = run_ranks(comms, [&](int r) {
    Communicator& c = *comms[static_cast<size_t>(r)];
    auto s = make_host_stream("fo" + std::to_string(r));
    Tensor in = host_tensor(count * ranks, DType::f32), out = host_tensor(count, DType::f32);
    auto* p = static_cast<float*>(in.data_ptr());
    for (int64_t i = 0; i < count * ranks; ++i) p[i] = order_value(ranks, r, i);
    c.reduce_scatter(in, out, ReduceOp::Sum, *s).synchronize();
    const auto* o = static_cast<const float*>(out.data_ptr());
    got[static_cast<size_t>(r)].assign(o, o + count);
  });
  INFO(join_errors(errs));
  REQUIRE(join_errors(errs).empty());
  for (int r = 0; r < ranks; ++r) {
    std::vector<float> want;
    for (int64_t i = 0; i < count; ++i) {
      std::vector<float> x;
      for (int q = 0; q < ranks; ++q) x.push_back(order_value(ranks, q, r * count + i));
      want.push_back(tree_sum(x));
    }
    INFO("rank " << r);
    CHECK(same_bits(got[static_cast<size_t>(r)], want));
  }
}

namespace {

// Two ranks of a threads group, both on this thread: every rank's buffers (and eager copy) are
// in place before the algorithm runs for rank 0, then for rank 1, so enter() only records.
struct TwoRankSlots final : detail::HostTransport {
  int me = 0;
  const void* ins[2] = {};
  void* outs[2] = {};
  float eager[2][8] = {};
  int entered = 0, left = 0;
  uint64_t left_early = 0;
  int rank() const override { return me; }
  int size() const override { return 2; }
  void enter(const detail::Op&, const void* in, void* out, size_t eager_bytes) override {
    REQUIRE(in == ins[me]);
    REQUIRE(eager_bytes <= sizeof(eager[me]));
    outs[me] = out;
    ++entered;
  }
  const void* peer_in(int j) const override { return ins[j]; }
  void* peer_out(int j) const override { return outs[j]; }
  const void* peer_eager(int j, uint64_t) const override { return eager[j]; }
  void leave(uint64_t, const detail::Op&) override { ++left; }
  void leave_early(uint64_t seq) override { left_early = seq; }
};

}  // namespace

TEST_CASE("algorithms: eager and flat run over any HostTransport, the slots' interface", "[unit]") {
  Tensor in[2] = {host_tensor(8, DType::f32), host_tensor(8, DType::f32)};
  Tensor out[2] = {host_tensor(8, DType::f32), host_tensor(8, DType::f32)};
  TwoRankSlots t;
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 8; ++i) static_cast<float*>(in[r].data_ptr())[i] = float(i + 100 * r);
    std::memcpy(t.eager[r], in[r].data_ptr(), sizeof(t.eager[r]));
    t.ins[r] = in[r].data_ptr();
    t.outs[r] = out[r].data_ptr();
  }
  auto call = [&](int r) {
    CommCall c;
    c.op = CommOp::AllReduce;
    c.count = 8;
    c.in = in[r];
    c.out = out[r];
    c.seq = 7;
    return c;
  };
  const detail::Op op;
  auto check_sums = [&] {
    for (int r = 0; r < 2; ++r)
      for (int i = 0; i < 8; ++i)
        CHECK(static_cast<const float*>(out[r].data_ptr())[i] == float(2 * i + 100));
  };
  SECTION("flat: rank 0 reduces the first cache line's slice into both outputs, rank 1 the rest") {
    for (int r = 0; r < 2; ++r) {
      t.me = r;
      detail::flat_all_reduce(t, call(r), op);
    }
    check_sums();
    CHECK(t.entered == 2);
    CHECK(t.left == 2);
    CHECK(t.left_early == 0);
  }
  SECTION("eager: each rank reduces both eager copies into its own output and leaves early") {
    for (int r = 0; r < 2; ++r) {
      t.me = r;
      detail::eager_all_reduce(t, call(r), op);
    }
    check_sums();
    CHECK(t.entered == 2);
    CHECK(t.left == 0);
    CHECK(t.left_early == 7);
  }
}
