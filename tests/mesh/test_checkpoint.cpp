// Checkpoints: the format, atomic writes that survive a rank failing mid-write, loading onto
// every other layout bit-exactly, exact resume, and rejection of corrupt or foreign input.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/error.h"
#include "tests/common/files.h"
#include "tests/mesh/harness.h"
#include "train/checkpoint.h"
#include "train/checkpoint_root.h"
#include "train/crc32c.h"
#include "train/token_data.h"
#include "train/train.h"
#include "train/train_checkpoint.h"

using namespace meshrt;
using meshrt::test::rel_err;
using meshrt::test::run_ranks;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test process (ctest runs test cases as parallel processes).
std::string scratch(const std::string& name) {
  fs::path p =
      fs::temp_directory_path() / ("meshrt_ckpt_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// hidden and heads divide by 4; ffn (90) and vocab (130) do not: tp=4 shards them unevenly.
ModelConfig small_model(uint64_t seed = 5) {
  return test::small_model_config(32, 4, 90, 1, 130, seed);
}

struct Layout {
  int world;
  std::string mesh;
  bool sp;
  std::string str() const { return mesh + (sp ? "+sp" : ""); }
};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> l = {
      {1, "dp=1", false}, {2, "tp=2", false},      {2, "dp=2", false}, {2, "tp=2", true},
      {4, "tp=4", false}, {4, "dp=2,tp=2", false}, {4, "dp=4", false}, {4, "tp=4", true}};
  return l;
}

// Full (unsharded) parameters and optimizer moments, by checkpoint name, as f32 bit patterns.
using Full = std::map<std::string, std::vector<double>>;

Full gather_full(DeviceMesh& mesh, const std::vector<Param*>& params, const Optimizer& opt) {
  Stream& cs = mesh.ctx().compute_stream();
  std::vector<std::pair<std::string, Tensor>> host;
  for (size_t i = 0; i < params.size(); ++i) {
    const Param* p = params[i];
    auto put = [&](const std::string& k, const Tensor& t) {
      host.emplace_back(
          k, full_tensor(t, mesh, p->placements, cs).to(mesh.ctx().host_allocator(), cs));
    };
    put(p->name, p->value);
    for (auto& [n, t] : opt.state(i)) put(p->name + "." + n, t);
  }
  cs.synchronize();
  Full out;
  for (auto& [k, t] : host) out[k] = t.to_vector();
  return out;
}

struct Rig {
  DeviceMesh mesh;
  CommScheduler tp;
  DecoderModel model;
  GradSync sync;
  Optimizer opt;
  Rig(Context& ctx, Communicator& w, const Layout& l, const ModelConfig& m)
      : mesh(ctx, w, l.mesh),
        tp(mesh, kTpDim, Overlap::None),
        model(mesh, tp, TpOptions{l.sp, Overlap::None}, m),
        sync(mesh, model.params(), DpOptions{}),
        opt(mesh, model.params(), OptimizerConfig{}) {
    sync.broadcast_params();
  }
  // One synchronous training step on 4 samples of length 8 (moments become non-zero).
  void step() {
    Context& ctx = mesh.ctx();
    const int64_t local = 4 / mesh.size(kDpDim);
    sync.set_active(0);
    sync.zero_grad();
    sync.enable_sync(true);
    Tensor ids, tg;
    make_synthetic_batch(ctx, 9, mesh.coord(kDpDim) * local, local, 8, 130, &ids, &tg);
    model.forward(ids, tg);
    model.backward(1.f, &sync);
    opt.step(&sync, 1.f, 0);
    ctx.synchronize();
  }
};

// The run the checkpoints of save_on claim to come from (its config fields are checked on load).
TrainConfig base_cfg() {
  TrainConfig c;
  c.model = small_model();
  c.seed = 9;
  c.seq = 8;
  c.batch = 4;
  return c;
}

CheckpointMeta meta_at(int64_t step, const std::string& run = "test-run") {
  CheckpointMeta m = train_checkpoint_meta(base_cfg(), step);
  m.run = run;
  return m;
}

// Trains one step on `l`, saves to `root` at `step`; returns the full tensors saved.
Full save_on(const Layout& l, const std::string& root, int64_t step = 1, int keep = 0,
             const std::string& run = "test-run") {
  Full ref;
  std::mutex mu;
  run_ranks(l.world, [&](int r, Communicator& w, Context& ctx) {
    Rig rig(ctx, w, l, small_model());
    rig.step();
    save_checkpoint(root, meta_at(step, run), rig.mesh, rig.model.params(), &rig.opt, keep);
    Full f = gather_full(rig.mesh, rig.model.params(), rig.opt);
    if (r != 0) return;
    std::lock_guard<std::mutex> lk(mu);
    ref = std::move(f);
  });
  return ref;
}

// Loads `dir` on `l` into a model initialised differently; returns the full tensors loaded.
Full load_on(const Layout& l, const std::string& dir, int64_t* opt_steps = nullptr) {
  Full got;
  std::mutex mu;
  run_ranks(l.world, [&](int r, Communicator& w, Context& ctx) {
    Rig rig(ctx, w, l, small_model(/*seed=*/77));
    load_checkpoint(dir, meta_at(0), rig.mesh, rig.model.params(), &rig.opt);
    Full f = gather_full(rig.mesh, rig.model.params(), rig.opt);
    if (r != 0) return;
    std::lock_guard<std::mutex> lk(mu);
    got = std::move(f);
    if (opt_steps) *opt_steps = rig.opt.steps();
  });
  return got;
}

void require_bit_identical(const Full& got, const Full& ref) {
  REQUIRE(got.size() == ref.size());
  for (auto& [k, v] : ref) {
    INFO("tensor " << k);
    REQUIRE(got.count(k) == 1);
    const auto& g = got.at(k);
    REQUIRE(g.size() == v.size());
    size_t diff = 0;
    for (size_t i = 0; i < v.size(); ++i) diff += std::memcmp(&g[i], &v[i], sizeof(double)) != 0;
    CHECK(diff == 0);
  }
}

std::string slurp(const std::string& p) { return meshrt::test::slurp(p); }

void spit(const std::string& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
}

// Every regular file under `root` with its contents: "nothing was overwritten" is equality.
std::map<std::string, std::string> snapshot(const std::string& root) {
  std::map<std::string, std::string> m;
  for (auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) m[e.path().string()] = slurp(e.path().string());
  return m;
}

}  // namespace

