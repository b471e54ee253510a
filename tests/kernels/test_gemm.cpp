// GEMM (plain, bias epilogue, flattened, transposed views, batched) against a double reference.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "helpers.h"
#include "kernels/host/gemm_dnnl.h"
#include "kernels/host/gemm_f32_path.h"
#include "tests/common/env.h"

using namespace kt;
namespace ops = meshrt::ops;

namespace {

// C = alpha op(A) op(B) + beta C0 (+ bias); A stored [m, k] (or [k, m] when ta), B [k, n]
// (or [n, k] when tb), row-major.
Vec ref_gemm(const Vec& A, bool ta, const Vec& B, bool tb, const Vec& C0, int64_t m, int64_t n,
             int64_t k, double alpha, double beta, const Vec* bias) {
  Vec C(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        double a = ta ? A[p * m + i] : A[i * k + p];
        double b = tb ? B[j * k + p] : B[p * n + j];
        s += a * b;
      }
      double v = alpha * s + (beta != 0 ? beta * C0[i * n + j] : 0.0);
      if (bias) v += (*bias)[j];
      C[i * n + j] = v;
    }
  }
  return C;
}

struct Dims {
  int64_t m, n, k;
};

void run_case(Host& h, DType dt, DType ct, Dims d, bool ta, bool tb, float alpha, float beta,
              bool with_bias, uint64_t seed) {
  Shape sa = ta ? Shape{d.k, d.m} : Shape{d.m, d.k};
  Shape sb = tb ? Shape{d.n, d.k} : Shape{d.k, d.n};
  Tensor a = rand_tensor(h, sa, dt, seed);
  Tensor b = rand_tensor(h, sb, dt, seed + 1);
  Tensor c = rand_tensor(h, {d.m, d.n}, ct, seed + 2);
  Tensor bias = rand_tensor(h, {d.n}, ct, seed + 3);
  Vec av = read(h, a), bv = read(h, b), c0 = read(h, c), biasv = read(h, bias);
  ops::gemm(h.ctx, h.s(), a, ta, b, tb, c, alpha, beta, with_bias ? &bias : nullptr);
  Vec ref = ref_gemm(av, ta, bv, tb, c0, d.m, d.n, d.k, alpha, beta, with_bias ? &biasv : nullptr);
  std::ostringstream what;
  what << "gemm " << dt_name(dt) << "->" << dt_name(ct) << " m=" << d.m << " n=" << d.n
       << " k=" << d.k << " ta=" << ta << " tb=" << tb << " alpha=" << alpha << " beta=" << beta
       << " bias=" << with_bias;
  check_close(read(h, c), ref, tol_for(ct, 1e-4), what.str());
}

struct F32ModeScope : meshrt::test::ScopedEnv {
  explicit F32ModeScope(const char* v) : ScopedEnv("MESHRT_HOST_F32_GEMM", v) {}
};

// The choices recorded for one shape (m, n, k, no transposes).
std::vector<meshrt::kernels::host::F32Choice> f32_choices_of(int64_t m, int64_t n, int64_t k) {
  std::vector<meshrt::kernels::host::F32Choice> r;
  for (const auto& c : meshrt::kernels::host::f32_choices())
    if (c.m == m && c.n == n && c.k == k && !c.trans_a && !c.trans_b) r.push_back(c);
  return r;
}

}  // namespace

