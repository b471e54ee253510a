// Shape, dtype and device mismatches raise meshrt::Error naming the op and the tensors; ops a
// backend does not support fail naming the op, the dtype and the backend.
#include <cstdlib>
#include <set>
#include <string>

#include "helpers.h"
#include "kernels/backend.h"
#include "runtime/error.h"
#include "runtime/half.h"

using namespace kt;
using Catch::Matchers::Contains;
namespace ops = meshrt::ops;

namespace {
// A tensor claiming to live on cuda:0 (never dereferenced: validation rejects it first).
Tensor fake_cuda(const Shape& s, DType dt) {
  static float dummy[64];
  return Tensor::from_blob(dummy, s, dt, Device::cuda(0));
}
}  // namespace

TEST_CASE("gemm rejects mismatched shapes, dtypes, layouts and devices", "[errors]") {
  Host h;
  Tensor a = h.ctx.empty({4, 5}, DType::f32), b = h.ctx.empty({6, 3}, DType::f32);
  Tensor c = h.ctx.empty({4, 3}, DType::f32);
  REQUIRE_THROWS_AS(ops::gemm(h.ctx, h.s(), a, false, b, false, c), meshrt::Error);
  REQUIRE_THROWS_WITH(ops::gemm(h.ctx, h.s(), a, false, b, false, c),
                      Contains("op gemm") && Contains("inner dims differ") &&
                          Contains("f32[4, 5]") && Contains("f32[6, 3]"));
  Tensor b2 = h.ctx.empty({5, 3}, DType::f32), cbad = h.ctx.empty({4, 4}, DType::f32);
  REQUIRE_THROWS_WITH(ops::gemm(h.ctx, h.s(), a, false, b2, false, cbad),
                      Contains("op gemm") && Contains("c must be [4, 3]"));
  Tensor bh = h.ctx.empty({5, 3}, DType::bf16);
  REQUIRE_THROWS_WITH(ops::gemm(h.ctx, h.s(), a, false, bh, false, c),
                      Contains("op gemm") && Contains("dtype mismatch"));
  Tensor ah = h.ctx.empty({4, 5}, DType::bf16), ch = h.ctx.empty({4, 3}, DType::f16);
  REQUIRE_THROWS_WITH(ops::gemm(h.ctx, h.s(), ah, false, bh, false, ch),
                      Contains("op gemm") && Contains("must have a's dtype"));
  Tensor bias = h.ctx.empty({4}, DType::f32);
  REQUIRE_THROWS_WITH(ops::gemm(h.ctx, h.s(), a, false, b2, false, c, 1, 0, &bias),
                      Contains("op gemm") && Contains("bias") && Contains("[3]"));
  REQUIRE_THROWS_WITH(ops::gemm(h.ctx, h.s(), fake_cuda({4, 5}, DType::f32), false, b2, false, c),
                      Contains("op gemm") && Contains("cuda:0") && Contains("stream's device"));
  // A view that is neither row-major nor a 2-D transpose.
  Tensor big = h.ctx.empty({4, 10}, DType::f32);
  Tensor strided = big.slice(1, 0, 10, 2);  // [4, 5] with column stride 2
  REQUIRE_THROWS_WITH(ops::gemm(h.ctx, h.s(), strided, false, b2, false, c),
                      Contains("op gemm") && Contains("make it contiguous"));
  Tensor a3 = h.ctx.empty({2, 4, 5}, DType::f32), b3 = h.ctx.empty({3, 5, 3}, DType::f32);
  Tensor c3 = h.ctx.empty({2, 4, 3}, DType::f32);
  REQUIRE_THROWS_WITH(ops::gemm_strided_batched(h.ctx, h.s(), a3, false, b3, false, c3),
                      Contains("op gemm_strided_batched") && Contains("batch counts differ"));
}