TEST_CASE("crc32c matches the standard check value and chains", "[checkpoint]") {
  const char* s = "123456789";
  CHECK(crc32c(0, s, 9) == 0xE3069283u);
  CHECK(crc32c(crc32c(0, s, 4), s + 4, 5) == 0xE3069283u);
  CHECK(crc32c(0, s, 0) == 0u);
  std::string big(1000, 'x');
  CHECK(crc32c(crc32c(0, big.data(), 333), big.data() + 333, 667) == crc32c(0, big.data(), 1000));
}

TEST_CASE("checkpoints are due every N steps, at the last step and when stopping", "[checkpoint]") {
  CheckpointOptions o;
  CHECK_FALSE(checkpoint_due(o, 10, 10, true));  // no --save
  o.save = "x";
  CHECK(checkpoint_due(o, 10, 10, false));
  CHECK_FALSE(checkpoint_due(o, 3, 10, false));
  CHECK(checkpoint_due(o, 3, 10, true));
  o.save_every = 3;
  CHECK(checkpoint_due(o, 3, 10, false));
  CHECK(checkpoint_due(o, 6, 10, false));
  CHECK_FALSE(checkpoint_due(o, 7, 10, false));
}

TEST_CASE("a safetensors reader reads byte ranges of one tensor", "[checkpoint]") {
  const std::string d = scratch("reader");
  Context ctx(Device::cpu());
  Tensor t = Tensor::empty({4, 5}, DType::f32, ctx.host_allocator());
  for (int i = 0; i < 20; ++i) t.data<float>()[i] = static_cast<float>(i) * 1.5f;
  Tensor u = Tensor::empty({3}, DType::i64, ctx.host_allocator());
  for (int i = 0; i < 3; ++i) u.data<int64_t>()[i] = 100 + i;
  save_safetensors(d + "/f.safetensors", {{"u", u}, {"t", t}}, ctx.compute_stream(), {{"k", "v"}});
  SafetensorsReader r(d + "/f.safetensors");
  CHECK(r.metadata().at("k") == "v");
  const auto& e = r.at("t");
  CHECK(e.shape == Shape({4, 5}));
  float row[5];
  r.read(e, 2 * 5 * sizeof(float), sizeof(row), row);  // row 2
  for (int i = 0; i < 5; ++i) CHECK(row[i] == static_cast<float>(10 + i) * 1.5f);
  int64_t v;
  r.read(r.at("u"), 2 * sizeof(int64_t), sizeof(v), &v);
  CHECK(v == 102);
  CHECK_THROWS_WITH(r.read(e, 76, 8, row), Catch::Contains("outside tensor 't'"));
  CHECK_THROWS_WITH(r.at("w"), Catch::Contains("f.safetensors") && Catch::Contains("'w'"));
  CHECK_THROWS_WITH(SafetensorsReader("/dev/zero"), Catch::Contains("not a regular file"));
  fs::remove_all(d);
}

TEST_CASE("a checkpoint loads bit-identically onto every layout of 1, 2 and 4 ranks",
          "[checkpoint][multirank]") {
  const std::string root = scratch("reshard");
  for (const Layout& src : layouts()) {
    const std::string dir = root + "/" + src.str();
    Full ref = save_on(src, dir);
    REQUIRE(ref.count("embed.weight.exp_avg") == 1);
    for (const Layout& dst : layouts()) {
      INFO("saved on " << src.str() << ", loaded on " << dst.str());
      int64_t steps = 0;
      require_bit_identical(load_on(dst, dir, &steps), ref);
      CHECK(steps == 1);
    }
  }
  fs::remove_all(root);
}

