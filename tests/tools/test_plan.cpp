// The planner's cost model: collective counts and bytes against hand-computed values and against
// what a real run of the block issues (profiler ranges and the schedulers' counters), FLOPs
// against bench/block/flops.h, the overlap rules on clusters where the answer is known, memory,
// the cluster presets and file.
#include <sys/stat.h>
#include <unistd.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <type_traits>

#include "bench/block/block_bench.h"
#include "bench/block/flops.h"
#include "bench/sweep/sweep.h"
#include "model/block_desc.h"
#include "model/model_spec.h"
#include "plan/command/plan_command.h"
#include "plan/cost_model.h"
#include "runtime/allocator.h"
#include "runtime/error.h"
#include "runtime/ranges.h"
#include "runtime/stream.h"
#include "train/optimizer.h"

using namespace meshrt;
using namespace meshrt::plan;
using json = nlohmann::json;

namespace {

ModelSpec model(int64_t hidden, int64_t heads, int64_t ffn, int64_t seq, int layers) {
  ModelSpec m;
  m.hidden = hidden;
  m.heads = heads;
  m.ffn = ffn;
  m.seq = seq;
  m.layers = layers;
  m.dtype = DType::f32;
  return m;
}

// hidden 256, ffn 1024, seq 128, 2 layers, f32: one activation [2 x 128, 256] is 262144 bytes.
ModelSpec small() { return model(256, 4, 1024, 128, 2); }

PlanConfig cfg(int dp, int tp, bool sp, Overlap ov = Overlap::Async) {
  PlanConfig c;
  c.dp = dp;
  c.tp = tp;
  c.sp = sp;
  c.micro_batch = 2;
  c.overlap = ov;
  c.optimizer = false;
  return c;
}

std::map<std::string, int> count_ops(const std::vector<Collective>& cs) {
  std::map<std::string, int> n;
  for (const Collective& c : cs) ++n[comm_op_name(c.op)];
  return n;
}

double sum_bytes(const std::vector<Collective>& cs) {
  double b = 0;
  for (const Collective& c : cs) b += c.bytes;
  return b;
}

// An idealised cluster: GEMMs at peak, no latency, elementwise free, all overlap hidden.
ClusterSpec ideal(double tflops, double busbw_gbps) {
  ClusterSpec c;
  c.name = "ideal";
  c.devices_per_node = 8;
  c.peaks = {{"f32", tflops}};
  c.peak_tflops = tflops;
  c.memory_gib = 0;
  c.mem_bw_gbps = 1e30;
  c.attention_eff = 1;
  c.overlap_eff = 1;
  for (int i = 0; i < 3; ++i) c.intra[i] = c.inter[i] = {busbw_gbps, 0};
  return c;
}

}  // namespace

TEST_CASE("plan: tp collectives per micro-batch match the block's structure", "[unit]") {
  const ModelSpec m = small();
  const double act = 2 * 128 * 256 * 4;  // 262144
  // Sequence parallel, async: per piece forward all-gather + reduce-scatter; backward the
  // rowwise all-gather of dy, the colwise regather and reduce-scatter, and the norm's gain and
  // bias gradients in one all-reduce (2 x hidden 256 x 4 bytes). 4 pieces.
  auto sp = tp_collectives(m, cfg(1, 2, true));
  CHECK(count_ops(sp) ==
        std::map<std::string, int>{{"all_gather", 12}, {"reduce_scatter", 8}, {"all_reduce", 4}});
  CHECK(sum_bytes(sp) == 4 * (5 * act + 2 * 1024));
  for (const Collective& c : sp) CHECK(c.group == 2);
  // Without: one all-reduce forward (rowwise output), one backward (colwise input gradient).
  auto nosp = tp_collectives(m, cfg(1, 2, false));
  CHECK(count_ops(nosp) == std::map<std::string, int>{{"all_reduce", 8}});
  CHECK(sum_bytes(nosp) == 8 * act);
  // Chunked: the forward all-gather and reduce-scatter in tp pieces, same bytes.
  auto ch = tp_collectives(m, cfg(1, 2, true, Overlap::Chunked));
  CHECK(count_ops(ch) ==
        std::map<std::string, int>{{"all_gather", 16}, {"reduce_scatter", 12}, {"all_reduce", 4}});
  CHECK(sum_bytes(ch) == sum_bytes(sp));
  // tp = 1: none.
  CHECK(tp_collectives(m, cfg(2, 1, false)).empty());
}

TEST_CASE("plan: dp buckets pack the local parameters as GradSync does", "[unit]") {
  const ModelSpec m = small();
  // Per layer at tp=1: attention 2*256 + 256*768 + 768 + 256*256 + 256 = 263680 elements,
  // MLP 2*256 + 256*1024 + 1024 + 1024*256 + 256 = 526080; two layers, f32.
  const double all = 2 * (263680 + 526080) * 4.0;
  PlanConfig c = cfg(2, 1, false);
  c.bucket_mb = 25;
  CHECK(dp_bucket_bytes(m, c) == std::vector<double>{all});
  CHECK(dp_collectives(m, c).size() == 1);
  // 1 MiB buckets: a 1 MiB weight closes the bucket before it and fills its own.
  c.bucket_mb = 1;
  const auto b = dp_bucket_bytes(m, c);
  double total = 0;
  for (double x : b) {
    total += x;
    CHECK((x <= 1048576 || x == 1048576.0));
  }
  CHECK(total == all);
  // In launch order: layer 1's fc2 bias (1 KiB) alone, then fc2's weight (1 MiB) alone.
  REQUIRE(b.size() >= 2);
  CHECK(b[0] == 1024);
  CHECK(b[1] == 1048576);
  // tp = 2: the local shards (qkv and fc1 by columns, proj and fc2 by rows; their biases
  // replicated for the rowwise ones).
  PlanConfig t = cfg(2, 2, true);
  const double local = 2 *
                       ((2 * 256 + 256 * 384 + 384 + 128 * 256 + 256) +
                        (2 * 256 + 256 * 512 + 512 + 512 * 256 + 256)) *
                       4.0;
  CHECK(dp_bucket_bytes(m, t) == std::vector<double>{local});
  // Every weight here is a whole size class; the one flat gradient buffer (3165184 bytes) takes
  // the next class, 3.5 MiB, as the allocator hands it out.
  CHECK(memory_per_device(m, t).weights == local);
  CHECK(memory_per_device(m, t).grads == 3670016.0);
  CHECK(allocator_size_class(static_cast<size_t>(local)) == 3670016);
  t.optimizer = true;
  CHECK(memory_per_device(m, t).optimizer == local / 4 * 8);
}

TEST_CASE("plan: ZeRO shards the optimizer state, then the gradients", "[unit][zero]") {
  const ModelSpec m = small();
  const double all = 2 * (263680 + 526080) * 4.0;  // f32 parameters, as above
  for (int dp : {2, 4}) {
    INFO("dp=" << dp);
    PlanConfig c = cfg(dp, 1, false);
    c.optimizer = true;
    c.bucket_mb = 1;
    const Memory z0 = memory_per_device(m, c);
    c.zero = 1;
    const Memory z1 = memory_per_device(m, c);
    c.zero = 2;
    const Memory z2 = memory_per_device(m, c);
    CHECK(z0.optimizer == all / 4 * 8);
    CHECK(z1.optimizer == std::ceil(all / 4 / dp) * 8);  // the AdamW state's 1/dp share
    CHECK(z1.grads == z0.grads);
    CHECK(z1.weights == z0.weights);
    // Stage 2: every bucket's shard plus the three largest buckets (1 MiB each here).
    CHECK(z2.grads < z1.grads);
    CHECK(z2.grads >= z1.grads / dp + 3 * 1048576.0);
    CHECK(z2.total() < z1.total());
  }
}

