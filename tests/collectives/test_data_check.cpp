// The data check's verdict (collectives/data_check.h) on hand-made digests: the cases the
// multirank tests cannot reach by corrupting one rank's result.
#include <catch2/catch.hpp>

#include <bit>
#include <vector>

#include "collectives/data_check.h"

using namespace meshrt;
using namespace meshrt::detail;

namespace {

std::vector<int64_t> words_of(const std::vector<std::vector<float>>& blocks) {
  std::vector<int64_t> w;
  for (const auto& b : blocks) {
    BlockDigest d = digest_block(b.data(), DType::f32, static_cast<int64_t>(b.size()));
    w.push_back(static_cast<int64_t>(d.hash));
    w.push_back(static_cast<int64_t>(d.sum));
    w.push_back(static_cast<int64_t>(d.asum));
  }
  return w;
}

std::string label(int r) { return "rank " + std::to_string(r); }

CommCall call(CommOp op, ReduceOp redop, int64_t count) {
  CommCall c;
  c.op = op;
  c.redop = redop;
  c.count = count;
  c.seq = 5;
  return c;
}

}  // namespace

TEST_CASE("data check digest: hash covers every byte, sums in double", "[unit]") {
  std::vector<float> a{1.5f, -2.0f, 3.0f}, b = a;
  BlockDigest da = digest_block(a.data(), DType::f32, 3);
  b[2] = 3.0000002f;
  BlockDigest db = digest_block(b.data(), DType::f32, 3);
  CHECK(da.hash != db.hash);
  CHECK(std::bit_cast<double>(da.sum) == 2.5);
  CHECK(std::bit_cast<double>(da.asum) == 6.5);
  // Odd byte counts hash their tail.
  std::vector<uint8_t> x{1, 2, 3, 4, 5, 6, 7, 8, 9}, y = x;
  y[8] = 10;
  CHECK(digest_block(x.data(), DType::u8, 9).hash != digest_block(y.data(), DType::u8, 9).hash);
  CHECK(digest_block(x.data(), DType::u8, 9).sum == 45);
}

TEST_CASE("data check verdict: agreeing data passes, words are checked", "[unit]") {
  const CommCall c = call(CommOp::AllReduce, ReduceOp::Sum, 2);
  std::vector<int64_t> all;
  for (auto w : {words_of({{1, 2}, {4, 6}}), words_of({{3, 4}, {4, 6}})})
    all.insert(all.end(), w.begin(), w.end());
  CHECK(verify_data(c, 2, "world", all, label).culprits.empty());
  all.pop_back();
  CHECK_THROWS_WITH(verify_data(c, 2, "world", all, label),
                    Catch::Contains("11 words exchanged, expected 12"));
}

TEST_CASE("data check verdict: two ranks with max and no evidence name both", "[unit]") {
  // Both results are plausible maxima and neither rank holds a majority: no guess.
  const CommCall c = call(CommOp::AllReduce, ReduceOp::Max, 2);
  std::vector<int64_t> all;
  for (auto w : {words_of({{1, 2}, {3, 4}}), words_of({{3, 4}, {3, 5}})})
    all.insert(all.end(), w.begin(), w.end());
  DataVerdict v = verify_data(c, 2, "world", all, label);
  CHECK(v.culprits == std::vector<int>{0, 1});
  CHECK_THAT(v.message, Catch::Contains("no result is held by a majority"));
}

TEST_CASE("data check verdict: one sender wrong at every receiver is the culprit", "[unit]") {
  // all_gather on 3 ranks: rank 2's block arrives altered at ranks 0 and 1 (it sent data other
  // than what it digested).
  const CommCall c = call(CommOp::AllGather, ReduceOp::Sum, 1);
  const std::vector<float> in0{1}, in1{2}, in2{3}, bad{9};
  std::vector<int64_t> all;
  for (auto w : {words_of({in0, in0, in1, bad}), words_of({in1, in0, in1, bad}),
                 words_of({in2, in0, in1, in2})})
    all.insert(all.end(), w.begin(), w.end());
  DataVerdict v = verify_data(c, 3, "tp", all, label);
  CHECK(v.culprits == std::vector<int>{2});
  CHECK_THAT(v.message, Catch::Contains("all_gather(f32, count=1) on group 'tp' (seq 5)") &&
                            Catch::Contains("rank 2 sent data that arrived different"));
}

TEST_CASE("data check verdict: every rank equally wrong names them all", "[unit]") {
  // A contribution altered after its digest: every rank holds the same wrong sum.
  const CommCall c = call(CommOp::AllReduce, ReduceOp::Sum, 1);
  std::vector<int64_t> all;
  for (auto w : {words_of({{1}, {100}}), words_of({{2}, {100}})})
    all.insert(all.end(), w.begin(), w.end());
  DataVerdict v = verify_data(c, 2, "world", all, label);
  CHECK(v.culprits == std::vector<int>{0, 1});
  CHECK_THAT(v.message, Catch::Contains("every rank holds the same result"));
}
