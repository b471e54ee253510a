// Injected faults on the threads backend, in process (the kinds whose rank returns: slow, skip,
// corrupt), and the flight recorder: written on SIGUSR1 and on an abort, with global ranks
// through split groups. hang / crash stop a rank for good; tools/fault-matrix.sh covers them
// through the CLI (collectives.faults.*).
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "coll_test_util.h"
#include "collectives/flight.h"
#include "collectives/flight_doctor.h"
#include "collectives/host_comm.h"
#include "runtime/stream.h"

using namespace meshrt;
using namespace meshrt::test;
namespace fs = std::filesystem;

namespace {

fs::path flight_tmp(const char* tag) {
  fs::path d = fs::temp_directory_path() /
               ("meshrt-flight-test-" + std::string(tag) + "-" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  setenv("MESHRT_FLIGHT_DIR", d.c_str(), 1);
  return d;
}

std::vector<detail::FlightFile> read_records(const fs::path& d, int n) {
  std::vector<detail::FlightFile> fs_;
  for (int r = 0; r < n; ++r) {
    fs::path p = d / ("meshrt-flight-" + std::to_string(r) + ".json");
    std::ifstream f(p);
    std::ostringstream s;
    s << f.rdbuf();
    fs_.push_back({p.string(), s.str()});
  }
  return fs_;
}

CommConfig fault_config(const std::string& fault, double timeout_s = 30) {
  CommConfig c;
  c.timeout_s = timeout_s;
  c.fault = fault;
  return c;
}

}  // namespace

TEST_CASE("fault slow: results stay right, the doctor reports the late rank", "[multirank]") {
  fs::path d = flight_tmp("slow");
  const int n = 3, iters = 6;
  auto comms = make_host_communicators(n, "world", fault_config("slow@rank=2,step=2,ms=60"));
  auto errs = run_ranks(comms, [&](int r) {
    auto s = make_host_stream("comm");
    for (int i = 0; i < iters; ++i) {
      Tensor t = host_tensor(8, DType::f32);
      fill_value(t, r + 1 + i);
      comms[static_cast<size_t>(r)]->all_reduce(t, ReduceOp::Sum, *s).synchronize();
      const float want = static_cast<float>(1 + 2 + 3 + 3 * i);
      for (int k = 0; k < 8; ++k) REQUIRE(static_cast<float*>(t.data_ptr())[k] == want);
    }
  });
  INFO(join_errors(errs));
  REQUIRE(join_errors(errs).empty());
  // SIGUSR1 writes every rank's record (from the recorder's own thread).
  kill(getpid(), SIGUSR1);
  const fs::path p2 = d / "meshrt-flight-2.json";
  for (int i = 0; i < 200 && !fs::exists(p2); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(fs::exists(p2));
  detail::DoctorReport rep = detail::flight_diagnose(read_records(d, n));
  INFO(rep.text);
  CHECK(rep.culprits == std::vector<int>{2});
  CHECK(rep.text.find("skew: rank 2 issued last in") != std::string::npos);
  CHECK(rep.text.find("SIGUSR1") != std::string::npos);
  unsetenv("MESHRT_FLIGHT_DIR");
  fs::remove_all(d);
}

TEST_CASE("fault skip: the next call mismatches, naming the rank, and the doctor agrees",
          "[multirank]") {
  fs::path d = flight_tmp("skip");
  const int n = 4;
  // Rank 3 skips its 2nd all_reduce; its 3rd call (a broadcast) meets the others' all_reduce.
  auto comms = make_host_communicators(n, "world", fault_config("skip@rank=3,step=2", 10));
  auto errs = run_ranks(comms, [&](int r) {
    auto s = make_host_stream("comm");
    Tensor t = host_tensor(8, DType::f32);
    fill_value(t, 1);
    auto& c = *comms[static_cast<size_t>(r)];
    c.all_reduce(t, ReduceOp::Sum, *s).synchronize();
    c.all_reduce(t, ReduceOp::Sum, *s).synchronize();
    c.broadcast(t, 0, *s).synchronize();
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << errs[static_cast<size_t>(r)]);
    CHECK_THAT(errs[static_cast<size_t>(r)],
               Catch::Contains("collective mismatch on group 'world'") &&
                   Catch::Contains("rank 3 called broadcast(f32, count=8, root=0) at seq 2"));
  }
  detail::DoctorReport rep = detail::flight_diagnose(read_records(d, n));
  INFO(rep.text);
  CHECK(rep.culprits == std::vector<int>{3});
  CHECK(rep.culprit_call.find("seq 2 on group 'world'") != std::string::npos);
  unsetenv("MESHRT_FLIGHT_DIR");
  fs::remove_all(d);
}

TEST_CASE("fault corrupt: only the injected rank's result is wrong", "[multirank]") {
  const int n = 2;
  auto comms = make_host_communicators(n, "world", fault_config("corrupt@rank=1,step=1"));
  std::vector<float> got(n);
  auto errs = run_ranks(comms, [&](int r) {
    auto s = make_host_stream("comm");
    Tensor t = host_tensor(4, DType::f32);
    fill_value(t, 1);
    comms[static_cast<size_t>(r)]->all_reduce(t, ReduceOp::Sum, *s).synchronize();
    got[static_cast<size_t>(r)] = static_cast<float*>(t.data_ptr())[0];
  });
  REQUIRE(join_errors(errs).empty());
  CHECK(got[0] == 2.0f);
  CHECK(got[1] != 2.0f);
}

namespace {

// Runs one collective of `op` on n host ranks with MESHRT_COMM_DEBUG=1 (and `fault`), on
// pattern data of `dt`; returns each rank's error ("" when it completed).
// Fractional values where the dtype holds them (so that the reductions round), small integers
// otherwise.
void fill_data(const Tensor& t, int rank) {
  if (t.dtype() == DType::i32 || t.dtype() == DType::i64 || t.dtype() == DType::u8) {
    fill_pattern(t, 7, rank);
    return;
  }
  uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(rank + 1);
  for (int64_t i = 0; i < t.numel(); ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    store(t.data_ptr(), t.dtype(), i, static_cast<double>(x >> 11) / double(1ull << 53) * 6 - 3);
  }
}

std::vector<std::string> debug_collective(int n, CommOp op, DType dt, ReduceOp redop,
                                          const std::string& fault, int64_t count = 257) {
  CommConfig cfg = fault_config(fault, 20);
  cfg.debug = true;
  auto comms = make_host_communicators(n, "world", cfg);
  return run_ranks(comms, [&](int r) {
    auto s = make_host_stream("comm");
    Communicator& c = *comms[static_cast<size_t>(r)];
    const int64_t N = count;
    switch (op) {
      case CommOp::AllReduce: {
        Tensor t = host_tensor(N, dt);
        fill_data(t, r);
        c.all_reduce(t, redop, *s).synchronize();
        break;
      }
      case CommOp::ReduceScatter: {
        Tensor in = host_tensor(N * n, dt), out = host_tensor(N, dt);
        fill_data(in, r);
        c.reduce_scatter(in, out, redop, *s).synchronize();
        break;
      }
      case CommOp::AllGather: {
        Tensor in = host_tensor(N, dt), out = host_tensor(N * n, dt);
        fill_data(in, r);
        c.all_gather(in, out, *s).synchronize();
        break;
      }
      case CommOp::Broadcast: {
        Tensor t = host_tensor(N, dt);
        fill_data(t, r);
        c.broadcast(t, n - 1, *s).synchronize();
        break;
      }
      case CommOp::AllToAll: {
        Tensor in = host_tensor(N * n, dt), out = host_tensor(N * n, dt);
        fill_data(in, r);
        c.all_to_all(in, out, *s).synchronize();
        break;
      }
      default:
        FAIL("unexpected op");
    }
  });
}

}  // namespace

TEST_CASE("data check: correct collectives pass it in every dtype and reduction", "[multirank]") {
  // No false alarms: real reductions round differently from the digests' double sums.
  for (int n : {2, 3, 4}) {
    for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64}) {
      for (ReduceOp rop : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
        for (CommOp op : {CommOp::AllReduce, CommOp::ReduceScatter}) {
          INFO("n=" << n << " " << dtype_name(dt) << " " << reduce_op_name(rop) << " "
                    << comm_op_name(op));
          auto errs = debug_collective(n, op, dt, rop, "", 4099);
          CHECK(join_errors(errs).empty());
        }
      }
      for (CommOp op : {CommOp::AllGather, CommOp::Broadcast, CommOp::AllToAll}) {
        INFO("n=" << n << " " << dtype_name(dt) << " " << comm_op_name(op));
        CHECK(join_errors(debug_collective(n, op, dt, ReduceOp::Sum, "", 1000)).empty());
      }
    }
  }
}