TEST_CASE("plan: ZeRO's parameter all-gathers are in the step's dp comm time", "[unit][zero]") {
  // Ring costs, no latency, 1 GB/s: all-reduce 2(n-1)/n of its bytes, all-gather and
  // reduce-scatter (n-1)/n. Per step over the local parameters' bytes B (f = (n-1)/n):
  // zero 0 all-reduces (2f B), 1 adds the after-step all-gather (3f B), 2 reduce-scatters then
  // gathers (2f B), 3 reduce-scatters once and gathers before every forward and backward.
  ModelSpec m = small();
  m.layers = 4;
  const ClusterSpec cl = ideal(1e-6, 1);
  for (int accum : {1, 2}) {
    INFO("accum=" << accum);
    PlanConfig c = cfg(4, 1, false);
    c.bucket_mb = 1;
    c.accum = accum;
    double B = 0;
    for (double b : dp_bucket_bytes(m, c)) B += b;
    const double f = 3.0 / 4, unit = f * B / 1e9;
    double t[4];
    for (int z = 0; z < 4; ++z) {
      c.zero = z;
      t[z] = predict(m, cl, c).dp_comm_s;
    }
    CHECK(t[0] == Approx(2 * unit).epsilon(1e-9));
    CHECK(t[1] == Approx(3 * unit).epsilon(1e-9));
    CHECK(t[2] == Approx(2 * unit).epsilon(1e-9));
    CHECK(t[3] == Approx((1 + 2 * accum) * unit).epsilon(1e-9));
    CHECK(t[1] > t[0]);
    CHECK(t[3] > t[2]);
  }
  // With an embedding and an LM head (vocab > 0), as DecoderModel runs them: the head's
  // parameters stay gathered from its forward to its backward, and the embedding's backward
  // gathers none, so each is gathered once per micro-batch, not twice.
  ModelSpec lm = m;
  lm.vocab = 512;
  const double once = (2.0 * lm.vocab * lm.hidden + 2.0 * lm.hidden) * 4;  // embedding, head, norm
  for (int accum : {1, 2}) {
    INFO("vocab, accum=" << accum);
    PlanConfig c = cfg(4, 1, false);
    c.bucket_mb = 1;
    c.accum = accum;
    c.zero = 3;
    double B = 0;
    for (double b : dp_bucket_bytes(lm, c)) B += b;
    const double f = 3.0 / 4;
    CHECK(predict(lm, cl, c).dp_comm_s ==
          Approx(f * ((1 + 2 * accum) * B - accum * once) / 1e9).epsilon(1e-3));
  }
  // The step time grows with them: nothing of zero 1's gather hides, and zero 3's forward gather
  // of the first piece waits before any compute.
  PlanConfig c = cfg(4, 1, false);
  c.bucket_mb = 1;
  c.optimizer = true;
  const ClusterSpec fast = ideal(1e6, 1);  // compute negligible: the step is its exposed comm
  c.zero = 0;
  const Prediction z0 = predict(m, fast, c);
  c.zero = 1;
  const Prediction z1 = predict(m, fast, c);
  c.zero = 3;
  const Prediction z3 = predict(m, fast, c);
  CHECK(z1.step_s - z0.step_s == Approx(z1.dp_comm_s - z0.dp_comm_s).epsilon(1e-6));
  CHECK(z3.step_s > z0.step_s);
  CHECK(z3.dp_exposed_s == Approx(z3.dp_comm_s).epsilon(1e-6));
}

TEST_CASE("plan: ZeRO 3 shards the parameters, gathering three pieces at most", "[unit][zero]") {
  ModelSpec m = small();
  m.layers = 8;
  const double attn = 263680 * 4.0, mlp = 526080 * 4.0, all = m.layers * (attn + mlp);
  double weights_dp2 = 0;
  for (int dp : {2, 4}) {
    INFO("dp=" << dp);
    PlanConfig c = cfg(dp, 1, false);
    c.optimizer = true;
    c.bucket_mb = 1;
    c.zero = 2;
    const Memory z2 = memory_per_device(m, c);
    c.zero = 3;
    const Memory z3 = memory_per_device(m, c);
    CHECK(z2.weights >= all);
    // The shard, plus the whole buffers of the three largest pieces (two MLPs, an attention),
    // each bucket rounded to the allocator's size classes.
    CHECK(z3.weights >= all / dp + 2 * mlp + attn);
    CHECK(z3.weights < z2.weights);
    CHECK(z3.optimizer == z2.optimizer);
    CHECK(z3.total() < z2.total());
    // Only the shard shrinks from dp=2 to dp=4: by a quarter of the parameters (within the
    // size classes' rounding).
    if (dp == 2) weights_dp2 = z3.weights;
    if (dp == 4) CHECK(weights_dp2 - z3.weights == Approx(all / 4).epsilon(0.1));
  }
}

TEST_CASE("plan: FLOPs are bench block's model FLOPs", "[unit]") {
  const ModelSpec m = small();
  const LayerFlops lf = layer_flops(LayerKind::Transformer, 6, m.seq, m.hidden, m.ffn, true);
  CHECK(model_flops_per_step(m, 6) == step_flops(lf, m.layers, false));
  // On an ideal cluster the compute time is those FLOPs at peak, plus the bias gradients'
  // row sums (qkv 3h, out-proj h, fc2 h per token: 2 FLOPs each) that meshrt runs as GEMMs.
  const ClusterSpec cl = ideal(1, 100);
  PlanConfig c = cfg(1, 1, false);
  c.micro_batch = 6;
  const Prediction p = predict(m, cl, c);
  const double T = 6.0 * 128, rowsums = m.layers * 2 * T * (3 * 256 + 256 + 256);
  CHECK(p.compute_s * 1e12 == Approx(model_flops_per_step(m, 6) + rowsums).epsilon(1e-12));
  CHECK(p.step_s == Approx(p.compute_s));
  CHECK(p.mfu == Approx(model_flops_per_step(m, 6) / (model_flops_per_step(m, 6) + rowsums)));
}

