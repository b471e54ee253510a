// Training with context parallelism (a cp mesh dim): the loss curve of every dp x cp x tp layout
// is the cp=1 curve within f32 rounding, also under ZeRO over dp x cp and across a resume that
// changes cp; what train does not run with cp is refused naming the option.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/error.h"
#include "tests/common/files.h"
#include "tests/mesh/harness.h"
#include "train/token_data.h"
#include "train/train.h"
#include "train/train_guard.h"

using namespace meshrt;
using meshrt::test::rel_err;

namespace {

// Tiny and cheap: 20 steps of 4 sequences of 16 tokens (2 x cp = 4 chunks of 4 at cp=2).
TrainConfig cp_cfg(const std::string& mesh, int steps = 20) {
  TrainConfig c;
  c.model = test::small_model_config(32, 4, 64, 1, 64);
  c.mesh = mesh;
  c.batch = 4;
  c.seq = 16;
  c.steps = steps;
  c.optim.lr = 3e-3f;
  return c;
}

// The tolerance of every comparison here: relative, over the whole curve (f32 sums in another
// order: cp attention merges partial softmaxes by their LSE, gradients are summed over cp). This
// machine measures 1.1e-7 for every layout here.
constexpr double kTol = 1e-5;

}  // namespace

TEST_CASE("train at cp=2 gives the cp=1 loss curve on every dp x cp x tp layout",
          "[cp][train][multirank]") {
  const auto ref = test::train_losses(1, cp_cfg("dp=1"));
  REQUIRE(ref.size() == 20);
  REQUIRE(ref.back() < ref.front());  // it learns
  for (CpComm how : {CpComm::Ring, CpComm::AllGather})
    for (auto [w, m, sp] :
         std::vector<std::tuple<int, std::string, bool>>{{2, "cp=2", false},
                                                         {4, "cp=2,tp=2", false},
                                                         {4, "cp=2,tp=2", true},
                                                         {4, "dp=2,cp=2", false}}) {
      INFO("mesh " << m << (sp ? " --sp" : "") << " --cp-comm " << cp_comm_name(how));
      TrainConfig c = cp_cfg(m);
      c.model.block.cp_comm = how;
      c.tp.sequence_parallel = sp;
      CHECK(rel_err(test::train_losses(w, c), ref) < kTol);
    }
}

TEST_CASE("train at cp=2 on a token file gives the cp=1 train and validation losses",
          "[cp][train][multirank]") {
  const std::string path = (test::scratch_dir("cp-tokens") / "tokens.u16").string();
  {
    std::vector<uint16_t> t(4096);
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>((i * 37 + i / 7) % 64);
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * 2));
  }
  const auto file = TokenFile::open(path, TokenDType::U16);
  auto run = [&](int world, const std::string& mesh) {
    TrainConfig c = cp_cfg(mesh, 4);
    c.data = file;
    c.val_data = file;
    c.eval_every = 2;
    std::vector<double> out;
    for (const StepStats& s : test::train_stats(world, c)) {
      out.push_back(s.loss);
      if (!std::isnan(s.val_loss)) out.push_back(s.val_loss);
    }
    return out;
  };
  const auto ref = run(1, "dp=1");
  REQUIRE(ref.size() == 6);  // 4 train losses, 2 validations
  CHECK(rel_err(run(4, "dp=2,cp=2"), ref) < kTol);
}

TEST_CASE("ZeRO 1, 2 and 3 over dp x cp give the cp=1 loss curve, clipped by the global norm",
          "[cp][train][zero][multirank]") {
  // SGD (which clipping changes, unlike AdamW) with a clip below the gradient norm: the norm of
  // ZeRO 2's shards must be summed over dp x cp.
  TrainConfig base = cp_cfg("dp=1", 8);
  base.optim.kind = OptimizerKind::Sgd;
  base.optim.lr = 0.5f;
  base.optim.clip_norm = 0.05f;
  const auto ref = test::train_losses(1, base);
  REQUIRE(ref.size() == 8);
  for (int zero : {1, 2, 3}) {
    INFO("--zero " << zero << " --mesh dp=2,cp=2");
    TrainConfig c = base;
    c.mesh = "dp=2,cp=2";
    c.dp.zero = zero;
    CHECK(rel_err(test::train_losses(4, c), ref) < kTol);
  }
}

