// Trace markers time what the streams ran, and the tracing communicator forwards collectives
// unchanged while recording them.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "bench/block/block_bench.h"
#include "bench/block/trace.h"
#include "dist/device_mesh.h"
#include "runtime/ranges.h"
#include "tests/mesh/harness.h"

using namespace meshrt;
using json = nlohmann::json;

namespace {

json parse_events(const TraceRecorder& rec) { return json::parse("[" + rec.serialize() + "]"); }

}  // namespace

TEST_CASE("trace slices time the work on the stream, not its enqueueing", "[unit]") {
  auto compute = make_host_stream("compute");
  auto comm = make_host_stream("comm.tp");
  TraceRecorder rec(3, *compute);
  rec.set_enabled(true);
  rec.begin_step(0, 1000.0);
  // 30 ms of work on the compute stream before the slice: enqueueing returns at once, the slice
  // must still start after it.
  compute->enqueue([] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); });
  int h = rec.begin(*compute, "work", "\"flops\":42");
  compute->enqueue([] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
  rec.end(h);
  int c = rec.begin(*comm, "all_gather", "\"bytes\":4096");
  comm->enqueue([] { std::this_thread::sleep_for(std::chrono::milliseconds(5)); });
  rec.end(c);
  compute->synchronize();
  comm->synchronize();
  rec.end_step();
  rec.set_enabled(false);
  // Disabled: no slice (-1), or only the range (-2) when ranges are on (NVTX in CUDA builds).
  const int off = rec.begin(*compute, "off");
  CHECK(off == (ranges::enabled() ? -2 : -1));
  rec.end(off);

  json ev = parse_events(rec);
  json work, ag;
  std::map<int, std::string> tracks;
  for (auto& e : ev) {
    REQUIRE(e["pid"] == 3);
    if (e["ph"] == "X" && e["name"] == "work") work = e;
    if (e["ph"] == "X" && e["name"] == "all_gather") ag = e;
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks[e["tid"]] = e["args"]["name"];
  }
  REQUIRE(work.is_object());
  REQUIRE(ag.is_object());
  CHECK(tracks[0] == "compute");
  CHECK(tracks[1] == "comm.tp");
  CHECK(work["tid"] == 0);
  CHECK(ag["tid"] == 1);
  CHECK(work["args"]["flops"] == 42);
  CHECK(work["args"]["step"] == 0);
  CHECK(ag["args"]["bytes"] == 4096);
  CHECK(work["ts"].get<double>() >= 1000.0 + 25000.0);  // after the 30 ms task (us)
  CHECK(work["dur"].get<double>() >= 18000.0);          // the 20 ms task
  CHECK(work["dur"].get<double>() < 200000.0);
  CHECK(ag["dur"].get<double>() >= 4000.0);
  CHECK(rec.markers() == 5);
}

TEST_CASE("tracing communicator: same results, one slice per collective with its bytes",
          "[multirank]") {
  constexpr int kRanks = 4;
  std::vector<std::string> traces(kRanks);
  test::run_ranks(kRanks, [&](int r, Communicator& world, Context& ctx) {
    Stream& cs = ctx.compute_stream();
    TraceRecorder rec(r, cs);
    TracingCommunicator traced(world, &rec);
    DeviceMesh mesh(ctx, traced, "dp=2,tp=2");
    rec.set_enabled(true);
    rec.begin_step(0, 0);
    // tp all-reduce of the rank id: the pair (2k, 2k+1) sums to 4k+1.
    Tensor t = ctx.empty({1024}, DType::f32);
    t.fill_(static_cast<double>(r), cs);
    Stream& ts = mesh.stream("tp");
    ts.wait(cs.record());
    Event done = mesh.group("tp").all_reduce(t, ReduceOp::Sum, ts);
    // dp all-gather of the rank id.
    Tensor in = ctx.empty({8}, DType::f32), out = ctx.empty({16}, DType::f32);
    in.fill_(static_cast<double>(r), cs);
    Stream& ds = mesh.stream("dp");
    ds.wait(cs.record());
    Event g = mesh.group("dp").all_gather(in, out, ds);
    cs.wait(done);
    cs.wait(g);
    ctx.synchronize();
    rec.end_step();
    const int base = (r / 2) * 2;
    RANK_REQUIRE(t.item(0) == Approx(base + base + 1));
    RANK_REQUIRE(t.item(1023) == Approx(base + base + 1));
    RANK_REQUIRE(out.item(0) == Approx(r % 2));
    RANK_REQUIRE(out.item(8) == Approx(r % 2 + 2));
    traces[static_cast<size_t>(r)] = rec.serialize();
  });
  for (int r = 0; r < kRanks; ++r) {
    json ev = json::parse("[" + traces[static_cast<size_t>(r)] + "]");
    int ar = 0, ag = 0;
    for (auto& e : ev) {
      if (e["ph"] != "X") continue;
      if (e["name"] == "all_reduce") {
        ++ar;
        CHECK(e["args"]["bytes"] == 4096);
        CHECK(e["args"]["count"] == 1024);
        CHECK(e["tid"] == 1);  // comm.tp
      }
      if (e["name"] == "all_gather") {
        ++ag;
        CHECK(e["args"]["bytes"] == 64);
        CHECK(e["tid"] == 2);  // comm.dp
      }
    }
    CHECK(ar == 1);
    CHECK(ag == 1);
  }
}