TEST_CASE("plan: exposed communication follows meshrt's overlap rules", "[unit]") {
  const ModelSpec m = small();
  const double act = 2 * 128 * 256 * 4;
  // Compute free: every collective is exposed in full.
  {
    const Prediction p = predict(m, ideal(1e9, 1), cfg(1, 2, true));
    CHECK(p.tp_exposed_s == Approx(p.tp_comm_s).epsilon(1e-9));
    // all-gather / reduce-scatter move (n-1)/n of their bytes, all-reduce 2(n-1)/n.
    CHECK(p.tp_comm_s == Approx((4 * 5 * act * 0.5 + 4 * 2 * 1024 * 1.0) / 1e9));
  }
  // Compute slow: the forward all-gather and the backward all-gather of dy hide under the own
  // shard's GEMM rows, the forward reduce-scatter's exchange under the own rows' GEMM (the other
  // ranks' rows go first), the regather under dgrad and the input gradient's reduce-scatter
  // under wgrad. Of the four norm all-reduces the stack defers (CommScheduler::GradDeferral)
  // three hide under the next pieces' backward; its end waits for the last.
  {
    const Prediction p = predict(m, ideal(1e-6, 1), cfg(1, 2, true));
    const double exposed = (1 * 2 * 1024 * 1.0) / 1e9;
    CHECK(p.tp_exposed_s == Approx(exposed).margin(1e-11));
    CHECK(p.tp_comm_s - p.tp_exposed_s ==
          Approx((4 * 5 * act * 0.5 + 3 * 2 * 1024 * 1.0) / 1e9).epsilon(1e-9));
    // Overlap none: nothing hides.
    const Prediction n = predict(m, ideal(1e-6, 1), cfg(1, 2, true, Overlap::None));
    CHECK(n.tp_exposed_s == Approx(n.tp_comm_s).epsilon(1e-9));
    // Half of the overlapped time lost when the collectives take the compute's resources.
    ClusterSpec half = ideal(1e-6, 1);
    half.overlap_eff = 0.5;
    const Prediction h = predict(m, half, cfg(1, 2, true));
    CHECK(h.step_s - p.step_s == Approx(0.5 * 4 * 5 * act * 0.5 / 1e9));
  }
  // dp: buckets launched during backward hide under it, except what runs after its end.
  {
    PlanConfig c = cfg(2, 1, false);
    c.bucket_mb = 1;
    const Prediction slow = predict(m, ideal(1e-6, 1), c);
    CHECK(slow.dp_count == static_cast<int64_t>(dp_bucket_bytes(m, c).size()));
    // Exposed: the buckets of layer 0's attention only, launched after the last backward piece.
    CHECK(slow.dp_exposed_s > 0);
    CHECK(slow.dp_exposed_s < 0.5 * slow.dp_comm_s);
    c.overlap = Overlap::None;
    const Prediction none = predict(m, ideal(1e-6, 1), c);
    CHECK(none.dp_exposed_s == Approx(none.dp_comm_s).epsilon(1e-9));
    // Accumulation: buckets only in the last micro-batch.
    c.overlap = Overlap::Async;
    c.accum = 3;
    CHECK(predict(m, ideal(1e-6, 1), c).dp_count == slow.dp_count);
  }
}

TEST_CASE("plan: layouts, memory overflow and the reason for the best", "[unit]") {
  ModelSpec m = parse_model_spec("hidden=4096,heads=32,ffn=16384,layers=32,seq=2048,vocab=51200");
  // Per layer 4h^2 + 6h (attention, norm) + 2hf + f + 3h (MLP, norm) = 12h^2 + 13h at f = 4h;
  // embedding and LM head 2Vh, final norm 2h.
  CHECK(m.params() == 32 * (12LL * 4096 * 4096 + 13 * 4096) + 2LL * 51200 * 4096 + 2 * 4096);
  m.dtype = DType::bf16;
  ClusterSpec cl = load_cluster("h100-sxm:8x4", "bf16");
  CHECK(cl.world() == 32);
  CHECK(cl.peak_tflops == 989.4);
  const auto all = plan_all(m, cl, 256, {25, 100}, Overlap::Async);
  // tp in {1, 2, 4, 8}; sp off / on for tp > 1; micro-batches dividing 256 / dp; two buckets.
  REQUIRE(!all.empty());
  CHECK(all.front().fits);
  for (size_t i = 1; i < all.size(); ++i)
    if (all[i].fits == all[i - 1].fits) CHECK(all[i].tokens_per_s <= all[i - 1].tokens_per_s);
  bool overflow = false;
  for (const Prediction& p : all) {
    CHECK(p.cfg.dp * p.cfg.micro_batch * p.cfg.accum == 256);
    if (!p.fits) {
      overflow = true;
      CHECK(p.overflow_bytes == Approx(p.mem.total() - cl.memory_gib * 1073741824.0));
    }
  }
  CHECK(overflow);  // dp=32, tp=1 with a micro-batch of 8 does not fit in 80 GB
  // Any global batch up to 2^40: the micro-batches are its divisors (found up to its square root,
  // not by walking every number below it) that leave at most 4096 accumulation steps.
  ModelSpec small_m = parse_model_spec("hidden=64,heads=4,layers=1,seq=16");
  small_m.dtype = DType::bf16;
  const int64_t huge = int64_t{1} << 40;
  const auto big = plan_all(small_m, cl, huge, {25}, Overlap::Async);
  REQUIRE(!big.empty());
  for (const Prediction& p : big) {
    CHECK(p.cfg.dp * p.cfg.micro_batch * p.cfg.accum == huge);
    CHECK(p.cfg.accum >= 1);
    CHECK(p.cfg.accum <= 4096);
  }
  CHECK_THROWS_WITH(plan_all(small_m, cl, huge + 1, {25}, Overlap::Async),
                    Catch::Contains("must be from 1 to 2^40"));
  const std::string why = why_best(all);
  CHECK(why.find(config_label(all[0].cfg) + " wins by ") == 0);
  // A dp group over nodes uses the NICs of its members on each node.
  PlanConfig c;
  c.dp = 32;
  CHECK(predict(m, cl, c).inter_node_dp);
  c.dp = 4;
  c.tp = 8;
  CHECK(predict(m, cl, c).inter_node_dp);
  c.dp = 1;
  CHECK(!predict(m, cl, c).inter_node_dp);
}