TEST_CASE("elementwise and norm ops reject bad arguments, naming the op", "[errors]") {
  Host h;
  Tensor a = h.ctx.empty({3, 4}, DType::f32), b = h.ctx.empty({4, 3}, DType::f32);
  Tensor o = h.ctx.empty({3, 4}, DType::f32), oh = h.ctx.empty({3, 4}, DType::bf16);
  REQUIRE_THROWS_WITH(ops::add(h.ctx, h.s(), a, b, o),
                      Contains("op add") && Contains("shape mismatch") && Contains("f32[3, 4]") &&
                          Contains("f32[4, 3]"));
  REQUIRE_THROWS_WITH(ops::add(h.ctx, h.s(), a, a, oh),
                      Contains("op add") && Contains("dtype mismatch"));
  REQUIRE_THROWS_WITH(ops::scale(h.ctx, h.s(), a, fake_cuda({3, 4}, DType::f32), 2.f),
                      Contains("op scale") && Contains("cuda:0"));
  REQUIRE_THROWS_WITH(ops::cast(h.ctx, h.s(), a, h.ctx.empty({3, 4}, DType::i32)),
                      Contains("op cast") && Contains("f32, bf16 or f16"));
  REQUIRE_THROWS_WITH(ops::add(h.ctx, h.s(), a.transpose(0, 1), b, b),
                      Contains("op add") && Contains("contiguous"));
  Tensor bias = h.ctx.empty({3}, DType::f32);
  REQUIRE_THROWS_WITH(ops::bias_gelu_fwd(h.ctx, h.s(), a, &bias, o),
                      Contains("op bias_gelu_fwd") && Contains("bias") && Contains("[4]"));
  REQUIRE_THROWS_WITH(ops::dropout_fwd(h.ctx, h.s(), a, o, 1.0f, 1, 2),
                      Contains("op dropout_fwd") && Contains("[0, 1)"));
  Tensor g = h.ctx.empty({4}, DType::f32), mean = h.ctx.empty({3}, DType::f32);
  Tensor rstd2 = h.ctx.empty({2}, DType::f32);
  REQUIRE_THROWS_WITH(ops::layernorm_fwd(h.ctx, h.s(), a, g, nullptr, o, mean, rstd2),
                      Contains("op layernorm_fwd") && Contains("rstd") && Contains("3 elements"));
  REQUIRE_THROWS_WITH(ops::rmsnorm_fwd(h.ctx, h.s(), a, h.ctx.empty({4}, DType::bf16), o, mean),
                      Contains("op rmsnorm_fwd") && Contains("gamma"));
  REQUIRE_THROWS_WITH(ops::layernorm_bwd(h.ctx, h.s(), b, a, g, mean, mean, o, nullptr, nullptr),
                      Contains("op layernorm_bwd") && Contains("shape mismatch"));
  REQUIRE_THROWS_WITH(ops::softmax_rows_fwd(h.ctx, h.s(), a, b),
                      Contains("op softmax_rows_fwd") && Contains("shape mismatch"));
}

TEST_CASE("attention, embedding, cross-entropy and optimizers reject bad arguments", "[errors]") {
  Host h;
  Tensor q = h.ctx.empty({1, 2, 8, 4}, DType::f32), k = h.ctx.empty({1, 2, 6, 4}, DType::f32);
  Tensor lse = h.ctx.empty({1, 2, 8}, DType::f32), out = h.ctx.empty({1, 2, 8, 4}, DType::f32);
  REQUIRE_THROWS_WITH(
      ops::attention_fwd(h.ctx, h.s(), q, k, k, out, lse, 0.5f, true),
      Contains("op attention_fwd") && Contains("causal") && Contains("[1, 2, 6, 4]"));
  Tensor k3 = h.ctx.empty({1, 2, 8, 5}, DType::f32);
  REQUIRE_THROWS_WITH(ops::attention_fwd(h.ctx, h.s(), q, k3, k3, out, lse, 0.5f, false),
                      Contains("op attention_fwd") && Contains("k f32[1, 2, 8, 5]"));
  REQUIRE_THROWS_WITH(
      ops::attention_fwd(h.ctx, h.s(), q, q, q, out, h.ctx.empty({1, 2, 8}, DType::bf16), 0.5f),
      Contains("op attention_fwd") && Contains("lse") && Contains("f32"));

  Tensor ids = h.ctx.empty({5}, DType::f32), w = h.ctx.empty({10, 3}, DType::f32);
  REQUIRE_THROWS_WITH(ops::embedding_fwd(h.ctx, h.s(), ids, w, h.ctx.empty({5, 3}, DType::f32)),
                      Contains("op embedding_fwd") && Contains("i32 or i64"));
  Tensor idi = h.ctx.empty({5}, DType::i32);
  REQUIRE_THROWS_WITH(ops::embedding_fwd(h.ctx, h.s(), idi, w, h.ctx.empty({5, 4}, DType::f32)),
                      Contains("op embedding_fwd") && Contains("must be [5, 3]"));

  Tensor logits = h.ctx.empty({4, 7}, DType::f32), rm = h.ctx.empty({3}, DType::f32);
  REQUIRE_THROWS_WITH(ops::xent_row_max(h.ctx, h.s(), logits, rm),
                      Contains("op xent_row_max") && Contains("4 elements"));
  REQUIRE_THROWS_WITH(ops::xent_target_logit(h.ctx, h.s(), logits, h.ctx.empty({3}, DType::i64),
                                             h.ctx.empty({4}, DType::f32)),
                      Contains("op xent_target_logit") && Contains("targets"));

  std::vector<Tensor> p{h.ctx.empty({3}, DType::f32)}, gr{h.ctx.empty({4}, DType::f32)};
  std::vector<Tensor> m{h.ctx.empty({3}, DType::f32)}, v{h.ctx.empty({3}, DType::f32)};
  REQUIRE_THROWS_WITH(ops::adamw_update(h.ctx, h.s(), p, gr, m, v, {}),
                      Contains("op adamw_update") && Contains("grads[0]"));
  std::vector<Tensor> none;
  REQUIRE_THROWS_WITH(ops::sgd_momentum_update(h.ctx, h.s(), p, none, m, {}),
                      Contains("op sgd_momentum_update") && Contains("list lengths differ"));
}