namespace {

// Every range a run opened, per issuing thread, as a nesting-checked list.
struct RangeLog {
  struct Range {
    std::string name;
    uint64_t payload;
    int depth;  // 0 = outermost on its thread
  };
  std::mutex mu;
  std::map<std::thread::id, std::vector<std::string>> stack;
  std::map<std::thread::id, std::vector<Range>> ranges;
  int unbalanced_pops = 0;
  ranges::Observer observer() {
    return [this](bool push, const std::string& name, uint64_t payload) {
      std::lock_guard<std::mutex> lk(mu);
      auto id = std::this_thread::get_id();
      auto& st = stack[id];
      if (push) {
        ranges[id].push_back({name, payload, static_cast<int>(st.size())});
        st.push_back(name);
      } else if (st.empty()) {
        ++unbalanced_pops;
      } else {
        st.pop_back();
      }
    };
  }
};

BlockBenchOptions tiny(const std::string& mesh) {
  BlockBenchOptions o;
  o.devices = "cpu:2";
  o.mesh = mesh;
  o.seq = 64;
  o.hidden = 128;
  o.heads = 4;
  o.steps = 2;
  o.warmup = 1;
  o.calibrate = false;
  o.quiet = true;
  return o;
}

}  // namespace

TEST_CASE("bench block opens a profiler range (NVTX on CUDA) per piece and per collective",
          "[multirank]") {
  for (const char* mesh : {"dp=1,tp=2", "dp=2,tp=1"}) {
    std::map<std::string, int> untraced;  // range counts of the run without --trace
    for (bool traced : {false, true}) {
      INFO("mesh " << mesh << (traced ? " with --trace" : ""));
      RangeLog log;
      BlockBenchOptions o = tiny(mesh);
      const auto tr = std::filesystem::temp_directory_path() /
                      ("meshrt-ranges-" + std::to_string(::getpid()) + ".json");
      if (traced) o.trace_path = tr.string();
      std::ostringstream out;
      BlockBenchResult r;
      {
        ranges::ObserverGuard guard(log.observer());
        r = run_block_bench_result(o, out);
      }
      REQUIRE(r.valid);
      CHECK(log.unbalanced_pops == 0);
      std::map<std::string, int> count;         // per name, over both ranks
      std::map<std::string, uint64_t> payload;  // last payload per name
      int nested_collectives = 0;
      for (auto& [id, st] : log.stack) CHECK(st.empty());  // every range closed
      for (auto& [id, rs] : log.ranges) {
        for (const auto& x : rs) {
          // Collectives are named "<op> <group>", the group "world/tp": keep the mesh dim.
          const size_t slash = x.name.rfind('/');
          const std::string key =
              x.name.find(' ') != std::string::npos && slash != std::string::npos
                  ? x.name.substr(0, x.name.find(' ') + 1) + x.name.substr(slash + 1)
                  : x.name;
          ++count[key];
          payload[key] = x.payload;
          const bool coll = x.name.rfind("all_", 0) == 0 || x.name.rfind("reduce_scatter", 0) == 0;
          if (coll && x.depth >= 2) ++nested_collectives;  // inside "step k" and a piece
        }
      }
      // 3 steps (1 warm-up + 2 timed) x 2 ranks of each piece, with this rank's FLOPs.
      for (const char* piece : {"L0.attn.fwd", "L0.mlp.fwd", "L0.mlp.bwd", "L0.attn.bwd"}) {
        CHECK(count[piece] == 6);
        CHECK(payload[piece] > 0);
      }
      CHECK(count["step 0"] == 2);
      CHECK(count["step 1"] == 2);
      if (std::string(mesh) == "dp=1,tp=2") {
        // Sequence parallel: all-gathers and reduce-scatters on tp, each opened once (the
        // tracing communicator forwards without a range of its own).
        CHECK(count["all_gather tp"] > 0);
        CHECK(count["reduce_scatter tp"] > 0);
        CHECK(payload["all_gather tp"] == 64 * 128 * 4);  // the gathered [seq, 1, hidden] f32
        CHECK(nested_collectives > 0);
      } else {
        CHECK(count["all_reduce dp"] > 0);
        CHECK(payload["all_reduce dp"] > 0);
      }
      // --trace wraps the communicators in a tracing forwarder: still one range per collective.
      // (Outside the steps, a traced run also gathers the traces over the world group.)
      std::map<std::string, int> mesh_colls;
      for (const auto& [k, n] : count) {
        const bool dim = k.size() > 3 && (k.ends_with(" tp") || k.ends_with(" dp"));
        if (dim) mesh_colls[k] = n;
      }
      CHECK(!mesh_colls.empty());
      if (traced) {
        for (const auto& [k, n] : mesh_colls) {
          INFO(k);
          CHECK(n == untraced[k]);
        }
      } else {
        untraced = mesh_colls;
      }
      std::error_code ec;
      std::filesystem::remove(tr, ec);
    }
  }
}
