// Fault specs (MESHRT_FAULT), the saturating deadline, flight records and `meshrt doctor`'s
// diagnosis of synthetic records: the pure parts of the fault tooling, on one thread.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <sstream>
#include <vector>

#include "collectives/comm_detail.h"
#include "collectives/config_check.h"
#include "collectives/fault.h"
#include "collectives/flight.h"
#include "collectives/flight_doctor.h"
#include "runtime/env.h"
#include "runtime/error.h"

using namespace meshrt;
using namespace meshrt::detail;

TEST_CASE("fault spec: every kind parses and prints back", "[unit]") {
  CHECK_FALSE(parse_fault_spec("").active());
  for (const char* s :
       {"crash@rank=0,step=1", "hang@rank=3,step=7", "skip@rank=1,step=2,op=barrier",
        "corrupt@rank=2,step=13,op=all_reduce", "slow@rank=1,step=2,op=all_gather,ms=150"}) {
    INFO(s);
    FaultSpec f = parse_fault_spec(s);
    CHECK(f.active());
    CHECK(f.str() == s);
  }
  FaultSpec f = parse_fault_spec("slow@step=4,ms=20,rank=5,op=allreduce");
  CHECK(f.kind == FaultKind::Slow);
  CHECK(f.rank == 5);
  CHECK(f.step == 4);
  CHECK(f.ms == 20);
  CHECK(f.has_op);
  CHECK(f.op == CommOp::AllReduce);
}

TEST_CASE("fault spec: malformed input is refused saying what to change", "[unit]") {
  const std::pair<const char*, const char*> bad[] = {
      {"hang", "has no '@'"},
      {"explode@rank=1,step=1", "unknown fault kind 'explode'"},
      {"hang@rank=1", "rank= and step= are required"},
      {"hang@step=1", "rank= and step= are required"},
      {"hang@rank=1,step=0", "step='0' is not an integer in [1,"},
      {"hang@rank=-1,step=1", "rank='-1' is not an integer"},
      {"hang@rank=1x,step=1", "rank='1x' is not an integer"},
      {"hang@rank=1,step=1,rank=2", "rank given twice"},
      {"hang@rank=1,step=1,", "'' is not key=value"},
      {"hang@rank=1,,step=1", "'' is not key=value"},
      {"hang@rank=1,step=1,color=2", "unknown key 'color'"},
      {"hang@rank=1,step=1,op=send", "op='send' is not a collective"},
      {"hang@rank=1,step=1,ms=5", "ms= applies to slow only"},
      {"slow@rank=1,step=1", "slow needs ms=T"},
      {"slow@rank=1,step=1,ms=0", "ms='0' is not an integer in [1, 3600000]"},
      {"hang@rank=99999999999999999999,step=1", "is not an integer"},
      {"hang@rank=1,step=1,op=\x01", "op='\\x01'"},
  };
  for (auto& [spec, want] : bad) {
    INFO(spec);
    CHECK_THROWS_AS(parse_fault_spec(spec), Error);
    CHECK_THROWS_WITH(parse_fault_spec(spec), Catch::Contains(want));
  }
}

TEST_CASE("MESHRT_FAULT and MESHRT_COMM_TIMEOUT are checked where they enter", "[unit]") {
  setenv("MESHRT_FAULT", "hang@rank=1", 1);
  CHECK_THROWS_WITH(CommConfig::from_env(), Catch::Contains("rank= and step= are required"));
  setenv("MESHRT_FAULT", "slow@rank=1,step=1,ms=3", 1);
  CHECK(CommConfig::from_env().fault == "slow@rank=1,step=1,ms=3");
  unsetenv("MESHRT_FAULT");
  // A timeout too large for the clock saturates to "never" instead of overflowing into the past.
  setenv("MESHRT_COMM_TIMEOUT", "1e10", 1);
  CommConfig c = CommConfig::from_env();
  unsetenv("MESHRT_COMM_TIMEOUT");
  CHECK(c.timeout_s == 1e10);
  for (double s : {9.3e9, 1e10, 1e300}) {
    Deadline d = Deadline::after(s);
    CHECK_FALSE(d.passed());
    CHECK(d.left_s() > 1e6);
  }
  Deadline d = Deadline::after(1e6);
  CHECK_FALSE(d.never);
  CHECK(d.left_s() > 0.99e6);
}

