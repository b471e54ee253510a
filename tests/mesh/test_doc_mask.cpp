// Packed documents (train --doc-mask): attention stays inside each document. A doc-masked model's
// loss and gradients are those of each document run on its own; training at any cp (both
// exchanges, with tp and dp) gives the cp=1 doc-masked loss curve on documents of odd lengths
// crossing the chunk boundaries, with the balanced layout; --deterministic keeps its bits.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "dist/context_parallel.h"
#include "model/model.h"
#include "runtime/error.h"
#include "tests/common/files.h"
#include "tests/mesh/harness.h"
#include "train/token_data.h"
#include "train/train.h"

using namespace meshrt;
using meshrt::test::rel_err;

namespace {

constexpr int64_t kVocab = 64;
constexpr int64_t kEot = 0;

ModelConfig doc_model() { return test::small_model_config(32, 4, 64, 2, kVocab); }

// ids [seq, n] and targets (ids shifted by one, the last from `next`) on the host.
void host_batch(Context& ctx, const std::vector<std::vector<int64_t>>& rows, Tensor* ids,
                Tensor* targets) {
  const auto n = static_cast<int64_t>(rows.size()), seq = static_cast<int64_t>(rows[0].size()) - 1;
  *ids = Tensor::empty({seq, n}, DType::i64, ctx.host_allocator());
  *targets = Tensor::empty({seq, n}, DType::i64, ctx.host_allocator());
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < seq; ++i) {
      ids->data<int64_t>()[i * n + j] = rows[static_cast<size_t>(j)][static_cast<size_t>(i)];
      targets->data<int64_t>()[i * n + j] =
          rows[static_cast<size_t>(j)][static_cast<size_t>(i + 1)];
    }
}

using Grads = std::map<std::string, std::vector<double>>;

double value(Context& ctx, const Tensor& loss) {
  Tensor h = loss.to(ctx.host_allocator(), ctx.compute_stream());
  ctx.synchronize();
  return h.item(0);
}

Grads grads_of(Context& ctx, DecoderModel& model) {
  Grads g;
  for (Param* p : model.params()) {
    Tensor h = p->grad.to(ctx.host_allocator(), ctx.compute_stream());
    ctx.synchronize();
    for (int64_t i = 0; i < h.numel(); ++i) g[p->name].push_back(h.item(i));
  }
  return g;
}

void zero_grads(Context& ctx, DecoderModel& model) {
  for (Param* p : model.params()) p->grad.fill_(0.0, ctx.compute_stream());
}

// A raw u16 token file of packed documents of 1 to 13 tokens (odd and even lengths), each
// ending with kEot, the other tokens in [1, kVocab).
std::string packed_token_file() {
  const std::string path = (test::scratch_dir("doc-mask-tokens") / "docs.u16").string();
  std::vector<uint16_t> t;
  uint32_t x = 12345;
  auto next = [&x] { return (x = x * 1103515245u + 12345u) >> 16; };
  while (t.size() < 4096) {
    const uint32_t len = 1 + next() % 13;
    for (uint32_t i = 0; i + 1 < len; ++i) t.push_back(static_cast<uint16_t>(1 + next() % 63));
    t.push_back(static_cast<uint16_t>(kEot));
  }
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * 2));
  return path;
}

TrainConfig doc_cfg(const std::string& mesh, const std::shared_ptr<const TokenFile>& file) {
  TrainConfig c;
  c.model = doc_model();
  c.model.layers = 1;
  c.mesh = mesh;
  c.batch = 4;
  c.seq = 16;
  c.steps = 20;
  c.optim.lr = 3e-3f;
  c.data = file;
  c.doc_eot = kEot;
  return c;
}

constexpr double kDocTol = 1e-5;  // as the cp train tests: f32 sums in another order

}  // namespace