TEST_CASE("a run saved at cp=2 resumes at cp=1 and one saved at cp=1 resumes at cp=2",
          "[cp][train][checkpoint][multirank]") {
  const auto full = test::train_losses(1, cp_cfg("dp=1"));
  REQUIRE(full.size() == 20);
  struct Case {
    int save_world;
    std::string save_mesh;
    int zero;  // of the saved run (ZeRO over dp x cp: its state is gathered into the checkpoint)
    int resume_world;
    std::string resume_mesh;
  };
  for (const Case& k : std::vector<Case>{
           {2, "cp=2", 0, 1, "dp=1"}, {1, "dp=1", 0, 2, "cp=2"}, {4, "dp=2,cp=2", 2, 1, "dp=1"}}) {
    INFO("saved at --mesh " << k.save_mesh << " --zero " << k.zero << ", resumed at --mesh "
                            << k.resume_mesh);
    const std::string root =
        test::scratch_dir("cp-resume-" + k.save_mesh + "-" + std::to_string(k.zero)).string();
    TrainConfig s = cp_cfg(k.save_mesh, 10);
    s.dp.zero = k.zero;
    s.checkpoint.save = root;
    const auto first = test::train_losses(k.save_world, s);
    REQUIRE(first.size() == 10);
    CHECK(rel_err(first, {full.begin(), full.begin() + 10}) < kTol);
    TrainConfig r = cp_cfg(k.resume_mesh, 20);
    r.checkpoint.resume = root;
    const auto rest = test::train_losses(k.resume_world, r);
    REQUIRE(rest.size() == 10);
    CHECK(rel_err(rest, {full.begin() + 10, full.end()}) < kTol);
  }
}

TEST_CASE("train refuses what it does not run with cp, naming the option and values",
          "[cp][train][unit]") {
  TrainConfig c = cp_cfg("cp=2");
  REQUIRE_NOTHROW(validate_train(c, 2));
  c.seq = 18;
  REQUIRE_THROWS_WITH(validate_train(c, 2),
                      Catch::Contains("sequence 18 does not divide by 2 x cp = 4 (cp=2)") &&
                          Catch::Contains("change --seq or the mesh's cp"));
  c = cp_cfg("cp=2,tp=4");
  c.seq = 12;
  c.tp.sequence_parallel = true;
  REQUIRE_THROWS_WITH(validate_train(c, 8), Catch::Contains("does not divide by tp=4"));
  c = cp_cfg("cp=2");
  c.deterministic = true;
  REQUIRE_THROWS_WITH(validate_train(c, 2),
                      Catch::Contains("--deterministic is not supported with context "
                                      "parallelism (--mesh cp=2, cp=2)"));
  c = cp_cfg("cp=2");
  c.grad_sync = GradSyncMode::Local;
  REQUIRE_THROWS_WITH(validate_train(c, 2),
                      Catch::Contains("--grad-sync local is not supported with context "
                                      "parallelism"));
  c = cp_cfg("dp=2,cp=2,pp=1");
  REQUIRE_THROWS_WITH(validate_train(c, 4), Catch::Contains("use dp, cp and tp"));
}

TEST_CASE("the memory estimate shards ZeRO over dp x cp and a cp rank's tokens are seq / cp",
          "[cp][train][unit]") {
  // dp=4 x cp=2 holds what dp=8 holds: ZeRO shards over 8 ranks, and each rank keeps
  // batch / 4 x seq / 2 = batch / 8 x seq tokens' activations (the attention scores: its
  // seq / cp queries over the whole sequence).
  TrainConfig c = cp_cfg("dp=4,cp=2");
  c.batch = 8;
  c.dp.zero = 3;
  TrainConfig d = c;
  d.mesh = "dp=8";
  const TrainMemory a = estimate_train_memory(c, 8), b = estimate_train_memory(d, 8);
  CHECK(a.weights == b.weights);
  CHECK(a.grads == b.grads);
  CHECK(a.optimizer == b.optimizer);
  CHECK(a.activations == b.activations);
}