TEST_CASE("data check: a corrupted result names the rank on every rank, and the doctor agrees",
          "[multirank]") {
  struct Case {
    int n;
    CommOp op;
    DType dt;
    ReduceOp redop;
    int bad;
  };
  // Two ranks: no majority; the sums against the inputs tell which result is wrong.
  const Case cases[] = {{2, CommOp::AllReduce, DType::f32, ReduceOp::Sum, 1},
                        {2, CommOp::AllReduce, DType::bf16, ReduceOp::Avg, 0},
                        {3, CommOp::AllReduce, DType::f32, ReduceOp::Max, 2},
                        {2, CommOp::AllReduce, DType::i32, ReduceOp::Sum, 1},
                        {4, CommOp::ReduceScatter, DType::f32, ReduceOp::Sum, 2},
                        {3, CommOp::ReduceScatter, DType::f16, ReduceOp::Sum, 1},
                        {3, CommOp::AllGather, DType::f32, ReduceOp::Sum, 1},
                        {2, CommOp::Broadcast, DType::i64, ReduceOp::Sum, 0},
                        {4, CommOp::AllToAll, DType::bf16, ReduceOp::Sum, 3}};
  for (const Case& k : cases) {
    INFO(k.n << " ranks, " << comm_op_name(k.op) << " " << dtype_name(k.dt) << ", rank " << k.bad
             << " corrupt");
    fs::path d = flight_tmp("corrupt");
    auto errs = debug_collective(k.n, k.op, k.dt, k.redop,
                                 "corrupt@rank=" + std::to_string(k.bad) + ",step=1");
    for (int r = 0; r < k.n; ++r) {
      INFO("rank " << r << ": " << errs[static_cast<size_t>(r)]);
      CHECK_THAT(
          errs[static_cast<size_t>(r)],
          Catch::Contains("data check (MESHRT_COMM_DEBUG=1): " + std::string(comm_op_name(k.op))) &&
              Catch::Contains("on group 'world' (seq 1)") &&
              Catch::Contains("culprit: rank " + std::to_string(k.bad) + " ("));
    }
    // The failing ranks aborted (run_ranks), which wrote the records: the doctor names the same
    // rank and call.
    detail::DoctorReport rep;
    for (int i = 0; i < 300; ++i) {  // until every record is written
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      try {
        rep = detail::flight_diagnose(read_records(d, k.n));
        break;
      } catch (const Error&) {
        if (i == 299) throw;
      }
    }
    INFO(rep.text);
    CHECK(rep.culprits == std::vector<int>{k.bad});
    CHECK(rep.text.find("failed its data check") != std::string::npos);
    unsetenv("MESHRT_FLIGHT_DIR");
    fs::remove_all(d);
  }
}