namespace {

FlightEntry entry(const char* group, uint64_t gid, int grank, int gsize, uint64_t seq, CommOp op,
                  int64_t count, int64_t t_ns, FlightState st) {
  FlightEntry e;
  std::snprintf(e.group, sizeof(e.group), "%s", group);
  std::snprintf(e.stream, sizeof(e.stream), "comm");
  e.gid = gid;
  e.group_rank = grank;
  e.group_size = gsize;
  e.seq = seq;
  e.op = static_cast<uint8_t>(op);
  e.count = count;
  e.bytes = count * 4;
  e.enqueue_ns = t_ns;
  e.state = st;
  return e;
}

// Rank r's record: all_reduces on 'world' (size `world`), the k-th issued at k seconds plus
// lateness_ns[k - 1]; the last one open when `open`.
FlightFile record_lags(int r, int world, const std::vector<int64_t>& lateness_ns, bool open,
                       int64_t count = 8) {
  FlightRing ring(r, 64);
  ring.set_context(world, "host", "");
  const int n = static_cast<int>(lateness_ns.size());
  for (int s = 1; s <= n; ++s) {
    const bool last_open = open && s == n;
    uint64_t id = ring.issue(entry(
        "world", 42, r, world, static_cast<uint64_t>(s), CommOp::AllReduce, count,
        int64_t{1000000000} * s + lateness_ns[static_cast<size_t>(s - 1)], FlightState::Issued));
    ring.started(id);
    if (!last_open) ring.ended(id, true);
  }
  return {"rank" + std::to_string(r) + ".json", ring.json("test")};
}

// The same with `n` calls, each `lateness_ns` late.
FlightFile record(int r, int world, int n, bool open, int64_t lateness_ns = 0, int64_t count = 8) {
  return record_lags(r, world, std::vector<int64_t>(static_cast<size_t>(n), lateness_ns), open,
                     count);
}

}  // namespace

TEST_CASE("doctor: the rank that never issued a collective is the culprit", "[unit]") {
  // Ranks 0, 1, 3 wait in seq 5; rank 2 stopped after seq 4.
  std::vector<FlightFile> fs = {record(0, 4, 5, true), record(1, 4, 5, true),
                                record(2, 4, 4, false), record(3, 4, 5, true)};
  DoctorReport rep = flight_diagnose(fs);
  INFO(rep.text);
  CHECK(rep.culprits == std::vector<int>{2});
  CHECK(rep.culprit_call == "all_reduce(f32, count=8, sum) seq 5 on group 'world'");
  CHECK(rep.text.find("first divergence at seq 5") != std::string::npos);
  CHECK(rep.text.find("ranks 0, 1, 3 reached it; rank 2 never did") != std::string::npos);
  // A trace with one slice per entry.
  const std::string trace = flight_trace(fs);
  size_t slices = 0;
  for (size_t at = trace.find("\"ph\":\"X\""); at != std::string::npos;
       at = trace.find("\"ph\":\"X\"", at + 1))
    ++slices;
  CHECK(slices == 5 + 5 + 4 + 5);
}

TEST_CASE("doctor: a mismatched call names the minority, a missing record the silent rank",
          "[unit]") {
  DoctorReport mm =
      flight_diagnose({record(0, 3, 3, true), record(1, 3, 3, true, 0, 9), record(2, 3, 3, true)});
  INFO(mm.text);
  CHECK(mm.culprits == std::vector<int>{1});
  CHECK(mm.text.find("mismatched calls") != std::string::npos);
  DoctorReport silent = flight_diagnose({record(0, 2, 3, true)});
  INFO(silent.text);
  CHECK(silent.culprits == std::vector<int>{1});
  CHECK(silent.text.find("rank 1 left no record") != std::string::npos);
}

TEST_CASE("doctor: a rank that issues every collective late is reported as skew", "[unit]") {
  DoctorReport rep = flight_diagnose({record(0, 2, 8, false), record(1, 2, 8, false, 150000000)});
  INFO(rep.text);
  CHECK(rep.culprits == std::vector<int>{1});
  CHECK(rep.text.find("skew: rank 1 issued last in 8 of 8 collectives, a median 150 ms") !=
        std::string::npos);
  DoctorReport fine = flight_diagnose({record(0, 2, 8, false), record(1, 2, 8, false, 1000)});
  CHECK(fine.culprits.empty());
  CHECK(fine.text.find("no rank diverged") != std::string::npos);
}