TEST_CASE("gemm f32 tiles: OpenBLAS and oneDNN match a double reference on strided operands",
          "[gemm]") {
  namespace hk = meshrt::kernels::host;
  std::mt19937 rng(91);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<hk::F32Path> paths{hk::F32Path::openblas};
  if (hk::dnnl_built()) paths.push_back(hk::F32Path::onednn);
  for (const Dims d : {Dims{1, 1, 1}, Dims{7, 13, 5}, Dims{33, 17, 65}, Dims{130, 67, 257}}) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        // Leading dims wider than the rows (a sub-matrix of a larger buffer), C too.
        const int64_t lda = (ta ? d.m : d.k) + 3, ldb = (tb ? d.k : d.n) + 5, ldc = d.n + 2;
        std::vector<float> a(static_cast<size_t>((ta ? d.k : d.m) * lda)),
            b(static_cast<size_t>((tb ? d.n : d.k) * ldb)), c0(static_cast<size_t>(d.m * ldc));
        for (auto* v : {&a, &b, &c0})
          for (float& x : *v) x = dist(rng);
        for (const hk::F32Path path : paths) {
          std::vector<float> c = c0;
          hk::DnnlTile t{d.m, d.n,      d.k, a.data(), lda,     ta,   b.data(), ldb,
                         tb,  c.data(), ldc, false,    nullptr, 0.5f, -1.5f,    true};
          hk::f32_tile_on(t, path);
          double worst = 0;
          for (int64_t i = 0; i < d.m; ++i) {
            for (int64_t j = 0; j < d.n; ++j) {
              double s = 0;
              for (int64_t p = 0; p < d.k; ++p)
                s += double(ta ? a[p * lda + i] : a[i * lda + p]) *
                     double(tb ? b[j * ldb + p] : b[p * ldb + j]);
              const double want = 0.5 * s - 1.5 * c0[i * ldc + j];
              worst = std::max(worst, std::abs(c[i * ldc + j] - want) / (1 + std::abs(want)));
            }
            // The padding past n is not written.
            for (int64_t j = d.n; j < ldc; ++j) REQUIRE(c[i * ldc + j] == c0[i * ldc + j]);
          }
          INFO(hk::f32_path_name(path)
               << " m=" << d.m << " n=" << d.n << " k=" << d.k << " ta=" << ta << " tb=" << tb);
          CHECK(worst < 1e-4);
        }
      }
    }
  }
}

// Issue 51 item 14: auto used to time both paths at a shape's first use and keep the faster, so
// two runs of the same command could take different paths and differ in the last bits. The
// choice is now a function of the shape and the CPU only; the two paths do differ in bits (the
// second half), so a choice that could change between runs would change results.
TEST_CASE("gemm f32 auto path: a table of shape and ISA, where the two paths differ in bits",
          "[gemm]") {
  namespace hk = meshrt::kernels::host;
  for (const bool avx512 : {false, true}) {
    CHECK(hk::f32_auto_path(64, 64, 1023, avx512) == hk::F32Path::openblas);  // under 2^22
    CHECK(hk::f32_auto_path(1, 1, 1, avx512) == hk::F32Path::openblas);
    for (int rep = 0; rep < 3; ++rep)  // no state: the same answer every time
      CHECK(hk::f32_auto_path(64, 64, 1024, avx512) ==
            (avx512 ? hk::F32Path::onednn : hk::F32Path::openblas));
  }
  CHECK(hk::f32_auto_path(2048, 3072, 768, false) == hk::F32Path::openblas);
  CHECK(hk::f32_auto_path(2048, 3072, 768, true) == hk::F32Path::onednn);
  if (!hk::dnnl_built()) return;
  // 64 x 64 x 1024 (2^22 multiply-adds, where the table starts giving oneDNN the tile).
  const int64_t m = 64, n = 64, k = 1024;
  std::mt19937 rng(97);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
  for (auto* v : {&a, &b})
    for (float& x : *v) x = dist(rng);
  std::vector<float> c_blas(static_cast<size_t>(m * n)), c_dnnl(c_blas.size());
  auto run = [&](std::vector<float>& c, hk::F32Path p) {
    hk::DnnlTile t{m,     n,        k, a.data(), k,       false, b.data(), n,
                   false, c.data(), n, false,    nullptr, 1.f,   0.f,      true};
    hk::f32_tile_on(t, p);
  };
  run(c_blas, hk::F32Path::openblas);
  run(c_dnnl, hk::F32Path::onednn);
  int differ = 0;
  for (size_t i = 0; i < c_blas.size(); ++i) differ += c_blas[i] != c_dnnl[i];
  INFO(differ << " of " << c_blas.size() << " outputs differ between OpenBLAS and oneDNN");
  CHECK(differ > 0);
}