TEST_CASE("a doc-masked model's loss and gradients are its documents' own", "[docmask][unit]") {
  // Two sequences of 24 tokens (+ the last target): the first packs documents of 5, 1, 11 and 7
  // tokens (each ending with kEot), the second is one document.
  std::vector<std::vector<int64_t>> rows(2);
  int64_t t = 7;
  for (int64_t len : {5, 1, 11, 7, 1}) {  // the last "document" is the final target
    for (int64_t i = 0; i + 1 < len; ++i) rows[0].push_back(1 + (t = (t * 13 + 5) % 63));
    rows[0].push_back(kEot);
  }
  for (int64_t i = 0; i < 25; ++i) rows[1].push_back(1 + (t = (t * 17 + 3) % 63));
  REQUIRE(rows[0].size() == 25);
  test::run_ranks(1, [&](int, Communicator& world, Context& ctx) {
    DeviceMesh mesh(ctx, world, "dp=1");
    CommScheduler tp(mesh, kTpDim, Overlap::Async);
    DecoderModel model(mesh, tp, {}, doc_model());
    Tensor ids, targets;
    host_batch(ctx, rows, &ids, &targets);
    const int64_t tokens = ids.numel();
    // Packed, doc-masked.
    model.set_documents(packed_documents(ctx, ids, kEot, 1));
    zero_grads(ctx, model);
    const double packed = value(ctx, model.forward(ids, targets));
    model.backward(1.f, nullptr);
    const Grads g_packed = grads_of(ctx, model);
    // Each document alone (no mask needed), weighted by its tokens.
    model.set_documents(nullptr);
    zero_grads(ctx, model);
    double sum = 0;
    int docs = 0;
    for (const auto& row : rows) {
      size_t a = 0;
      for (size_t i = 0; i + 1 < row.size(); ++i) {
        if (row[i] != kEot && i + 2 < row.size()) continue;
        Tensor di, dt;
        host_batch(ctx, {std::vector<int64_t>(row.begin() + a, row.begin() + i + 2)}, &di, &dt);
        const auto len = static_cast<double>(di.numel());
        sum += len * value(ctx, model.forward(di, dt));
        model.backward(static_cast<float>(len / static_cast<double>(tokens)), nullptr);
        a = i + 1;
        ++docs;
      }
    }
    REQUIRE(docs == 5);
    const Grads g_docs = grads_of(ctx, model);
    CHECK(std::fabs(packed - sum / static_cast<double>(tokens)) < 1e-5 * std::fabs(packed));
    for (const auto& [name, g] : g_packed) {
      INFO(name);
      CHECK(rel_err(g, g_docs.at(name)) < 1e-4);
    }
    // The mask matters: without it the packed loss differs.
    model.set_documents(nullptr);
    const double unmasked = value(ctx, model.forward(ids, targets));
    CHECK(std::fabs(unmasked - packed) > 1e-3);
  });
}

TEST_CASE("packed documents: ids per row, and a balanced cp layout for the batch",
          "[docmask][unit]") {
  test::run_ranks(1, [&](int, Communicator&, Context& ctx) {
    // seq 8, two rows: documents [0, 5) [5, 8) and [0, 2) [2, 8).
    Tensor ids, targets;
    host_batch(ctx, {{1, 2, 3, 4, kEot, 5, 6, 7, 9}, {1, kEot, 2, 3, 4, 5, 6, 7, 9}}, &ids,
               &targets);
    auto one = packed_documents(ctx, ids, kEot, 1);
    REQUIRE((one->ids.size(0) == 2 && one->ids.size(1) == 8));
    const int32_t* d = one->device_ids.data<int32_t>();
    CHECK(std::vector<int32_t>(d, d + 16) ==
          std::vector<int32_t>{0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1});
    // cp=2: chunk works {3, 7, 6, 5} + {3, 3, 7, 11} = {6, 10, 13, 16}; balanced pairs the
    // lightest with the heaviest: {0, 3} and {1, 2} (the standard pairing, here), 22 and 23.
    auto two = packed_documents(ctx, ids, kEot, 2);
    CHECK(two->layout.chunks(0) == std::vector<int64_t>{0, 3});
    CHECK(two->layout.chunks(1) == std::vector<int64_t>{1, 2});
    // One row with its heavy work in the middle: documents [0, 4) [4, 6) [6, 7) [7, 8), chunk
    // works {3, 7, 3, 2}. Standard: {0, 3} 5 and {1, 2} 10; balanced: {0, 2} 6 and {1, 3} 9.
    host_batch(ctx, {{1, 2, 3, kEot, 1, kEot, kEot, 5, 9}}, &ids, &targets);
    const std::vector<int64_t> work{3, 7, 3, 2};
    REQUIRE(cp_chunk_work(8, 2, {0, 4, 6, 7}) == work);
    auto mid = packed_documents(ctx, ids, kEot, 2);
    CHECK(mid->layout.chunks(0) == std::vector<int64_t>{0, 2});
    CHECK(mid->layout.chunks(1) == std::vector<int64_t>{1, 3});
    CHECK(cp_imbalance(cp_rank_work(mid->layout, work)) == Approx(9.0 / 7.5));
    CHECK(cp_imbalance(cp_rank_work(CpLayout::make(8, 2), work)) == Approx(10.0 / 7.5));
    REQUIRE_THROWS_WITH(packed_documents(ctx, ids, kEot, 3),
                        Catch::Contains("not divisible by 2 x cp = 6"));
  });
}

