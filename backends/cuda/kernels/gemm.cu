// CUDA GEMM through cuBLASLt: per-rank handle, plans (descriptors + the heuristic's algorithms,
// tried in order until one runs) cached per problem shape, workspace per stream from the caching
// allocator, bias in the epilogue (or a separate kernel when the bias is under 16-byte aligned).
#include <cublasLt.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/cublas_check.h"
#include "backends/cuda/kernels/gemm_version.h"
#include "kernels/gemm_algos.h"
#include "kernels/ops.h"
#include "runtime/env.h"

namespace meshrt::kernels::cuda {

namespace {

// 32 MiB: what NVIDIA recommends for Hopper so that every cuBLASLt kernel is eligible.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// Heuristic results asked for: the fallbacks when the preferred algorithm refuses to run.
constexpr int kMaxAlgos = 8;

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      break;
  }
  MESHRT_FAIL("op gemm: dtype " << dtype_name(t) << " has no cuBLASLt type");
}

// Largest power of two (<= 256) dividing the address: cuBLASLt kernels need aligned operands.
uint32_t alignment(const void* p) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al >>= 1;
  return al;
}

// MESHRT_CUBLAS_TF32=1 lets f32 GEMMs use TF32 tensor cores (off: exact f32, like the host).
bool allow_tf32() {
  static const bool v = [] { return env_switch("MESHRT_CUBLAS_TF32"); }();
  return v;
}

using PlanKey =
    std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
               int64_t, int64_t, int, int, int, uint32_t, uint32_t, uint32_t, uint32_t>;

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  // Wrapped: nvcc's front end fails on a std::vector of cuBLASLt's unnamed-struct typedef.
  struct Algo {
    cublasLtMatmulAlgo_t algo;
  };
  std::vector<Algo> algos;  // the heuristic's results, best first
  std::vector<int> order;   // the usable ones
  size_t pos = 0;           // position in `order` of the one that last ran
  bool bias_epilogue = false;
  std::string problem;  // for errors
  ~Plan() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// One rank's cuBLASLt state (kept in Context::state).
struct LtState {
  std::mutex mu;
  cublasLtHandle_t handle = nullptr;
  std::shared_ptr<Allocator> alloc;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
  std::map<cudaStream_t, void*> workspaces;
  ~LtState() {
    for (auto& [st, p] : workspaces) alloc->deallocate(p);
    plans.clear();
    if (handle) cublasLtDestroy(handle);
  }
};

LtState& lt_state(Context& ctx) {
  return ctx.state<LtState>([&ctx] {
    auto s = std::make_shared<LtState>();
    MESHRT_CUBLAS_CHECK(cublasLtCreate(&s->handle));
    s->alloc = ctx.allocator_ptr();
    return s;
  });
}

void set_layout_batch(cublasLtMatrixLayout_t l, int64_t batch, int64_t stride) {
  if (batch <= 1) return;
  int32_t b = static_cast<int32_t>(batch);
  MESHRT_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof(b)));
  MESHRT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
      l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our B and