TEST_CASE("MESHRT_HOST_F32_GEMM forces one path, auto follows its table", "[gemm]") {
  namespace hk = meshrt::kernels::host;
  Host h;
  {
    F32ModeScope mode("openblas");
    CHECK(hk::host_gemm_f32_info().find("for every shape") != std::string::npos);
    for (int it = 0; it < 3; ++it)
      run_case(h, DType::f32, DType::f32, Dims{71, 45, 33}, false, false, 1.f, 0.f, false, 81);
    const auto cs = f32_choices_of(71, 45, 33);
    REQUIRE(cs.size() == 1);
    CHECK(cs[0].forced);
    CHECK(cs[0].path == hk::F32Path::openblas);
  }
  if (hk::dnnl_built()) {
    F32ModeScope mode("onednn");
    run_case(h, DType::f32, DType::f32, Dims{73, 45, 33}, false, false, 1.f, 0.5f, true, 82);
    const auto cs = f32_choices_of(73, 45, 33);
    REQUIRE(cs.size() == 1);
    CHECK(cs[0].forced);
    CHECK(cs[0].path == hk::F32Path::onednn);
  }
  {
    F32ModeScope mode("auto");
    // Small tiles stay on OpenBLAS (and unrecorded).
    run_case(h, DType::f32, DType::f32, Dims{75, 45, 33}, false, false, 1.f, 0.f, false, 83);
    CHECK(f32_choices_of(75, 45, 33).empty());
    // 256^3 is split into row panels of at least 2^22 multiply-adds each: every panel shape takes
    // the table's path, recorded once (a second and third run add no entry).
    auto recorded = [] {
      std::vector<hk::F32Choice> r;
      for (const auto& c : hk::f32_choices())
        if (c.n == 256 && c.k == 256 && !c.forced && !c.trans_a && !c.trans_b) r.push_back(c);
      return r;
    };
    run_case(h, DType::f32, DType::f32, Dims{256, 256, 256}, false, false, 1.f, 0.f, false, 84);
    const auto first = recorded();
    REQUIRE(!first.empty());
    for (int it = 0; it < 2; ++it)
      run_case(h, DType::f32, DType::f32, Dims{256, 256, 256}, false, false, 1.f, 0.f, false, 85);
    CHECK(recorded().size() == first.size());
    for (const auto& c : first)
      CHECK(c.path == hk::f32_auto_path(c.m, c.n, c.k, hk::dnnl_built() && hk::dnnl_avx512()));
    if (hk::dnnl_built())
      CHECK(hk::host_gemm_f32_info().find("by a fixed table") != std::string::npos);
  }
  {
    F32ModeScope mode("mkl");
    try {
      (void)hk::host_gemm_f32_info();
      FAIL("MESHRT_HOST_F32_GEMM=mkl was accepted");
    } catch (const std::exception& e) {
      CHECK(std::string(e.what()).find("MESHRT_HOST_F32_GEMM='mkl' is not accepted: use auto, "
                                       "openblas, onednn or bf16") != std::string::npos);
    }
  }
}

