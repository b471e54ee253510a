// Data parallelism: DP gradients equal the full-batch gradients, accumulation equals the large
// batch, buckets of every size agree, and the loss curve is the same for every dp x tp layout.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <mutex>
#include <numbers>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/error.h"
#include "tests/mesh/harness.h"
#include "train/train.h"
#include "train/train_guard.h"

using namespace meshrt;
using meshrt::test::rel_err;
using meshrt::test::run_ranks;

namespace {

ModelConfig tiny_model() { return test::small_model_config(32, 4, 64, 2, 64, 5); }

using Grads = std::map<std::string, std::vector<double>>;

// `steps` forward/backward passes of `global_batch` samples each (step t draws from stream
// 3 + t) over a dp-only mesh of `dp` ranks with `micro` micro-batches, each step zeroed by
// zero_grad(first_write); returns the synchronised gradients of rank 0 after the last step.
Grads dp_grads(int dp, int64_t global_batch, int micro, double bucket_mb, bool bf16 = false,
               int steps = 1, bool first_write = false) {
  Grads res;
  std::mutex mu;
  run_ranks(dp, [&](int r, Communicator& world, Context& ctx) {
    DeviceMesh mesh(ctx, world, "dp=" + std::to_string(dp));
    CommScheduler tp(mesh, kTpDim, Overlap::Async);
    DecoderModel model(mesh, tp, {}, tiny_model());
    DpOptions o;
    o.bucket_mb = bucket_mb;
    o.bf16_comm = bf16;
    GradSync sync(mesh, model.params(), o);
    const int64_t local = global_batch / dp, mb = local / micro, seq = 8;
    for (int step = 0; step < steps; ++step) {
      sync.set_active(0);
      sync.zero_grad(first_write);
      for (Param* p : model.params())
        REQUIRE(p->grad_unwritten == (first_write && p->grad_overwritable));
      for (int m = 0; m < micro; ++m) {
        sync.enable_sync(m == micro - 1);
        Tensor ids, tg;
        make_synthetic_batch(ctx, 3 + step, r * local + m * mb, mb, seq, 64, &ids, &tg);
        model.forward(ids, tg);
        model.backward(1.f / static_cast<float>(micro), &sync);
      }
      for (Param* p : model.params()) REQUIRE_FALSE(p->grad_unwritten);
      sync.wait_all();
      ctx.synchronize();
    }
    if (r != 0) return;
    std::lock_guard<std::mutex> lk(mu);
    for (Param* p : model.params()) res[p->name] = p->grad.to_vector();
  });
  return res;
}

void compare_grads(const Grads& got, const Grads& ref, double tol) {
  REQUIRE(got.size() == ref.size());
  for (auto& [n, v] : ref) {
    INFO("grad " << n << " rel err " << rel_err(got.at(n), v));
    CHECK(rel_err(got.at(n), v) <= tol);
  }
}

}  // namespace

TEST_CASE("dp gradients equal the single-rank full-batch gradients", "[dp][multirank]") {
  Grads ref = dp_grads(1, 8, 1, 25);
  compare_grads(dp_grads(2, 8, 1, 25), ref, 1e-5);
  compare_grads(dp_grads(4, 8, 1, 25), ref, 1e-5);
  // Accumulation over micro-batches equals the large batch.
  compare_grads(dp_grads(1, 8, 4, 25), ref, 1e-5);
  compare_grads(dp_grads(2, 8, 2, 25), ref, 1e-5);
}

TEST_CASE("bf16 gradient communication stays within bf16 rounding of f32", "[dp][multirank]") {
  Grads ref = dp_grads(2, 8, 1, 25);
  Grads b = dp_grads(2, 8, 1, 25, true);
  compare_grads(b, ref, 1e-2);  // two bf16 roundings (before the reduction, of the result)
  bool any_diff = false;
  for (auto& [n, v] : ref) any_diff |= b.at(n) != v;
  REQUIRE(any_diff);  // it really went through bf16
}

TEST_CASE("bucket sizes from one parameter per bucket to one bucket agree bit for bit",
          "[dp][multirank]") {
  Grads big = dp_grads(2, 4, 1, 1000);
  for (double mb : {1e-6, 0.004, 0.02}) {
    Grads g = dp_grads(2, 4, 1, mb);
    for (auto& [n, v] : big) REQUIRE(g.at(n) == v);
  }
}