// its "B" is our A, each stored column-major as the transpose of our row-major storage.
std::unique_ptr<Plan> make_plan(LtState& st, const GemmProblem& p, uint32_t al_a, uint32_t al_b,
                                uint32_t al_c, bool bias_epilogue) {
  auto plan = std::make_unique<Plan>();
  const DType in = p.a.dtype(), out = p.c.dtype();
  plan->bias_epilogue = bias_epilogue;
  plan->problem =
      gemm_problem_str(p.m, p.n, p.k, p.batch, p.trans_a, p.trans_b, dtype_name(in),
                       dtype_name(out), p.bias.defined() ? dtype_name(p.bias.dtype()) : "");
  const cublasComputeType_t compute =
      (in == DType::f32 && allow_tf32()) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  MESHRT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, compute, CUDA_R_32F));
  cublasOperation_t op_lt_a = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_lt_b = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  MESHRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                     &op_lt_a, sizeof(op_lt_a)));
  MESHRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                     &op_lt_b, sizeof(op_lt_b)));
  if (bias_epilogue) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    MESHRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                       &epi, sizeof(epi)));
    cudaDataType_t bt = cuda_type(p.bias.dtype());
    MESHRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
  // Column-major shapes (rows, cols, ld) of the stored operands.
  const uint64_t a_rows = static_cast<uint64_t>(p.trans_b ? p.k : p.n);
  const uint64_t a_cols = static_cast<uint64_t>(p.trans_b ? p.n : p.k);
  const uint64_t b_rows = static_cast<uint64_t>(p.trans_a ? p.m : p.k);
  const uint64_t b_cols = static_cast<uint64_t>(p.trans_a ? p.k : p.m);
  MESHRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->la, cuda_type(in), a_rows, a_cols, p.ldb));
  MESHRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lb, cuda_type(in), b_rows, b_cols, p.lda));
  MESHRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(
      &plan->lc, cuda_type(out), static_cast<uint64_t>(p.n), static_cast<uint64_t>(p.m), p.ldc));
  set_layout_batch(plan->la, p.batch, p.stride_b);
  set_layout_batch(plan->lb, p.batch, p.stride_a);
  set_layout_batch(plan->lc, p.batch, p.stride_c);

  cublasLtMatmulPreference_t pref = nullptr;
  MESHRT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                  decltype(&cublasLtMatmulPreferenceDestroy)>
      pref_guard(pref, &cublasLtMatmulPreferenceDestroy);
  uint64_t ws = kWorkspaceBytes;
  MESHRT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // Our A is cuBLASLt's B and vice versa.
  MESHRT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_b, sizeof(al_b)));
  MESHRT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_a, sizeof(al_a)));
  MESHRT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  MESHRT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));

  cublasLtMatmulHeuristicResult_t results[kMaxAlgos] = {};
  int found = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(st.handle, plan->desc, plan->la, plan->lb, plan->lc, plan->lc,
                                     pref, kMaxAlgos, results, &found);
  MESHRT_CHECK(hs == CUBLAS_STATUS_SUCCESS, "op gemm: cuBLASLt heuristic failed for "
                                                << plan->problem << ": "
                                                << cublasGetStatusName(hs));
  std::vector<AlgoCandidate> cands;
  for (int i = 0; i < found; ++i) {
    const bool fits = results[i].workspaceSize <= kWorkspaceBytes;
    AlgoCandidate c;
    c.usable = results[i].state == CUBLAS_STATUS_SUCCESS && fits;
    c.state = fits ? cublasGetStatusName(results[i].state) : "workspace too large";
    cands.push_back(std::move(c));
    plan->algos.push_back(Plan::Algo{results[i].algo});
  }
  plan->order = usable_algos(cands, plan->problem);
  return plan;
}

// C = beta * C (+ bias) when k == 0 (cuBLASLt does not take empty inner dimensions).
template <class CT>
__global__ void gemm_k0_kernel(CT* c, const CT* __restrict__ bias, int64_t m, int64_t n,
                               int64_t ldc, int64_t stride_c, int64_t batch, float beta) {
  const int64_t total = batch * m * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / (m * n), r = (i / n) % m, j = i % n;
    CT* e = c + b * stride_c + r * ldc;
    float v = beta == 0.f ? 0.f : beta * load_f32(e, j);
    if (bias) v += load_f32(bias, j);
    store_f32(e, j, v);
  }
}

// C[b, r, :] += bias: the bias of a GEMM whose bias is too little aligned for the epilogue.
template <class CT>
__global__ void add_bias_kernel(CT* c, const CT* __restrict__ bias, int64_t m, int64_t n,
                                int64_t ldc, int64_t stride_c, int64_t batch) {
  const int64_t total = batch * m * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / (m * n), r = (i / n) % m, j = i % n;
    CT* e = c + b * stride_c + r * ldc;
    store_f32(e, j, load_f32(e, j) + load_f32(bias, j));
  }
}

}  // namespace

