// bf16 and f32 GEMM tiles through oneDNN's matmul (see gemm_dnnl.h). Primitives are built once per
// tile shape and kept per thread (oneDNN's own cache would still rebuild the descriptor, ~5 us a
// call).
#include "kernels/host/gemm_dnnl.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>

#include "kernels/ops.h"
#include "runtime/env.h"
#include "runtime/error.h"

#if defined(MESHRT_HAVE_DNNL)
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#endif

namespace meshrt::kernels::host {

namespace {

// MESHRT_HOST_BF16_GEMM: "auto" (default: oneDNN when the CPU has bf16 dot products) or "f32"
// (always the convert-to-f32 sgemm path, e.g. to compare the two).
bool forced_f32() { return env_choice("MESHRT_HOST_BF16_GEMM") == "f32"; }

}  // namespace

#if defined(MESHRT_HAVE_DNNL)

namespace {

// The ISA oneDNN runs at, by name (ONEDNN_MAX_CPU_ISA caps it).
std::string dnnl_isa_name() {
  const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  auto has = [isa](dnnl_cpu_isa_t want) {
    return (isa & static_cast<unsigned>(want)) == static_cast<unsigned>(want);
  };
  if (has(dnnl_cpu_isa_avx512_core_amx)) return "avx512_core_amx";
  if (has(dnnl_cpu_isa_avx512_core_bf16)) return "avx512_core_bf16";
  if (has(dnnl_cpu_isa_avx512_core)) return "avx512_core";
  if (has(dnnl_cpu_isa_avx2)) return "avx2";
  return "below avx2";
}

bool cpu_has_bf16() {
  const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const auto want = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
  return (isa & want) == want;
}

struct Decision {
  bool enabled = false;
  std::string why;
};

const Decision& decision() {
  static const Decision d = [] {
    Decision r;
    const bool hw = cpu_has_bf16();
    const std::string lib = dnnl_description();
    if (forced_f32()) {
      r.why = "f32 sgemm on converted panels (MESHRT_HOST_BF16_GEMM=f32); " + lib;
    } else if (!hw) {
      r.why = "f32 sgemm on converted panels: " + lib + " reports no bf16 dot products";
    } else {
      r.enabled = true;
      r.why = "bf16 matmul of " + lib + ", f32 accumulation";
    }
    return r;
  }();
  return d;
}

struct Key {
  int64_t m, n, k, lda, ldb, ldc;
  uint32_t alpha_bits, beta_bits;
  bool ta, tb, c_bf16, bias, ab_f32;
  bool operator==(const Key& o) const { return std::memcmp(this, &o, sizeof(Key)) == 0; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 1469598103934665603ull;
    const auto* p = reinterpret_cast<const unsigned char*>(&k);
    for (size_t i = 0; i < sizeof(Key); ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
  }
};

struct Prim {
  dnnl::matmul mm;
  dnnl::memory::desc a, b, c, bias;
};

struct ThreadState {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream st{eng};
  std::unordered_map<Key, Prim, KeyHash> prims;
  ThreadState() {
    // oneDNN (Debian's build) threads with OpenMP; each caller is its own OpenMP initial thread,
    // so this keeps this thread's oneDNN calls on it alone.
    omp_set_num_threads(1);
  }
};

ThreadState& state() {
  thread_local ThreadState s;
  return s;
}

Key key_of(const DnnlTile& t) {
  Key k;
  std::memset(&k, 0, sizeof(k));  // padding bytes take part in the hash and compare
  k.m = t.m;
  k.n = t.n;
  k.k = t.k;
  k.lda = t.lda;
  k.ldb = t.ldb;
  k.ldc = t.ldc;
  std::memcpy(&k.alpha_bits, &t.alpha, 4);
  std::memcpy(&k.beta_bits, &t.beta, 4);
  k.ta = t.trans_a;
  k.tb = t.trans_b;
  k.c_bf16 = t.c_bf16;
  k.bias = t.bias != nullptr;
  k.ab_f32 = t.ab_f32;
  return k;
}

Prim make_prim(ThreadState& s, const DnnlTile& t) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const dt cdt = t.c_bf16 && !t.ab_f32 ? dt::bf16 : dt::f32;
  const dt in = t.ab_f32 ? dt::f32 : dt::bf16;
  Prim p;
  p.a = dnnl::memory::desc(dims{t.m, t.k}, in, t.trans_a ? dims{1, t.lda} : dims{t.lda, 1});
  p.b = dnnl::memory::desc(dims{t.k, t.n}, in, t.trans_b ? dims{1, t.ldb} : dims{t.ldb, 1});
  p.c = dnnl::memory::desc(dims{t.m, t.n}, cdt, dims{t.ldc, 1});
  if (t.bias) p.bias = dnnl::memory::desc(dims{1, t.n}, cdt, dims{t.n, 1});
  dnnl::primitive_attr attr;
  // dst = alpha * (A B) [+ bias] + beta * dst; the caller never combines alpha != 1 with a bias
  // (oneDNN would scale the bias too).
  if (t.alpha != 1.f) attr.set_output_scales(0, {t.alpha});
  if (t.beta != 0.f) {
    dnnl::post_ops po;
    po.append_sum(t.beta);
    attr.set_post_ops(po);
  }
  const dnnl::matmul::desc d =
      t.bias ? dnnl::matmul::desc(p.a, p.b, p.bias, p.c) : dnnl::matmul::desc(p.a, p.b, p.c);
  p.mm = dnnl::matmul(dnnl::matmul::primitive_desc(d, attr, s.eng));
  return p;
}

}  // namespace

bool dnnl_built() { return true; }

std::string dnnl_description() {
  const dnnl_version_t* v = dnnl_version();
  std::ostringstream os;
  os << "oneDNN " << v->major << "." << v->minor << "." << v->patch << " (CPU ISA "
     << dnnl_isa_name() << ")";
  return os.str();
}

bool dnnl_bf16_gemm_enabled() { return decision().enabled; }

void dnnl_tile(const DnnlTile& t) {
  MESHRT_CHECK(t.alpha == 1.f || t.bias == nullptr,
               "internal: oneDNN tile with alpha=" << t.alpha << " and a bias");
  try {
    ThreadState& s = state();
    const Key k = key_of(t);
    auto it = s.prims.find(k);
    if (it == s.prims.end()) {
      if (s.prims.size() >= 512) s.prims.clear();  // bound the cache on shape-churning callers
      it = s.prims.emplace(k, make_prim(s, t)).first;
    }
    const Prim& p = it->second;
    dnnl::memory am(p.a, s.eng, const_cast<void*>(t.a));
    dnnl::memory bm(p.b, s.eng, const_cast<void*>(t.b));
    dnnl::memory cm(p.c, s.eng, t.c);
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    if (t.bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(p.bias, s.eng, const_cast<void*>(t.bias)));
    p.mm.execute(s.st, args);
    s.st.wait();
  } catch (const dnnl::error& e) {
    MESHRT_CHECK(false,
                 "op gemm: oneDNN "
                     << (t.ab_f32 ? "f32" : "bf16") << " matmul failed (status "
                     << static_cast<int>(e.status) << ": " << e.what() << ") on m=" << t.m
                     << " n=" << t.n << " k=" << t.k << " lda=" << t.lda << " ldb=" << t.ldb
                     << " ldc=" << t.ldc << " trans_a=" << t.trans_a << " trans_b=" << t.trans_b
                     << " out=" << (t.c_bf16 && !t.ab_f32 ? "bf16" : "f32") << "; "
                     << (t.ab_f32 ? "MESHRT_HOST_F32_GEMM=openblas" : "MESHRT_HOST_BF16_GEMM=f32")
                     << " uses OpenBLAS instead");
  }
}

std::string host_gemm_16bit_info() {
  // oneDNN 2.x has no f16 matmul on CPUs (its f16 CPU kernels need avx512_core_fp16, from 3.x).
  return "bf16: " + decision().why + "; f16: f32 sgemm on converted panels (no f16 kernels here)";
}

#else  // no oneDNN in this build

bool dnnl_built() { return false; }

std::string dnnl_description() { return "no oneDNN (built without it: install libdnnl-dev)"; }

bool dnnl_bf16_gemm_enabled() { return false; }

void dnnl_tile(const DnnlTile&) {
  MESHRT_CHECK(false, "internal: oneDNN tile called in a build without oneDNN");
}

std::string host_gemm_16bit_info() {
  (void)forced_f32();
  return "bf16 and f16: f32 sgemm on converted panels (built without oneDNN: install libdnnl-dev "
         "and reconfigure)";
}

#endif

}  // namespace meshrt::kernels::host

namespace meshrt::ops {
std::string host_gemm_16bit_info() { return kernels::host::host_gemm_16bit_info(); }
}  // namespace meshrt::ops