TEST_CASE("buckets: tiny parameters pack together, a large one gets its own bucket",
          "[dp][multirank]") {
  run_ranks(2, [](int r, Communicator& world, Context& ctx) {
    DeviceMesh mesh(ctx, world, "dp=2");
    std::vector<Param> ps;
    ps.reserve(2001);
    for (int i = 0; i < 2000; ++i)
      ps.push_back(make_param_const(mesh, "tiny." + std::to_string(i), static_cast<uint64_t>(i),
                                    {3}, placements_on(mesh, kTpDim, Placement::replicate()),
                                    DType::f32, 0.0));
    ps.push_back(make_param_const(mesh, "large", 9999, {64, 1024},
                                  placements_on(mesh, kTpDim, Placement::replicate()), DType::f32,
                                  0.0));
    std::vector<Param*> pp;
    for (auto& p : ps) pp.push_back(&p);
    DpOptions o;
    o.bucket_mb = 0.01;  // 10 KiB: the 256 KiB parameter exceeds it
    GradSync sync(mesh, pp, o);
    // Backward order: "large" first, in a bucket of its own; 2000 x 12 bytes in 3 buckets.
    RANK_REQUIRE(sync.bucket_params(0) == std::vector<std::string>{"large"});
    RANK_REQUIRE(sync.num_buckets() == 1 + (2000 * 12 + 10485) / 10486);
    Stream& s = ctx.compute_stream();
    for (int i = 0; i < 2001; ++i) pp[static_cast<size_t>(i)]->grad.fill_(r == 0 ? i : 3 * i, s);
    // Mark in backward order, one by one: buckets launch as they fill.
    for (int i = 2000; i >= 0; --i) sync.mark_ready({pp[static_cast<size_t>(i)]});
    sync.wait_all();
    s.synchronize();
    for (int i : {0, 1, 777, 1999, 2000})
      RANK_REQUIRE(pp[static_cast<size_t>(i)]->grad.item(2) == 2.0 * i);
    RANK_REQUIRE(pp[2000]->grad.item(64 * 1024 - 1) == 4000.0);
    RANK_REQUIRE_THROWS_WITH(sync.bind(3), Catch::Contains("grad set 3"));
  });
}

TEST_CASE("replicas that differ are named, and broadcast makes them equal", "[dp][multirank]") {
  run_ranks(2, [](int r, Communicator& world, Context& ctx) {
    DeviceMesh mesh(ctx, world, "dp=2");
    CommScheduler tp(mesh, kTpDim, Overlap::Async);
    DecoderModel model(mesh, tp, {}, tiny_model());
    GradSync sync(mesh, model.params(), {});
    sync.verify_params_identical();
    if (r == 1) model.params()[3]->value.fill_(0.5, ctx.compute_stream());
    std::string msg;  // a collective: evaluated outside the assertion lock
    try {
      sync.verify_params_identical();
    } catch (const Error& e) {
      msg = e.what();
    }
    RANK_REQUIRE_THROWS_WITH(
        throw Error(msg), Catch::Contains(model.params()[3]->name) && Catch::Contains("differs"));
    sync.broadcast_params();
    sync.verify_params_identical();
  });
}

namespace {

std::vector<double> losses(int world, const std::string& mesh, GradSyncMode mode,
                           OptimizerKind opt = OptimizerKind::AdamW, int staleness = 1,
                           int sync_every = 1, bool sp = false,
                           const ModelConfig& model = tiny_model()) {
  TrainConfig cfg;
  cfg.model = model;
  cfg.mesh = mesh;
  cfg.tp.sequence_parallel = sp;
  cfg.batch = 8;
  cfg.seq = 16;
  cfg.steps = 5;
  cfg.optim.kind = opt;
  cfg.optim.lr = opt == OptimizerKind::AdamW ? 3e-3f : 0.5f;
  cfg.optim.momentum = 0.f;
  cfg.grad_sync = mode;
  cfg.staleness = staleness;
  cfg.sync_every = sync_every;
  return meshrt::test::train_losses(world, cfg);
}

}  // namespace