TEST_CASE("train --doc-mask at cp 2 and 4 gives the cp=1 doc-masked loss curve",
          "[docmask][cp][train][multirank]") {
  const auto file = TokenFile::open(packed_token_file(), TokenDType::U16);
  REQUIRE(file->end_of_text(kEot) == kEot);
  // The run's batches (cp=2: dp=1, 4 sequences a step) do not all keep the standard pairing: the
  // balanced layout is exercised.
  int moved = 0;
  test::run_ranks(1, [&](int, Communicator&, Context& ctx) {
    for (int step = 0; step < 20; ++step) {
      Tensor ids, targets;
      make_token_batch(ctx, *file, 1, kTrainTokenStream, step * 4, 4, 16, &ids, &targets);
      moved +=
          packed_documents(ctx, ids, kEot, 2)->layout.chunks(0) != CpLayout::make(16, 2).chunks(0);
    }
  });
  CHECK(moved > 0);
  // Each step reports the balance the loader reached (rank 0's replica): never worse than the
  // standard layout's, better where the layout moved.
  const std::vector<StepStats> stats = test::train_stats(2, doc_cfg("cp=2", file));
  REQUIRE(stats.size() == 20);
  int better = 0;
  for (const StepStats& st : stats) {
    CHECK(st.cp_imbalance >= 1.0);
    CHECK(st.cp_imbalance <= st.cp_standard_imbalance);
    better += st.cp_imbalance < st.cp_standard_imbalance;
  }
  CHECK(better == moved);
  const auto ref = test::train_losses(1, doc_cfg("dp=1", file));
  REQUIRE(ref.size() == 20);
  REQUIRE(ref.back() < ref.front());  // it learns
  TrainConfig unmasked = doc_cfg("dp=1", file);
  unmasked.doc_eot = -1;
  CHECK(rel_err(test::train_losses(1, unmasked), ref) > 1e-3);  // the mask changes the run
  struct Layout {
    int world;
    std::string mesh;
    bool sp;
    int chunks;  // per cp rank
  };
  for (CpComm how : {CpComm::Ring, CpComm::AllGather})
    for (const Layout& l : std::vector<Layout>{{2, "cp=2", false, 2},
                                               {4, "cp=4", false, 2},
                                               {4, "cp=2,tp=2", true, 2},
                                               {4, "dp=2,cp=2", false, 2},
                                               {2, "cp=2", false, 4},
                                               {4, "cp=4", false, 4}}) {
      INFO("mesh " << l.mesh << (l.sp ? " --sp" : "") << " --cp-comm " << cp_comm_name(how)
                   << " --cp-chunks " << l.chunks);
      TrainConfig c = doc_cfg(l.mesh, file);
      c.model.block.cp_comm = how;
      c.tp.sequence_parallel = l.sp;
      c.cp_chunks = l.chunks;
      CHECK(rel_err(test::train_losses(l.world, c), ref) < kDocTol);
    }
}

TEST_CASE("train --doc-mask --deterministic gives the same bits on dp 1 and 2",
          "[docmask][train]") {
  const auto file = TokenFile::open(packed_token_file(), TokenDType::U16);
  auto run = [&](int world, const std::string& mesh) {
    TrainConfig c = doc_cfg(mesh, file);
    c.steps = 6;
    c.deterministic = true;
    c.digest_steps = {6};
    std::vector<double> out;
    const std::vector<StepStats> st = test::train_stats(world, c);
    for (const StepStats& s : st) out.push_back(s.loss);
    if (!st.empty()) out.push_back(static_cast<double>(st.back().state_digest));
    return out;
  };
  const auto one = run(1, "dp=1");
  REQUIRE(one.size() == 7);
  CHECK(run(2, "dp=2") == one);
}

TEST_CASE("train refuses a --doc-mask token outside the vocabulary and bad --cp-chunks",
          "[docmask][train][unit]") {
  TrainConfig c = doc_cfg("dp=1", nullptr);
  c.doc_eot = kVocab;
  REQUIRE_THROWS_WITH(validate_train(c, 1),
                      Catch::Contains("--doc-mask's end-of-text token 64 is >= --vocab 64"));
  c = doc_cfg("dp=1", nullptr);
  c.cp_chunks = 4;
  REQUIRE_THROWS_WITH(validate_train(c, 1),
                      Catch::Contains("--cp-chunks 4 sets the chunks per cp rank of --doc-mask's "
                                      "balanced layout; it needs --doc-mask and a mesh with cp > 1 "
                                      "(--mesh dp=1)"));
  c = doc_cfg("cp=2", nullptr);
  c.cp_chunks = 3;
  REQUIRE_THROWS_WITH(validate_train(c, 2),
                      Catch::Contains("--cp-chunks 3 with --seq 16: context parallelism: 3 chunks "
                                      "per rank: it must be an even number"));
  c.cp_chunks = 6;
  REQUIRE_THROWS_WITH(validate_train(c, 2),
                      Catch::Contains("sequence length 16 is not divisible by 6 x cp = 12"));
  c.cp_chunks = 8;
  REQUIRE_NOTHROW(validate_train(c, 2));
}