TEST_CASE("plan: cluster presets and files, model specs, and their errors", "[unit]") {
  const ClusterSpec a = load_cluster("a100-sxm:8x16", "bf16");
  CHECK(a.world() == 128);
  CHECK(a.peak_tflops == 312);
  const ClusterSpec back = cluster_from_json(cluster_to_json(a), "round trip");
  CHECK(back.world() == 128);
  CHECK(back.peaks == a.peaks);
  CHECK(back.gemm_eff == a.gemm_eff);
  CHECK(back.intra[2].busbw_gbps == a.intra[2].busbw_gbps);
  CHECK(back.inter[0].latency_us == a.inter[0].latency_us);
  CHECK(back.overlap_eff == a.overlap_eff);
  CHECK_THROWS_WITH(load_cluster("v100:8", "bf16"), Catch::Contains("unknown preset 'v100'"));
  CHECK_THROWS_WITH(load_cluster("h100-sxm:9", "bf16"), Catch::Contains("1-8 GPUs per node"));
  CHECK_THROWS_WITH(load_cluster("/nonexistent/c.json", "bf16"),
                    Catch::Contains("cannot read the file"));
  // Not regular files: refused at once, never read without end (/dev/zero) or waited on (FIFO).
  CHECK_THROWS_WITH(load_cluster("/dev/zero", "bf16"),
                    Catch::Contains("--cluster /dev/zero: is a character device, not a regular "
                                    "file"));
  {
    const std::string fifo = "plan-cluster-" + std::to_string(getpid()) + ".fifo";
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    CHECK_THROWS_WITH(load_cluster("./" + fifo, "bf16"),
                      Catch::Contains("is a FIFO (named pipe), not a regular file"));
    std::remove(fifo.c_str());
    const std::string big = "plan-cluster-" + std::to_string(getpid()) + ".json";
    std::ofstream(big) << std::string((16u << 20) + 1, ' ');
    CHECK_THROWS_WITH(load_cluster(big, "bf16"),
                      Catch::Contains("16777217 bytes is more than the 16777216 bytes"));
    std::remove(big.c_str());
  }
  CHECK_THROWS_WITH(cluster_from_json("{\"devices_per_node\": 2}", "x.json"),
                    Catch::Contains("peak_tflops"));
  CHECK_THROWS_WITH(cluster_from_json("[1", "x.json"), Catch::Contains("not valid JSON"));
  ClusterSpec cpu = cluster_preset("cpu");
  CHECK_THROWS_WITH(cpu.select_dtype("f8"),
                    Catch::StartsWith("cluster cpu has no peak FLOP/s for --dtype f8 (it has: "
                                      "bf16, f16, f32); choose one of those for --dtype, or add "
                                      "f8 to the cluster file's \"peak_tflops\""));
  CHECK_THROWS_WITH(parse_model_spec("hidden=64,heads=3,seq=8"),
                    Catch::Contains("does not divide by heads"));
  CHECK_THROWS_WITH(parse_model_spec("hidden=64,heads=4"), Catch::Contains("seq are required"));
  CHECK_THROWS_WITH(parse_model_spec("hidden=64,heads=4,seq=8,depth=2"),
                    Catch::Contains("unknown key 'depth'"));
  CHECK_THROWS_WITH(parse_model_spec("hidden=x,heads=4,seq=8"),
                    Catch::Contains("hidden=x must be a positive integer (1 to 1099511627775)"));
  // Past int64, past the per-key bound, and a model whose counts would overflow int64.
  CHECK_THROWS_WITH(parse_model_spec("hidden=9223372036854775807,heads=4,seq=8"),
                    Catch::StartsWith("--model hidden=9223372036854775807,heads=4,seq=8: "
                                      "hidden=9223372036854775807 must be a positive integer (1 "
                                      "to 1099511627775)"));
  CHECK_THROWS_WITH(parse_model_spec("hidden=99999999999999999999,heads=4,seq=8"),
                    Catch::Contains("hidden=99999999999999999999 must be a positive integer (1 "
                                    "to 1099511627775)"));
  CHECK_THROWS_WITH(parse_model_spec("hidden=1099511627775,heads=5,seq=8"),
                    Catch::StartsWith("--model hidden=1099511627775,heads=5,seq=8: about "
                                      "1.45071e+25 parameters, more than the planner counts (at "
                                      "most 2^53 = 9007199254740992); lower hidden, ffn, layers "
                                      "or vocab"));
  CHECK_NOTHROW(parse_model_spec("hidden=16384,heads=128,seq=8,layers=1000,vocab=262144"));
  CHECK_THROWS_WITH(parse_model_spec("hidden=64,heads=4,seq=8,layers=100001"),
                    Catch::Contains("layers=100001 is more than 100000; give 1 to 100000 layers"));
  CHECK_THROWS_WITH(load_cluster(":8", "bf16"),
                    Catch::StartsWith("--cluster :8: no device before ':'; give a preset such as "
                                      "h100-sxm:8, h200-sxm:8, a100-sxm:8 (':8xN' for N nodes) or "
                                      "cpu, or a cluster JSON file"));
  CHECK_THROWS_WITH(load_cluster("h100-sxm:", "bf16"),
                    Catch::Contains("e.g. h100-sxm:8x4 (got '' after ':')"));
  {
    nlohmann::json j = nlohmann::json::parse(cluster_to_json(a));
    j["device"] = "";
    CHECK_THROWS_WITH(cluster_from_json(j.dump(), "x.json"),
                      Catch::Contains("field 'device' is \"\", not a name of the device"));
  }
  CHECK_THROWS_WITH(parse_model_spec("hidden=64,heads=4,seq=8,hidden=128"),
                    Catch::Contains("'hidden' is given twice; give each key once"));
  const ModelSpec m = small();
  CHECK_THROWS_WITH(predict(m, ideal(1, 1), cfg(1, 3, false)), Catch::Contains("by tp=3"));
  PlanConfig big = cfg(1, 16, false);
  CHECK_THROWS_WITH(predict(m, ideal(1, 1), big), Catch::Contains("spans nodes"));
}

namespace {

// What a real run issues per rank and step: each collective's profiler range (op and mesh dim)
// and the block's counters (bytes and count per dim, from its JSON).
struct Issued {
  std::map<std::string, int> ops;  // "all_gather/tp" -> count per rank
  double tp_bytes = 0, dp_bytes = 0;
  int64_t tp_count = 0, dp_count = 0;
};

// A quiet block benchmark of model `m` (micro-batch 2, one timed step) on the host ranks `mesh`
// needs.
BlockBenchOptions block_options(const ModelSpec& m, const std::string& mesh, bool sp,
                                const std::string& overlap, int warmup) {
  BlockBenchOptions o;
  o.devices = "cpu:" + std::to_string(mesh == "dp=2,tp=2" ? 4 : 2);
  o.mesh = mesh;
  o.sp = sp ? 1 : 0;
  o.overlap = overlap;
  o.seq = m.seq;
  o.hidden = m.hidden;
  o.heads = m.heads;
  o.ffn = m.ffn;
  o.batch = 2;
  o.layers = m.layers;
  o.steps = 1;
  o.warmup = warmup;
  o.calibrate = false;
  o.quiet = true;
  return o;
}

ModelSpec tiny() { return model(64, 4, 256, 16, 2); }

Issued run_real(const std::string& mesh, bool sp, const std::string& overlap, double bucket_mb) {
  BlockBenchOptions o = block_options(tiny(), mesh, sp, overlap, 0);
  o.bucket_mb = bucket_mb;
  std::mutex mu;
  std::map<std::string, int> ops;
  std::ostringstream out;
  BlockBenchResult r;
  {
    ranges::ObserverGuard guard([&](bool push, const std::string& name, uint64_t) {
      if (!push) return;
      const size_t sp_ = name.find(' '), slash = name.rfind('/');
      if (sp_ == std::string::npos || slash == std::string::npos) return;
      std::string op = name.substr(0, sp_);
      const std::string dim = name.substr(slash + 1);
      // Async's rowwise forward sends a reduce-scatter's blocks by an exchange and sums them
      // itself (Linear::gemm_peer_rows_first); the planner counts it as the reduce-scatter.
      if (op == "all_to_all") op = "reduce_scatter";
      if (op != "all_gather" && op != "reduce_scatter" && op != "all_reduce") return;
      if (dim != "tp" && dim != "dp") return;
      std::lock_guard<std::mutex> lk(mu);
      ++ops[op + "/" + dim];
    });
    r = run_block_bench_result(o, out);
  }
  REQUIRE(r.valid);
  Issued is;
  for (auto& [k, n] : ops) is.ops[k] = n / r.world;
  const json j = json::parse(r.json);
  is.tp_bytes = j["comm"]["tp"]["bytes_per_step_per_rank"].get<double>();
  is.tp_count = std::llround(j["comm"]["tp"]["collectives_per_step_per_rank"].get<double>());
  is.dp_bytes = j["comm"]["dp"]["bytes_per_step_per_rank"].get<double>();
  is.dp_count = std::llround(j["comm"]["dp"]["collectives_per_step_per_rank"].get<double>());
  return is;
}

}  // namespace