TEST_CASE("MESHRT_HOST_F32_GEMM=bf16: f32 GEMMs with products of bf16-rounded inputs", "[gemm]") {
  // Where oneDNN has a bf16-product f32 matmul (AMX in 3.2), a tile it runs on it gives the f32 sum
  // of products of A and B rounded to bf16: within f32 accumulation error of a double reference on
  // the rounded inputs, and far from the exact one. oneDNN does so for dense B and C rows of
  // matmul-sized tiles (64 rows and up here); a B or C with a row stride above n, or a tiny tile,
  // keeps f32 arithmetic. Without such a matmul every tile keeps f32 arithmetic.
  namespace hk = meshrt::kernels::host;
  if (!hk::dnnl_built()) {
    F32ModeScope mode("bf16");
    CHECK_THROWS_WITH(hk::host_gemm_f32_info(), Catch::Contains("this build has no oneDNN"));
    return;
  }
  std::mt19937 rng(93);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  // What `meshrt info` reports: whether oneDNN takes bf16 products for f32 on this CPU.
  const bool bf16_hw = !hk::dnnl_f32_bf16_impl().empty();
  struct Case {
    Dims d;
    int64_t pad;   // added to B's row stride
    bool rounded;  // expected on bf16 products (with bf16 hardware)
  };
  for (const Case& cs : {Case{{64, 96, 128}, 0, true}, Case{{130, 67, 257}, 0, true},
                         Case{{64, 96, 128}, 3, false}}) {
    for (const bool tb : {false, true}) {
      const Dims d = cs.d;
      // A column panel's stride applies to B stored [k, n]; stored [n, k] it is dense either way.
      const int64_t pad = tb ? 0 : cs.pad;
      const int64_t lda = d.k, ldb = (tb ? d.k : d.n) + pad, ldc = d.n;
      std::vector<float> a(static_cast<size_t>(d.m * lda)),
          b(static_cast<size_t>((tb ? d.n : d.k) * ldb)), c(static_cast<size_t>(d.m * ldc));
      for (auto* v : {&a, &b})
        for (float& x : *v) x = dist(rng);
      hk::DnnlTile t{d.m, d.n,      d.k, a.data(), lda,     false, b.data(), ldb,
                     tb,  c.data(), ldc, false,    nullptr, 1.f,   0.f,      true};
      hk::f32_tile_on(t, hk::F32Path::onednn_bf16);
      double worst_rounded = 0, worst_exact = 0;
      for (int64_t i = 0; i < d.m; ++i) {
        for (int64_t j = 0; j < d.n; ++j) {
          double rounded = 0, exact = 0;
          for (int64_t p = 0; p < d.k; ++p) {
            const float x = a[i * lda + p], y = tb ? b[j * ldb + p] : b[p * ldb + j];
            exact += double(x) * double(y);
            rounded += round_to(x, DType::bf16) * round_to(y, DType::bf16);
          }
          const double got = c[i * ldc + j];
          worst_rounded =
              std::max(worst_rounded, std::abs(got - rounded) / (1 + std::abs(rounded)));
          worst_exact = std::max(worst_exact, std::abs(got - exact) / (1 + std::abs(exact)));
        }
      }
      INFO("m=" << d.m << " n=" << d.n << " k=" << d.k << " tb=" << tb << " ldb=" << ldb
                << "; bf16-product matmul: '" << hk::dnnl_f32_bf16_impl() << "'"
                << "; relative error against the "
                << "bf16-rounded reference " << worst_rounded << ", against the exact one "
                << worst_exact);
      if (bf16_hw && (cs.rounded || tb)) {
        CHECK(worst_rounded < 1e-5);
        CHECK(worst_exact > 1e-4);
      } else {
        CHECK(worst_exact < 1e-5);
      }
    }
  }
  // Through ops::gemm on a 2-thread pool: row panels (dense B and C), so bf16 products whenever
  // oneDNN has them here; every panel shape forced to the path and reported as such.
  meshrt::test::ScopedEnv threads("MESHRT_HOST_THREADS", "2");
  F32ModeScope mode("bf16");
  CHECK(hk::host_gemm_f32_info().find("MESHRT_HOST_F32_GEMM=bf16") != std::string::npos);
  Host h;
  REQUIRE(ops::host_threads(h.ctx) == 2);
  const int64_t m = 256, n = 192, k = 160;
  Tensor a = rand_tensor(h, {m, k}, DType::f32, 94), b = rand_tensor(h, {k, n}, DType::f32, 95);
  Tensor c = rand_tensor(h, {m, n}, DType::f32, 96);
  const Vec av = read(h, a), bv = read(h, b);
  ops::gemm(h.ctx, h.s(), a, false, b, false, c, 1.f, 0.f, nullptr);
  const Vec got = read(h, c);
  double worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (int64_t p = 0; p < k; ++p)
        want += round_to(av[i * k + p], DType::bf16) * round_to(bv[p * n + j], DType::bf16);
      worst = std::max(worst, std::abs(got[i * n + j] - want) / (1 + std::abs(want)));
    }
  }
  INFO("ops::gemm under MESHRT_HOST_F32_GEMM=bf16: relative error " << worst
                                                                    << " against bf16 products");
  CHECK(worst < (bf16_hw ? 1e-5 : 1e-1));
  int panels = 0;
  for (const auto& ch : hk::f32_choices()) {
    if (ch.n != n || ch.k != k || ch.trans_a || ch.trans_b || ch.path != hk::F32Path::onednn_bf16)
      continue;
    CHECK(ch.forced);
    CHECK(ch.m < m);  // row panels, not column panels
    ++panels;
  }
  CHECK(panels >= 1);
}

TEST_CASE("gemm f32 matches a double reference over odd and round shapes", "[gemm]") {
  Host h;
  auto d = GENERATE(Dims{1, 1, 1}, Dims{7, 13, 5}, Dims{17, 31, 29}, Dims{64, 64, 64},
                    Dims{33, 1, 65}, Dims{1, 47, 3}, Dims{130, 67, 257}, Dims{256, 192, 128});
  auto ta = GENERATE(false, true);
  auto tb = GENERATE(false, true);
  run_case(h, DType::f32, DType::f32, d, ta, tb, 1.f, 0.f, false, 11);
}

