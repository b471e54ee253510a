// Internal: the CUDA attention kernels' launchers, shared by the op entry points
// (attention.cu) and the per-dtype files that instantiate them (attention_reference_*.cu,
// flash_attention_*.cu), so each dtype's kernels compile in their own unit.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <type_traits>

#include "backends/cuda/runtime/cuda_check.h"
#include "runtime/half.h"

namespace meshrt::kernels::cuda {

// One attention call: bh heads of q [sq, d] against k / v [sk, d], all contiguous. A block of a
// sequence (attention_block_fwd / bwd; both kernels) sets delta = q_offset -
// kv_offset (causal: query i sees key j <= i + delta) and, doc-masked, the document ids
// q_doc [bh / heads, sq] and k_doc [bh / heads, sk] (query i sees key j only with equal ids).
struct AttnArgs {
  int64_t bh, sq, sk;
  int d;
  float scale;
  bool causal;
  int64_t delta = 0;
  int64_t heads = 1;
  const int32_t* q_doc = nullptr;
  const int32_t* k_doc = nullptr;
};

// Whether query row i of head bh sees key j (rows or keys past the end: false).
__device__ __forceinline__ bool attn_visible(const AttnArgs& a, int64_t bh, int64_t i, int64_t j) {
  if (i >= a.sq || j >= a.sk || (a.causal && j > i + a.delta)) return false;
  if (a.q_doc == nullptr) return true;
  const int64_t b = bh / a.heads;
  return a.q_doc[b * a.sq + i] == a.k_doc[b * a.sk + j];
}

// The keys [0, end) a causal query tile whose last row is q_last can see (0 when none).
__host__ __device__ inline int64_t attn_causal_key_end(const AttnArgs& a, int64_t q_last) {
  const int64_t end = q_last + 1 + a.delta;
  return end < 0 ? 0 : (end < a.sk ? end : a.sk);
}

// Today's kernels: f32 math on CUDA cores, any floating dtype, head_dim <= 256. The reference
// the flash kernels are checked against on the GPU.
template <class T>
void reference_attention_fwd(const AttnArgs& a, const T* q, const T* k, const T* v, T* out,
                             float* lse, cudaStream_t st);
// dvec[row] = dO_row . O_row (computed by the caller, shared by both backward paths).
template <class T>
void reference_attention_bwd(const AttnArgs& a, const T* q, const T* k, const T* v, const T* dout,
                             const float* lse, const float* dvec, T* dq, T* dk, T* dv,
                             cudaStream_t st);

// FlashAttention-2 on tensor cores (mma.sync m16n8k16, f32 accumulation): bf16 / f16 only,
// head_dim 64 or 128, every pointer 16-byte aligned (flash_supported).
template <class T>
void flash_attention_fwd(const AttnArgs& a, const T* q, const T* k, const T* v, T* out, float* lse,
                         cudaStream_t st);
template <class T>
void flash_attention_bwd(const AttnArgs& a, const T* q, const T* k, const T* v, const T* dout,
                         const float* lse, const float* dvec, T* dq, T* dk, T* dv, cudaStream_t st);

// Opts a kernel into more than 48 KiB of dynamic shared memory when it needs it.
template <class K>
void set_smem(K kernel, size_t bytes) {
  if (bytes > (size_t{48} << 10)) {
    MESHRT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
  }
}

// "bf16": the storage type's name, for launch errors.
template <class T>
constexpr const char* attn_dtype_name() {
  if constexpr (std::is_same_v<T, bf16>) {
    return "bf16";
  } else if constexpr (std::is_same_v<T, f16>) {
    return "f16";
  } else {
    return "f32";
  }
}

inline unsigned attn_tiles(int64_t n, int per) {
  return static_cast<unsigned>((n + per - 1) / per);
}

}  // namespace meshrt::kernels::cuda