TEST_CASE("flight records name global ranks through split groups, a timeout writes them",
          "[multirank]") {
  fs::path d = flight_tmp("split");
  const int n = 4;
  CommConfig cfg;
  cfg.timeout_s = 1;
  auto comms = make_host_communicators(n, "world", cfg);
  // Rows {0,1}, {2,3}; global rank 2 never calls its row's all_reduce.
  auto errs = run_ranks(
      comms,
      [&](int r) {
        auto s = make_host_stream("comm");
        auto row = comms[static_cast<size_t>(r)]->split(r / 2, r, "world/row");
        Tensor t = host_tensor(8, DType::f32);
        fill_value(t, 1);
        row->all_reduce(t, ReduceOp::Sum, *s).synchronize();
        if (r == 2) return;
        row->all_reduce(t, ReduceOp::Sum, *s).synchronize();
        // Rank 3's row all_reduce times out first (its deadline is the earliest).
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        comms[static_cast<size_t>(r)]->barrier(*s).synchronize();
      },
      /*abort_on_error=*/false);
  // Global ranks, with the group-local one in brackets, as the MPI watchdog names them.
  CHECK_THAT(errs[3], Catch::Contains("group 'world/row' (seq 2, rank 3 [group rank 1])") &&
                          Catch::Contains("rank 2 [group rank 0] never arrived"));
  detail::DoctorReport rep = detail::flight_diagnose(read_records(d, n));
  INFO(rep.text);
  CHECK(rep.culprits == std::vector<int>{2});
  CHECK(rep.culprit_call == "all_reduce(f32, count=8, sum) seq 2 on group 'world/row'");
  unsetenv("MESHRT_FLIGHT_DIR");
  fs::remove_all(d);
}