TEST_CASE("the f32 loss curve is the same for every dp x tp layout", "[dp][train][multirank]") {
  auto ref = losses(1, "dp=1,tp=1", GradSyncMode::Sync);
  REQUIRE(ref.size() == 5);
  REQUIRE(ref.back() < ref.front());  // it learns
  for (auto [w, m] : std::vector<std::pair<int, std::string>>{{2, "dp=2,tp=1"},
                                                              {2, "dp=1,tp=2"},
                                                              {4, "dp=2,tp=2"},
                                                              {4, "dp=4,tp=1"},
                                                              {4, "dp=1,tp=4"}}) {
    INFO("mesh " << m);
    auto got = losses(w, m, GradSyncMode::Sync);
    CHECK(rel_err(got, ref) < 1e-4);
  }
  INFO("dp=2,tp=2 with sequence parallel");
  CHECK(rel_err(losses(4, "dp=2,tp=2", GradSyncMode::Sync, OptimizerKind::AdamW, 1, 1, true), ref) <
        1e-4);
}

TEST_CASE("the loss curve with ffn and vocab that tp does not divide is the tp=1 curve",
          "[dp][train][multirank][uneven]") {
  ModelConfig m = tiny_model();
  m.block.hidden = 36;  // hidden and heads divide by 3 and 6; ffn and vocab do not
  m.block.heads = 6;
  m.block.ffn = 10;
  m.vocab = 100;
  const auto sync = GradSyncMode::Sync;
  const auto adam = OptimizerKind::AdamW;
  auto ref = losses(1, "dp=1,tp=1", sync, adam, 1, 1, false, m);
  REQUIRE(ref.size() == 5);
  REQUIRE(ref.back() < ref.front());
  for (auto [w, mesh] : std::vector<std::pair<int, std::string>>{
           {3, "dp=1,tp=3"}, {6, "dp=1,tp=6"}, {6, "dp=2,tp=3"}}) {
    INFO("mesh " << mesh);
    CHECK(rel_err(losses(w, mesh, sync, adam, 1, 1, false, m), ref) < 1e-4);
  }
}

TEST_CASE("async with staleness 0 is synchronous, and local SGD with H=1 is parameter averaging",
          "[dp][train][multirank]") {
  auto sync = losses(2, "dp=2", GradSyncMode::Sync, OptimizerKind::Sgd);
  auto async0 = losses(2, "dp=2", GradSyncMode::Async, OptimizerKind::Sgd, 0);
  REQUIRE(async0 == sync);
  auto local1 = losses(2, "dp=2", GradSyncMode::Local, OptimizerKind::Sgd, 1, 1);
  CHECK(rel_err(local1, sync) < 1e-4);
  // Staleness 2 and local SGD with H=4 train too, on a different curve.
  auto async2 = losses(2, "dp=2", GradSyncMode::Async, OptimizerKind::Sgd, 2);
  auto local4 = losses(2, "dp=2", GradSyncMode::Local, OptimizerKind::Sgd, 1, 4);
  CHECK(async2 != sync);
  CHECK(async2.back() < async2.front());
  CHECK(local4.back() < local4.front());
}

TEST_CASE("bad training configurations are rejected with what to change", "[dp][train][unit]") {
  TrainConfig c;
  c.model = tiny_model();
  c.batch = 6;
  c.micro_batches = 4;
  REQUIRE_THROWS_WITH(validate_train(c, 2),
                      Catch::Contains("must divide by dp (2) x --micro-batches (4)"));
  c.batch = 8;
  c.micro_batches = 1;
  c.mesh = "dp=2,pp=2";
  REQUIRE_THROWS_WITH(validate_train(c, 4), Catch::Contains("'pp' is not supported"));
  c.mesh = "dp=3";
  REQUIRE_THROWS_WITH(validate_train(c, 4), Catch::Contains("has 3 ranks but the world has 4"));
  c.mesh = "tp=4";
  c.model.vocab = 3;  // uneven vocabularies are sharded; one smaller than tp is not
  REQUIRE_THROWS_WITH(validate_train(c, 4), Catch::Contains("--vocab 3"));
  c.model.vocab = 66;
  REQUIRE_NOTHROW(validate_train(c, 4));
  REQUIRE_THROWS_WITH(parse_grad_sync("ring"), Catch::Contains("sync, async or local"));
}

