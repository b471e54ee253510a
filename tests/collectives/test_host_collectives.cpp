// Host (ranks = threads) communicator: every op x dtype x in-place x world size x size, split
// grids with concurrent streams, the watchdog, the mismatch detector, send/recv, validation.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "coll_matrix.h"
#include "coll_test_util.h"
#include "collectives/host_comm.h"
#include "runtime/stream.h"

using namespace meshrt;
using namespace meshrt::test;

namespace {

CommConfig test_config(double timeout_s = 60) {
  CommConfig c;
  c.timeout_s = timeout_s;
  return c;
}

// Host streams keep the first error of their tasks until stream.synchronize() reports it.
void clear_error(Stream& s) {
  try {
    s.synchronize();
  } catch (const std::exception&) {
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("host: every op x dtype x in/out-of-place x world 1..8 x sizes 0, 1, odd, large",
          "[multirank]") {
  CommConfig cfg = test_config();
  const std::vector<int64_t> sizes = {0, 1, 37, 20001};
  for (int n = 1; n <= 8; ++n) {
    auto comms = make_host_communicators(n, "world", cfg);
    Failures f;
    std::atomic<int64_t> ops{0};
    auto errs = run_ranks(comms, [&](int r) {
      auto s = make_host_stream("comm" + std::to_string(r));
      ops += run_matrix(*comms[static_cast<size_t>(r)], *s, sizes, f, 1000 * n);
    });
    INFO("world size " << n << "\n" << f.str() << join_errors(errs));
    CHECK(join_errors(errs).empty());
    CHECK(f.count() == 0);
    CHECK(ops.load() == int64_t{n} * 11 * 5 * 2 * static_cast<int64_t>(sizes.size()));
  }
}

TEST_CASE("host: large all_reduce of random floats is bit-identical across ranks", "[multirank]") {
  // Large enough for non-temporal stores, ragged against the slices and blocks.
  const int64_t N = (int64_t{1} << 21) + 3;
  for (int n : {2, 3, 8}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      auto comms = make_host_communicators(n, "world", test_config());
      std::vector<Tensor> ins, outs;
      for (int r = 0; r < n; ++r) {
        Tensor in = host_tensor(N, dt);
        std::mt19937 rng(static_cast<unsigned>(r * 7919 + 17));
        std::uniform_real_distribution<float> u(-1.f, 1.f);
        for (int64_t i = 0; i < N; ++i) store(in.data_ptr(), dt, i, u(rng));
        ins.push_back(in);
        outs.push_back(host_tensor(N, dt));
      }
      auto errs = run_ranks(comms, [&](int r) {
        auto s = make_host_stream("comm");
        comms[static_cast<size_t>(r)]
            ->all_reduce(ins[static_cast<size_t>(r)], outs[static_cast<size_t>(r)], ReduceOp::Sum,
                         *s)
            .synchronize();
      });
      REQUIRE(join_errors(errs).empty());
      // Reference: f32 sum in rank order 0..n-1, rounded once.
      int64_t bad = 0;
      for (int64_t i = 0; i < N; ++i) {
        float acc = static_cast<float>(load(ins[0].data_ptr(), dt, i));
        for (int j = 1; j < n; ++j) {
          acc += static_cast<float>(load(ins[static_cast<size_t>(j)].data_ptr(), dt, i));
        }
        double want = dt == DType::f32 ? acc : bf16_bits_to_f32(f32_to_bf16_bits(acc));
        if (load(outs[0].data_ptr(), dt, i) != want) ++bad;
      }
      INFO("n=" << n << " dtype " << dtype_name(dt));
      CHECK(bad == 0);
      for (int r = 1; r < n; ++r) {
        CHECK(std::memcmp(outs[0].data_ptr(), outs[static_cast<size_t>(r)].data_ptr(),
                          outs[0].nbytes()) == 0);
      }
    }
  }
}

TEST_CASE("host: 2x4 grid split into rows and columns, concurrent collectives on two streams",
          "[multirank]") {
  const int n = 8;
  auto comms = make_host_communicators(n, "world", test_config());
  Failures f;
  auto errs = run_ranks(comms, [&](int r) {
    Communicator& world = *comms[static_cast<size_t>(r)];
    const int row = r / 4, col = r % 4;
    auto rows = world.split(row, col, "row");
    auto cols = world.split(col, row, "col");
    auto none = world.split(r == 5 ? 1 : kNoColor, 0);
    if (rows->size() != 4 || rows->rank() != col || cols->size() != 2 || cols->rank() != row ||
        rows->name() != "row" || cols->name() != "col") {
      f.add("rank " + std::to_string(r) + ": wrong split shape");
    }
    if ((r == 5) != (none != nullptr)) f.add("kNoColor split returned a communicator");
    if (none && none->size() != 1) f.add("single-rank split has size != 1");
    auto sa = make_host_stream("row-stream");
    auto sb = make_host_stream("col-stream");
    const int64_t N = 5003;
    for (int it = 0; it < 20; ++it) {
      const uint64_t seed = 7 + static_cast<uint64_t>(it);
      Tensor a = host_tensor(N, DType::f32);
      Tensor b = host_tensor(N, DType::bf16);
      Tensor g_in = host_tensor(N, DType::i32);
      Tensor g_out = host_tensor(N * 2, DType::i32);
      fill_pattern(a, seed, rows->rank());
      fill_pattern(b, seed + 1, cols->rank());
      fill_pattern(g_in, seed + 2, cols->rank());
      // Issue everything before waiting for anything: both groups run at once.
      Event ea = rows->all_reduce(a, ReduceOp::Sum, *sa);
      Event eb = cols->all_reduce(b, ReduceOp::Max, *sb);
      Event eg = cols->all_gather(g_in, g_out, *sb);
      Event ea2 = rows->all_reduce(a, ReduceOp::Sum, *sa);  // sums of sums: x4 again
      ea.synchronize();
      eb.synchronize();
      eg.synchronize();
      ea2.synchronize();
      const std::string w = "grid rank " + std::to_string(r) + " it " + std::to_string(it);
      check_values(f, w + " rows", a, 0, N,
                   [&](int64_t i) { return 4 * reduced(DType::f32, ReduceOp::Sum, seed, 4, i); });
      check_values(f, w + " cols", b, 0, N,
                   [&](int64_t i) { return reduced(DType::bf16, ReduceOp::Max, seed + 1, 2, i); });
      for (int j = 0; j < 2; ++j) {
        check_values(f, w + " col gather", g_out, j * N, N,
                     [&](int64_t i) { return pattern(seed + 2, j, i); });
      }
    }
    // A world collective after the sub-group traffic still works.
    Tensor t = host_tensor(3, DType::i64);
    fill_pattern(t, 3, r);
    world.all_reduce(t, ReduceOp::Sum, *sa).synchronize();
    check_values(f, "world after split", t, 0, 3,
                 [&](int64_t i) { return reduced(DType::i64, ReduceOp::Sum, 3, n, i); });
  });
  INFO(f.str() << join_errors(errs));
  CHECK(join_errors(errs).empty());
  CHECK(f.count() == 0);
}

TEST_CASE("host: watchdog fails every waiting rank when one rank never calls", "[multirank]") {
  setenv("MESHRT_COMM_TIMEOUT", "1", 1);
  CommConfig cfg = CommConfig::from_env();
  unsetenv("MESHRT_COMM_TIMEOUT");
  REQUIRE(cfg.timeout_s == 1.0);
  const int n = 4;
  auto comms = make_host_communicators(n, "world", cfg);
  std::vector<double> elapsed(n, -1);
  std::vector<int> comm_errors(n, 0);
  auto errs = run_ranks(
      comms,
      [&](int r) {
        auto s = make_host_stream("comm");
        Tensor t = host_tensor(16, DType::f32);
        fill_value(t, 1);
        // One collective that completes, so the timed-out one carries seq 2.
        comms[static_cast<size_t>(r)]->all_reduce(t, ReduceOp::Sum, *s).synchronize();
        if (r == 3) return;  // never calls the second all_reduce
        auto t0 = std::chrono::steady_clock::now();
        try {
          comms[static_cast<size_t>(r)]->all_reduce(t, ReduceOp::Sum, *s).synchronize();
        } catch (const CommError&) {
          comm_errors[static_cast<size_t>(r)] = 1;
          elapsed[static_cast<size_t>(r)] = seconds_since(t0);
          throw;
        }
      },
      /*abort_on_error=*/false);
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << errs[static_cast<size_t>(r)]);
    CHECK(comm_errors[static_cast<size_t>(r)] == 1);
    CHECK(elapsed[static_cast<size_t>(r)] < 1.0 + 5.0);
    const std::string& m = errs[static_cast<size_t>(r)];
    CHECK(m.find("all_reduce") != std::string::npos);
    CHECK(m.find("'world'") != std::string::npos);
    CHECK(m.find("seq 2") != std::string::npos);
    CHECK(m.find("rank 3 never arrived") != std::string::npos);
  }
  CHECK(errs[3].empty());
  // The straggler finds its communicator aborted, with the reason, instead of hanging.
  Tensor t = host_tensor(16, DType::f32);
  auto s = make_host_stream("late");
  CHECK(comms[3]->aborted());
  CHECK_THROWS_AS(comms[3]->all_reduce(t, ReduceOp::Sum, *s), CommError);
  CHECK_THROWS_WITH(comms[3]->all_reduce(t, ReduceOp::Sum, *s),
                    Catch::Contains("rank 3 never arrived"));
}