TEST_CASE("doctor: skew survives another rank's occasional stall, and needs a late median",
          "[unit]") {
  const int64_t ms = 1000000;
  // Rank 2 is 60 ms late from the 2nd call on; rank 0 stalls 100 ms at calls 3 and 5 (a busy
  // machine descheduling it), so rank 2 is last in only 3 of 6 calls: still the slow rank.
  const std::vector<int64_t> r0 = {0, 0, 100 * ms, 0, 100 * ms, 0};
  const std::vector<int64_t> r2 = {0, 60 * ms, 60 * ms, 60 * ms, 60 * ms, 60 * ms};
  DoctorReport rep = flight_diagnose({record_lags(0, 3, r0, false),
                                      record_lags(1, 3, std::vector<int64_t>(6, 0), false),
                                      record_lags(2, 3, r2, false)});
  INFO(rep.text);
  CHECK(rep.culprits == std::vector<int>{2});
  CHECK(rep.text.find("skew: rank 2 issued last in 3 of 6 collectives, a median 60 ms") !=
        std::string::npos);
  CHECK(rep.text.find("skew: rank 0") == std::string::npos);
  // Two ranks both slow at every call are both named.
  DoctorReport two = flight_diagnose(
      {record(0, 3, 6, false), record(1, 3, 6, false, 40 * ms), record(2, 3, 6, false, 80 * ms)});
  INFO(two.text);
  CHECK(two.culprits == std::vector<int>{1, 2});
  // Late in fewer than half the calls (a stall, not a slow rank): no skew.
  const std::vector<int64_t> some = {0, 90 * ms, 0, 90 * ms, 0, 0};
  DoctorReport stall = flight_diagnose({record(0, 2, 6, false), record_lags(1, 2, some, false)});
  INFO(stall.text);
  CHECK(stall.culprits.empty());
  // Fewer than 4 calls every rank issued say nothing.
  DoctorReport few = flight_diagnose({record(0, 2, 3, false), record(1, 2, 3, false, 90 * ms)});
  CHECK(few.culprits.empty());
}

TEST_CASE("rank lists: runs as ranges, at most 32 pieces", "[unit]") {
  CHECK(format_ranks({3}) == "rank 3");
  CHECK(format_ranks({0, 1, 3}) == "ranks 0, 1, 3");
  CHECK(format_ranks({0, 1, 2, 3, 7, 9, 10, 11}) == "ranks 0-3, 7, 9-11");
  std::vector<int> many(1000000);
  for (int i = 0; i < 1000000; ++i) many[static_cast<size_t>(i)] = i;
  CHECK(format_ranks(many) == "ranks 0-999999");
  std::vector<int> odd;
  for (int i = 1; i < 200; i += 2) odd.push_back(i);
  const std::string s = format_ranks(odd);
  CHECK(s.rfind("ranks 1, 3, 5, ", 0) == 0);
  CHECK(s.find(", 63 and 68 more") != std::string::npos);
}

TEST_CASE("doctor: files that are not flight records are refused naming the file", "[unit]") {
  CHECK_THROWS_WITH(flight_diagnose({}), Catch::Contains("no flight records given"));
  CHECK_THROWS_WITH(flight_diagnose({{"a.json", "{"}}),
                    Catch::Contains("a.json: not valid JSON: parse error at line 1"));
  CHECK_THROWS_WITH(flight_diagnose({{"b.json", "{\"x\": 1}"}}),
                    Catch::Contains("b.json: not a meshrt flight record"));
  CHECK_THROWS_WITH(
      flight_diagnose(
          {{"c.json", "{\"meshrt_flight\": 1, \"world_size\": 2, \"rank\": \"zero\"}"}}),
      Catch::Contains("c.json: field 'rank' is \"zero\", not an integer in [0, 1]"));
  FlightFile r0 = record(0, 2, 1, false);
  CHECK_THROWS_WITH(flight_diagnose({r0, {"again.json", r0.text}}),
                    Catch::Contains("are both records of rank 0"));
}