TEST_CASE("plan: predicted collectives equal what a real run issues", "[multirank]") {
  const ModelSpec m = tiny();
  struct Case {
    const char* mesh;
    bool sp;
    const char* overlap;
    double bucket_mb;
  };
  for (const Case& k :
       {Case{"dp=1,tp=2", true, "async", 25}, Case{"dp=1,tp=2", false, "async", 25},
        Case{"dp=1,tp=2", true, "chunked", 25}, Case{"dp=1,tp=2", true, "none", 25},
        Case{"dp=2,tp=1", false, "async", 0.01}, Case{"dp=2,tp=2", true, "async", 0.02}}) {
    INFO(k.mesh << " sp " << k.sp << " overlap " << k.overlap << " bucket " << k.bucket_mb);
    const Issued real = run_real(k.mesh, k.sp, k.overlap, k.bucket_mb);
    CHECK(!real.ops.empty());  // the ranges were seen
    PlanConfig c;
    c.dp = k.mesh[3] - '0';
    c.tp = k.mesh[8] - '0';
    c.sp = k.sp;
    c.micro_batch = 2;
    c.bucket_mb = k.bucket_mb;
    c.overlap = parse_overlap(k.overlap);
    c.optimizer = false;
    const Prediction p = predict(m, ideal(1, 1), c);
    CHECK(p.tp_bytes == real.tp_bytes);
    CHECK(p.tp_count == real.tp_count);
    CHECK(p.dp_bytes == real.dp_bytes);
    CHECK(p.dp_count == real.dp_count);
    std::map<std::string, int> predicted;
    for (const Collective& x : tp_collectives(m, c))
      ++predicted[std::string(comm_op_name(x.op)) + "/tp"];
    for (const Collective& x : dp_collectives(m, c))
      ++predicted[std::string(comm_op_name(x.op)) + "/dp"];
    CHECK(predicted == real.ops);
  }
}

TEST_CASE("plan: predicted memory is the program-order peak of a real run", "[multirank]") {
  // With launch-blocking host streams a tensor is freed where the program drops it, as a CUDA
  // caching allocator reuses it: the allocator's peak is then exactly what the model walks.
  const ModelSpec m = model(256, 4, 1024, 64, 2);
  struct Case {
    const char* mesh;
    bool sp;
    const char* overlap;
  };
  set_host_launch_blocking(1);
  for (const Case& k : {Case{"dp=2,tp=1", false, "async"}, Case{"dp=1,tp=2", true, "async"},
                        Case{"dp=1,tp=2", false, "async"}, Case{"dp=1,tp=2", true, "chunked"}}) {
    INFO(k.mesh << " sp " << k.sp << " overlap " << k.overlap);
    // Warm-up 1: the loop then holds the previous step's output and input gradient.
    const BlockBenchOptions o = block_options(m, k.mesh, k.sp, k.overlap, 1);
    std::ostringstream out;
    const BlockBenchResult r = run_block_bench_result(o, out);
    REQUIRE(r.valid);
    CHECK(json::parse(r.json)["memory"]["launch_blocking"].get<bool>());
    PlanConfig c;
    c.dp = k.mesh[3] - '0';
    c.tp = k.mesh[8] - '0';
    c.sp = k.sp;
    c.micro_batch = 2;
    c.overlap = parse_overlap(k.overlap);
    c.optimizer = false;
    const Memory mem = predict(m, ideal(1, 1), c).mem;
    // Within 1%: the cached all-ones rows of the bias gradients are not in the model.
    CHECK(static_cast<double>(r.peak_bytes) == Approx(mem.total()).epsilon(0.01));
    CHECK(static_cast<double>(r.peak_bytes) >= mem.total());
  }
  set_host_launch_blocking(-1);
}

TEST_CASE("plan: bench block's prediction of a cp run: its exchange and memory",
          "[multirank][cp]") {
  // `bench block --mesh cp=...` carries the planner's prediction of its own cp layout (it had
  // only a note before): the K/V exchange's calls and bytes as the run counts them (the ring's
  // sends and receives), and with launch-blocking streams the memory within 1% of the peak.
  const ModelSpec m = model(64, 2, 256, 64, 1);
  struct Case {
    const char* mesh;
    const char* comm;
    int devices;
  };
  set_host_launch_blocking(1);
  for (const Case& k :
       {Case{"cp=2", "ring", 2}, Case{"cp=2", "allgather", 2}, Case{"cp=2,tp=2", "ring", 4}}) {
    INFO(k.mesh << " " << k.comm);
    BlockBenchOptions o = block_options(m, k.mesh, false, "async", 1);
    o.devices = "cpu:" + std::to_string(k.devices);
    o.cp_comm = k.comm;
    std::ostringstream out;
    const BlockBenchResult r = run_block_bench_result(o, out);
    REQUIRE(r.valid);
    const json j = json::parse(r.json);
    REQUIRE(j["plan"].contains("predicted"));
    const json& pr = j["plan"]["predicted"];
    const json& cp = j["comm"]["cp"];
    // One layer, micro-batch 2 x seq 64 / cp 2 tokens x hidden 64 / tp x 4 bytes, K and V.
    const double kv = 2.0 * (2 * 64 / 2) * 64 * 4 / (k.devices / 2);
    const bool ring = std::string(k.comm) == "ring";
    // ring: 1 forward and 3 backward steps, each a send and a receive; allgather: the K/V
    // gathered twice (cp x kv each) and dK/dV reduce-scattered.
    CHECK(pr["cp_collectives_per_step_per_rank"].get<double>() == (ring ? 8 : 3));
    CHECK(pr["cp_bytes_per_step_per_rank"].get<double>() == (ring ? 8 * kv : 3 * 2 * kv));
    CHECK(pr["cp_collectives_per_step_per_rank"].get<double>() ==
          cp["collectives_per_step_per_rank"].get<double>());
    CHECK(pr["cp_bytes_per_step_per_rank"].get<double>() ==
          cp["bytes_per_step_per_rank"].get<double>());
    CHECK(pr["dp_bytes_per_step_per_rank"].get<double>() ==
          j["comm"]["dp"]["bytes_per_step_per_rank"].get<double>());
    const double mem = pr["memory_bytes"].get<double>();
    CHECK(static_cast<double>(r.peak_bytes) == Approx(mem).epsilon(0.01));
  }
  set_host_launch_blocking(-1);
}

TEST_CASE("plan: --compare on a small real sweep: collectives, bytes and memory agree",
          "[multirank]") {
  // The comparison of bench/results/plan-vs-sweep.md in small: a real `meshrt sweep` on two host
  // ranks, with launch-blocking streams so that its peaks are the program-order ones, compared
  // with the model. Times are only printed (a test does not time).
  SweepOptions so;
  so.base = block_options(model(128, 4, 512, 32, 1), "", false, "async", 1);
  so.base.sp = -1;  // the sweep sets it per run
  so.base.quiet = false;
  so.batches = {1, 2};
  so.progress = false;
  so.json_path = "plan-test-small-sweep.json";
  std::ostringstream sweep_out;
  set_host_launch_blocking(1);
  const int rc = run_sweep(so, sweep_out);
  set_host_launch_blocking(-1);
  REQUIRE(rc == 0);
  std::ostringstream out;
  const json s = json::parse(compare_with_sweep(so.json_path, "h100-sxm:8", out, so.json_path));
  INFO(out.str());
  CHECK(s["configurations"] == 6);  // dp=2 b=1,2; tp=2 sp off / on b=1,2
  CHECK(s["memory_measured"] == "launch_blocking");
  CHECK(s["memory_max_abs_error"].get<double>() < 0.01);
  CHECK(out.str().find("DIFFER") == std::string::npos);
  CHECK(out.str().find("| equal |") != std::string::npos);
  std::remove(so.json_path.c_str());
}