TEST_CASE("the bucket probe sums local squared gradients and the guard sees one rank's NaN",
          "[dp][train][multirank]") {
  for (bool poison : {false, true}) {
    INFO("NaN on rank 1: " << poison);
    std::mutex mu;
    std::vector<StepVerdict> verdicts;
    run_ranks(2, [&](int r, Communicator& world, Context& ctx) {
      DeviceMesh mesh(ctx, world, "dp=2");
      CommScheduler tp(mesh, kTpDim, Overlap::Async);
      DecoderModel model(mesh, tp, {}, tiny_model());
      DpOptions o;
      o.bucket_mb = 0.01;  // several buckets
      GradSync sync(mesh, model.params(), o);
      REQUIRE(sync.num_buckets() > 2);
      sync.set_active(0);
      sync.zero_grad();
      Tensor sumsq = ctx.zeros({1, 1}, DType::f32);
      sync.set_sumsq_probe(sumsq);
      Tensor ids, tg;
      make_synthetic_batch(ctx, 3, r * 2, 2, 8, 64, &ids, &tg);
      Tensor loss = model.forward(ids, tg);
      // The local gradients as they are when their buckets launch: backward without the sync.
      model.backward(1.f, nullptr);
      ctx.synchronize();
      double expect = 0;
      for (Param* p : model.params())
        for (double v : p->grad.to_vector()) expect += v * v;
      if (poison && r == 1) {
        Param* p = model.params().back();
        p->grad.view({p->grad.numel()}).narrow(0, 0, 1).fill_(std::nan(""), ctx.compute_stream());
      }
      sync.finish();  // launches every bucket: each adds its local sum of squares first
      ctx.synchronize();
      const double got = sumsq.to(ctx.host_allocator(), ctx.compute_stream()).item(0);
      if (!(poison && r == 1)) CHECK(got == Approx(expect).epsilon(1e-5));
      StepVerdict v = agree_step(ctx, world, loss.view({1}), sumsq, 0);
      sync.wait_all();
      std::lock_guard<std::mutex> lk(mu);
      verdicts.push_back(v);
    });
    REQUIRE(verdicts.size() == 2);
    for (const StepVerdict& v : verdicts) {
      CHECK(v.loss_finite);
      CHECK(v.grads_finite == !poison);
      CHECK_FALSE(v.stop);
    }
  }
}

TEST_CASE("a stop request is agreed with the signal most ranks got", "[dp][train][multirank]") {
  // Rank 1 alone got SIGINT (a signal to one process under mpirun): every rank stops with it,
  // so every process exits 128 + SIGINT, not 128 + SIGTERM.
  struct Case {
    std::vector<int> asks;
    int expect;
  };
  const std::vector<Case> cases = {{{0, 2, 0, 0}, 2},
                                   {{15, 2, 0, 15}, 15},
                                   {{15, 2, 2, 15}, 2},  // a tie: the smaller number
                                   {{0, 0, 0, 0}, 0}};
  for (const Case& c : cases) {
    std::mutex mu;
    std::vector<StepVerdict> got;
    run_ranks(4, [&](int r, Communicator& world, Context& ctx) {
      StepVerdict v = agree_stop(ctx, world, c.asks[static_cast<size_t>(r)]);
      std::lock_guard<std::mutex> lk(mu);
      got.push_back(v);
    });
    REQUIRE(got.size() == 4);
    for (const StepVerdict& v : got) {
      CHECK(v.stop == (c.expect != 0));
      CHECK(v.stop_signal == c.expect);
    }
  }
}

TEST_CASE("learning-rate schedules give the hand-computed values", "[train][lr][unit]") {
  // lr 1, 2 warmup steps of 10, min_lr 0.1: warmup lr (i + 1) / 2, then r = (i - 2) / 8.
  LrSchedule s;
  s.warmup_steps = 2;
  s.total_steps = 10;
  s.min_lr = 0.1f;
  const double min = 0.1f;  // as the schedule holds it (f32)
  struct Want {
    LrScheduleKind kind;
    int64_t it;
    double lr;
  };
  for (const Want& w : std::vector<Want>{
           {LrScheduleKind::Cosine, 0, 0.5},
           {LrScheduleKind::Cosine, 1, 1.0},
           {LrScheduleKind::Cosine, 2, 1.0},
           {LrScheduleKind::Cosine, 4, min + 0.5 * (1 + std::sqrt(0.5)) * (1 - min)},
           {LrScheduleKind::Cosine, 6, min + 0.5 * (1 - min)},
           {LrScheduleKind::Cosine, 9,
            min + 0.5 * (1 - std::cos(std::numbers::pi / 8)) * (1 - min)},
           {LrScheduleKind::Linear, 0, 0.5},
           {LrScheduleKind::Linear, 2, 1.0},
           {LrScheduleKind::Linear, 4, min + 0.75 * (1 - min)},
           {LrScheduleKind::Linear, 9, min + 0.125 * (1 - min)},
       }) {
    INFO(lr_schedule_name(w.kind) << " step " << w.it);
    s.kind = w.kind;
    CHECK(scheduled_lr_f64(s, 1.0, w.it) == Approx(w.lr).epsilon(1e-12));
    CHECK(scheduled_lr(s, 1.f, w.it) == static_cast<float>(scheduled_lr_f64(s, 1.0, w.it)));
  }
  // The hand values in decimals: cosine at step 4 is 0.868198052, at step 9 0.134254211.
  s.kind = LrScheduleKind::Cosine;
  CHECK(scheduled_lr_f64(s, 1.0, 4) == Approx(0.868198052).epsilon(1e-8));
  CHECK(scheduled_lr_f64(s, 1.0, 9) == Approx(0.134254211).epsilon(1e-8));
  // Constant: warmup, then exactly lr (the f32 value itself, as without a schedule).
  s.kind = LrScheduleKind::Constant;
  s.min_lr = 0.f;
  CHECK(scheduled_lr(s, 3e-3f, 0) == static_cast<float>(3e-3f * 0.5));
  for (int64_t it : {2, 5, 9}) CHECK(scheduled_lr(s, 3e-3f, it) == 3e-3f);
  s.warmup_steps = 0;
  CHECK(scheduled_lr(s, 3e-3f, 0) == 3e-3f);
  CHECK(parse_lr_schedule("cosine") == LrScheduleKind::Cosine);
  REQUIRE_THROWS_WITH(
      parse_lr_schedule("step"),
      Catch::Contains("unknown --lr-schedule 'step': use constant, cosine or linear"));
}