// Replaces `"key": <value>` in a record's text (values the tests set contain no comma or brace).
std::string with_field(std::string text, const std::string& key, const std::string& value) {
  const std::string k = "\"" + key + "\": ";
  const size_t p = text.find(k);
  REQUIRE(p != std::string::npos);
  const size_t from = p + k.size(), to = text.find_first_of(",}", from);
  return text.replace(from, to - from, value);
}

TEST_CASE("doctor: sparse or negative sequence numbers neither hang nor pass", "[unit]") {
  // Two calls 10^12 sequence numbers apart: diagnosed without walking the numbers between.
  FlightFile a = record(0, 2, 2, false), b = record(1, 2, 2, false);
  const std::string far = "1000000000000";
  for (FlightFile* f : {&a, &b}) {
    const std::string second = "\"seq\": 2";
    const size_t p = f->text.rfind(second);
    REQUIRE(p != std::string::npos);
    f->text.replace(p, second.size(), "\"seq\": " + far);
  }
  DoctorReport rep = flight_diagnose({a, b});
  CHECK(rep.culprits.empty());  // both made the same calls
  FlightFile neg = record(0, 2, 1, false);
  neg.text = with_field(neg.text, "seq", "-1");
  CHECK_THROWS_WITH(flight_diagnose({neg}),
                    Catch::Contains("field 'entries[0].seq' is -1, not an integer in [0, "
                                    "4611686018427387904]"));
  // Integers past the field's type are refused, not wrapped (3567587328 read as -727379968).
  FlightFile big = record(0, 2, 1, false);
  big.text = with_field(big.text, "rank", "3567587328");
  CHECK_THROWS_WITH(flight_diagnose({big}),
                    Catch::Contains("field 'rank' is 3567587328, not an integer in [0, 1]"));
  FlightFile huge = record(0, 2, 1, false);
  huge.text = with_field(huge.text, "count", "18446744073709551615");
  CHECK_THROWS_WITH(flight_diagnose({huge}),
                    Catch::Contains("field 'entries[0].count' is "
                                    "18446744073709551615, not an integer"));
  FlightFile state = record(0, 2, 1, false);
  state.text = with_field(state.text, "state", "\"stuck\"");
  CHECK_THROWS_WITH(flight_diagnose({state}),
                    Catch::Contains("field 'entries[0].state' is \"stuck\", not one of issued"));
  FlightFile real = record(0, 2, 1, false);
  real.text = with_field(real.text, "group_size", "2.5");
  CHECK_THROWS_WITH(flight_diagnose({real}),
                    Catch::Contains("field 'entries[0].group_size' is 2.5, not an integer"));
}

TEST_CASE("doctor: records of another job or format version are refused naming both", "[unit]") {
  FlightFile r0 = record(0, 2, 1, false), r1 = record(1, 2, 1, false);
  // Thread ranks of one process: the job is host:pid.
  CHECK(r0.text.find("\"job\": \"") != std::string::npos);
  CHECK_NOTHROW(flight_diagnose({r0, r1}));
  const std::string job = r0.text.substr(r0.text.find("\"job\": ") + 7,
                                         r0.text.find(", \"pid\"") - r0.text.find("\"job\": ") - 7);
  FlightFile other{"other.json", with_field(r1.text, "job", "\"SLURM_JOB_ID=77.0\"")};
  CHECK_THROWS_WITH(flight_diagnose({r0, other}),
                    Catch::Contains("meshrt doctor: rank0.json is a record of job " +
                                    job.substr(1, job.size() - 2) +
                                    " but other.json is of job SLURM_JOB_ID=77.0: pass the "
                                    "records of one job"));
  FlightFile v99{"v99.json", with_field(r1.text, "meshrt_flight", "99")};
  CHECK_THROWS_WITH(flight_diagnose({r0, v99}),
                    Catch::Contains("v99.json: flight record format version 99; this meshrt "
                                    "reads version 1"));
  // Records without a job (older ones, or a launcher that names none) still merge.
  FlightFile nojob{"nojob.json", r1.text};
  const size_t p = nojob.text.find(", \"job\": ");
  nojob.text.erase(p, nojob.text.find(", \"pid\"") - p);
  CHECK_NOTHROW(flight_diagnose({r0, nojob}));
}