TEST_CASE("host: abort() wakes the ranks waiting in a collective", "[multirank]") {
  const int n = 3;
  auto comms = make_host_communicators(n, "world", test_config(300));
  std::vector<double> elapsed(n, -1);
  auto errs = run_ranks(
      comms,
      [&](int r) {
        if (r == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          comms[2]->abort("test abort");
          return;
        }
        auto s = make_host_stream("comm");
        Tensor t = host_tensor(8, DType::f32);
        auto t0 = std::chrono::steady_clock::now();
        try {
          comms[static_cast<size_t>(r)]->all_reduce(t, ReduceOp::Sum, *s).synchronize();
        } catch (const CommError&) {
          elapsed[static_cast<size_t>(r)] = seconds_since(t0);
          throw;
        }
      },
      false);
  for (int r = 0; r < 2; ++r) {
    INFO(errs[static_cast<size_t>(r)]);
    CHECK(errs[static_cast<size_t>(r)].find("test abort") != std::string::npos);
    CHECK(elapsed[static_cast<size_t>(r)] >= 0);
    CHECK(elapsed[static_cast<size_t>(r)] < 2.0);
  }
}

TEST_CASE("host: mismatch detector names the differing ranks and their calls", "[multirank]") {
  setenv("MESHRT_COMM_DEBUG", "1", 1);
  CommConfig cfg = CommConfig::from_env();
  unsetenv("MESHRT_COMM_DEBUG");
  cfg.timeout_s = 60;
  REQUIRE(cfg.debug);
  const int n = 3;
  auto comms = make_host_communicators(n, "world", cfg);
  std::vector<std::string> m1(n), m2(n), m3(n);
  Failures f;
  auto errs = run_ranks(comms, [&](int r) {
    Communicator& c = *comms[static_cast<size_t>(r)];
    auto s = make_host_stream("comm");
    // 1: counts differ.
    Tensor t = host_tensor(r == 1 ? 5 : 4, DType::f32);
    try {
      c.all_reduce(t, ReduceOp::Sum, *s).synchronize();
    } catch (const CommError& e) {
      m1[static_cast<size_t>(r)] = e.what();
      clear_error(*s);
    }
    // 2: all_gather with unequal counts per rank.
    Tensor gin = host_tensor(r == 2 ? 3 : 2, DType::i32);
    Tensor gout = host_tensor(gin.numel() * n, DType::i32);
    try {
      c.all_gather(gin, gout, *s).synchronize();
    } catch (const CommError& e) {
      m2[static_cast<size_t>(r)] = e.what();
      clear_error(*s);
    }
    // 3: different operations.
    Tensor u = host_tensor(4, DType::bf16);
    try {
      if (r == 0) {
        c.broadcast(u, 0, *s).synchronize();
      } else {
        c.all_reduce(u, ReduceOp::Sum, *s).synchronize();
      }
    } catch (const CommError& e) {
      m3[static_cast<size_t>(r)] = e.what();
      clear_error(*s);
    }
    // The communicator is still usable afterwards.
    Tensor ok = host_tensor(4, DType::f32);
    fill_pattern(ok, 5, r);
    c.all_reduce(ok, ReduceOp::Sum, *s).synchronize();
    check_values(f, "after mismatches", ok, 0, 4,
                 [&](int64_t i) { return reduced(DType::f32, ReduceOp::Sum, 5, n, i); });
  });
  INFO(join_errors(errs) << f.str());
  CHECK(join_errors(errs).empty());
  CHECK(f.count() == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ":\n" << m1[r] << "\n" << m2[r] << "\n" << m3[r]);
    CHECK_THAT(m1[r], Catch::Contains("collective mismatch on group 'world'") &&
                          Catch::Contains("ranks 0, 2 called all_reduce(f32, count=4, sum)") &&
                          Catch::Contains("rank 1 called all_reduce(f32, count=5, sum)"));
    CHECK_THAT(m2[r], Catch::Contains("ranks 0, 1 called all_gather(i32, count=2)") &&
                          Catch::Contains("rank 2 called all_gather(i32, count=3)") &&
                          Catch::Contains("element counts differ"));
    CHECK_THAT(m3[r], Catch::Contains("rank 0 called broadcast(bf16, count=4, root=0)") &&
                          Catch::Contains("ranks 1, 2 called all_reduce(bf16, count=4, sum)"));
  }
}