TEST_CASE("plan: --compare-memory takes a launch-blocking sweep of the same layouts", "[unit]") {
  ModelSpec m = small();
  PlanConfig c = cfg(1, 2, true);
  const Prediction p = predict(m, load_cluster("h100-sxm:8", "f32"), c);
  auto sweep = [&](bool blocking, int64_t batch, double peak) {
    json comm = {{"exposed_ms_median", 0.0},
                 {"bytes_per_step_per_rank", 0.0},
                 {"collectives_per_step_per_rank", 0.0}};
    json r = {{"config",
               {{"hidden", m.hidden},
                {"heads", m.heads},
                {"ffn", m.ffn},
                {"layers", m.layers},
                {"seq", m.seq},
                {"dtype", "f32"},
                {"kind", "block"},
                {"dp", 1},
                {"tp", 2},
                {"sp", true},
                {"mesh", "dp=1,tp=2"},
                {"batch_per_replica", batch},
                {"global_batch", batch},
                {"bucket_mb", 25.0},
                {"overlap", "async"},
                {"device_type", "cpu"}}},
              {"comm", {{"tp", comm}, {"dp", comm}}},
              {"step_ms", {{"median", p.step_s * 1e3}}},
              {"memory", {{"peak_allocated_bytes_max", peak}, {"launch_blocking", blocking}}}};
    return json{{"results", json::array({r})}};
  };
  auto write = [](const std::string& path, const json& j) { std::ofstream(path) << j.dump(); };
  const std::string timed = "plan-test-timed.json", mem = "plan-test-mem.json";
  write(timed, sweep(false, 2, 2 * p.mem.total()));
  std::ostringstream out;
  // Without it: the queued peaks are compared, and the summary says so.
  json s = json::parse(compare_with_sweep(timed, "h100-sxm:8", out));
  CHECK(s["memory_measured"] == "queued");
  CHECK(s["memory_max_abs_error"].get<double>() == Approx(0.5));
  CHECK(out.str().find("MESHRT_LAUNCH_BLOCKING=1") != std::string::npos);
  {
    // A sweep whose host pool reused blocks stream-ordered: its peaks are compared as they are.
    json reuse = sweep(false, 2, 2 * p.mem.total());
    reuse["results"][0]["memory"]["host_stream_reuse"] = true;
    write(timed, reuse);
    std::ostringstream o2;
    json s2 = json::parse(compare_with_sweep(timed, "h100-sxm:8", o2));
    CHECK(s2["memory_measured"] == "sweep");
    CHECK(o2.str().find("stream-ordered host pool") != std::string::npos);
    write(timed, sweep(false, 2, 2 * p.mem.total()));
  }
  // A sweep that did not block is refused; so is one without the timed sweep's layouts.
  write(mem, sweep(false, 2, p.mem.total()));
  CHECK_THROWS_WITH(compare_with_sweep(timed, "h100-sxm:8", out, mem),
                    Catch::Contains("ran with queueing host streams"));
  write(mem, sweep(true, 4, p.mem.total()));
  CHECK_THROWS_WITH(compare_with_sweep(timed, "h100-sxm:8", out, mem),
                    Catch::Contains("no run of dp=1,tp=2 sp=on b=2"));
  write(mem, sweep(true, 2, p.mem.total()));
  s = json::parse(compare_with_sweep(timed, "h100-sxm:8", out, mem));
  CHECK(s["memory_measured"] == "launch_blocking");
  CHECK(s["memory_max_abs_error"].get<double>() == Approx(0).margin(1e-12));
  CHECK(s["median_abs_error"].get<double>() == Approx(0).margin(1e-12));
  PlanOptions o;
  o.compare_memory_path = mem;
  o.model = "hidden=256,heads=4,seq=128";
  o.global_batch = 2;
  CHECK_THROWS_WITH(check_plan_options(o), Catch::Contains("goes with --compare"));
  std::remove(timed.c_str());
  std::remove(mem.c_str());
}