TEST_CASE("an op refuses a stream of another device than its context", "[errors]") {
  Host h;
  Tensor a = h.ctx.empty({4}, DType::f32);
  // A stream whose device index differs from the context's device.
  auto s1 = meshrt::make_host_stream("other", 1);
  REQUIRE_THROWS_WITH(ops::add(h.ctx, *s1, a, a, a),
                      Contains("op add") && Contains("cpu:1") && Contains("context"));
}

namespace {
namespace k = meshrt::kernels;

// The host backend is the reference: every op for f32 / bf16 / f16, and fill for every dtype.
void check_complete(const k::OpTable& be) {
  std::set<std::string> names;
  for (int i = 0; i < k::kOpCount; ++i) {
    const auto op = static_cast<k::Op>(i);
    names.insert(k::op_name(op));
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      INFO(be.name << " " << k::op_name(op) << " " << meshrt::dtype_name(dt));
      CHECK(be.supports(op, dt));
    }
    INFO(be.name << " " << k::op_name(op) << " i32");
    CHECK(be.supports(op, DType::i32) == (op == k::Op::fill));
  }
  CHECK(names.size() == static_cast<size_t>(k::kOpCount));
  // The dtypes are the op table's (kernels/backend.h), bound without gaps.
  for (int i = 0; i < k::kOpCount; ++i) {
    INFO(be.name << " " << k::op_name(static_cast<k::Op>(i)));
    CHECK(be.dtypes[i].str() == k::table_dtypes(static_cast<k::Op>(i)).str());
  }
  CHECK(be.supports(k::Op::fill, DType::u8));
  CHECK(be.supports(k::Op::fill, DType::i64));
}
}  // namespace

TEST_CASE("the op table names the public ops and the host backend implements all of them",
          "[errors]") {
  CHECK(std::string(k::op_name(k::Op::gemm)) == "gemm");
  CHECK(std::string(k::op_name(k::Op::rmsnorm_bwd)) == "rmsnorm_bwd");
  CHECK(std::string(k::op_name(k::Op::sgd_momentum_update)) == "sgd_momentum_update");
  CHECK(std::string(k::host::backend().name) == "host");
  check_complete(k::host::backend());
#if defined(MESHRT_WITH_CUDA)
  // The table only (no GPU needed). CUDA may lack an op; what it has takes the host's dtypes.
  const k::OpTable& cu = k::cuda::backend();
  CHECK(std::string(cu.name) == "cuda");
  CHECK(cu.supports(k::Op::gemm, DType::bf16));
  for (int i = 0; i < k::kOpCount; ++i) {
    const auto op = static_cast<k::Op>(i);
    INFO("cuda " << k::op_name(op));
    if (!cu.dtypes[i].empty()) CHECK(cu.dtypes[i].str() == k::host::backend().dtypes[i].str());
  }
  // Context parallelism's block ops run on CUDA too (the reference attention kernels).
  for (k::Op op : {k::Op::attention_block_fwd, k::Op::attention_block_bwd, k::Op::attention_merge})
    CHECK(cu.dtypes[static_cast<int>(op)].str() ==
          k::host::backend().dtypes[static_cast<int>(op)].str());
#endif
}