namespace {
// Round `it` of a ring: each rank sends a pattern to the next on `ss`, receives the previous one's
// on `sr`, and checks it.
void ring_round(Communicator& c, Stream& ss, Stream& sr, int it, Failures& f) {
  const int r = c.rank(), n = c.size();
  Tensor out = host_tensor(1000 + it, DType::i64);
  Tensor in = host_tensor(1000 + it, DType::i64);
  fill_pattern(out, static_cast<uint64_t>(it), r);
  Event es = c.send(out, (r + 1) % n, ss);
  Event er = c.recv(in, (r + n - 1) % n, sr);
  es.synchronize();
  er.synchronize();
  check_values(f, "ring", in, 0, in.numel(),
               [&](int64_t i) { return pattern(static_cast<uint64_t>(it), (r + n - 1) % n, i); });
}
}  // namespace

TEST_CASE("host: send/recv around a ring, and a count mismatch", "[multirank]") {
  const int n = 4;
  auto comms = make_host_communicators(n, "world", test_config());
  Failures f;
  std::vector<std::string> mm(n);
  auto errs = run_ranks(comms, [&](int r) {
    Communicator& c = *comms[static_cast<size_t>(r)];
    auto ss = make_host_stream("send");
    auto sr = make_host_stream("recv");
    for (int it = 0; it < 5; ++it) ring_round(c, *ss, *sr, it, f);
    if (r < 2) {
      Tensor t = host_tensor(r == 0 ? 4 : 5, DType::f32);
      try {
        (r == 0 ? c.send(t, 1, *ss) : c.recv(t, 0, *sr)).synchronize();
      } catch (const CommError& e) {
        mm[static_cast<size_t>(r)] = e.what();
        clear_error(r == 0 ? *ss : *sr);
      }
    }
  });
  INFO(join_errors(errs) << f.str());
  CHECK(join_errors(errs).empty());
  CHECK(f.count() == 0);
  for (int r = 0; r < 2; ++r) {
    CHECK_THAT(mm[r], Catch::Contains("rank 0 sends f32 count=4 to rank 1") &&
                          Catch::Contains("rank 1 receives f32 count=5"));
  }
}

