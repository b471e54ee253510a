// The style plan (dist/style_plan.h): linears take their parallel style by layer name, and the
// default plan is the layout the blocks always ran.
#include <catch2/catch.hpp>

#include <mutex>

#include "model/blocks.h"
#include "runtime/error.h"
#include "tests/mesh/harness.h"

using namespace meshrt;
using meshrt::test::run_ranks;

TEST_CASE("style plan: exact names, wildcards and the error for an unplanned layer",
          "[mesh][unit]") {
  const StylePlan& d = default_style_plan();
  CHECK(d.style_of("attn.qkv") == LinearStyle::Colwise);
  CHECK(d.style_of("attn.proj") == LinearStyle::Rowwise);
  CHECK(d.style_of("mlp.fc1") == LinearStyle::Colwise);
  CHECK(d.style_of("mlp.fc2") == LinearStyle::Rowwise);
  CHECK(d.style_of("lm.head") == LinearStyle::Colwise);

  // An exact entry wins over an earlier wildcard; wildcards match in plan order.
  const StylePlan p{{"*", LinearStyle::Colwise},
                    {"mlp.fc2", LinearStyle::Rowwise},
                    {"*.proj", LinearStyle::Rowwise}};
  CHECK(p.style_of("mlp.fc2") == LinearStyle::Rowwise);
  CHECK(p.style_of("attn.proj") == LinearStyle::Colwise);  // "*" comes first
  const StylePlan w{{"*.proj", LinearStyle::Rowwise}, {"mlp.*", LinearStyle::Colwise}};
  CHECK(w.style_of("attn.proj") == LinearStyle::Rowwise);
  CHECK(w.style_of("mlp.fc1") == LinearStyle::Colwise);
  CHECK(style_pattern_matches("*.attn.qkv", "layer3.attn.qkv"));
  CHECK(style_pattern_matches("a*b*c", "a__b__c"));
  CHECK_FALSE(style_pattern_matches("*.attn.qkv", "attn.qkv"));
  CHECK_FALSE(style_pattern_matches("mlp.fc", "mlp.fc1"));

  CHECK_THROWS_WITH(w.style_of("attn.qkv"),
                    Catch::Contains("style plan: no entry for layer 'attn.qkv' (patterns: "
                                    "'*.proj', 'mlp.*')"));
  CHECK_THROWS_WITH(StylePlan{}.style_of("mlp.fc1"),
                    Catch::Contains("no entry for layer 'mlp.fc1' (patterns: none)"));
  CHECK_THROWS_WITH((StylePlan{{"mlp.*", LinearStyle::Colwise}, {"mlp.*", LinearStyle::Rowwise}}),
                    Catch::Contains("layer pattern 'mlp.*' given twice (colwise and rowwise)"));
  CHECK_THROWS_WITH((StylePlan{{"", LinearStyle::Colwise}}),
                    Catch::Contains("style plan: an empty layer pattern"));
}

TEST_CASE("style plan: a block built from an explicit plan equals the default one, bit for bit",
          "[mesh][multirank]") {
  // The default's layout written with wildcards, as a user would give it.
  const StylePlan explicit_plan{{"*.qkv", LinearStyle::Colwise},
                                {"*.fc1", LinearStyle::Colwise},
                                {"*.proj", LinearStyle::Rowwise},
                                {"mlp.fc2", LinearStyle::Rowwise}};
  std::vector<std::vector<double>> got[2];
  std::mutex mu;
  for (int which = 0; which < 2; ++which) {
    run_ranks(2, [&](int r, Communicator& world, Context& ctx) {
      DeviceMesh mesh(ctx, world, "tp=2");
      CommScheduler sched(mesh, kTpDim, Overlap::Async);
      Stream& s = ctx.compute_stream();
      BlockConfig cfg;
      cfg.hidden = 16;
      cfg.ffn = 32;
      cfg.heads = 4;
      cfg.param_noise = 0.3f;
      if (which == 1) cfg.styles = explicit_plan;
      TransformerBlock block(mesh, sched, TpOptions{true, Overlap::Async}, cfg, "b", 0);
      Tensor x = ctx.empty({4, 2, cfg.hidden}, DType::f32);  // this rank's sequence shard
      x.init_philox_({77, static_cast<uint64_t>(r), PhiloxInit::Dist::Normal, 0.f, 1.f}, s);
      Tensor dout = ctx.empty({4, 2, cfg.hidden}, DType::f32);
      dout.init_philox_({78, static_cast<uint64_t>(r), PhiloxInit::Dist::Normal, 0.f, 1.f}, s);
      std::vector<Tensor> t{block.forward(x)};
      t.push_back(block.backward(dout));
      for (Param* p : block.params()) t.push_back(p->grad);
      ctx.synchronize();  // every stream's work done: the values are read on this thread next
      std::vector<std::vector<double>> mine;
      for (const Tensor& v : t) mine.push_back(v.to_vector());
      std::lock_guard<std::mutex> lk(mu);
      if (r == 0) got[which] = std::move(mine);
    });
  }
  REQUIRE(got[0].size() == 14);  // out, dx, 12 parameters' gradients
  CHECK(got[1] == got[0]);
}

TEST_CASE("style plan: a block refuses a plan it cannot run, naming the layer",
          "[mesh][multirank]") {
  run_ranks(1, [&](int, Communicator& world, Context& ctx) {
    DeviceMesh mesh(ctx, world, "tp=1");
    CommScheduler sched(mesh, kTpDim, Overlap::Async);
    BlockConfig cfg;
    cfg.hidden = 16;
    cfg.ffn = 32;
    cfg.heads = 4;
    cfg.styles = {{"mlp.fc1", LinearStyle::Rowwise}, {"*", LinearStyle::Colwise}};
    RANK_REQUIRE_THROWS_WITH(MlpBlock(mesh, sched, {}, cfg, "b", 0),
                             Catch::Contains("block: the style plan makes mlp.fc1 rowwise, and the "
                                             "mlp block runs it colwise: give that layer colwise"));
    cfg.styles = {{"mlp.fc1", LinearStyle::Colwise}};
    RANK_REQUIRE_THROWS_WITH(MlpBlock(mesh, sched, {}, cfg, "b", 0),
                             Catch::Contains("no entry for layer 'mlp.fc2' (patterns: 'mlp.fc1')"));
  });
}