TEST_CASE("a checkpoint is one safetensors file per rank, replicas once, and an index",
          "[checkpoint][multirank]") {
  const std::string root = scratch("format");
  save_on({4, "dp=2,tp=2", false}, root, 3);
  CHECK(slurp(root + "/latest") == "step-00000003\n");
  const std::string dir = root + "/step-00000003";
  auto idx = nlohmann::json::parse(slurp(dir + "/index.json"));
  CHECK(idx["format"] == "meshrt-checkpoint");
  CHECK(idx["mesh"] == "dp=2,tp=2");
  CHECK(idx["step"] == 3);
  CHECK(idx["data"]["seed"] == 9);
  CHECK(idx["files"].size() == 4);
  for (auto it = idx["files"].begin(); it != idx["files"].end(); ++it) {
    const std::string f = slurp(dir + "/" + it.key());
    CHECK(f.size() == it.value()["bytes"].get<size_t>());
    char hex[9];
    std::snprintf(hex, sizeof hex, "%08x", crc32c(0, f.data(), f.size()));
    CHECK(it.value()["crc32c"] == hex);
  }
  // The vocabulary-sharded embedding: two tp shards from the dp=0 ranks 0 and 1.
  auto emb = idx["tensors"]["embed.weight"];
  CHECK(emb["shape"] == nlohmann::json::array({130, 32}));
  REQUIRE(emb["shards"].size() == 2);
  CHECK(emb["shards"][1]["file"] == "rank-00001.safetensors");
  CHECK(emb["shards"][1]["offsets"] == nlohmann::json::array({65, 0}));
  Context ctx(Device::cpu());
  auto f0 = load_safetensors(dir + "/rank-00000.safetensors", ctx.host_allocator());
  auto f2 = load_safetensors(dir + "/rank-00002.safetensors", ctx.host_allocator());
  CHECK(f0.at("embed.weight").shape() == Shape({65, 32}));
  CHECK(f0.at("optimizer.step").item(0) == 1);
  CHECK(f2.tensors.size() == 1);  // a dp replica writes only the step count
  fs::remove_all(root);
}

namespace {

TrainConfig train_cfg(const std::string& mesh, int steps) {
  TrainConfig c;
  c.model = small_model();
  c.model.layers = 2;
  c.mesh = mesh;
  c.batch = 8;
  c.seq = 16;
  c.steps = steps;
  c.optim.lr = 3e-3f;
  return c;
}

std::vector<double> run_train(int world, const TrainConfig& cfg) {
  return meshrt::test::train_losses(world, cfg);
}

}  // namespace