TEST_CASE("gemm alpha, beta and the bias epilogue", "[gemm]") {
  Host h;
  auto dt = GENERATE(DType::f32, DType::bf16, DType::f16);
  auto d = GENERATE(Dims{5, 9, 3}, Dims{37, 19, 23});
  run_case(h, dt, dt, d, false, true, 0.5f, -1.25f, true, 21);
  run_case(h, dt, dt, d, true, false, 2.f, 0.f, true, 22);
  run_case(h, dt, DType::f32, d, false, false, 1.f, 1.f, true, 23);
  // alpha and beta without a bias (oneDNN's output scale and sum post-op for bf16).
  run_case(h, dt, dt, d, true, true, 0.5f, 0.75f, false, 24);
}

TEST_CASE("gemm 16-bit inputs accumulate in f32, with f32 or 16-bit outputs", "[gemm]") {
  Host h;
  auto dt = GENERATE(DType::bf16, DType::f16);
  auto ct = GENERATE(DType::f32, DType::bf16, DType::f16);
  if (ct != DType::f32 && ct != dt) return;
  // Odd shapes, and one spanning several conversion blocks in every dimension.
  auto d = GENERATE(Dims{1, 1, 1}, Dims{13, 7, 31}, Dims{300, 530, 600});
  auto ta = GENERATE(false, true);
  auto tb = GENERATE(false, true);
  if (d.m == 300 && (ta || tb) && dt == DType::f16) return;  // keep the suite fast
  run_case(h, dt, ct, d, ta, tb, 1.f, 0.f, false, 31);
}

TEST_CASE("gemm 16-bit column panels: oneDNN's reference kernels are never run", "[gemm]") {
  // Few rows and many columns on a 2-thread pool: the tiles are column panels (B and C with a row
  // stride above the panel's n), for which oneDNN 3.2 has f16 matmul only as its reference
  // implementation (~1000x slower); those tiles take the converted-panel path instead
  // (gemm_dnnl.h), and every tile must still be right.
  meshrt::test::ScopedEnv threads("MESHRT_HOST_THREADS", "2");
  Host h;
  REQUIRE(ops::host_threads(h.ctx) == 2);
  auto dt = GENERATE(DType::bf16, DType::f16);
  auto ct = GENERATE(DType::f32, DType::bf16, DType::f16);
  if (ct != DType::f32 && ct != dt) return;
  const int64_t before = meshrt::kernels::host::dnnl_reference_skips();
  run_case(h, dt, ct, Dims{16, 2048, 256}, false, false, 1.f, 0.f, false, 35);
  run_case(h, dt, ct, Dims{16, 2048, 256}, false, false, 0.5f, 0.25f, true, 36);
  const int64_t skipped = meshrt::kernels::host::dnnl_reference_skips() - before;
  INFO(meshrt::ops::host_gemm_16bit_info() << "; tiles left to the converted path: " << skipped);
  // oneDNN 3.2's f16 kernels refuse these tiles on an AVX512-FP16 CPU: the skip must have run.
  if (dt == DType::f16 && meshrt::kernels::host::dnnl_f16_gemm_enabled() &&
      meshrt::kernels::host::dnnl_description().rfind("oneDNN 3.2.", 0) == 0) {
    CHECK(skipped > 0);
  }
}

TEST_CASE("gemm 16-bit with a bias stays on oneDNN's fast kernels", "[gemm]") {
  // oneDNN 3.2's AVX512-FP16 matmul takes an f16 bias only in its reference implementation; the
  // tile passes the bias as f32 instead (gemm_dnnl.cpp), so the Linear layers' forward GEMMs do not
  // fall back to the converted-panel path. Row panels of 32 rows on 2 threads: dense B and C.
  meshrt::test::ScopedEnv threads("MESHRT_HOST_THREADS", "2");
  Host h;
  auto dt = GENERATE(DType::bf16, DType::f16);
  auto ct = GENERATE(DType::f32, DType::bf16, DType::f16);
  if (ct != DType::f32 && ct != dt) return;
  const int64_t before = meshrt::kernels::host::dnnl_reference_skips();
  run_case(h, dt, ct, Dims{64, 96, 80}, false, false, 1.f, 0.f, true, 41);
  run_case(h, dt, ct, Dims{64, 96, 80}, false, true, 1.f, 1.f, true, 42);
  const int64_t skipped = meshrt::kernels::host::dnnl_reference_skips() - before;
  INFO(meshrt::ops::host_gemm_16bit_info() << "; tiles left to the converted path: " << skipped);
  const bool on_dnnl = dt == DType::f16 ? meshrt::kernels::host::dnnl_f16_gemm_enabled()
                                        : meshrt::kernels::host::dnnl_bf16_gemm_enabled();
  if (on_dnnl && meshrt::kernels::host::dnnl_description().rfind("oneDNN 3.2.", 0) == 0) {
    CHECK(skipped == 0);
  }
}