void gemm(Context& ctx, Stream& s, const GemmProblem& p) {
  DeviceGuard guard(s.device().index);
  const cudaStream_t st = native(s);
  if (p.k == 0) {
    dispatch_float(p.c.dtype(), [&](auto tag) {
      using CT = decltype(tag);
      gemm_k0_kernel<CT><<<grid_for(p.batch * p.m * p.n), kThreads, 0, st>>>(
          p.c.data<CT>(), p.bias.defined() ? p.bias.data<CT>() : nullptr, p.m, p.n, p.ldc,
          p.stride_c, p.batch, p.beta);
    });
    MESHRT_CUDA_CHECK_LAUNCH("gemm_k0");
    return;
  }
  MESHRT_CHECK(p.batch <= INT32_MAX,
               "op gemm_strided_batched: batch " << p.batch << " exceeds int32");
  LtState& lt = lt_state(ctx);
  const void* bias_ptr = p.bias.defined() ? p.bias.data_ptr() : nullptr;
  const uint32_t al_a = alignment(p.a.data_ptr()), al_b = alignment(p.b.data_ptr());
  const uint32_t al_c = alignment(p.c.data_ptr());
  const bool bias_epilogue = bias_in_epilogue(bias_ptr);
  PlanKey key{p.trans_a,
              p.trans_b,
              p.m,
              p.n,
              p.k,
              p.lda,
              p.ldb,
              p.ldc,
              p.batch,
              p.stride_a,
              p.stride_b,
              p.stride_c,
              static_cast<int>(p.a.dtype()),
              static_cast<int>(p.c.dtype()),
              p.bias.defined() ? static_cast<int>(p.bias.dtype()) : -1,
              al_a,
              al_b,
              al_c,
              bias_epilogue ? 1u : 0u};
  std::lock_guard<std::mutex> lk(lt.mu);
  auto it = lt.plans.find(key);
  if (it == lt.plans.end()) {
    it = lt.plans.emplace(key, make_plan(lt, p, al_a, al_b, al_c, bias_epilogue)).first;
  }
  Plan& plan = *it->second;
  void*& ws = lt.workspaces[st];
  if (!ws) ws = lt.alloc->allocate(kWorkspaceBytes, &s);
  if (plan.bias_epilogue) {
    MESHRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &bias_ptr, sizeof(bias_ptr)));
  }
  const float alpha = p.alpha, beta = p.beta;
  plan.pos = run_with_fallback(
      plan.order, plan.pos,
      [&](int i) -> std::string {
        const cublasStatus_t r =
            cublasLtMatmul(lt.handle, plan.desc, &alpha, p.b.data_ptr(), plan.la, p.a.data_ptr(),
                           plan.lb, &beta, p.c.data_ptr(), plan.lc, p.c.data_ptr(), plan.lc,
                           &plan.algos[static_cast<size_t>(i)].algo, ws, kWorkspaceBytes, st);
        return r == CUBLAS_STATUS_SUCCESS ? std::string() : cublasGetStatusName(r);
      },
      plan.problem);
  if (bias_ptr && !plan.bias_epilogue) {
    // Rounds twice for 16-bit outputs (GEMM result, then the sum), where the epilogue rounds once.
    dispatch_float(p.c.dtype(), [&](auto tag) {
      using CT = decltype(tag);
      add_bias_kernel<CT><<<grid_for(p.batch * p.m * p.n), kThreads, 0, st>>>(
          p.c.data<CT>(), p.bias.data<CT>(), p.m, p.n, p.ldc, p.stride_c, p.batch);
    });
    MESHRT_CUDA_CHECK_LAUNCH("gemm add_bias");
  }
}

// The batch count and strides are in the problem: one entry point serves both.
void gemm_strided_batched(Context& ctx, Stream& s, const GemmProblem& p) { gemm(ctx, s, p); }

}  // namespace meshrt::kernels::cuda

namespace meshrt::kernels::cuda {

std::string gemm_library_version() {
  // cublasLtGetVersion: major * 10000 + minor * 100 + patch.
  const size_t v = cublasLtGetVersion();
  return "cuBLASLt " + std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." +
         std::to_string(v % 100);
}

}  // namespace meshrt::kernels::cuda