TEST_CASE(
    "resuming continues the loss curve exactly on the same mesh and within tolerance on "
    "another",
    "[checkpoint][train][multirank]") {
  const std::string root = scratch("resume");
  const auto full = run_train(4, train_cfg("dp=2,tp=2", 6));
  REQUIRE(full.size() == 6);
  {
    TrainConfig c = train_cfg("dp=2,tp=2", 6);
    c.checkpoint.save = root;
    c.checkpoint.save_every = 2;
    c.checkpoint.keep = 2;
    c.stop_requested = [] {  // after step 3, on every rank (each asks once per step)
      thread_local int calls = 0;
      return ++calls == 3;
    };
    auto first = run_train(4, c);
    REQUIRE(first.size() == 3);
    for (size_t i = 0; i < 3; ++i) CHECK(first[i] == full[i]);
  }
  // Steps 2 and 3 are kept (--keep 2); latest is the stop's checkpoint.
  CHECK(fs::exists(root + "/step-00000002/index.json"));
  CHECK(fs::exists(root + "/step-00000003/index.json"));
  CHECK(slurp(root + "/latest") == "step-00000003\n");
  TrainConfig r = train_cfg("dp=2,tp=2", 6);
  r.checkpoint.resume = root;
  auto same = run_train(4, r);
  REQUIRE(same.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(same[i] == full[3 + i]);  // bit-identical f32
  for (auto [w, m] :
       std::vector<std::pair<int, std::string>>{{4, "tp=4"}, {1, "dp=1"}, {2, "dp=2"}}) {
    INFO("resumed on " << m);
    TrainConfig o = train_cfg(m, 6);
    o.checkpoint.resume = root + "/step-00000002";
    auto got = run_train(w, o);
    REQUIRE(got.size() == 4);
    CHECK(rel_err(got, {full.begin() + 2, full.end()}) < 1e-4);
  }
  // Saving again at a step that exists (a resumed run) replaces it whole.
  r.steps = 3;
  r.checkpoint.save = root;
  r.checkpoint.resume = root + "/step-00000002";
  auto again = run_train(4, r);
  REQUIRE(again.size() == 1);
  CHECK(again[0] == full[2]);
  CHECK(slurp(root + "/latest") == "step-00000003\n");
  r.steps = 6;
  r.checkpoint.save.clear();
  r.checkpoint.resume = root;
  auto after = run_train(4, r);
  REQUIRE(after.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(after[i] == full[3 + i]);
  fs::remove_all(root);
}

TEST_CASE("resuming on a token file continues at the saved data position",
          "[checkpoint][train][multirank]") {
  const std::string root = scratch("resume-data");
  // Tokens of a varied byte pattern below the vocabulary, as raw u16.
  std::string bytes;
  for (int i = 0; i < 4096; ++i) {
    const uint16_t t = static_cast<uint16_t>((i * 37 + i / 7) % small_model().vocab);
    bytes.append(reinterpret_cast<const char*>(&t), 2);
  }
  const std::string file = root + "-tokens.bin";
  std::ofstream(file, std::ios::binary) << bytes;
  auto with_data = [&](const std::string& mesh, int steps) {
    TrainConfig c = train_cfg(mesh, steps);
    c.data = TokenFile::open(file, TokenDType::U16);
    return c;
  };
  const auto full = run_train(2, with_data("dp=2", 5));
  REQUIRE(full.size() == 5);
  TrainConfig c = with_data("dp=2", 2);
  c.checkpoint.save = root;
  run_train(2, c);
  TrainConfig r = with_data("dp=2", 5);
  r.checkpoint.resume = root;
  auto same = run_train(2, r);
  REQUIRE(same.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(same[i] == full[2 + i]);  // the batches of steps 3..5
  auto tp = with_data("tp=2", 5);
  tp.checkpoint.resume = root;
  auto other = run_train(2, tp);
  REQUIRE(other.size() == 3);
  CHECK(rel_err(other, {full.begin() + 2, full.end()}) < 1e-4);
  // Another stream of tokens or another batch would continue somewhere else: refused.
  TrainConfig synth = train_cfg("dp=2", 5);
  synth.checkpoint.resume = root;
  CHECK_THROWS_WITH(run_train(2, synth), Catch::Contains("data=raw u16, 4096 tokens") &&
                                             Catch::Contains("data=synthetic"));
  TrainConfig batch = with_data("dp=2", 5);
  batch.batch = 4;
  batch.checkpoint.resume = root;
  CHECK_THROWS_WITH(run_train(2, batch), Catch::Contains("batch=8") && Catch::Contains("batch=4"));
  fs::remove_all(root);
  fs::remove(file);
}

TEST_CASE("resuming a cosine schedule with warmup and weight decay continues it bit for bit",
          "[checkpoint][train][lr][multirank]") {
  const std::string root = scratch("resume-lr");
  auto sched = [](const std::string& mesh, int steps) {
    TrainConfig c = train_cfg(mesh, steps);
    c.lr_schedule = LrScheduleKind::Cosine;
    c.warmup_steps = 2;
    c.min_lr = 3e-4f;
    c.optim.weight_decay = 0.1f;
    return c;
  };
  const auto full = run_train(2, sched("dp=2", 6));
  REQUIRE(full.size() == 6);
  // The first half holds the warmup, the resumed half the decay.
  TrainConfig a = sched("dp=2", 6);
  a.checkpoint.save = root;
  a.stop_requested = [] {
    thread_local int calls = 0;
    return ++calls == 3;
  };
  const auto first = run_train(2, a);
  REQUIRE(first.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(first[i] == full[i]);
  TrainConfig b = sched("dp=2", 6);
  b.checkpoint.resume = root;
  const auto rest = run_train(2, b);
  REQUIRE(rest.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(rest[i] == full[3 + i]);  // bit-identical f32
  // The schedule is recorded: another decay length, schedule or weight decay is refused.
  TrainConfig longer = sched("dp=2", 8);
  longer.checkpoint.resume = root;
  CHECK_THROWS_WITH(run_train(2, longer), Catch::Contains("was saved with lr_decay_steps=6 but "
                                                          "this run has lr_decay_steps=8"));
  TrainConfig flat = sched("dp=2", 6);
  flat.lr_schedule = LrScheduleKind::Linear;
  flat.checkpoint.resume = root;
  CHECK_THROWS_WITH(run_train(2, flat), Catch::Contains("lr_schedule=cosine but this run has "
                                                        "lr_schedule=linear"));
  TrainConfig wd = sched("dp=2", 6);
  wd.optim.weight_decay = 0.f;
  wd.checkpoint.resume = root;
  CHECK_THROWS_WITH(run_train(2, wd), Catch::Contains("weight_decay=0.100000001 but this run has "
                                                      "weight_decay=0"));
  fs::remove_all(root);
}

TEST_CASE("a mismatched model config is refused naming the field and both values",
          "[checkpoint][train][multirank]") {
  const std::string root = scratch("mismatch");
  TrainConfig c = train_cfg("tp=2", 1);
  c.checkpoint.save = root;
  run_train(2, c);
  TrainConfig r = train_cfg("tp=2", 2);
  r.model.block.ffn = 60;
  r.checkpoint.resume = root;
  CHECK_THROWS_WITH(run_train(2, r), Catch::Contains("ffn=90") && Catch::Contains("ffn=60") &&
                                         Catch::Contains("index.json"));
  r = train_cfg("tp=2", 2);
  r.optim.kind = OptimizerKind::Sgd;
  r.checkpoint.resume = root;
  CHECK_THROWS_WITH(run_train(2, r),
                    Catch::Contains("optimizer=adamw") && Catch::Contains("optimizer=sgd"));
  r = train_cfg("tp=2", 2);
  r.grad_sync = GradSyncMode::Local;
  r.checkpoint.resume = root;
  CHECK_THROWS_WITH(validate_train(r, 2), Catch::Contains("--grad-sync sync"));
  fs::remove_all(root);
}

TEST_CASE("corrupt or foreign checkpoints are rejected naming the file, nothing overwritten",
          "[checkpoint][multirank]") {
  const std::string root = scratch("corrupt");
  const Layout two{2, "tp=2", false};
  save_on(two, root + "/good");
  const std::string dir = root + "/good/step-00000001";
  const auto pristine = snapshot(root);
  auto expect_rejected = [&](const std::string& path, const std::string& what) {
    INFO("expecting: " << what);
    const auto before = snapshot(root);
    CHECK_THROWS_WITH(load_on(two, path), Catch::Contains(what));
    // A run resuming from it with --save on the same root writes nothing either.
    TrainConfig c = base_cfg();
    c.mesh = "tp=2";
    c.steps = 3;
    c.checkpoint.resume = path;
    c.checkpoint.save = root + "/good";
    CHECK_THROWS(run_train(2, c));
    CHECK(snapshot(root) == before);
  };
  const std::string r0 = dir + "/rank-00000.safetensors", r1 = dir + "/rank-00001.safetensors";
  const std::string f0 = slurp(r0), f1 = slurp(r1), index = slurp(dir + "/index.json");

  spit(r0, f0.substr(0, f0.size() - 10));
  expect_rejected(root + "/good", "rank-00000.safetensors is " + std::to_string(f0.size() - 10) +
                                      " bytes but the index says");
  spit(r0, f0);

  std::string flipped = f1;
  flipped[flipped.size() / 2] ^= 0x10;
  spit(r1, flipped);
  expect_rejected(root + "/good", "rank-00001.safetensors");
  CHECK_THROWS_WITH(load_on({1, "dp=1", false}, dir), Catch::Contains("fails its checksum"));
  spit(r1, f1);
  // A byte of the header changed: named by the checksum too, on every mesh (not as the header
  // error a rank that reads the file without verifying it would meet first).
  std::string header = f0;
  header[header.find("__metadata__") + 11] = 'X';
  spit(r0, header);
  CHECK_THROWS_WITH(load_on({2, "dp=2", false}, dir),
                    Catch::Contains("rank-00000.safetensors fails its checksum"));
  CHECK_THROWS_WITH(load_on({1, "dp=1", false}, dir), Catch::Contains("fails its checksum"));
  spit(r0, f0);

  fs::remove(r1);
  expect_rejected(dir, "rank-00001.safetensors (listed in");
  spit(r1, f1);

  auto idx = nlohmann::json::parse(index);
  idx["tensors"]["embed.weight"]["shape"] = {131, 32};
  spit(dir + "/index.json", idx.dump());
  expect_rejected(dir, "'embed.weight' has shape [131, 32] but the model's is [130, 32]");
  idx = nlohmann::json::parse(index);
  for (auto& [k, v] : idx["tensors"].items())
    if (k.find("exp_avg_sq") != std::string::npos) {
      idx["tensors"].erase(k);
      break;
    }
  spit(dir + "/index.json", idx.dump());
  expect_rejected(dir, "has no tensor");
  spit(dir + "/index.json", index);

  fs::remove(r0);
  fs::create_symlink("/dev/zero", r0);
  expect_rejected(dir, "rank-00000.safetensors is not a regular file");
  fs::remove(r0);
  spit(r0, f0);
  CHECK(snapshot(root) == pristine);
  CHECK_NOTHROW(load_on(two, root + "/good"));

  // Directories from other tools.
  fs::create_directories(root + "/hf");
  spit(root + "/hf/index.json", R"({"metadata": {}, "weight_map": {"w": "model.safetensors"}})");
  expect_rejected(root + "/hf", "hf/index.json is not a meshrt checkpoint index");
  fs::create_directories(root + "/other");
  spit(root + "/other/model.safetensors", f0);
  expect_rejected(root + "/other", "not a meshrt checkpoint (no 'latest' pointer");
  spit(root + "/other/latest", "../../etc\n");
  expect_rejected(root + "/other", "does not name a checkpoint");
  fs::remove_all(root);
}

TEST_CASE("a rank failing mid-write leaves the previous checkpoint and latest loadable",
          "[checkpoint][multirank]") {
  const std::string root = scratch("crash");
  const Layout two{2, "tp=2", false};
  Full ref = save_on(two, root, 1);
  ::setenv("MESHRT_CHECKPOINT_FAULT", "rank=1,mode=throw", 1);
  CHECK_THROWS_WITH(save_on(two, root, 2), Catch::Contains("injected fault on rank 1") ||
                                               Catch::Contains("rank 1 failed"));
  ::unsetenv("MESHRT_CHECKPOINT_FAULT");
  CHECK_FALSE(fs::exists(root + "/step-00000002"));
  CHECK(slurp(root + "/latest") == "step-00000001\n");
  require_bit_identical(load_on(two, root), ref);
  require_bit_identical(load_on({4, "tp=4", false}, root), ref);
  fs::remove_all(root);
}

TEST_CASE("save targets must be directories that can be created and temporary names are unique",
          "[checkpoint][multirank]") {
  const std::string root = scratch("paths");
  spit(root + "/file", "x");
  CHECK_THROWS_WITH(prepare_checkpoint_root(root + "/file"),
                    Catch::Contains("file: exists and is not a directory (a regular file)"));
  CHECK_THROWS_WITH(prepare_checkpoint_root("/dev/null"), Catch::Contains("a device node"));
  CHECK_THROWS_WITH(prepare_checkpoint_root(root + "/file/sub"),
                    Catch::Contains("cannot create the directory"));
  prepare_checkpoint_root(root + "/a/b");
  CHECK(fs::is_directory(root + "/a/b"));
  // What a save would replace but meshrt did not write: refused up front, left as it was.
  spit(root + "/a/b/latest", "user notes\n");
  CHECK_THROWS_WITH(prepare_checkpoint_root(root + "/a/b"),
                    Catch::Contains("latest is not a checkpoint pointer meshrt wrote"));
  CHECK(slurp(root + "/a/b/latest") == "user notes\n");
  spit(root + "/a/b/latest", "step-00000003\n");
  spit(root + "/a/b/step-00000003", "a file");
  CHECK_THROWS_WITH(prepare_checkpoint_root(root + "/a/b"),
                    Catch::Contains("step-00000003 is not a checkpoint folder"));
  fs::remove(root + "/a/b/step-00000003");
  fs::create_directory_symlink(root + "/a", root + "/a/b/step-00000003");
  CHECK_THROWS_WITH(prepare_checkpoint_root(root + "/a/b"),
                    Catch::Contains("step-00000003 is not a checkpoint folder"));
  fs::remove(root + "/a/b/step-00000003");
  fs::create_directory(root + "/a/b/step-00000003");
  prepare_checkpoint_root(root + "/a/b");  // a pointer and its folder, as a save leaves them
  Full ref = save_on({2, "dp=2", false}, root + "/ck", 1);
  require_bit_identical(load_on({1, "dp=1", false}, root + "/ck"), ref);
  // --keep 1 leaves only the newest.
  save_on({2, "dp=2", false}, root + "/ck", 2, /*keep=*/1);
  CHECK_FALSE(fs::exists(root + "/ck/step-00000001"));
  CHECK(fs::exists(root + "/ck/step-00000002/index.json"));
  fs::remove_all(root);
}

namespace {

// The names directly in `dir`, sorted.
std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> v;
  for (auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

TEST_CASE("a --save folder of another run is refused unless resumed or --overwrite",
          "[checkpoint][train][multirank]") {
  const std::string root = scratch("reuse");
  TrainConfig a = train_cfg("dp=2", 10);
  a.checkpoint.save = root;
  a.checkpoint.save_every = 5;
  run_train(2, a);
  REQUIRE(fs::exists(root + "/step-00000005/index.json"));
  const auto before = snapshot(root);
  // A fresh run into it: refused before any step, nothing touched.
  TrainConfig b = train_cfg("dp=2", 3);
  b.checkpoint.save = root;
  b.checkpoint.keep = 2;
  CHECK_THROWS_WITH(run_train(2, b),
                    Catch::Contains("--save " + root +
                                    " holds checkpoints of another run (step-00000005, "
                                    "step-00000010): continue that run with --resume " +
                                    root + ", or pass --overwrite"));
  CHECK(snapshot(root) == before);
  // --overwrite: this run's checkpoints go there, --keep prunes only its own.
  fs::create_directories(root + "/step-00000002");
  spit(root + "/step-00000002/notes.txt", "mine");
  b.checkpoint.overwrite = true;
  b.checkpoint.save_every = 1;
  REQUIRE(run_train(2, b).size() == 3);
  CHECK(slurp(root + "/latest") == "step-00000003\n");
  CHECK(names_in(root) == std::vector<std::string>{".meshrt-lock", "latest", "step-00000002",
                                                   "step-00000003", "step-00000005",
                                                   "step-00000010"});
  CHECK(slurp(root + "/step-00000005/index.json") == before.at(root + "/step-00000005/index.json"));
  // Steps 2 and 3 are this run's newest two (its step 1 was pruned); step 2 replaced the user's
  // directory of that name and took its file over.
  CHECK(fs::exists(root + "/step-00000002/index.json"));
  CHECK(slurp(root + "/step-00000002/notes.txt") == "mine");  // kept through the replacement
  // Resuming continues the folder; --keep 1 then removes only this lineage's older files, and a
  // directory holding a user's file stays (without its index).
  TrainConfig c = train_cfg("dp=2", 4);
  c.checkpoint.save = root;
  c.checkpoint.resume = root;
  c.checkpoint.keep = 1;
  REQUIRE(run_train(2, c).size() == 1);
  CHECK(names_in(root + "/step-00000002") == std::vector<std::string>{"notes.txt"});
  CHECK_FALSE(fs::exists(root + "/step-00000003"));
  CHECK(fs::exists(root + "/step-00000004/index.json"));
  CHECK(fs::exists(root + "/step-00000010/index.json"));
  CHECK(slurp(root + "/latest") == "step-00000004\n");
  // --overwrite without --save says so.
  TrainConfig d = train_cfg("dp=2", 4);
  d.checkpoint.overwrite = true;
  CHECK_THROWS_WITH(validate_train(d, 2), Catch::Contains("--overwrite goes with --save DIR"));
  fs::remove_all(root);
}

TEST_CASE("a second job on a --save folder is refused, and a killed holder leaves no lock",
          "[checkpoint][multirank]") {
  const std::string root = scratch("lock");
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto lock = lock_checkpoint_root(root);
    (void)!::write(ready[1], "x", 1);
    while (true) ::pause();
  }
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  const std::string holder = "locked by pid " + std::to_string(child) + " on host ";
  CHECK_THROWS_WITH(save_on({2, "dp=2", false}, root, 1),
                    Catch::Contains("--save " + root +
                                    ": another job is writing checkpoints "
                                    "there (" +
                                    root + "/.meshrt-lock is " + holder));
  CHECK_THROWS_WITH(lock_checkpoint_root(root), Catch::Contains(holder));
  CHECK_FALSE(fs::exists(root + "/step-00000001"));
  ::kill(child, SIGKILL);
  int st = 0;
  ::waitpid(child, &st, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  Full ref = save_on({2, "dp=2", false}, root, 1);
  require_bit_identical(load_on({1, "dp=1", false}, root), ref);
  fs::remove_all(root);
}

TEST_CASE("temporaries of killed saves are removed, only under meshrt's names",
          "[checkpoint][multirank]") {
  const std::string root = scratch("stale");
  save_on({2, "dp=2", false}, root, 1);
  // What kill -9 during saves leaves: temporary directories (with a rank file, a rank file's
  // temporary), a pointer's temporary, and step 1 moved aside before its replacement arrived.
  const std::string t1 = root + "/.tmp-step-00000002-AbC123",
                    t2 = root + "/.tmp-step-00000003-x9Y8z7";
  fs::create_directories(t1);
  fs::create_directories(t2);
  spit(t1 + "/rank-00000.safetensors", "partial");
  spit(t1 + "/.rank-00001.safetensors.tmp-77-0-0badf00d", "partial");
  spit(t2 + "/rank-00000.safetensors", "partial");
  spit(t2 + "/user.txt", "not meshrt's");
  spit(root + "/.latest-QwErTy", "step-00000002\n");
  fs::rename(root + "/step-00000001", root + "/.old-step-00000001-ZZZZZZ");
  spit(root + "/.tmp-notes", "a user's file with a similar name");
  const Full ref = save_on({2, "dp=2", false}, root, 5);
  CHECK(names_in(root) == std::vector<std::string>{".meshrt-lock", ".tmp-notes",
                                                   ".tmp-step-00000003-x9Y8z7", "latest",
                                                   "step-00000001", "step-00000005"});
  CHECK(names_in(t2) == std::vector<std::string>{"user.txt"});
  CHECK(fs::exists(root + "/step-00000001/index.json"));  // moved back
  require_bit_identical(load_on({1, "dp=1", false}, root), ref);
  fs::remove_all(root);
}

TEST_CASE("a checkpoint holding NaN or infinity is refused at load naming the file and tensor",
          "[checkpoint][multirank]") {
  const std::string root = scratch("nonfinite");
  // A run whose weights had diverged saved them: rank 1's shard of the embedding holds a NaN and
  // an infinity (tp=2 shards it, so rank 1's file holds them).
  run_ranks(2, [&](int r, Communicator& w, Context& ctx) {
    Rig rig(ctx, w, {2, "tp=2", false}, small_model());
    rig.step();
    ctx.synchronize();
    for (Param* p : rig.model.params())
      if (p->name == "embed.weight" && r == 1) {
        p->value.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
        p->value.data<float>()[5] = std::numeric_limits<float>::infinity();
      }
    save_checkpoint(root, meta_at(1), rig.mesh, rig.model.params(), &rig.opt, 0);
  });
  const std::string dir = root + "/step-00000001";
  const std::string want = dir +
                           "/rank-00001.safetensors holds non-finite values (NaN or infinity) in "
                           "tensor 'embed.weight': it was saved from a run whose weights had "
                           "diverged";
  // Read whole by one rank, by the rank holding the shard, and resharded across ranks.
  for (const Layout& l :
       {Layout{1, "dp=1", false}, Layout{2, "tp=2", false}, Layout{4, "tp=4", false}}) {
    INFO(l.str());
    CHECK_THROWS_WITH(load_on(l, dir), Catch::Contains(want));
  }
  fs::remove_all(root);

  // Finite but huge weights load; the first step after the resume overflows, and the error says
  // so instead of blaming --lr alone.
  run_ranks(2, [&](int, Communicator& w, Context& ctx) {
    Rig rig(ctx, w, {2, "tp=2", false}, small_model());
    ctx.synchronize();
    for (Param* p : rig.model.params())
      if (p->name == "embed.weight")
        for (int64_t i = 0; i < p->value.numel(); ++i) p->value.data<float>()[i] = 3e38f;
    save_checkpoint(root, meta_at(1), rig.mesh, rig.model.params(), &rig.opt, 0);
  });
  TrainConfig cfg = base_cfg();
  cfg.mesh = "tp=2";
  cfg.steps = 3;
  cfg.checkpoint.resume = root;
  CHECK_THROWS_WITH(meshrt::test::train_losses(2, cfg),
                    Catch::Contains("step 2: the loss is not finite") &&
                        Catch::Contains("it is the first step after --resume " + root +
                                        ", whose weights loaded finite") &&
                        !Catch::Contains("pass --skip-nonfinite"));
  fs::remove_all(root);
}

TEST_CASE("a save's temporary names are described once: what a save names them is read back",
          "[checkpoint]") {
  using detail::CheckpointTemporary;
  struct Case {
    CheckpointTemporary kind;
    std::string step, name;
  };
  const std::vector<Case> cases = {
      {CheckpointTemporary::Save, "step-00000012", ".tmp-step-00000012-AbC123"},
      {CheckpointTemporary::Replaced, "step-00000012", ".old-step-00000012-AbC123"},
      {CheckpointTemporary::Latest, "", ".latest-AbC123"}};
  for (const Case& c : cases) {
    INFO(c.name);
    CHECK(detail::checkpoint_temporary_name(c.kind, c.step, "AbC123") == c.name);
    CheckpointTemporary kind{};
    std::string step = "unchanged";
    REQUIRE(detail::parse_checkpoint_temporary(c.name, &kind, &step));
    CHECK(kind == c.kind);
    CHECK(step == c.step);
    // The folder check counts every one of them as meshrt's.
    CHECK(checkpoint_entry_name(c.name));
  }
  // Names that only start like one: kept for meshrt in the folder, but not its temporaries (the
  // clean-up of killed jobs' leftovers never removes them).
  for (const std::string n : {".tmp-notes", ".old-step-x-AbC123", ".latest-AbC12",
                              ".tmp-step-00000012AbC123", ".old-step-00000012-"}) {
    INFO(n);
    CheckpointTemporary kind{};
    std::string step;
    CHECK_FALSE(detail::parse_checkpoint_temporary(n, &kind, &step));
    CHECK(checkpoint_entry_name(n));
  }
  for (const std::string n : {"tmp-step-00000012-AbC123", "notes.txt", ".latest"}) {
    INFO(n);
    CHECK_FALSE(checkpoint_entry_name(n));
  }
  CHECK_THROWS_WITH(detail::checkpoint_temporary_name(CheckpointTemporary::Save, "step-1", "ab"),
                    Catch::Contains("'ab' is not 6 characters"));
}

TEST_CASE("index fields of a wrong type or out of range are refused naming the file and the field",
          "[checkpoint]") {
  const std::string root = scratch("numbers");
  save_on({1, "dp=1", false}, root, 1);
  const std::string ip = root + "/step-00000001/index.json";
  const auto good = nlohmann::json::parse(slurp(ip));
  // The message of reading the index with field `ptr` set to `v` (null: removed); the index is
  // read before any rank file is opened.
  auto with = [&](const std::string& ptr, const nlohmann::json& v) {
    auto j = good;
    const nlohmann::json::json_pointer p(ptr);
    if (v.is_null())
      j[p.parent_pointer()].erase(p.back());
    else
      j[p] = v;
    spit(ip, j.dump());
    try {
      read_checkpoint_meta(root, meta_at(0));
    } catch (const Error& e) {
      return e.message();
    }
    return std::string();
  };
  const std::string at = "checkpoint: " + ip + ": ";
  CHECK(with("/step", 1e20) == at + "field 'step' is 1e+20, not an integer in [0, 2147483647]");
  CHECK(with("/step", -3) == at + "field 'step' is -3, not an integer in [0, 2147483647]");
  CHECK(with("/step", nullptr) ==
        at + "field 'step' is missing; give an integer in [0, 2147483647]");
  CHECK(with("/data/seed", "9") ==
        at + "field 'data.seed' is \"9\", not an integer in [0, 18446744073709551615]");
  CHECK(with("/data", 9) == at + "field 'data' is 9, not an object");
  CHECK(with("/optimizer/step", 2.5) ==
        at + "field 'optimizer.step' is 2.5, not an integer in [0, 9223372036854775807]");
  CHECK(with("/world_size", 0) == at + "field 'world_size' is 0, not an integer in [1, 1048576]");
  CHECK(with("/world_size", -2) == at + "field 'world_size' is -2, not an integer in [1, 1048576]");
  CHECK(with("/world_size", "1") ==
        at + "field 'world_size' is \"1\", not an integer in [1, 1048576]");
  CHECK(with("/world_size", 2) == at + "field 'files' lists 1 files but field 'world_size' is 2 "
                                       "(one file per rank): the index is not meshrt's or was "
                                       "edited");
  CHECK(with("/checksum", "md5") == at + "field 'checksum' is \"md5\", not \"crc32c\" (the only "
                                         "checksum this meshrt verifies; written by another "
                                         "tool?)");
  CHECK(with("/checksum", nullptr) == at + "field 'checksum' is missing; give a string");
  CHECK(with("/mesh", 1) == at + "field 'mesh' is 1, not a string");
  CHECK(with("/run", false) == at + "field 'run' is false, not a string");
  CHECK(with("/skipped_steps", -1) ==
        at + "field 'skipped_steps' is -1, not an integer in [0, 2147483647]");
  CHECK(with("/config/seq", 8) == at + "field 'config.seq' is 8, not a string");
  CHECK(with("/files/rank-00000.safetensors/bytes", "big") ==
        at + "file 'rank-00000.safetensors': field 'bytes' is \"big\", not an integer in [0, "
             "18446744073709551615]");
  CHECK(with("/files/rank-00000.safetensors/crc32c", 7) ==
        at + "file 'rank-00000.safetensors': field 'crc32c' is 7, not a string");
  CHECK(with("/tensors/embed.weight/dtype", nullptr) ==
        at + "tensor 'embed.weight': field 'dtype' is missing; give a string");
  CHECK(with("/tensors/embed.weight/shape", "130x32") ==
        at + "tensor 'embed.weight' shape: not an array of at most 8 extents");
  CHECK(with("/tensors/embed.weight/shards/0/file", 0) ==
        at + "tensor 'embed.weight': shard 0: field 'file' is 0, not a string");
  CHECK(with("/tensors/embed.weight/shards", 1) ==
        at + "tensor 'embed.weight': field 'shards' is 1, not an array");
  CHECK(with("/tensors", nlohmann::json::array()) == at + "field 'tensors' is [], not an object");
  spit(ip, good.dump());
  CHECK(read_checkpoint_meta(root, meta_at(0)).step == 1);
  // A --resume of the run stops at the index, before it loads anything or writes a step.
  spit(ip, [&] {
    auto j = good;
    j["world_size"] = 0;
    return j.dump();
  }());
  TrainConfig c = base_cfg();
  c.steps = 2;
  c.checkpoint.resume = root;
  c.checkpoint.save = root;
  CHECK_THROWS_WITH(run_train(1, c), Catch::Contains(at + "field 'world_size' is 0"));
  CHECK_FALSE(fs::exists(root + "/step-00000002"));
  fs::remove_all(root);
}

TEST_CASE("every rank's error names what another rank rejected", "[checkpoint][multirank]") {
  const std::string root = scratch("remote-error");
  const Layout two{2, "tp=2", false};
  save_on(two, root, 1);
  // Rank 1 checks rank-00001's checksum; rank 0 (whose error run_ranks reports) must say why.
  const std::string f1 = root + "/step-00000001/rank-00001.safetensors";
  std::string bytes = slurp(f1);
  bytes[bytes.size() / 2] ^= 0x10;
  spit(f1, bytes);
  std::string rank0;
  run_ranks(2, [&](int r, Communicator& w, Context& ctx) {
    Rig rig(ctx, w, two, small_model(77));
    try {
      load_checkpoint(root, meta_at(0), rig.mesh, rig.model.params(), &rig.opt);
    } catch (const Error& e) {
      if (r == 0) rank0 = e.what();
    }
  });
  CHECK_THAT(rank0, Catch::Contains("checkpoint: rank 1 rejected the checkpoint " + root +
                                    "/step-00000001: " + f1 + " fails its checksum"));
  fs::remove_all(root);
}