TEST_CASE("the build links the oneDNN of MESHRT_DNNL_ROOT when that prefix has one", "[gemm]") {
  // CMake prefers MESHRT_DNNL_ROOT (tools/install-deps.sh puts oneDNN 3.2 there) over the system's
  // oneDNN 2.6.3, whose matmul has no f16: a build that silently took the system's would lose the
  // f16 kernels with every other test still passing.
  const std::filesystem::path root = MESHRT_TEST_DNNL_ROOT;
  const std::filesystem::path header = root / "include/oneapi/dnnl/dnnl_version.h";
  if (root.empty() || !std::filesystem::exists(header) ||
      !std::filesystem::exists(root / "lib/libdnnl.so")) {
    SUCCEED("no oneDNN under MESHRT_DNNL_ROOT='" << root.string() << "'");
    return;
  }
  std::ifstream in(header);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string version;
  for (const char* part : {"MAJOR", "MINOR", "PATCH"}) {
    std::smatch m;
    const std::regex re(std::string("#define DNNL_VERSION_") + part + " ([0-9]+)");
    REQUIRE(std::regex_search(text, m, re));
    version += (version.empty() ? "" : ".") + m[1].str();
  }
  REQUIRE(meshrt::kernels::host::dnnl_built());
  INFO("linked: " << meshrt::kernels::host::dnnl_description() << "; " << header.string()
                  << " says " << version);
  CHECK(meshrt::kernels::host::dnnl_description().rfind("oneDNN " + version + " ", 0) == 0);
}

TEST_CASE("gemm with k = 0 scales c and adds the bias", "[gemm]") {
  Host h;
  run_case(h, DType::f32, DType::f32, Dims{4, 6, 0}, false, false, 1.f, 0.5f, true, 41);
  run_case(h, DType::bf16, DType::f32, Dims{4, 6, 0}, false, false, 1.f, 0.f, false, 42);
}

TEST_CASE("gemm flattens leading dims and accepts transposed 2-D views", "[gemm]") {
  Host h;
  // x [2, 3, 5] @ w [5, 4] -> y [2, 3, 4]
  Tensor x = rand_tensor(h, {2, 3, 5}, DType::f32, 51);
  Tensor w = rand_tensor(h, {5, 4}, DType::f32, 52);
  Tensor y = h.ctx.empty({2, 3, 4}, DType::f32);
  ops::gemm(h.ctx, h.s(), x, false, w, false, y);
  Vec ref = ref_gemm(read(h, x), false, read(h, w), false, {}, 6, 4, 5, 1, 0, nullptr);
  check_close(read(h, y), ref, 1e-5, "flattened [2,3,5] @ [5,4]");

  // dW = x^T dy with x [2, 3, 5] flattened to [6, 5]: [5, 6] @ [6, 4]
  Tensor dy = rand_tensor(h, {2, 3, 4}, DType::f32, 53);
  Tensor dw = h.ctx.empty({5, 4}, DType::f32);
  ops::gemm(h.ctx, h.s(), x, true, dy, false, dw);
  ref = ref_gemm(read(h, x), true, read(h, dy), false, {}, 5, 4, 6, 1, 0, nullptr);
  check_close(read(h, dw), ref, 1e-5, "x^T dy with flattened rows");

  // A transposed view of a contiguous [7, 3] tensor is a [3, 7] matrix.
  Tensor base = rand_tensor(h, {7, 3}, DType::f32, 54);
  Tensor at = base.transpose(0, 1);
  Tensor b = rand_tensor(h, {7, 2}, DType::f32, 55);
  Tensor c = h.ctx.empty({3, 2}, DType::f32);
  ops::gemm(h.ctx, h.s(), at, false, b, false, c);
  ref = ref_gemm(read(h, base), true, read(h, b), false, {}, 3, 2, 7, 1, 0, nullptr);
  check_close(read(h, c), ref, 1e-5, "transposed view operand");
  // ... and trans_a on that view undoes it.
  Tensor b2 = rand_tensor(h, {3, 4}, DType::f32, 56);
  Tensor c2 = h.ctx.empty({7, 4}, DType::f32);
  ops::gemm(h.ctx, h.s(), at, true, b2, false, c2);
  ref = ref_gemm(read(h, base), false, read(h, b2), false, {}, 7, 4, 3, 1, 0, nullptr);
  check_close(read(h, c2), ref, 1e-5, "transposed view with trans_a");

  // A row-strided view (narrow on the last dim) is a matrix with a larger leading dim.
  Tensor wide = rand_tensor(h, {6, 10}, DType::f32, 57);
  Tensor left = wide.narrow(1, 2, 5);  // [6, 5], ld 10
  Tensor c3 = h.ctx.empty({6, 4}, DType::f32);
  ops::gemm(h.ctx, h.s(), left, false, w, false, c3);
  Vec wv = read(h, wide), lv;
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 5; ++j) lv.push_back(wv[i * 10 + 2 + j]);
  ref = ref_gemm(lv, false, read(h, w), false, {}, 6, 4, 5, 1, 0, nullptr);
  check_close(read(h, c3), ref, 1e-5, "row-strided operand");
}