TEST_CASE("host ISA variants: MESHRT_HOST_ISA values, the choice and the cap", "[errors]") {
  using k::host::HostIsa;
  CHECK(k::host::parse_host_isa_cap(nullptr) == HostIsa::avx512);
  CHECK(k::host::parse_host_isa_cap("") == HostIsa::avx512);
  CHECK(k::host::parse_host_isa_cap("auto") == HostIsa::avx512);
  CHECK(k::host::parse_host_isa_cap("baseline") == HostIsa::baseline);
  CHECK(k::host::parse_host_isa_cap("avx2") == HostIsa::avx2);
  CHECK(k::host::parse_host_isa_cap("avx512") == HostIsa::avx512);
  REQUIRE_THROWS_WITH(k::host::parse_host_isa_cap("AVX2"),
                      Contains("MESHRT_HOST_ISA=AVX2") && Contains("use auto, baseline"));
  CHECK(k::host::host_isa_built(HostIsa::baseline));
  CHECK(k::host::host_isa_runs_here(HostIsa::baseline));
  // The cap is an upper bound; the choice is the widest variant built and runnable under it.
  CHECK(k::host::choose_host_isa(HostIsa::baseline) == HostIsa::baseline);
  for (HostIsa cap : {HostIsa::baseline, HostIsa::avx2, HostIsa::avx512}) {
    const HostIsa got = k::host::choose_host_isa(cap);
    INFO("cap " << k::host::host_isa_name(cap) << " -> " << k::host::host_isa_name(got));
    CHECK(static_cast<int>(got) <= static_cast<int>(cap));
    CHECK(k::host::host_isa_built(got));
    CHECK(k::host::host_isa_runs_here(got));
    for (HostIsa wider : {HostIsa::avx2, HostIsa::avx512})
      if (static_cast<int>(wider) > static_cast<int>(got) &&
          static_cast<int>(wider) <= static_cast<int>(cap))
        CHECK_FALSE((k::host::host_isa_built(wider) && k::host::host_isa_runs_here(wider)));
  }
  const char* env = std::getenv("MESHRT_HOST_ISA");
  CHECK(k::host::host_isa() == k::host::choose_host_isa(k::host::parse_host_isa_cap(env)));
  CHECK_THAT(ops::host_isa_info(),
             Contains(k::host::host_isa_name(k::host::host_isa())) && Contains("built: baseline"));
  // A variant left out of the build, or one this CPU cannot run, is refused by name (its table
  // is never bound).
  for (HostIsa isa : {HostIsa::avx2, HostIsa::avx512}) {
    INFO(k::host::host_isa_name(isa));
    if (!k::host::host_isa_built(isa))
      REQUIRE_THROWS_WITH(k::host::backend(isa), Contains("variant is not in this build") &&
                                                     Contains(k::host::host_isa_name(isa)));
    else if (!k::host::host_isa_runs_here(isa))
      REQUIRE_THROWS_WITH(k::host::backend(isa),
                          Contains("cannot run the") && Contains(k::host::host_isa_name(isa)));
  }
}

TEST_CASE("every host ISA variant this CPU runs is complete, distinct and agrees with baseline",
          "[errors]") {
  using k::host::HostIsa;
  const k::OpTable& base = k::host::backend(HostIsa::baseline);
  check_complete(base);
  int compared = 0;
  for (HostIsa isa : {HostIsa::avx2, HostIsa::avx512}) {
    if (!k::host::host_isa_built(isa) || !k::host::host_isa_runs_here(isa)) continue;
    const k::OpTable& be = k::host::backend(isa);
    INFO(k::host::host_isa_name(isa));
    check_complete(be);
    CHECK(be.add != base.add);  // its own code, not the baseline's table again
    CHECK(be.layernorm_fwd != base.layernorm_fwd);
    // Same ops through both tables: GeLU (exp polynomial), LayerNorm (row reductions), softmax.
    Host h;
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      const int64_t rows = 37, cols = 389;  // odd: vector bodies and scalar tails
      Tensor x = rand_tensor(h, {rows, cols}, dt, 5, -4.0, 4.0);
      Tensor bias = rand_tensor(h, {cols}, dt, 6);
      Tensor gamma = rand_tensor(h, {cols}, dt, 7, 0.5, 1.5), beta = rand_tensor(h, {cols}, dt, 8);
      auto run = [&](const k::OpTable& b) {
        Tensor g = h.ctx.empty({rows, cols}, dt), y = h.ctx.empty({rows, cols}, dt);
        Tensor sm = h.ctx.empty({rows, cols}, dt);
        Tensor mean = h.ctx.empty({rows}, DType::f32), rstd = h.ctx.empty({rows}, DType::f32);
        b.bias_gelu_fwd(h.ctx, h.s(), x, bias, g, ops::GeluKind::Tanh);
        b.layernorm_fwd(h.ctx, h.s(), x, gamma, beta, y, mean, rstd, 1e-5f);
        b.softmax_rows_fwd(h.ctx, h.s(), x, sm, 0.7f);
        return std::vector<Vec>{read(h, g), read(h, y), read(h, sm), read(h, rstd)};
      };
      const auto want = run(base), got = run(be);
      const char* what[] = {"bias_gelu_fwd", "layernorm_fwd", "softmax_rows_fwd", "rstd"};
      for (size_t i = 0; i < want.size(); ++i)
        check_close(got[i], want[i], tol_for(dt, 1e-5), std::string(what[i]) + " " + dt_name(dt));
      ++compared;
    }
  }
  if (compared == 0) SUCCEED("this CPU runs only the baseline variant");
}