TEST_CASE("host: send/recv and collectives still queue under launch blocking", "[multirank]") {
  // MESHRT_LAUNCH_BLOCKING=1 blocks each host enqueue until its task ran; a send that blocked so
  // would never let its rank post the receive its peer's send waits for. The ring completes, and
  // the compute stream's own work still blocks.
  set_host_launch_blocking(1);
  const int n = 4;
  auto comms = make_host_communicators(n, "world", test_config(30));
  Failures f;
  std::atomic<int> blocked{0};
  auto errs = run_ranks(comms, [&](int r) {
    Communicator& c = *comms[static_cast<size_t>(r)];
    auto ss = make_host_stream("send");
    auto sr = make_host_stream("recv");
    for (int it = 0; it < 3; ++it) {
      ring_round(c, *ss, *sr, it, f);
      Tensor t = host_tensor(64, DType::f32);
      fill_pattern(t, static_cast<uint64_t>(it), r);
      c.all_reduce(t, ReduceOp::Sum, *ss).synchronize();
    }
    std::atomic<bool> done{false};
    ss->enqueue([&done] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      done = true;
    });
    if (done) ++blocked;
  });
  set_host_launch_blocking(-1);
  INFO(join_errors(errs) << f.str());
  CHECK(join_errors(errs).empty());
  CHECK(f.count() == 0);
  CHECK(blocked == n);
}