TEST_CASE("gemm_strided_batched over [batch, m, k] and 4-D [b, h, s, d]", "[gemm]") {
  Host h;
  auto dt = GENERATE(DType::f32, DType::bf16);
  auto ta = GENERATE(false, true);
  auto tb = GENERATE(false, true);
  const int64_t B = 6, m = 9, n = 17, k = 11;
  Shape sa = ta ? Shape{2, 3, k, m} : Shape{2, 3, m, k};
  Shape sb = tb ? Shape{2, 3, n, k} : Shape{2, 3, k, n};
  Tensor a = rand_tensor(h, sa, dt, 61);
  Tensor b = rand_tensor(h, sb, dt, 62);
  Tensor c = rand_tensor(h, {2, 3, m, n}, dt, 63);
  Vec av = read(h, a), bv = read(h, b), c0 = read(h, c);
  ops::gemm_strided_batched(h.ctx, h.s(), a, ta, b, tb, c, 0.75f, 0.5f);
  Vec ref;
  for (int64_t i = 0; i < B; ++i) {
    Vec ai(av.begin() + i * m * k, av.begin() + (i + 1) * m * k);
    Vec bi(bv.begin() + i * k * n, bv.begin() + (i + 1) * k * n);
    Vec ci(c0.begin() + i * m * n, c0.begin() + (i + 1) * m * n);
    Vec r = ref_gemm(ai, ta, bi, tb, ci, m, n, k, 0.75, 0.5, nullptr);
    ref.insert(ref.end(), r.begin(), r.end());
  }
  check_close(read(h, c), ref, tol_for(dt, 1e-5), "batched gemm " + dt_name(dt));
}

TEST_CASE("gemm splits over the pool and stays correct with concurrent ranks", "[gemm]") {
  // Two ranks as threads of one process, each with its own pool, running GEMMs at once.
  Host r0(2), r1(2);
  const int64_t m = 192, n = 160, k = 96;
  Tensor a0 = rand_tensor(r0, {m, k}, DType::f32, 71), b0 = rand_tensor(r0, {k, n}, DType::f32, 72);
  Tensor a1 = rand_tensor(r1, {m, k}, DType::f32, 73), b1 = rand_tensor(r1, {k, n}, DType::f32, 74);
  Tensor c0 = r0.ctx.empty({m, n}, DType::f32), c1 = r1.ctx.empty({m, n}, DType::f32);
  for (int it = 0; it < 4; ++it) {
    ops::gemm(r0.ctx, r0.s(), a0, false, b0, false, c0);
    ops::gemm(r1.ctx, r1.s(), a1, false, b1, false, c1);
  }
  check_close(read(r0, c0),
              ref_gemm(read(r0, a0), false, read(r0, b0), false, {}, m, n, k, 1, 0, nullptr), 1e-4,
              "rank 0");
  check_close(read(r1, c1),
              ref_gemm(read(r1, a1), false, read(r1, b1), false, {}, m, n, k, 1, 0, nullptr), 1e-4,
              "rank 1");
  CHECK(ops::host_threads(r0.ctx) >= 1);
}