TEST_CASE("bad learning-rate schedules and weight decays are refused with what to change",
          "[train][lr][unit]") {
  TrainConfig c;
  c.model = tiny_model();
  c.steps = 10;
  c.optim.lr = 1e-3f;
  c.lr_schedule = LrScheduleKind::Cosine;
  c.warmup_steps = 10;
  REQUIRE_THROWS_WITH(
      validate_train(c, 1),
      Catch::Contains("train: --warmup-steps 10 must be >= 0 and below --steps 10"));
  c.warmup_steps = -1;
  REQUIRE_THROWS_WITH(
      validate_train(c, 1),
      Catch::Contains("train: --warmup-steps -1 must be >= 0 and below --steps 10"));
  c.warmup_steps = 9;
  REQUIRE_NOTHROW(validate_train(c, 1));
  c.min_lr = 2e-3f;
  REQUIRE_THROWS_WITH(validate_train(c, 1),
                      Catch::Contains("train: --min-lr 0.002 must be >= 0 and <= --lr 0.001"));
  c.min_lr = 1e-4f;
  REQUIRE_NOTHROW(validate_train(c, 1));
  c.lr_schedule = LrScheduleKind::Constant;
  REQUIRE_THROWS_WITH(
      validate_train(c, 1),
      Catch::Contains(
          "train: --min-lr 0.0001 needs --lr-schedule cosine or linear (constant keeps --lr)"));
  c.min_lr = 0.f;
  c.optim.weight_decay = -0.5f;
  REQUIRE_THROWS_WITH(validate_train(c, 1),
                      Catch::Contains("train: --weight-decay -0.5 must be finite and >= 0"));
  c.optim.weight_decay = std::nanf("");
  REQUIRE_THROWS_WITH(validate_train(c, 1), Catch::Contains("--weight-decay nan"));
}

namespace {

// Rank 0's step statistics of train(cfg) on `world` thread ranks.
std::vector<StepStats> schedule_run(int world, const TrainConfig& cfg) {
  std::vector<StepStats> out;
  std::mutex mu;
  run_ranks(world, [&](int r, Communicator& w, Context& ctx) {
    auto st = train(cfg, ctx, w, nullptr);
    if (r != 0) return;
    std::lock_guard<std::mutex> lk(mu);
    out = st;
  });
  return out;
}

TrainConfig schedule_cfg(const std::string& mesh, OptimizerKind opt) {
  TrainConfig cfg;
  cfg.model = tiny_model();
  cfg.mesh = mesh;
  cfg.batch = 8;
  cfg.seq = 16;
  cfg.steps = 6;
  cfg.optim.kind = opt;
  cfg.optim.lr = opt == OptimizerKind::AdamW ? 3e-3f : 0.5f;
  cfg.optim.momentum = 0.f;
  cfg.lr_schedule = LrScheduleKind::Cosine;
  cfg.warmup_steps = 2;
  cfg.min_lr = cfg.optim.lr / 10;
  cfg.optim.weight_decay = 0.1f;
  return cfg;
}

}  // namespace

