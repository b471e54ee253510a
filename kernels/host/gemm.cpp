// Host GEMM: panels split over the rank's pool. f32 panels run OpenBLAS sgemm or oneDNN's f32
// matmul, chosen per panel shape (gemm_f32_path.h). bf16 and f16 inputs go to oneDNN's matmul
// (AVX512-BF16 / AVX512-FP16 / AMX, f32 accumulation) when the build's oneDNN and the CPU have it
// (gemm_dnnl.h); otherwise 16-bit inputs are converted to f32 in cache-sized blocks (never
// whole-tensor copies) for sgemm and accumulated in f32.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <type_traits>
#include <vector>

#include "kernels/backend.h"
#include "kernels/deterministic.h"
#include "kernels/host/gemm_dnnl.h"
#include "kernels/host/gemm_f32_path.h"
#include "kernels/host/isa.h"
#include "kernels/host/parallel.h"
#include "kernels/host/reduce.h"
#include "runtime/dtype_dispatch.h"

namespace meshrt::kernels::host {
MESHRT_HOST_ISA_BEGIN

namespace {

// Block sizes of the 16-bit path: A block kMB x kKB and B block kKB x kNB as f32 (512 KiB and
// 1 MiB) plus the kMB x kNB f32 accumulator: large enough for sgemm to run near peak, small
// enough to stay in L2 / L3.
constexpr int64_t kMB = 256;
constexpr int64_t kNB = 512;
constexpr int64_t kKB = 512;

// Minimum multiply-adds per parallel task: below this, splitting costs more than it saves.
constexpr int64_t kMinTaskFma = int64_t{1} << 21;

CBLAS_TRANSPOSE tr(bool t) { return t ? CblasTrans : CblasNoTrans; }
blasint bi(int64_t v) { return static_cast<blasint>(v); }

// One rectangular piece of C: rows [i0, i1), cols [j0, j1) of batch entry `b`.
struct Tile {
  int64_t b, i0, i1, j0, j1;
};

// Pointer offsets of op(A) rows i.. / op(B) cols j.. in stored layouts.
inline int64_t a_off(const GemmProblem& p, int64_t i, int64_t kk) {
  return p.trans_a ? kk * p.lda + i : i * p.lda + kk;
}
inline int64_t b_off(const GemmProblem& p, int64_t kk, int64_t j) {
  return p.trans_b ? j * p.ldb + kk : kk * p.ldb + j;
}

// C tile = beta * C (+ bias) when k == 0 (BLAS would not touch the bias).
template <class CT>
void scale_tile(const GemmProblem& p, const Tile& t, CT* c, const CT* bias) {
  for (int64_t i = t.i0; i < t.i1; ++i) {
    CT* cr = c + i * p.ldc;
    for (int64_t j = t.j0; j < t.j1; ++j) {
      float v = p.beta == 0.f ? 0.f : p.beta * load_f32(cr, j);
      if (bias) v += load_f32(bias, j);
      store_f32(cr, j, v);
    }
  }
}

void tile_f32(const GemmProblem& p, const Tile& t) {
  const float* a = p.a.data<float>() + t.b * p.stride_a;
  const float* b = p.b.data<float>() + t.b * p.stride_b;
  float* c = p.c.data<float>() + t.b * p.stride_c;
  const float* bias = p.bias.defined() ? p.bias.data<float>() : nullptr;
  if (p.k == 0) {
    scale_tile(p, t, c, bias);
    return;
  }
  DnnlTile d{t.i1 - t.i0,
             t.j1 - t.j0,
             p.k,
             a + a_off(p, t.i0, 0),
             p.lda,
             p.trans_a,
             b + b_off(p, 0, t.j0),
             p.ldb,
             p.trans_b,
             c + t.i0 * p.ldc + t.j0,
             p.ldc,
             false,
             nullptr,
             p.alpha,
             p.beta,
             true};
  f32_tile(d);
  if (bias) {
    for (int64_t i = t.i0; i < t.i1; ++i) {
      float* cr = c + i * p.ldc;
      for (int64_t j = t.j0; j < t.j1; ++j) cr[j] += bias[j];
    }
  }
}

// Converts the stored sub-matrix rows [r0, r0 + nr) x cols [c0, c0 + nc) (leading dim ld) into
// a dense f32 block with leading dim nc.
template <class T>
void convert_block(const T* src, int64_t ld, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                   float* dst) {
  for (int64_t r = 0; r < nr; ++r) load_row(src + (r0 + r) * ld + c0, dst + r * nc, nc);
}

// 16-bit inputs: f32 blocks through sgemm, f32 accumulator, epilogue writes C (T or f32).
template <class T, class CT>
void tile_16(const GemmProblem& p, const Tile& t) {
  const T* a = p.a.data<T>() + t.b * p.stride_a;
  const T* b = p.b.data<T>() + t.b * p.stride_b;
  CT* c = p.c.data<CT>() + t.b * p.stride_c;
  const CT* bias = p.bias.defined() ? p.bias.data<CT>() : nullptr;
  if (p.k == 0) {
    scale_tile(p, t, c, bias);
    return;
  }
  float* abuf = scratch_f32(0, static_cast<size_t>(kMB * kKB));
  float* bbuf = scratch_f32(1, static_cast<size_t>(kKB * kNB));
  float* acc = scratch_f32(2, static_cast<size_t>(kMB * kNB));
  for (int64_t j0 = t.j0; j0 < t.j1; j0 += kNB) {
    const int64_t nb = std::min(kNB, t.j1 - j0);
    for (int64_t i0 = t.i0; i0 < t.i1; i0 += kMB) {
      const int64_t mb = std::min(kMB, t.i1 - i0);
      for (int64_t k0 = 0; k0 < p.k; k0 += kKB) {
        const int64_t kb = std::min(kKB, p.k - k0);
        // Blocks keep the stored orientation; sgemm applies the transposes.
        if (p.trans_a) {
          convert_block(a, p.lda, k0, kb, i0, mb, abuf);  // [kb, mb]
        } else {
          convert_block(a, p.lda, i0, mb, k0, kb, abuf);  // [mb, kb]
        }
        if (p.trans_b) {
          convert_block(b, p.ldb, j0, nb, k0, kb, bbuf);  // [nb, kb]
        } else {
          convert_block(b, p.ldb, k0, kb, j0, nb, bbuf);  // [kb, nb]
        }
        cblas_sgemm(CblasRowMajor, tr(p.trans_a), tr(p.trans_b), bi(mb), bi(nb), bi(kb), 1.0f, abuf,
                    bi(p.trans_a ? mb : kb), bbuf, bi(p.trans_b ? kb : nb), k0 == 0 ? 0.0f : 1.0f,
                    acc, bi(nb));
      }
      for (int64_t i = 0; i < mb; ++i) {
        CT* cr = c + (i0 + i) * p.ldc + j0;
        const float* ar = acc + i * nb;
        if (p.beta == 0.f) {
          if (bias) {
            for (int64_t j = 0; j < nb; ++j)
              store_f32(cr, j, p.alpha * ar[j] + load_f32(bias, j0 + j));
          } else {
            for (int64_t j = 0; j < nb; ++j) store_f32(cr, j, p.alpha * ar[j]);
          }
        } else {
          for (int64_t j = 0; j < nb; ++j) {
            float v = p.alpha * ar[j] + p.beta * load_f32(cr, j);
            if (bias) v += load_f32(bias, j0 + j);
            store_f32(cr, j, v);
          }
        }
      }
    }
  }
}

// bf16 / f16 inputs (T) through oneDNN: the tile straight into C with the bias and beta fused;
// alpha != 1 with a bias (oneDNN 2 would scale the bias) computes A B into an f32 block and runs
// the epilogue.
template <class T, class CT>
void tile_16_dnnl(const GemmProblem& p, const Tile& t) {
  const T* a = p.a.data<T>() + t.b * p.stride_a;
  const T* b = p.b.data<T>() + t.b * p.stride_b;
  CT* c = p.c.data<CT>() + t.b * p.stride_c;
  const CT* bias = p.bias.defined() ? p.bias.data<CT>() : nullptr;
  if (p.k == 0) {
    scale_tile(p, t, c, bias);
    return;
  }
  constexpr bool c16 = std::is_same_v<CT, T>;
  DnnlTile d{t.i1 - t.i0,
             t.j1 - t.j0,
             p.k,
             a + a_off(p, t.i0, 0),
             p.lda,
             p.trans_a,
             b + b_off(p, 0, t.j0),
             p.ldb,
             p.trans_b,
             c + t.i0 * p.ldc + t.j0,
             p.ldc,
             c16,
             bias ? bias + t.j0 : nullptr,
             p.alpha,
             p.beta,
             false,
             std::is_same_v<T, f16>};
  if (p.alpha == 1.f || !bias) {
    if (!dnnl_tile(d)) tile_16<T, CT>(p, t);
    return;
  }
  for (int64_t i0 = t.i0; i0 < t.i1; i0 += kMB) {
    const int64_t mb = std::min(kMB, t.i1 - i0);
    float* acc = scratch_f32(2, static_cast<size_t>(mb * (t.j1 - t.j0)));
    DnnlTile u = d;
    u.m = mb;
    u.a = a + a_off(p, i0, 0);
    u.c = acc;
    u.ldc = t.j1 - t.j0;
    u.c16 = false;
    u.bias = nullptr;
    u.alpha = 1.f;
    u.beta = 0.f;
    if (!dnnl_tile(u)) {
      tile_16<T, CT>(p, Tile{t.b, i0, t.i1, t.j0, t.j1});  // the rows not done yet
      return;
    }
    for (int64_t i = 0; i < mb; ++i) {
      CT* cr = c + (i0 + i) * p.ldc;
      const float* ar = acc + i * u.ldc;
      for (int64_t j = t.j0; j < t.j1; ++j) {
        // The order of tile_16's epilogue: alpha A B + beta C, then the bias.
        float v = p.alpha * ar[j - t.j0];
        if (p.beta != 0.f) v += p.beta * load_f32(cr, j);
        store_f32(cr, j, v + load_f32(bias, j));
      }
    }
  }
}

// Splits the problem into tiles: whole batch entries when there are enough of them, else
// panels of rows (or columns, whichever is longer, each of at least min_task_fma multiply-adds)
// so every pool thread gets work. rows_first:
// row panels whenever each is at least 16 rows (oneDNN's fast matmul kernels want B and C
// dense: a column panel's row stride above n sends bf16 to a slower GEMM and f16 to none).
std::vector<Tile> plan_tiles(const GemmProblem& p, int threads, bool rows_first,
                             int64_t min_task_fma) {
  std::vector<Tile> tiles;
  const int64_t fma = p.m * p.n * std::max<int64_t>(p.k, 1);
  int64_t per_batch = 1;
  if (p.batch < threads) {
    int64_t want = (threads + p.batch - 1) / p.batch;
    int64_t by_work = std::max<int64_t>(1, fma / min_task_fma);
    per_batch = std::min(want, by_work);
  }
  const bool split_rows = p.m >= p.n || (rows_first && p.m >= 16 * per_batch);
  const int64_t len = split_rows ? p.m : p.n;
  per_batch = std::min(per_batch, std::max<int64_t>(1, len / 16));
  // Panel edges on multiples of 16 keep the sgemm micro-kernels on full register tiles.
  int64_t step = (len + per_batch - 1) / per_batch;
  step = std::min(len, (step + 15) / 16 * 16);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t s = 0; s < len; s += step) {
      int64_t e = std::min(len, s + step);
      if (split_rows) {
        tiles.push_back({b, s, e, 0, p.n});
      } else {
        tiles.push_back({b, 0, p.m, s, e});
      }
    }
  }
  return tiles;
}

}  // namespace

