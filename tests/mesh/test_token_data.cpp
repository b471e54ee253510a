// Token files (raw, llm.c, .npy) read the tokens written; bad files fail naming the file and the
// fix; every mesh trains on the same global batches; validation losses, non-finite steps (stop or
// skip) and a stop requested by one rank end every rank at the same step.
#include <unistd.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <set>

#include "harness.h"
#include "tests/common/files.h"
#include "train/token_data.h"
#include "train/train.h"
#include "train/train_guard.h"

using namespace meshrt;
using namespace meshrt::test;
namespace fs = std::filesystem;

namespace {

fs::path scratch() {
  static const fs::path d = scratch_dir("tokens");
  return d;
}

fs::path write_file(const std::string& name, const std::string& bytes) {
  fs::path p = scratch() / name;
  std::ofstream(p, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return p;
}

template <typename T>
std::string raw_bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// A .npy v1 file as numpy.save writes it (header padded so the data starts at a multiple of 64).
std::string npy(const std::string& descr, const std::string& order, const std::string& shape,
                const std::string& data) {
  std::string dict =
      "{'descr': '" + descr + "', 'fortran_order': " + order + ", 'shape': " + shape + ", }";
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string h = "\x93NUMPY";
  h += '\x01';
  h += '\x00';
  const auto len = static_cast<uint16_t>(dict.size());
  h += static_cast<char>(len & 0xff);
  h += static_cast<char>(len >> 8);
  return h + dict + data;
}

// Byte-level text tokens: the data a user makes from a text file.
std::vector<uint16_t> text_tokens(int64_t n) {
  const std::string text =
      "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. ";
  std::vector<uint16_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<unsigned char>(text[i % text.size()]));
  return t;
}

ModelConfig byte_model() { return test::small_model_config(32, 4, 64, 2, 256, 5, 0.f); }

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("raw, llm.c and .npy token files read the tokens written", "[data][unit]") {
  std::vector<uint16_t> t16 = {1, 2, 3, 65535, 7};
  std::vector<uint32_t> t32 = {1, 2, 3, 70000, 7};
  auto f16 = TokenFile::open(write_file("a.bin", raw_bytes(t16)), TokenDType::U16);
  REQUIRE(f16->size() == 5);
  CHECK(f16->token(3) == 65535);
  CHECK(f16->max_token() == 65535);
  auto f32 = TokenFile::open(write_file("b.bin", raw_bytes(t32)), TokenDType::U32);
  REQUIRE(f32->size() == 5);
  CHECK(f32->token(3) == 70000);
  // llm.c: 256 int32 of header (magic, version 2 = u32, count), then the tokens.
  std::vector<int32_t> hdr(256, 0);
  hdr[0] = 20240520;
  hdr[1] = 2;
  hdr[2] = 5;
  auto fl = TokenFile::open(write_file("c.bin", raw_bytes(hdr) + raw_bytes(t32)), TokenDType::U16);
  CHECK(fl->format() == "llm.c u32");
  REQUIRE(fl->size() == 5);
  CHECK(fl->token(3) == 70000);
  auto fn = TokenFile::open(write_file("d.npy", npy("<u2", "False", "(5,)", raw_bytes(t16))),
                            TokenDType::U32);
  REQUIRE(fn->size() == 5);
  for (int64_t i = 0; i < 5; ++i) CHECK(fn->token(i) == t16[static_cast<size_t>(i)]);
  std::vector<int64_t> t64 = {4, 5, 6, 7};
  auto f64 = TokenFile::open(write_file("e.npy", npy("<i8", "False", "(2, 2)", raw_bytes(t64))),
                             TokenDType::U16);
  REQUIRE(f64->size() == 4);
  CHECK(f64->token(3) == 7);
}

TEST_CASE("bad token files fail naming the file and what to change", "[data][unit]") {
  auto open16 = [](const fs::path& p) {
    return error_of([&] { TokenFile::open(p.string(), TokenDType::U16); });
  };
  std::vector<uint16_t> t = {1, 2, 3, 4};
  CHECK_THAT(open16(scratch() / "missing.bin"),
             Catch::Contains("missing.bin: cannot open") && Catch::Contains("No such file"));
  CHECK_THAT(open16(write_file("empty.bin", "")), Catch::Contains("empty.bin is empty"));
  CHECK_THAT(
      error_of([&] { TokenFile::open(write_file("odd.bin", "abcde").string(), TokenDType::U32); }),
      Catch::Contains("5 bytes is not a whole number of raw u32 tokens") &&
          Catch::Contains("--data-dtype"));
  CHECK_THAT(open16(write_file("magic.npy", raw_bytes(t))),
             Catch::Contains("magic.npy: not a NumPy .npy file (bad magic)"));
  CHECK_THAT(open16(write_file("f.npy", npy("<u2", "True", "(4,)", raw_bytes(t)))),
             Catch::Contains("f.npy: the array is in Fortran order") &&
                 Catch::Contains("ascontiguousarray"));
  CHECK_THAT(open16(write_file("g.npy", npy("<f4", "False", "(2,)", raw_bytes(t)))),
             Catch::Contains("g.npy: dtype '<f4' is not an integer type") &&
                 Catch::Contains("numpy.uint16"));
  CHECK_THAT(open16(write_file("h.npy", npy(">u2", "False", "(4,)", raw_bytes(t)))),
             Catch::Contains("is big-endian"));
  CHECK_THAT(open16(write_file("i.npy", npy("<u2", "False", "(9,)", raw_bytes(t)))),
             Catch::Contains("i.npy: truncated: the .npy header says 9 tokens, the file holds 4"));
  std::vector<int16_t> neg = {1, -3};
  // Found by fuzzing: a shape whose element count overflows int64, no shape tuple, a dtype size
  // atoi would overflow on.
  CHECK_THAT(open16(write_file("k.npy", npy("<u2", "False", "(4294967296, 4294967296, 8)", ""))),
             Catch::Contains("too large .npy shape"));
  CHECK_THAT(open16(write_file("l.npy", npy("<u2", "False", "", raw_bytes(t)))),
             Catch::Contains("malformed .npy shape ''"));
  CHECK_THAT(
      open16(write_file("m.npy", npy("<u99999999999999999999", "False", "(4,)", raw_bytes(t)))),
      Catch::Contains("unknown .npy dtype"));
  CHECK_THAT(open16(write_file("j.npy", npy("<i2", "False", "(2,)", raw_bytes(neg)))),
             Catch::Contains("token -3 at position 1 is negative"));

  // Vocabulary and length: checked per run in O(1) (the load found the largest token).
  std::vector<uint16_t> big = {1, 2, 300, 4, 999, 5};
  auto f = TokenFile::open(write_file("big.bin", raw_bytes(big)), TokenDType::U16);
  CHECK(f->max_token() == 999);
  CHECK_THAT(error_of([&] { f->check(256, 2); }),
             Catch::Contains("big.bin: token 300 at position 2 is >= --vocab 256") &&
                 Catch::Contains("raise --vocab to at least 1000"));
  CHECK_NOTHROW(f->check(1000, 5));
  // The same 16-bit tokens read as u32: pairs past 65535, and the error says which flag to fix.
  auto f32 = TokenFile::open(write_file("big16.bin", raw_bytes(big)), TokenDType::U32);
  CHECK(f32->max_token() == 5 * 65536 + 999);
  CHECK_THAT(error_of([&] { f32->check(1000, 2); }),
             Catch::Contains("token 131073 at position 0") &&
                 Catch::Contains("read it with --data-dtype u16"));
  CHECK_THAT(error_of([&] { f->check(256, 2); }), !Catch::Contains("--data-dtype"));
  CHECK_THAT(error_of([&] { f->check(1000, 6); }),
             Catch::Contains("big.bin holds 6 tokens and one sample needs --seq + 1 = 7"));
  // Ids past any vocabulary (2^31 - 1 and up): the error says the file is not token ids as
  // read, not to raise --vocab past what a model can hold.
  const int64_t i32max = std::numeric_limits<int32_t>::max();
  std::vector<int64_t> huge = {3, std::numeric_limits<int64_t>::max(), i32max};
  auto fi = TokenFile::open(write_file("huge.npy", npy("<i8", "False", "(3,)", raw_bytes(huge))),
                            TokenDType::U16);
  const std::string e64 = error_of([&] { fi->check(50257, 2); });
  CHECK_THAT(e64, Catch::Contains("token 9223372036854775807 at position 1 is >= --vocab 50257") &&
                      Catch::Contains("past any vocabulary (at most 2147483647 ids)") &&
                      Catch::Contains("does not hold token ids as read (.npy <i8)") &&
                      !Catch::Contains("raise --vocab"));
  std::vector<uint32_t> at_edge = {7, static_cast<uint32_t>(i32max)};
  auto fe = TokenFile::open(write_file("edge.bin", raw_bytes(at_edge)), TokenDType::U32);
  CHECK_THAT(
      error_of([&] { fe->check(100, 1); }),
      Catch::Contains("past any vocabulary") && Catch::Contains("--data-dtype (u16 or u32)"));
  std::vector<uint32_t> below = {7, static_cast<uint32_t>(i32max - 1)};
  auto fb = TokenFile::open(write_file("below.bin", raw_bytes(below)), TokenDType::U32);
  CHECK_THAT(error_of([&] { fb->check(100, 1); }),
             Catch::Contains("raise --vocab to at least 2147483647"));
  TrainConfig c;
  c.model = byte_model();
  c.data = f;
  c.seq = 2;
  CHECK_THAT(error_of([&] { validate_train(c, 1); }), Catch::Contains("token 300 at position 2"));
  c.model.vocab = 1000;
  c.eval_every = 2;
  CHECK_THAT(error_of([&] { validate_train(c, 1); }), Catch::Contains("needs --val-data"));
}

TEST_CASE("a token batch is windows of the file, keyed by the global sample index only",
          "[data][unit]") {
  std::vector<uint16_t> t(1000);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>(i);
  auto f = TokenFile::open(write_file("seq.bin", raw_bytes(t)), TokenDType::U16);
  Context ctx(Device::cpu(0));
  Tensor ids, tg, ids_a, tg_a, ids_b, tg_b;
  const int64_t seq = 16;
  make_token_batch(ctx, *f, 7, kTrainTokenStream, 40, 8, seq, &ids, &tg);
  // Two dp ranks' halves of the same global batch are its columns.
  make_token_batch(ctx, *f, 7, kTrainTokenStream, 40, 4, seq, &ids_a, &tg_a);
  make_token_batch(ctx, *f, 7, kTrainTokenStream, 44, 4, seq, &ids_b, &tg_b);
  std::set<int64_t> starts;
  for (int64_t j = 0; j < 8; ++j) {
    const int64_t s = static_cast<int64_t>(ids.item(j));
    starts.insert(s);
    for (int64_t k = 0; k < seq; ++k) {
      REQUIRE(ids.item(k * 8 + j) == s + k);  // a contiguous window of the file
      REQUIRE(tg.item(k * 8 + j) == s + k + 1);
      const Tensor& half = j < 4 ? ids_a : ids_b;
      REQUIRE(half.item(k * 4 + j % 4) == ids.item(k * 8 + j));
    }
    REQUIRE(s + seq < 1000);
  }
  CHECK(starts.size() == 8);  // distinct draws
  // Another seed or stream draws other windows.
  make_token_batch(ctx, *f, 8, kTrainTokenStream, 40, 8, seq, &ids_a, &tg_a);
  make_token_batch(ctx, *f, 7, kValTokenStream, 40, 8, seq, &ids_b, &tg_b);
  CHECK(ids_a.item(0) != ids.item(0));
  CHECK(ids_b.item(0) != ids.item(0));
}

TEST_CASE("a token file truncated or rewritten during a run is an error, not a crash",
          "[data][unit]") {
  std::vector<uint16_t> t(4096);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>(i % 500);
  const fs::path p = write_file("shrinks.bin", raw_bytes(t));
  auto f = TokenFile::open(p.string(), TokenDType::U16);
  REQUIRE(f->max_token() == 499);
  Context ctx(Device::cpu(0));
  Tensor ids, tg;
  const int64_t seq = 64;
  make_token_batch(ctx, *f, 7, kTrainTokenStream, 0, 16, seq, &ids, &tg);
  for (int64_t k = 0; k < seq; ++k)
    REQUIRE(tg.item(k * 16) == std::fmod(ids.item(k * 16) + 1, 500.));
  // Rewritten in place with a token past the range the open found: it would index past the
  // embedding table. Every window of 65 tokens among these 16 draws holds one of them.
  std::vector<uint16_t> big(t.size(), 60000);
  {
    std::fstream out(p, std::ios::binary | std::ios::in | std::ios::out);
    out.write(reinterpret_cast<const char*>(big.data()),
              static_cast<std::streamsize>(big.size() * 2));
  }
  CHECK_THAT(
      error_of([&] { make_token_batch(ctx, *f, 7, kTrainTokenStream, 0, 16, seq, &ids, &tg); }),
      Catch::Contains("shrinks.bin: token 60000 at position") &&
          Catch::Contains("is outside 0..499") && Catch::Contains("it was rewritten"));
  CHECK_THAT(error_of([&] { f->check(400, seq); }), Catch::Contains("token 60000 at position 0"));
  // Truncated: what the mapped file raised as SIGBUS is an error naming the bytes.
  fs::resize_file(p, 100);
  CHECK_THAT(
      error_of([&] { make_token_batch(ctx, *f, 7, kTrainTokenStream, 0, 16, seq, &ids, &tg); }),
      Catch::Contains("shrinks.bin: tokens") &&
          Catch::Contains("are no longer in the file: it had 8192 bytes") &&
          Catch::Contains("truncated since"));
  CHECK_THAT(error_of([&] { f->token(4000); }), Catch::Contains("no longer in the file"));
  CHECK_THAT(error_of([&] { f->token(4096); }),
             Catch::Contains("token 4096 asked for, the file holds 4096"));
  // A file renamed over the path does not change what the open file reads.
  auto g = TokenFile::open(write_file("renamed.bin", raw_bytes(t)).string(), TokenDType::U16);
  fs::rename(write_file("other.bin", raw_bytes(big)), scratch() / "renamed.bin");
  CHECK(g->token(3) == 3);
  CHECK_NOTHROW(make_token_batch(ctx, *g, 7, kTrainTokenStream, 0, 16, seq, &ids, &tg));
}

namespace {

struct Curve {
  std::vector<double> loss, val;
  std::vector<bool> skipped;
};

Curve run_curve(int world, const std::string& mesh, const std::function<void(TrainConfig&)>& edit,
                std::function<bool(int)> stop_at_rank = {}) {
  static auto train_file = TokenFile::open(
      write_file("train.bin", raw_bytes(text_tokens(4000))).string(), TokenDType::U16);
  static auto val_file = TokenFile::open(
      write_file("val.bin", raw_bytes(text_tokens(1000))).string(), TokenDType::U16);
  Curve out;
  std::mutex mu;
  std::vector<size_t> steps(static_cast<size_t>(world));
  run_ranks(world, [&](int r, Communicator& w, Context& ctx) {
    TrainConfig cfg;
    cfg.model = byte_model();
    cfg.mesh = mesh;
    cfg.batch = 8;
    cfg.seq = 16;
    cfg.steps = 6;
    cfg.optim.lr = 3e-3f;
    cfg.data = train_file;
    cfg.val_data = val_file;
    cfg.eval_every = 3;
    cfg.eval_batches = 2;
    int polls = 0;
    if (stop_at_rank) cfg.stop_requested = [&] { return stop_at_rank(r) && ++polls >= 3; };
    edit(cfg);
    auto st = train(cfg, ctx, w, nullptr);
    std::lock_guard<std::mutex> lk(mu);
    steps[static_cast<size_t>(r)] = st.size();
    if (r != 0) return;
    for (auto& s : st) {
      out.loss.push_back(s.loss);
      out.val.push_back(s.val_loss);
      out.skipped.push_back(s.skipped);
    }
  });
  // Every rank ran as many steps.
  for (size_t n : steps) REQUIRE(n == out.loss.size());
  return out;
}

}  // namespace

TEST_CASE("every mesh trains on the same global batches of a token file",
          "[data][train][multirank]") {
  auto ref = run_curve(1, "dp=1", [](TrainConfig&) {});
  REQUIRE(ref.loss.size() == 6);
  CHECK(ref.loss.back() < ref.loss.front());
  // Validation after steps 3 and 6 only, and it learns.
  for (size_t i = 0; i < 6; ++i) CHECK(std::isnan(ref.val[i]) == (i != 2 && i != 5));
  CHECK(ref.val[5] < ref.val[2]);
  for (auto [w, m] : std::vector<std::pair<int, std::string>>{
           {2, "dp=2"}, {2, "tp=2"}, {4, "dp=2,tp=2"}, {4, "dp=4"}}) {
    INFO("mesh " << m);
    auto got = run_curve(w, m, [](TrainConfig&) {});
    CHECK(rel_err(got.loss, ref.loss) < 1e-4);
    CHECK(std::abs(got.val[2] - ref.val[2]) < 1e-4 * ref.val[2]);
    CHECK(std::abs(got.val[5] - ref.val[5]) < 1e-4 * ref.val[5]);
  }
  // The data matters: the synthetic walk gives another curve.
  auto synth = run_curve(1, "dp=1", [](TrainConfig& c) {
    c.data = nullptr;
    c.val_data = nullptr;
    c.eval_every = 0;
  });
  CHECK(synth.loss[0] != ref.loss[0]);
}

TEST_CASE("a non-finite loss stops every rank naming the step and the first bad gradient",
          "[data][train][multirank]") {
  std::string msg;
  try {
    run_curve(2, "dp=2", [](TrainConfig& c) { c.optim.lr = 1e30f; });
  } catch (const NonFiniteError& e) {
    msg = e.message();
  }
  CHECK_THAT(msg, Catch::StartsWith("step 2: the loss is not finite and the gradient of ") &&
                      Catch::Contains("is not finite (the first such parameter)") &&
                      Catch::Contains("--skip-nonfinite"));
  // The same on a tp mesh, where each rank holds a shard of the gradients.
  msg.clear();
  try {
    run_curve(4, "dp=2,tp=2", [](TrainConfig& c) { c.optim.lr = 1e30f; });
  } catch (const NonFiniteError& e) {
    msg = e.message();
  }
  CHECK_THAT(msg, Catch::StartsWith("step 2: the loss is not finite"));
  // Skipped instead: counted, and a skipped step changes nothing (the loss stays what the broken
  // weights give: NaN at every later step, never a finite value from a NaN update).
  auto skip = run_curve(2, "dp=2", [](TrainConfig& c) {
    c.optim.lr = 1e30f;
    c.skip_nonfinite = true;
    c.val_data = nullptr;
    c.eval_every = 0;
  });
  REQUIRE(skip.loss.size() == 6);
  CHECK(std::isfinite(skip.loss[0]));
  CHECK_FALSE(skip.skipped[0]);
  for (size_t i = 1; i < 6; ++i) CHECK(skip.skipped[i]);
}

TEST_CASE("a stop requested on one rank ends every rank after the same step",
          "[data][train][multirank]") {
  for (int world : {2, 4}) {
    INFO("world " << world);
    // Only the last rank asks, at its third poll: every rank runs exactly 3 steps.
    auto c = run_curve(
        world, "dp=" + std::to_string(world), [](TrainConfig&) {},
        [world](int r) { return r == world - 1; });
    CHECK(c.loss.size() == 3);
    // A stop is not a reason to evaluate: the last step's validation would have been step 6.
    CHECK(std::isnan(c.val.back()));
  }
  auto full = run_curve(2, "dp=2", [](TrainConfig&) {});
  auto part = run_curve(
      2, "dp=2", [](TrainConfig&) {}, [](int r) { return r == 0; });
  REQUIRE(part.loss.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(part.loss[i] == full.loss[i]);
}

TEST_CASE("the memory estimate counts weights, states and activations", "[data][train][unit]") {
  TrainConfig c;
  c.model.block.hidden = 4096;
  c.model.block.heads = 32;
  c.model.block.ffn = 4 * 4096;
  c.model.layers = 4;
  // The run: 4 layers of hidden 4096 on cpu:2 (dp=2), AdamW. About 0.8 G parameters.
  TrainMemory m = estimate_train_memory(c, 2);
  const double p = 4.0 * (4 * 4096.0 * 4096 + 2 * 4096.0 * 16384) + 2 * 512 * 4096.0;
  CHECK(m.weights == Approx(4 * p).epsilon(0.01));
  CHECK(m.grads == Approx(4 * p).epsilon(0.01));
  CHECK(m.optimizer == Approx(8 * p).epsilon(0.01));
  CHECK(2 * m.total() > 23e9);
  // tp shards the weights; SGD keeps one state; micro-batches shrink the activations.
  c.mesh = "tp=2";
  CHECK(estimate_train_memory(c, 2).weights == Approx(m.weights / 2).epsilon(0.01));
  c.optim.kind = OptimizerKind::Sgd;
  CHECK(estimate_train_memory(c, 2).optimizer == Approx(m.optimizer / 4).epsilon(0.01));
  c.mesh = "";
  c.micro_batches = 4;
  CHECK(estimate_train_memory(c, 2).activations == Approx(m.activations / 4).epsilon(0.01));
}

TEST_CASE("document boundaries from the end-of-text token", "[data][unit][docmask]") {
  // A document ends with (and includes) its end-of-text token; one at the window's end starts
  // nothing.
  const std::vector<int64_t> w = {5, 9, 1, 9, 9, 2};
  CHECK(document_starts(w.data(), 6, 9) == std::vector<int64_t>{0, 2, 4, 5});
  CHECK(document_ids(w.data(), 6, 9) == std::vector<int32_t>{0, 0, 1, 1, 2, 3});
  CHECK(document_starts(w.data(), 2, 9) == std::vector<int64_t>{0});
  CHECK(document_ids(w.data(), 6, 7) == std::vector<int32_t>(6, 0));
  // The id: explicit (present in the file), or the format's (llm.c u16: GPT-2's 50256).
  const std::vector<uint16_t> raw = {3, 50256, 4, 9, 4};
  auto f = TokenFile::open(write_file("eot.bin", raw_bytes(raw)), TokenDType::U16);
  CHECK(f->end_of_text(9) == 9);
  CHECK(error_of([&] { f->end_of_text(7); }) ==
        "--data " + (scratch() / "eot.bin").string() +
            ": the end-of-text token 7 never occurs in the file (5 tokens, the largest 50256), so "
            "it would hold one document; give the id that ends its documents");
  CHECK_THAT(error_of([&] { f->end_of_text(-1); }),
             Catch::Contains("(raw u16) has no end-of-text token of its own (only llm.c's u16 "
                             "files do: 50256); give the id that ends each document"));
  std::vector<int32_t> hdr(256, 0);
  hdr[0] = 20240520;
  hdr[1] = 1;
  hdr[2] = 5;
  auto fl =
      TokenFile::open(write_file("eot-llmc.bin", raw_bytes(hdr) + raw_bytes(raw)), TokenDType::U32);
  CHECK(fl->end_of_text(-1) == 50256);
}