TEST_CASE("f16 rows convert exactly in every host ISA variant (F16C and portable)", "[errors]") {
  // The avx2 / avx512 loops convert f16 with vcvtph2ps / vcvtps2ph, the baseline ones in software
  // (runtime/half.h): scaling every f16 bit pattern must give the software's bits in each variant:
  // subnormals, ties (x 0.5 of odd subnormals), overflow to Inf (x 2, x 3), NaN payloads.
  using k::host::HostIsa;
  const int64_t n = 65536 + 13;  // every pattern, then a tail shorter than a vector
  int variants = 0;
  for (HostIsa isa : {HostIsa::baseline, HostIsa::avx2, HostIsa::avx512}) {
    if (!k::host::host_isa_built(isa) || !k::host::host_isa_runs_here(isa)) continue;
    INFO(k::host::host_isa_name(isa));
    const k::OpTable& be = k::host::backend(isa);
    Host h;
    Tensor x = h.ctx.empty({n}, DType::f16), y = h.ctx.empty({n}, DType::f16);
    h.sync();
    auto* xb = static_cast<uint16_t*>(x.data_ptr());
    for (int64_t i = 0; i < n; ++i) xb[i] = static_cast<uint16_t>(i * 40503);  // a permutation
    for (float alpha : {1.f, 0.5f, 0.25f, 1.f / 3.f, 2.f, 3.f, -1.f / 1024.f}) {
      INFO("alpha " << alpha);
      be.add(h.ctx, h.s(), x, x, y, alpha, 0.f);
      h.sync();
      const auto* yb = static_cast<const uint16_t*>(y.data_ptr());
      int64_t bad = 0, first = -1;
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t want = meshrt::f32_to_f16_bits(alpha * meshrt::f16_bits_to_f32(xb[i]));
        if (yb[i] != want && bad++ == 0) first = i;
      }
      INFO("first mismatch at " << first << ": x bits " << (first >= 0 ? xb[first] : 0) << ", got "
                                << (first >= 0 ? yb[first] : 0));
      CHECK(bad == 0);
    }
    ++variants;
  }
  CHECK(variants >= 1);
}

TEST_CASE("an op a backend lacks or a dtype it does not take fails naming op, dtype and backend",
          "[errors]") {
  // What a backend's gaps() leave of the table's dtypes.
  CHECK(k::kFloating.without(k::DTypeSet{DType::bf16}).str() == "f32, f16");
  CHECK(k::kFloating.without(k::kAnyDType).empty());
  CHECK(k::table_dtypes(k::Op::fill).str() == "f32, bf16, f16, i32, i64, u8");
  CHECK(k::table_dtypes(k::Op::layernorm_fwd).str() == "f32, bf16, f16");
  k::OpTable be("test");
  be.dtypes[static_cast<int>(k::Op::add)] = k::DTypeSet{DType::f32, DType::f16};
  CHECK(be.supports(k::Op::add, DType::f32));
  CHECK_FALSE(be.supports(k::Op::add, DType::bf16));
  CHECK_FALSE(be.supports(k::Op::attention_fwd, DType::f32));
  REQUIRE_NOTHROW(k::require_support(be, k::Op::add, DType::f16));
  REQUIRE_THROWS_AS(k::require_support(be, k::Op::add, DType::bf16), meshrt::Error);
  REQUIRE_THROWS_WITH(k::require_support(be, k::Op::add, DType::bf16),
                      Contains("op add:") && Contains("the test backend") &&
                          Contains("does not support dtype bf16") &&
                          Contains("it supports f32, f16"));
  REQUIRE_THROWS_WITH(k::require_support(be, k::Op::attention_fwd, DType::f32),
                      Contains("op attention_fwd:") && Contains("the test backend") &&
                          Contains("does not implement it") && Contains("dtype f32"));
}
