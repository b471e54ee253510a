// Trace markers time what the streams ran, and the tracing communicator forwards collectives
// unchanged while recording them.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <map>
#include <thread>

#include "bench/block/trace.h"
#include "mesh/device_mesh.h"
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
  CHECK(rec.begin(*compute, "off") == -1);  // disabled: nothing recorded

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
    CHECK(mesh.group("tp").name() == mesh.group("tp").name());
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
    CHECK(t.item(0) == Approx(base + base + 1));
    CHECK(t.item(1023) == Approx(base + base + 1));
    CHECK(out.item(0) == Approx(r % 2));
    CHECK(out.item(8) == Approx(r % 2 + 2));
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