TEST_CASE("host: all_to_all with some ranks in place and some not", "[multirank]") {
  // Pairs of ranks exchange their blocks in halves; in place the exchange is a swap. Ranks may
  // differ in place or not (each rank's buffers are its own), and odd counts split unevenly.
  for (int n : {2, 3, 4}) {
    auto comms = make_host_communicators(n, "world", test_config());
    Failures f;
    auto errs = run_ranks(comms, [&](int r) {
      Communicator& c = *comms[static_cast<size_t>(r)];
      auto s = make_host_stream("a2a");
      uint64_t seed = 40;
      for (int64_t N : {int64_t{1}, int64_t{7}, int64_t{4099}}) {
        for (int mix = 0; mix < 3; ++mix) {  // in place: every rank, even ranks, none
          ++seed;
          const bool in_place = mix == 0 || (mix == 1 && r % 2 == 0);
          Tensor in = host_tensor(N * n, DType::f32);
          fill_pattern(in, seed, r);
          Tensor out = in_place ? in : host_tensor(N * n, DType::f32);
          c.all_to_all(in, out, *s).synchronize();
          const std::string what =
              "n=" + std::to_string(n) + " N=" + std::to_string(N) + " mix " + std::to_string(mix);
          for (int j = 0; j < n; ++j)
            check_values(f, what, out, j * N, N,
                         [&](int64_t i) { return pattern(seed, j, r * N + i); });
          if (!in_place)
            check_values(f, what + " (input untouched)", in, 0, N * n,
                         [&](int64_t i) { return pattern(seed, r, i); });
        }
      }
    });
    INFO(join_errors(errs) << f.str());
    CHECK(join_errors(errs).empty());
    CHECK(f.count() == 0);
  }
}

TEST_CASE("host: a collective waits for the event that produced its input", "[multirank]") {
  const int n = 4;
  auto comms = make_host_communicators(n, "world", test_config());
  Failures f;
  auto errs = run_ranks(comms, [&](int r) {
    Communicator& c = *comms[static_cast<size_t>(r)];
    auto compute = make_host_stream_jitter("compute", true);
    auto comm = make_host_stream_jitter("comm", true);
    for (int it = 0; it < 20; ++it) {
      Tensor t = host_tensor(257, DType::f32);
      fill_value(t, -1000);
      const uint64_t seed = 100 + static_cast<uint64_t>(it);
      compute->enqueue([t, seed, r] {
        std::this_thread::sleep_for(std::chrono::microseconds(300));
        fill_pattern(t, seed, r);
      });
      Event produced = compute->record();
      Event reduced_ev = c.all_reduce(t, ReduceOp::Sum, *comm, {produced});
      // The consumer waits for the collective's event only.
      std::vector<double> seen;
      compute->wait(reduced_ev);
      compute->enqueue([t, &seen] { seen = t.to_vector(); });
      compute->synchronize();
      for (int64_t i = 0; i < 257; ++i) {
        double want = reduced(DType::f32, ReduceOp::Sum, seed, n, i);
        if (seen[static_cast<size_t>(i)] != want) {
          f.add("ordering: element " + std::to_string(i) + " wrong");
          break;
        }
      }
    }
  });
  INFO(join_errors(errs) << f.str());
  CHECK(join_errors(errs).empty());
  CHECK(f.count() == 0);
}

TEST_CASE("host: barrier holds every rank until all arrived", "[multirank]") {
  const int n = 4;
  auto comms = make_host_communicators(n, "world", test_config());
  std::vector<std::chrono::steady_clock::time_point> before(n), after(n);
  auto errs = run_ranks(comms, [&](int r) {
    auto s = make_host_stream("comm");
    std::this_thread::sleep_for(std::chrono::milliseconds(30 * r));
    before[static_cast<size_t>(r)] = std::chrono::steady_clock::now();
    comms[static_cast<size_t>(r)]->barrier(*s).synchronize();
    after[static_cast<size_t>(r)] = std::chrono::steady_clock::now();
  });
  REQUIRE(join_errors(errs).empty());
  auto last = *std::max_element(before.begin(), before.end());
  for (int r = 0; r < n; ++r) CHECK(after[static_cast<size_t>(r)] >= last);
}