namespace {

// The message of the meshrt::Error `fn` throws (without its source location), or "" when none.
template <class F>
std::string plan_error(F fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

}  // namespace

TEST_CASE("plan: a cluster file is checked field by field, naming the file and the field",
          "[unit]") {
  const json good = json::parse(cluster_to_json(load_cluster("h100-sxm:8", "bf16")));
  // Cluster `good` with field `ptr` set to `v` (null: removed), read as file c.json.
  auto with = [&](const std::string& ptr, const json& v) {
    json j = good;
    const json::json_pointer p(ptr);
    if (v.is_null())
      j[p.parent_pointer()].erase(p.back());
    else
      j[p] = v;
    return plan_error([&] { cluster_from_json(j.dump(), "c.json"); });
  };
  CHECK(with("/name", "x").empty());
  CHECK(with("/memory_gib", -1) == "cluster c.json: field 'memory_gib' is -1, not a number >= 0");
  CHECK(with("/memory_gib", "80") ==
        "cluster c.json: field 'memory_gib' is \"80\", not a number >= 0");
  CHECK(with("/memory_gib", nullptr) ==
        "cluster c.json: field 'memory_gib' is missing; give a number >= 0");
  CHECK(with("/mem_bw_gbps", 0) == "cluster c.json: field 'mem_bw_gbps' is 0, not a number > 0");
  CHECK(with("/devices_per_node", 0) ==
        "cluster c.json: field 'devices_per_node' is 0, not an integer in [1, 1048576]");
  CHECK(with("/devices_per_node", 2.5) ==
        "cluster c.json: field 'devices_per_node' is 2.5, not an integer in [1, 1048576]");
  CHECK(with("/nodes", -2) ==
        "cluster c.json: field 'nodes' is -2, not an integer in [1, 1000000]");
  CHECK(with("/peak_tflops/bf16", -5) ==
        "cluster c.json: field 'peak_tflops.bf16' is -5, not a number > 0");
  CHECK(with("/peak_tflops", 989) == "cluster c.json: field 'peak_tflops' is 989, not an object");
  CHECK(with("/attention_efficiency", 1.5) ==
        "cluster c.json: field 'attention_efficiency' is 1.5, not a number in (0, 1]");
  CHECK(with("/overlap_efficiency", -0.1) ==
        "cluster c.json: field 'overlap_efficiency' is -0.1, not a number in [0, 1]");
  CHECK(with("/gemm_efficiency/1", json::array({1e9, 0})) ==
        "cluster c.json: field 'gemm_efficiency[1]' is [1000000000.0,0], not [GEMM FLOPs > 0, "
        "fraction of peak in (0, 1]]");
  CHECK(with("/gemm_efficiency/1", json::array({1, 0.5})) ==
        "cluster c.json: field 'gemm_efficiency[1]' is [1,0.5], not above the FLOPs of the entry "
        "before (sort the entries by FLOPs)");
  CHECK(with("/gemm_efficiency", json::array()) ==
        "cluster c.json: field 'gemm_efficiency' is [], not a list of [GEMM FLOPs > 0, fraction "
        "of peak in (0, 1]]");
  CHECK(with("/collectives/inter/all_reduce/busbw_gbps", -1) ==
        "cluster c.json: field 'collectives.inter.all_reduce.busbw_gbps' is -1, not a number > 0");
  CHECK(with("/collectives/intra/all_gather", nullptr) ==
        "cluster c.json: field 'collectives.intra.all_gather' is missing; give an object");
  CHECK(with("/collectives/intra/reduce_scatter/latency_us", true) ==
        "cluster c.json: field 'collectives.intra.reduce_scatter.latency_us' is true, not a "
        "number >= 0");
  CHECK(with("/sources", 3) == "cluster c.json: field 'sources' is 3, not a string");
  CHECK(plan_error([] { cluster_from_json("[1, 2]", "c.json"); }) ==
        "cluster c.json is [1,2], not an object");
  // NaN and Infinity are not JSON; a number too large for a double is refused as well.
  CHECK(plan_error([] { cluster_from_json("{\"memory_gib\": NaN}", "c.json"); }) ==
        "cluster c.json: not valid JSON: parse error at line 1, column 16: syntax error while "
        "parsing value - invalid literal; last read: '\"memory_gib\": N' (numbers must be finite: "
        "JSON has no NaN or Infinity)");
  CHECK(plan_error([] { cluster_from_json("{\"memory_gib\": 1e999}", "c.json"); }) ==
        "cluster c.json: not valid JSON: number overflow parsing '1e999' (numbers must be finite: "
        "JSON has no NaN or Infinity)");
}

TEST_CASE("plan: --compare checks every field of the sweep it reads", "[unit]") {
  const std::string path = "plan-test-fields.json";
  json comm = {{"exposed_ms_median", 0.0},
               {"bytes_per_step_per_rank", 0.0},
               {"collectives_per_step_per_rank", 0.0}};
  const json run = {{"config",
                     {{"hidden", 256},
                      {"heads", 4},
                      {"ffn", 1024},
                      {"layers", 2},
                      {"seq", 128},
                      {"dtype", "f32"},
                      {"kind", "block"},
                      {"dp", 1},
                      {"tp", 2},
                      {"sp", true},
                      {"mesh", "dp=1,tp=2"},
                      {"batch_per_replica", 2},
                      {"global_batch", 2},
                      {"bucket_mb", 25.0},
                      {"overlap", "async"},
                      {"device_type", "cpu"}}},
                    {"comm", {{"tp", comm}, {"dp", comm}}},
                    {"step_ms", {{"median", 10.0}}},
                    {"memory", {{"peak_allocated_bytes_max", 1e7}, {"launch_blocking", true}}}};
  // --compare of a sweep whose one run has field `ptr` set to `v` (null: removed).
  auto with = [&](const std::string& ptr, const json& v) {
    json r = run;
    const json::json_pointer p(ptr);
    if (v.is_null())
      r[p.parent_pointer()].erase(p.back());
    else
      r[p] = v;
    std::ofstream(path) << json{{"results", json::array({r})}}.dump();
    std::ostringstream out;
    return plan_error([&] { compare_with_sweep(path, "h100-sxm:8", out); });
  };
  const std::string at = "--compare " + path + ": results[0]: ";
  CHECK(with("/config/mesh", "dp=1,tp=2").empty());
  CHECK(with("/config/hidden", 0) ==
        at + "field 'config.hidden' is 0, not an integer in [1, 1099511627776]");
  CHECK(with("/config/hidden", "256") ==
        at + "field 'config.hidden' is \"256\", not an integer in [1, 1099511627776]");
  CHECK(with("/config/heads", 3) ==
        at + "field 'config.heads' is 3, not a divisor of config.hidden 256");
  CHECK(with("/config/layers", -1) ==
        at + "field 'config.layers' is -1, not an integer in [1, 100000]");
  CHECK(with("/config/dp", nullptr) ==
        at + "field 'config.dp' is missing; give an integer in [1, 1048576]");
  CHECK(with("/config/sp", 1) == at + "field 'config.sp' is 1, not true or false");
  CHECK(with("/config/zero", 7) == at + "field 'config.zero' is 7, not an integer in [0, 3]");
  CHECK(with("/config/zero", 0).empty());
  CHECK(with("/config/bucket_mb", -25) == at + "field 'config.bucket_mb' is -25, not a number > 0");
  CHECK(with("/config/dtype", "f8") ==
        at + "field 'config.dtype': dtype 'f8': use f32, bf16 or f16");
  CHECK(with("/config/overlap", "fast") ==
        at + "field 'config.overlap': unknown overlap mode 'fast': use none, async or chunked");
  CHECK(with("/step_ms/median", 0) == at + "field 'step_ms.median' is 0, not a number > 0");
  CHECK(with("/comm/tp/exposed_ms_median", -1) ==
        at + "field 'comm.tp.exposed_ms_median' is -1, not a number >= 0");
  CHECK(with("/comm/dp", "none") == at + "field 'comm.dp' is \"none\", not an object");
  CHECK(with("/memory/peak_allocated_bytes_max", -1) ==
        at + "field 'memory.peak_allocated_bytes_max' is -1, not a number > 0");
  CHECK(with("/memory", nullptr) == at + "field 'memory' is missing; give an object");
  CHECK(with("/config/tp", 3) ==
        "--compare " + path +
            ": results[0] (dp=1,tp=2 sp=on b=2): plan: hidden 256 does not "
            "divide by tp=3");
  std::ofstream(path) << R"({"results": []})";
  std::ostringstream out;
  CHECK(plan_error([&] { compare_with_sweep(path, "h100-sxm:8", out); }) ==
        "--compare " + path +
            ": field 'results' is [], not a list of runs; give a `meshrt sweep "
            "--json` file of a sweep that ran");
  std::ofstream(path) << R"({"runs": []})";
  CHECK(plan_error([&] { compare_with_sweep(path, "h100-sxm:8", out); }) ==
        "--compare " + path + ": field 'results' is missing; give an array");
  std::remove(path.c_str());
}

TEST_CASE("plan: the command checks its options and prints the table and the JSON", "[unit]") {
  PlanOptions o;
  CHECK_THROWS_WITH(check_plan_options(o), Catch::Contains("--model is required"));
  o.model = "hidden=256,heads=4,ffn=1024,layers=2,seq=128";
  CHECK_THROWS_WITH(check_plan_options(o), Catch::Contains("--global-batch is required"));
  o.global_batch = 3;
  o.cluster = "h100-sxm:8";
  std::ostringstream err;
  // seq 128 takes cp = 8 with dp = 1, which any global batch divides by; seq 130 takes no cp > 1
  // (130 is not a multiple of 2 x 2), so dp is 8, 4 or 2.
  CHECK(run_plan(o, err) == 0);
  o.model = "hidden=256,heads=4,ffn=1024,layers=2,seq=130";
  CHECK_THROWS_WITH(run_plan(o, err), Catch::Contains("must divide by dp"));
  o.model = "hidden=256,heads=4,ffn=1024,layers=2,seq=128";
  o.global_batch = 16;
  o.calibrate_path = "x.json";
  o.compare_path = "y.json";
  CHECK_THROWS_WITH(check_plan_options(o), Catch::Contains("give one of them"));
  o.calibrate_path.clear();
  std::ostringstream cmp;
  CHECK_THROWS_WITH(run_plan(o, cmp), Catch::Contains("--compare y.json: cannot open"));
  o.compare_path.clear();
  std::ostringstream out;
  CHECK(run_plan(o, out) == 0);
  // tp in {1, 2, 4} (heads 4), sp for tp > 1, micro-batches dividing 16 / dp.
  CHECK(out.str().find("  best dp=") != std::string::npos);
  CHECK(out.str().find(" wins") != std::string::npos);
}

TEST_CASE("plan: one model description, the runtime's collectives and the optimizer's state size",
          "[unit]") {
  // plan's model is model/model_spec.h's, with the runtime's DType (--dtype sets it).
  static_assert(std::is_same_v<plan::ModelSpec, meshrt::ModelSpec>);
  ModelSpec m = parse_model_spec("hidden=64,heads=4,seq=16,layers=2");
  CHECK(m.dtype == DType::bf16);
  CHECK(m.ffn == 256);
  CHECK(parse_model_dtype("f16") == DType::f16);
  CHECK_THROWS_WITH(parse_model_dtype("i32"),
                    Catch::StartsWith("dtype 'i32': use f32, bf16 or f16"));
  // The collectives are the runtime's CommOps; the cluster's links exist for the three it issues.
  PlanConfig c;
  c.tp = 2;
  c.sp = true;
  std::set<CommOp> ops;
  for (const Collective& x : tp_collectives(m, c)) ops.insert(x.op);
  // sp: sequence all-gathers and reduce-scatters, and the norms' gradient all-reduce.
  CHECK(ops == std::set<CommOp>{CommOp::AllReduce, CommOp::AllGather, CommOp::ReduceScatter});
  CHECK(link_index(CommOp::AllReduce) == 0);
  CHECK(link_index(CommOp::ReduceScatter) == 2);
  CHECK_THROWS_WITH(link_index(CommOp::Broadcast),
                    Catch::StartsWith("planner: no link figures for broadcast (only all_reduce, "
                                      "all_gather and reduce_scatter)"));
  // The optimizer reports its state's size; the planner's memory is that per local parameter.
  CHECK(optimizer_state_bytes_per_element(OptimizerKind::AdamW) == 8);
  CHECK(optimizer_state_bytes_per_element(OptimizerKind::Sgd) == 4);
  CHECK(optimizer_state_names(OptimizerKind::AdamW) ==
        std::vector<std::string>{"exp_avg", "exp_avg_sq"});
  CHECK(is_optimizer_state_name("momentum"));
  CHECK_FALSE(is_optimizer_state_name("exp_avg_sqr"));
  m.dtype = DType::f32;
  const Memory mem = memory_per_device(m, PlanConfig{});
  CHECK(mem.optimizer == static_cast<double>(m.params()) * 8);
}

TEST_CASE("plan: context parallel: the K/V exchange, the memory and the causal balance",
          "[unit][cp]") {
  // The causal work of each cp rank: CpLayout's chunks i and 2cp-1-i balance it exactly; a
  // contiguous layout of seq 8 over cp=2 gives rank 0 tokens 0-3 (1+2+3+4 = 10 key pairs) and
  // rank 1 tokens 4-7 (5+6+7+8 = 26): max / mean = 26 / 18.
  CHECK(causal_imbalance(8, 2) == 1.0);
  CHECK(causal_imbalance(131072, 16) == 1.0);
  CHECK(causal_imbalance(8, 2, /*balanced=*/false) == Approx(26.0 / 18));
  CHECK(causal_imbalance(8, 1, false) == 1.0);
  const ModelSpec m = small();  // hidden 256, seq 128, 2 layers, f32
  PlanConfig c = cfg(1, 1, false);
  c.cp = 2;
  // One layer's K and V shard: micro-batch 2 x seq 128 / cp 2 tokens x hidden 256 x 4 bytes x 2.
  const double kv = 2.0 * (2 * 128 / 2) * 256 * 4;
  const ClusterSpec fast = ideal(1e-3, 1);  // a ring step's transfer < its attention compute
  const Prediction ring = predict(m, fast, c);
  // Ring, per layer: cp-1 K/V steps forward; backward cp-1 K/V and cp dK/dV steps.
  CHECK(ring.cp_count == 2 * (1 + 1 + 2));
  CHECK(ring.cp_bytes == 2 * 4 * kv);
  CHECK(ring.cp_comm_s > 0);
  // Every transfer hidden under the attention of the block held but each layer's last: the dK/dV
  // of the last step, back to its owner (kv bytes at 1 GB/s).
  CHECK(ring.cp_exposed_s == Approx(2 * kv / 1e9));
  CHECK(ring.tp_count == 0);
  CHECK(ring.cp_imbalance == 1.0);
  c.cp_comm = CpComm::AllGather;
  const Prediction ag = predict(m, fast, c);
  // All-gather, per layer: every rank's K/V forward, again in the backward, and the
  // reduce-scatter of dK/dV: exposed whole.
  CHECK(ag.cp_count == 2 * 3);
  CHECK(ag.cp_bytes == 2 * 3 * 2 * kv);
  CHECK(ag.cp_exposed_s == Approx(ag.cp_comm_s));
  CHECK(ag.step_s > ring.step_s);
  // On a slow link the ring's transfers outlast the attention: exposed, but less than all of it.
  const Prediction slow = predict(m, ideal(1e-3, 1e-3), [&] {
    PlanConfig r = c;
    r.cp_comm = CpComm::Ring;
    return r;
  }());
  CHECK(slow.cp_exposed_s > 0);
  CHECK(slow.cp_exposed_s < slow.cp_comm_s);
  // Activations hold seq / cp tokens: cp = 2 needs about half of cp = 1's.
  c.cp_comm = CpComm::Ring;
  const Memory m2 = memory_per_device(m, c);
  c.cp = 1;
  const Memory m1 = memory_per_device(m, c);
  CHECK(m2.activations < 0.6 * m1.activations);
  CHECK(m2.weights == m1.weights);
  // The gradients are reduced, and ZeRO shards, over dp x cp.
  c.dp = 2;
  c.cp = 2;
  c.zero = 1;
  c.optimizer = true;
  for (const Collective& d : dp_collectives(m, c)) CHECK(d.group == 4);
  const double params = static_cast<double>(m.params());
  CHECK(memory_per_device(m, c).optimizer == Approx(std::ceil(params / 4) * 8));
  // Labels, and the layout's rule refused with the values.
  CHECK(config_label(c) == "dp=2,cp=2,tp=1 ring sp=- mb=2 x1 bucket=25MiB zero=1");
  c.cp = 3;
  CHECK_THROWS_WITH(predict(m, fast, c),
                    Catch::Contains("sequence length 128 is not divisible by 2 x cp = 6 (cp=3)"));
}

TEST_CASE("plan: a 128K-token model on h100-sxm:8x4 fits only with cp", "[unit][cp]") {
  // Llama-3-8B's shape at a 128K context: no dp x tp layout (cp = 1) fits in 80 GB; the planner
  // picks a cp layout, and the table shows cp and its exchange.
  PlanOptions o;
  o.model = "hidden=4096,heads=32,ffn=14336,layers=32,seq=131072,vocab=128256";
  o.cluster = "h100-sxm:8x4";
  o.global_batch = 16;
  ModelSpec m = parse_model_spec(o.model);
  m.dtype = DType::bf16;
  const ClusterSpec cl = load_cluster(o.cluster, "bf16");
  const auto all = plan_all(m, cl, o.global_batch, {25}, Overlap::Async);
  REQUIRE(!all.empty());
  bool cp1 = false, cp_fits = false;
  for (const Prediction& p : all) {
    if (p.cfg.cp == 1) {
      cp1 = true;
      CHECK_FALSE(p.fits);
    }
    cp_fits = cp_fits || (p.cfg.cp > 1 && p.fits);
  }
  CHECK(cp1);
  CHECK(cp_fits);
  REQUIRE(all.front().fits);
  CHECK(all.front().cfg.cp > 1);
  std::ostringstream out;
  o.json_path = "plan-test-128k.json";
  CHECK(run_plan(o, out) == 0);
  std::ifstream jf(o.json_path);
  const json j = json::parse(jf);
  std::remove(o.json_path.c_str());
  const json& first = j.at("configs").at(0);
  CHECK(first.at("best") == true);
  CHECK(first.at("cp") == all.front().cfg.cp);
  CHECK(first.at("cp_comm") == cp_comm_name(all.front().cfg.cp_comm));
  CHECK(first.at("cp_imbalance") == 1.0);
  CHECK(first.at("cp_exposed_ms").get<double>() <= first.at("cp_comm_ms").get<double>());
  const std::string best = "  best " + mesh_label(all.front().cfg);
  CHECK(out.str().find(best) != std::string::npos);
  CHECK(out.str().find(cp_comm_name(all.front().cfg.cp_comm)) != std::string::npos);
  CHECK(out.str().find(config_label(all.front().cfg) + " wins by ") != std::string::npos);
}