TEST_CASE("config check: differing fields are named with every rank's value", "[unit]") {
  using F = std::vector<std::pair<std::string, std::string>>;
  CHECK(config_mismatch({F{{"hidden", "64"}}, F{{"hidden", "64"}}}, "meshrt train").empty());
  const std::string m =
      config_mismatch({F{{"hidden", "64"}, {"layers", "2"}}, F{{"hidden", "128"}, {"layers", "2"}},
                       F{{"hidden", "64"}}},
                      "meshrt train");
  CHECK(m ==
        "the ranks of this meshrt train were started with different configurations (hidden: "
        "rank 0 has 64, rank 1 has 128, rank 2 has 64; layers: rank 0 has 2, rank 1 has 2, rank "
        "2 has (unset)): start every rank with the same options and environment");
}

TEST_CASE("config check: a rank that failed first is named by its error, not its unset fields",
          "[unit]") {
  using F = std::vector<std::pair<std::string, std::string>>;
  const std::string failed = kConfigFailure;
  // Rank 1 failed its environment check before it set train's "--data contents": its error is
  // the cause, the field it never reached is not a difference.
  CHECK(config_mismatch(
            {F{{"--hidden", "64"}, {"--data contents", "(none)"}},
             F{{"--hidden", "64"}, {failed, "MESHRT_LOG_LEVEL='loud' is not a log level"}}},
            "meshrt train") ==
        "the ranks of this meshrt train did not all start (rank 1 failed: MESHRT_LOG_LEVEL='loud' "
        "is not a log level): fix what that rank was started with (its environment, files or "
        "options)");
  // An option that differs is still what is named, failed rank or not.
  CHECK(config_mismatch({F{{"--micro-batches", "1"}, {"--data contents", "(none)"}},
                         F{{"--micro-batches", "3"}, {failed, "--batch 4 must divide by 3"}}},
                        "meshrt train") ==
        "the ranks of this meshrt train were started with different configurations "
        "(--micro-batches: rank 0 has 1, rank 1 has 3): start every rank with the same options "
        "and environment");
  // Every rank failed alike: nothing differs, each reports its own error.
  CHECK(
      config_mismatch({F{{"--hidden", "64"}, {failed, "x"}}, F{{"--hidden", "64"}, {failed, "x"}}},
                      "meshrt train")
          .find("rank 0 failed: x; rank 1 failed: x") != std::string::npos);
}

TEST_CASE("config check: environment settings every rank must share are compared as read",
          "[unit]") {
  const char* name = "MESHRT_COMM_DEBUG";
  auto value = [&] {
    for (auto& [k, v] : env_rank_shared_settings())
      if (k == name) return v;
    return std::string("(missing)");
  };
  const char* old = std::getenv(name);
  const std::string saved = old ? old : "";
  unsetenv(name);
  CHECK(value() == "off");
  setenv(name, "no", 1);
  CHECK(value() == "off");  // the default written out agrees with the default
  setenv(name, "yes", 1);
  CHECK(value() == "on");
  setenv(name, "2", 1);
  CHECK(value() == "'2' (not accepted)");  // never throws: the rank's own check names it
  if (old)
    setenv(name, saved.c_str(), 1);
  else
    unsetenv(name);
  // MESHRT_HOST_ISA (the host loop variant, FMA or not) is compared as given, unset as auto;
  // its own reader (the kernels) refuses a value that is no variant.
  name = "MESHRT_HOST_ISA";
  const char* old_isa = std::getenv(name);
  const std::string saved_isa = old_isa ? old_isa : "";
  unsetenv(name);
  CHECK(value() == "auto");
  setenv(name, "", 1);
  CHECK(value() == "auto");
  setenv(name, "avx2", 1);
  CHECK(value() == "avx2");
  setenv(name, "baseline", 1);
  CHECK(value() == "baseline");
  if (old_isa)
    setenv(name, saved_isa.c_str(), 1);
  else
    unsetenv(name);
  // Settings that may differ per rank (logging, binding, node ids) are not compared.
  for (auto& [k, v] : env_rank_shared_settings()) {
    INFO(k);
    CHECK(k != "MESHRT_LOG_LEVEL");
    CHECK(k != "MESHRT_HOST_BIND");
    CHECK(k != "MESHRT_NODE_ID");
  }
}