TEST_CASE("host: invalid arguments are rejected with the values involved", "[multirank]") {
  auto comms = make_host_communicators(2, "world", test_config());
  Communicator& c = *comms[0];
  auto s = make_host_stream("comm");
  Tensor a = host_tensor(4, DType::f32);
  Tensor b = host_tensor(7, DType::f32);
  CHECK_THROWS_WITH(c.all_gather(a, b, *s),
                    Catch::Contains("output has 7 elements but needs size 2 x input 4 = 8"));
  CHECK_THROWS_WITH(c.reduce_scatter(b, a, ReduceOp::Sum, *s),
                    Catch::Contains("input has 7 elements but needs size 2 x output 4 = 8"));
  CHECK_THROWS_WITH(c.all_reduce(a, b, ReduceOp::Sum, *s),
                    Catch::Contains("input has 4 elements but output has 7"));
  CHECK_THROWS_WITH(c.broadcast(a, 2, *s), Catch::Contains("root 2 outside [0, 2)"));
  CHECK_THROWS_WITH(c.all_to_all(b, b, *s), Catch::Contains("7 elements do not split into 2"));
  CHECK_THROWS_WITH(c.send(a, 0, *s), Catch::Contains("peer 0 must be another rank"));
  Tensor m = Tensor::empty(Shape{4, 4}, DType::f32, test_allocator());
  CHECK_THROWS_WITH(c.all_reduce(m.transpose(0, 1), ReduceOp::Sum, *s),
                    Catch::Contains("is not contiguous"));
  Tensor u = host_tensor(4, DType::u8);
  CHECK_THROWS_WITH(c.all_reduce(u, ReduceOp::Sum, *s), Catch::Contains("dtype u8"));
  Tensor i = host_tensor(4, DType::i32);
  CHECK_THROWS_WITH(c.all_reduce(a, i, ReduceOp::Sum, *s), Catch::Contains("differ in dtype"));
  // Nothing was issued: the communicator's sequence numbers did not move.
  CHECK(c.next_seq() == 1);
}

TEST_CASE("host: a stream carrying one rank's communication is refused to another rank",
          "[multirank]") {
  auto comms = make_host_communicators(2, "world", test_config());
  auto s0 = make_host_stream("rank0-comm");
  auto s1 = make_host_stream("rank1-comm");
  std::vector<Tensor> t = {host_tensor(4, DType::f32), host_tensor(4, DType::f32)};
  for (int r = 0; r < 2; ++r) fill_pattern(t[r], 1, r);
  // The first collective binds s0 to rank 0 and s1 to rank 1.
  auto errs = run_ranks(comms, [&](int r) {
    comms[r]->all_reduce(t[r], ReduceOp::Sum, r == 0 ? *s0 : *s1).synchronize();
  });
  REQUIRE(join_errors(errs).empty());
  for (int r = 0; r < 2; ++r)
    for (int64_t i = 0; i < 4; ++i)
      CHECK(load(t[r].data_ptr(), DType::f32, i) == reduced(DType::f32, ReduceOp::Sum, 1, 2, i));
  // Rank 1 issuing on rank 0's stream is refused at once, before anything queues or waits.
  const uint64_t seq = comms[1]->next_seq();
  CHECK_THROWS_WITH(comms[1]->all_reduce(t[1], ReduceOp::Sum, *s0),
                    Catch::Contains("global rank 1") &&
                        Catch::Contains("stream 'rank0-comm' carries the communication of "
                                        "global rank 0"));
  CHECK(comms[1]->next_seq() == seq);
  // Another world's rank 0 may share rank 0's stream.
  auto solo = make_host_communicators(1, "solo", test_config());
  CHECK_NOTHROW(solo[0]->all_reduce(t[0], ReduceOp::Sum, *s0).synchronize());
  // Once rank 0's communicators are gone the streams can serve other ranks: swapped here.
  comms.clear();
  solo.clear();
  auto again = make_host_communicators(2, "again", test_config());
  errs = run_ranks(again, [&](int r) {
    again[r]->all_reduce(t[r], ReduceOp::Sum, r == 0 ? *s1 : *s0).synchronize();
  });
  CHECK(join_errors(errs).empty());
}
