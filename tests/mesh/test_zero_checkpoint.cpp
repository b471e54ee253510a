// ZeRO checkpoints saved per dp shard (index version 2, docs/zero.md "## Checkpoints"): no dp
// all-gather in the save, one file per rank of about 1/dp of the state, resharded loads onto other
// dp, tp and stages, the gathered format (version 1) still resuming, and corrupt or missing files
// named in the error.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "runtime/safetensors.h"
#include "tests/mesh/harness.h"
#include "train/checkpoint.h"
#include "train/train.h"
#include "train/train_checkpoint.h"

using namespace meshrt;
using meshrt::test::rel_err;
using meshrt::test::run_ranks;
namespace fs = std::filesystem;

namespace {

// Sizes that dp = 2, 3 and 4 do not divide: ffn 74, vocab 61, biases of 36 and 74.
TrainConfig zc_cfg(const std::string& mesh, int zero, int steps = 6) {
  TrainConfig cfg;
  cfg.model.block.hidden = 36;
  cfg.model.block.heads = 6;
  cfg.model.block.ffn = 74;
  cfg.model.block.init_std = 0.1f;
  cfg.model.block.param_noise = 0.1f;
  cfg.model.block.seed = 5;
  cfg.model.layers = 2;
  cfg.model.vocab = 61;
  cfg.mesh = mesh;
  cfg.batch = 12;  // divides by dp = 1, 2, 3 and 4
  cfg.seq = 16;
  cfg.steps = steps;
  cfg.optim.lr = 3e-3f;
  cfg.dp.zero = zero;
  cfg.dp.bucket_mb = 0.01;  // several buckets of uneven sizes
  return cfg;
}

int zc_world(const std::string& mesh) {
  int w = 1;
  for (const auto& d : parse_mesh_spec(mesh)) w *= d.size;
  return w;
}

std::vector<double> zc_losses(const TrainConfig& cfg) {
  return meshrt::test::train_losses(zc_world(cfg.mesh), cfg);
}

std::string zc_scratch(const std::string& name) {
  fs::path p =
      fs::temp_directory_path() / ("meshrt_zckpt_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

nlohmann::json zc_index(const std::string& dir) {
  std::ifstream f(dir + "/index.json");
  return nlohmann::json::parse(f);
}

// Saves steps 1-3 of `from` under `root`; returns the uninterrupted run's steps 4-6.
std::vector<double> zc_save_head(const TrainConfig& from, const std::string& root) {
  const auto full = zc_losses(from);
  REQUIRE(full.size() == 6);
  TrainConfig first = from;
  first.steps = 3;
  first.checkpoint.save = root;
  const auto head = zc_losses(first);
  REQUIRE(head == std::vector<double>(full.begin(), full.begin() + 3));
  return {full.begin() + 3, full.end()};
}

std::vector<double> zc_resume(const std::string& mesh, int zero, const std::string& root) {
  TrainConfig r = zc_cfg(mesh, zero);
  r.checkpoint.resume = root;
  return zc_losses(r);
}

}  // namespace

TEST_CASE("a ZeRO checkpoint holding NaN in a state shard is refused at load naming the file",
          "[zero][checkpoint][multirank]") {
  const std::string root = zc_scratch("nonfinite");
  run_ranks(2, [&](int r, Communicator& w, Context& ctx) {
    DeviceMesh mesh(ctx, w, "dp=2");
    CommScheduler tp(mesh, kTpDim, Overlap::None);
    const TrainConfig cfg = zc_cfg("dp=2", 1);
    DecoderModel model(mesh, tp, {}, cfg.model);
    GradSync sync(mesh, model.params(), cfg.dp, 1);
    sync.broadcast_params();
    Optimizer opt(mesh, model.params(), cfg.optim, &sync);
    ctx.synchronize();
    // Rank 1's shard of bucket 0's first moment: a diverged run's optimizer state.
    if (r == 1) opt.shard_state(0, 0).data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
    CheckpointMeta meta = train_checkpoint_meta(cfg, 1);
    meta.run = "nonfinite";
    save_checkpoint(root, meta, mesh, model.params(), &opt, 0);
  });
  REQUIRE(zc_index(root + "/step-00000001")["version"] == 2);
  // Onto the same layout, and resharded onto one rank without ZeRO.
  for (const auto& [mesh, zero] : {std::pair<std::string, int>{"dp=2", 1}, {"dp=1", 0}}) {
    INFO(mesh << " zero " << zero);
    CHECK_THROWS_WITH(zc_resume(mesh, zero, root),
                      Catch::Contains("rank-00001.safetensors holds non-finite values (NaN or "
                                      "infinity) in tensor '") &&
                          Catch::Contains(".exp_avg'"));
  }
  fs::remove_all(root);
}

TEST_CASE("a ZeRO save gathers nothing over dp", "[zero][checkpoint][multirank]") {
  for (int zero : {1, 3}) {
    const std::string root = zc_scratch("nogather" + std::to_string(zero));
    run_ranks(2, [&](int, Communicator& w, Context& ctx) {
      DeviceMesh mesh(ctx, w, "dp=2");
      CommScheduler tp(mesh, kTpDim, Overlap::None);
      const TrainConfig cfg = zc_cfg("dp=2", zero);
      DecoderModel model(mesh, tp, {}, cfg.model);
      GradSync sync(mesh, model.params(), cfg.dp, 1,
                    zero == 3 ? model.pieces() : std::vector<std::vector<Param*>>());
      sync.broadcast_params();
      sync.shard_params();
      Optimizer opt(mesh, model.params(), cfg.optim, &sync);
      RANK_REQUIRE(checkpoint_saves_shards(mesh, &opt));
      CheckpointMeta meta = train_checkpoint_meta(cfg, 1);
      meta.run = "nogather";
      sync.scheduler().reset_times();
      save_checkpoint(root, meta, mesh, model.params(), &opt, 0);
      const CommTimes t = sync.scheduler().times();
      RANK_REQUIRE(t.all_gather_bytes == 0);
      RANK_REQUIRE(t.count == 0);
      // The counter sees the all-gathers the gathered format needs.
      opt.gather_state();
      opt.scatter_state();
      RANK_REQUIRE(sync.scheduler().times().all_gather_bytes > 0);
    });
    CHECK(zc_index(root + "/step-00000001")["version"] == 2);
    fs::remove_all(root);
  }
}

TEST_CASE("a ZeRO checkpoint is one file per dp rank of about 1/dp of the state, padded",
          "[zero][checkpoint][train][multirank]") {
  const std::string root = zc_scratch("files");
  TrainConfig c = zc_cfg("dp=3", 2, 1);
  c.checkpoint.save = root;
  zc_losses(c);
  const std::string dir = root + "/step-00000001";
  const auto idx = zc_index(dir);
  REQUIRE(idx["version"] == 2);
  const auto& z = idx["zero"];
  CHECK(z["stage"] == 2);
  CHECK(z["dp"] == 3);
  CHECK(z["tp"] == 1);
  CHECK(z["state"] == nlohmann::json({"exp_avg", "exp_avg_sq"}));
  const auto& tp0 = z["tp_ranks"][0];
  REQUIRE(tp0["files"] == nlohmann::json({"rank-00000.safetensors", "rank-00001.safetensors",
                                          "rank-00002.safetensors"}));
  // Every bucket padded to a multiple of 3, some with padding; each file holds its shard of each.
  int64_t numel = 0, padded = 0;
  bool some_padding = false;
  for (const auto& b : tp0["buckets"]) {
    CHECK(b["shard"].get<int64_t>() * 3 == b["padded"].get<int64_t>());
    numel += b["numel"].get<int64_t>();
    padded += b["padded"].get<int64_t>();
    some_padding |= b["padded"] != b["numel"];
  }
  CHECK(some_padding);
  CHECK(padded - numel < 3 * static_cast<int64_t>(tp0["buckets"].size()));
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.path().extension() == ".safetensors";
  CHECK(files == 3);
  for (int r = 0; r < 3; ++r) {
    const std::string f = "rank-0000" + std::to_string(r) + ".safetensors";
    SafetensorsReader rd(dir + "/" + f);
    int64_t elems = 0;
    for (const auto& e : rd.entries())
      if (e.name != "optimizer.step") elems += e.shape.numel();
    CHECK(elems == padded / 3 * 3);  // parameters, exp_avg and exp_avg_sq: a third each
    CHECK(rd.file_size() == idx["files"][f]["bytes"].get<uint64_t>());
    CHECK(rd.file_size() < static_cast<uint64_t>(padded / 3 * 3 * 4 + 16384));
  }
  // Resharded onto other dp sizes and stages, and the same layout bit for bit.
  fs::remove_all(root);
  const std::string root2 = zc_scratch("pad");
  const auto tail = zc_save_head(zc_cfg("dp=3", 2), root2);
  CHECK(zc_resume("dp=3", 2, root2) == tail);
  CHECK(rel_err(zc_resume("dp=2", 1, root2), tail) < 1e-5);
  CHECK(rel_err(zc_resume("dp=4", 3, root2), tail) < 1e-5);
  CHECK(rel_err(zc_resume("dp=1", 0, root2), tail) < 1e-5);
  fs::remove_all(root2);
}

TEST_CASE("a ZeRO checkpoint on dp=2 x tp=2 reshards onto other tp and dp sizes",
          "[zero][checkpoint][train][multirank]") {
  const std::string root = zc_scratch("tp");
  const auto tail = zc_save_head(zc_cfg("dp=2,tp=2", 2), root);
  CHECK(zc_index(root + "/step-00000003")["version"] == 2);
  CHECK(zc_resume("dp=2,tp=2", 2, root) == tail);
  CHECK(rel_err(zc_resume("dp=4", 1, root), tail) < 1e-5);
  CHECK(rel_err(zc_resume("dp=1,tp=2", 3, root), tail) < 1e-5);
  CHECK(rel_err(zc_resume("dp=3", 0, root), tail) < 1e-5);
  fs::remove_all(root);
}

TEST_CASE("a gathered-format ZeRO checkpoint still resumes onto ZeRO layouts",
          "[zero][checkpoint][train][multirank]") {
  // zero 0, and zero 1 on dp = 1, write whole tensors (version 1).
  for (const auto& [mesh, zero] :
       std::vector<std::pair<std::string, int>>{{"dp=2", 0}, {"dp=1", 1}}) {
    INFO("saved on " << mesh << " --zero " << zero);
    const std::string root = zc_scratch("v1");
    const auto tail = zc_save_head(zc_cfg(mesh, zero), root);
    CHECK(zc_index(root + "/step-00000003")["version"] == 1);
    CHECK(zc_resume(mesh, zero, root) == tail);
    CHECK(rel_err(zc_resume("dp=2", 1, root), tail) < 1e-5);
    CHECK(rel_err(zc_resume("dp=2,tp=2", 2, root), tail) < 1e-5);
    CHECK(rel_err(zc_resume("dp=4", 3, root), tail) < 1e-5);
    fs::remove_all(root);
  }
}

TEST_CASE("a corrupt or missing ZeRO shard file is named, and a rank reads only its own",
          "[zero][checkpoint][train][multirank]") {
  const std::string root = zc_scratch("bad");
  TrainConfig c = zc_cfg("dp=2", 2, 2);
  c.checkpoint.save = root;
  zc_losses(c);
  const std::string dir = root + "/step-00000002";
  const std::string f1 = dir + "/rank-00001.safetensors";
  const auto bytes = fs::file_size(f1);
  {
    std::fstream f(f1, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(bytes - 5));
    char ch = 0;
    f.read(&ch, 1);
    f.seekp(static_cast<std::streamoff>(bytes - 5));
    ch = static_cast<char>(ch ^ 0x40);
    f.write(&ch, 1);
  }
  TrainConfig r = zc_cfg("dp=2", 2, 4);
  r.checkpoint.resume = root;
  // Onto the same layout rank 0 reads only rank-00000: rank 1 alone finds the corruption.
  CHECK_THROWS_WITH(zc_losses(r), Catch::StartsWith("checkpoint: rank 1 rejected the checkpoint") &&
                                      Catch::Contains(f1 + " fails its checksum"));
  r = zc_cfg("dp=1", 0, 4);
  r.checkpoint.resume = root;
  CHECK_THROWS_WITH(zc_losses(r), Catch::Contains(f1 + " fails its checksum"));
  fs::remove(f1);
  r = zc_cfg("dp=2", 3, 4);
  r.checkpoint.resume = root;
  CHECK_THROWS_WITH(zc_losses(r),
                    Catch::Contains(f1 + " (listed in " + dir + "/index.json) is missing"));
  fs::remove_all(root);
}