TEST_CASE("flight records go to MESHRT_FLIGHT_DIR or a per-job folder, never the working directory",
          "[unit]") {
  const fs::path tmp = flight_tmp("default-dir");
  unsetenv("MESHRT_FLIGHT_DIR");
  const std::string old_tmpdir = getenv("TMPDIR") ? getenv("TMPDIR") : "";
  setenv("TMPDIR", tmp.c_str(), 1);
  setenv("MESHRT_RUN_ID", "job 7/a", 1);
  // Every rank of a job names the same folder (from the job id, made a file name).
  CHECK(detail::flight_job_id() == "job_7_a");
  const fs::path want = tmp / "meshrt-flight-job_7_a";
  CHECK(detail::flight_dir() == want.string());
  {
    auto st = detail::make_rank_state(0, 1, "host", "");
    REQUIRE(st->ring);
    const std::vector<std::string> paths = detail::flight_dump_all("test");
    REQUIRE(paths.size() == 1);
    CHECK(paths[0] == (want / "meshrt-flight-0.json").string());
    CHECK(fs::exists(want / "meshrt-flight-0.json"));
    CHECK_FALSE(fs::exists("meshrt-flight-0.json"));
  }
  unsetenv("MESHRT_RUN_ID");
  CHECK(detail::flight_job_id() == "pid" + std::to_string(getpid()));
  if (old_tmpdir.empty())
    unsetenv("TMPDIR");
  else
    setenv("TMPDIR", old_tmpdir.c_str(), 1);
  fs::remove_all(tmp);
}

TEST_CASE("a fault naming a rank outside the world is refused at init", "[multirank]") {
  std::string err;
  try {
    make_host_communicators(2, "world", fault_config("crash@rank=5,step=1"));
  } catch (const Error& e) {
    err = e.message();
  }
  CHECK(err ==
        "MESHRT_FAULT / --fault 'crash@rank=5,step=1' names rank 5, but this world has 2 rank(s) "
        "(0..1): name a global rank below 2");
}

TEST_CASE("a mismatch in a split group names global ranks and their group ranks", "[multirank]") {
  const int n = 4;
  auto comms = make_host_communicators(n, "world", fault_config("", 10));
  std::vector<std::string> msgs(n);
  auto errs = run_ranks(comms, [&](int r) {
    auto s = make_host_stream("comm");
    auto g = comms[static_cast<size_t>(r)]->split(r / 2, r);  // {0, 1} and {2, 3}
    Tensor t = host_tensor(r == 3 ? 5 : 4, DType::f32);
    fill_value(t, 1);
    try {
      g->all_reduce(t, ReduceOp::Sum, *s).synchronize();
    } catch (const CommError& e) {
      msgs[static_cast<size_t>(r)] = e.message();
    }
  });
  REQUIRE(join_errors(errs).empty());
  CHECK(msgs[0].empty());
  CHECK(msgs[1].empty());
  for (int r : {2, 3}) {
    INFO("rank " << r);
    CHECK(msgs[static_cast<size_t>(r)] ==
          "collective mismatch on group 'world/split1': global rank 2 (rank 0 of group "
          "'world/split1') called all_reduce(f32, count=4, sum) at seq 1; global rank 3 (rank 1 "
          "of group 'world/split1') called all_reduce(f32, count=5, sum) at seq 1 (element "
          "counts differ: every rank must pass the same count to all_reduce)");
  }
}

TEST_CASE("fault skip in a two-rank group: the doctor blames the rank that skipped",
          "[multirank]") {
  fs::path d = flight_tmp("skip2");
  const int n = 2;
  // Rank 1 skips its 2nd collective; its 3rd (a broadcast) meets rank 0's 2nd, whose shape
  // differs from every earlier call: a tie that the calls alone cannot break.
  auto comms = make_host_communicators(n, "world", fault_config("skip@rank=1,step=2", 10));
  auto errs = run_ranks(comms, [&](int r) {
    auto s = make_host_stream("comm");
    auto& c = *comms[static_cast<size_t>(r)];
    Tensor a = host_tensor(4, DType::f32), b = host_tensor(8, DType::f32);
    Tensor t = host_tensor(16, DType::f32);
    fill_value(a, 1);
    fill_value(b, 1);
    fill_value(t, 1);
    c.all_reduce(a, ReduceOp::Sum, *s).synchronize();
    c.all_reduce(b, ReduceOp::Sum, *s).synchronize();
    c.broadcast(t, 0, *s).synchronize();
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << errs[static_cast<size_t>(r)]);
    CHECK_THAT(errs[static_cast<size_t>(r)],
               Catch::Contains("rank 1 called broadcast(f32, count=16, root=0) at seq 2"));
  }
  detail::DoctorReport rep = detail::flight_diagnose(read_records(d, n));
  INFO(rep.text);
  CHECK(rep.culprits == std::vector<int>{1});
  CHECK(rep.culprit_call == "broadcast(f32, count=16, root=0) seq 2 on group 'world'");
  unsetenv("MESHRT_FLIGHT_DIR");
  fs::remove_all(d);
}