TEST_CASE(
    "a scheduled, weight-decayed run applies the f64 schedule and is the same on every layout",
    "[dp][train][lr][multirank]") {
  for (OptimizerKind opt : {OptimizerKind::AdamW, OptimizerKind::Sgd}) {
    INFO((opt == OptimizerKind::AdamW ? "adamw" : "sgd"));
    const TrainConfig cfg = schedule_cfg("dp=1", opt);
    const auto ref = schedule_run(1, cfg);
    REQUIRE(ref.size() == 6);
    std::vector<double> ref_loss;
    for (const StepStats& s : ref) {
      // The rate each step applied is the float64 schedule, rounded once to f32.
      const double want = scheduled_lr_f64(train_lr_schedule(cfg), cfg.optim.lr, s.step - 1);
      CHECK(s.lr == static_cast<double>(static_cast<float>(want)));
      ref_loss.push_back(s.loss);
    }
    CHECK(ref[0].lr == Approx(cfg.optim.lr / 2.0).epsilon(1e-6));  // warmup: lr (0 + 1) / 2
    CHECK(ref_loss.back() < ref_loss.front());
    // Neither the schedule nor the decay is a no-op: each changes the curve.
    TrainConfig flat = cfg;
    flat.lr_schedule = LrScheduleKind::Constant;
    flat.warmup_steps = 0;
    flat.min_lr = 0.f;
    TrainConfig no_wd = cfg;
    no_wd.optim.weight_decay = 0.f;
    std::vector<double> flat_loss, no_wd_loss;
    for (const StepStats& s : schedule_run(1, flat)) flat_loss.push_back(s.loss);
    for (const StepStats& s : schedule_run(1, no_wd)) no_wd_loss.push_back(s.loss);
    CHECK(flat_loss != ref_loss);
    CHECK(no_wd_loss != ref_loss);
    CHECK(no_wd_loss[0] == ref_loss[0]);  // the first loss is before any update
    // Sharded matrices decay as the whole ones do; replicated biases and gains not at all.
    for (auto [w, m] : std::vector<std::pair<int, std::string>>{{2, "dp=2"}, {4, "dp=2,tp=2"}}) {
      INFO("mesh " << m);
      std::vector<double> got;
      for (const StepStats& s : schedule_run(w, schedule_cfg(m, opt))) got.push_back(s.loss);
      CHECK(rel_err(got, ref_loss) < 1e-4);
    }
  }
}

TEST_CASE("stream-ordered host reuse gives the launch-blocking loss curve bit for bit",
          "[dp][train][stream][multirank]") {
  // Host tasks hold caching-pool blocks without owning them (Tensor::stream_ref), so the host
  // thread's allocations reuse blocks whose queued readers have not run yet. The curves must be
  // those of launch blocking, where every task ran before the next allocation; mesh.jitter runs
  // this with random delays before every task.
  for (auto [w, m, sp] : std::vector<std::tuple<int, std::string, bool>>{
           {2, "dp=2,tp=1", false}, {2, "dp=1,tp=2", true}, {4, "dp=2,tp=2", false}}) {
    INFO("mesh " << m << (sp ? " sp" : ""));
    auto queued = losses(w, m, GradSyncMode::Sync, OptimizerKind::AdamW, 1, 1, sp);
    set_host_launch_blocking(1);
    std::vector<double> blocking;
    try {
      blocking = losses(w, m, GradSyncMode::Sync, OptimizerKind::AdamW, 1, 1, sp);
    } catch (...) {
      set_host_launch_blocking(-1);
      throw;
    }
    set_host_launch_blocking(-1);
    REQUIRE(queued.size() == 5);
    for (size_t i = 0; i < queued.size(); ++i) CHECK(queued[i] == blocking[i]);
  }
}

TEST_CASE("first-write gradients equal zero-filled ones over steps and micro-batches",
          "[dp][multirank]") {
  // Accumulating into the first step's gradients instead of overwriting them would double them.
  for (auto [dp, micro] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{2, 2}}) {
    INFO("dp=" << dp << " micro-batches=" << micro);
    const int64_t batch = 2 * dp * micro;
    const Grads filled = dp_grads(dp, batch, micro, 25.0, false, 2, false);
    const Grads first = dp_grads(dp, batch, micro, 25.0, false, 2, true);
    compare_grads(first, filled, 1e-5);
  }
}