void gemm(Context& ctx, Stream& s, const GemmProblem& p) {
  for (int64_t v : {p.m, p.n, p.k, p.lda, p.ldb, p.ldc}) {
    MESHRT_CHECK(v <= INT_MAX, "op gemm: a dimension or leading dimension ("
                                   << v << ") exceeds the BLAS 32-bit int range; m=" << p.m
                                   << " n=" << p.n << " k=" << p.k);
  }
  ThreadPool* tp = &pool(ctx);
  const int plan_threads = gemm_plan_threads(ctx);
  // --deterministic: larger panels (kernels/deterministic.h), as the thread count, fixed.
  const int64_t min_task = gemm_deterministic(ctx) ? ops::kDeterministicGemmMinFma : kMinTaskFma;
  // The task's operands do not own stream-ordered blocks (Tensor::stream_ref).
  GemmProblem held = p;
  for (Tensor* t : {&held.a, &held.b, &held.c, &held.bias}) *t = t->stream_ref(s);
  s.enqueue([tp, plan_threads, min_task, p = std::move(held)] {
    ensure_blas_single_threaded();
    std::function<void(const Tile&)> body;
    // oneDNN's 16-bit matmul, or its f32 one with bf16 products: row panels (plan_tiles'
    // rows_first).
    bool on_dnnl = false;
    const DType at = p.a.dtype(), ct = p.c.dtype();
    if (at == DType::f32) {
      on_dnnl = f32_bf16_math();
      body = [&p](const Tile& t) { tile_f32(p, t); };
    } else {
      dispatch_float(at, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (sizeof(T) == 2) {
          on_dnnl = std::is_same_v<T, f16> ? dnnl_f16_gemm_enabled() : dnnl_bf16_gemm_enabled();
          if (on_dnnl && ct == DType::f32) {
            body = [&p](const Tile& t) { tile_16_dnnl<T, float>(p, t); };
          } else if (on_dnnl) {
            body = [&p](const Tile& t) { tile_16_dnnl<T, T>(p, t); };
          } else if (ct == DType::f32) {
            body = [&p](const Tile& t) { tile_16<T, float>(p, t); };
          } else {
            body = [&p](const Tile& t) { tile_16<T, T>(p, t); };
          }
        }
      });
    }
    const std::vector<Tile> tiles = plan_tiles(p, plan_threads, on_dnnl, min_task);
    tp->run(static_cast<int64_t>(tiles.size()),
            [&](int64_t i) { body(tiles[static_cast<size_t>(i)]); });
  });
}

// The batch count and strides are in the problem: one entry point serves both.
void gemm_strided_batched(Context& ctx, Stream& s, const GemmProblem& p) { gemm(ctx, s, p); }

MESHRT_HOST_ISA_END
}  // namespace meshrt::kernels::host
