// bf16 and f32 GEMM tiles through oneDNN's matmul (see gemm_dnnl.h). Primitives are built once per
// tile shape and kept per thread (oneDNN's own cache would still rebuild the descriptor, ~5 us a
// call).
#include "kernels/host/gemm_dnnl.h"

#include <atomic>
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
#include <vector>

#include "runtime/half.h"
#endif

namespace meshrt::kernels::host {

namespace {

std::atomic<int64_t> reference_skips{0};

// MESHRT_HOST_BF16_GEMM / MESHRT_HOST_F16_GEMM: "auto" (default: oneDNN when the CPU has the
// dot products) or "f32" (always the convert-to-f32 sgemm path, e.g. to compare the two).
bool forced_f32(bool f16) {
  return env_choice(f16 ? "MESHRT_HOST_F16_GEMM" : "MESHRT_HOST_BF16_GEMM") == "f32";
}

}  // namespace

#if defined(MESHRT_HAVE_DNNL)

namespace {

using dnnl_dt = dnnl::memory::data_type;

bool isa_has(dnnl_cpu_isa_t want) {
  const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  return (isa & static_cast<unsigned>(want)) == static_cast<unsigned>(want);
}

// True when oneDNN has f16 matmul kernels for this CPU: oneDNN 3's AVX512-FP16 ones.
bool cpu_has_f16() {
#if DNNL_VERSION_MAJOR >= 3
  return isa_has(dnnl_cpu_isa_avx512_core_fp16);
#else
  return false;
#endif
}

// The ISA oneDNN runs at, by name (ONEDNN_MAX_CPU_ISA caps it).
std::string dnnl_isa_name() {
#if DNNL_VERSION_MAJOR >= 3
  if (isa_has(dnnl_cpu_isa_avx512_core_amx_fp16)) return "avx512_core_amx_fp16";
#endif
  if (isa_has(dnnl_cpu_isa_avx512_core_amx)) return "avx512_core_amx";
  if (cpu_has_f16()) return "avx512_core_fp16";
  if (isa_has(dnnl_cpu_isa_avx512_core_bf16)) return "avx512_core_bf16";
  if (isa_has(dnnl_cpu_isa_avx512_core)) return "avx512_core";
  if (isa_has(dnnl_cpu_isa_avx2)) return "avx2";
  return "below avx2";
}

struct Decision {
  bool enabled = false;
  std::string why;
};

Decision decide(bool f16) {
  Decision r;
  const char* name = f16 ? "f16" : "bf16";
  const std::string lib = dnnl_description();
  const bool hw = f16 ? cpu_has_f16() : isa_has(dnnl_cpu_isa_avx512_core_bf16);
  if (forced_f32(f16)) {
    r.why = std::string("f32 sgemm on converted panels (") +
            (f16 ? "MESHRT_HOST_F16_GEMM" : "MESHRT_HOST_BF16_GEMM") + "=f32); " + lib;
  } else if (!hw) {
    r.why = "f32 sgemm on converted panels: " + lib + " has no " + name + " matmul kernels here" +
            (f16 && DNNL_VERSION_MAJOR < 3 ? " (oneDNN 3 has them for AVX512-FP16 CPUs)" : "");
  } else {
    r.enabled = true;
    r.why = std::string(name) + " matmul of " + lib + ", f32 accumulation";
  }
  return r;
}

const Decision& decision(bool f16) {
  static const Decision bf = decide(false);
  static const Decision hf = decide(true);
  return f16 ? hf : bf;
}

struct Key {
  int64_t m, n, k, lda, ldb, ldc;
  uint32_t alpha_bits, beta_bits;
  bool ta, tb, c16, bias, ab_f32, f16, bf16_math;
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
  float alpha = 1.f;  // oneDNN 3: the weights' scale, passed at execution (kept at a fixed address)
  bool reference = false;  // oneDNN picked its reference implementation: never run it
  bool bias_f32 = false;   // the 16-bit bias is passed converted to f32 (see make_prim)
};

struct ThreadState {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream st{eng};
  std::unordered_map<Key, Prim, KeyHash> prims;
  std::vector<float> bias;  // Prim::bias_f32: the tile's bias converted
  ThreadState() {
    // oneDNN (Debian's and the PyPI build) threads with OpenMP; each caller is its own OpenMP
    // initial thread, so this keeps this thread's oneDNN calls on it alone.
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
  k.c16 = t.c16;
  k.bias = t.bias != nullptr;
  k.ab_f32 = t.ab_f32;
  k.f16 = t.f16;
  k.bf16_math = t.ab_f32 && t.bf16_math;
  return k;
}

dnnl_dt in_type(const DnnlTile& t) {
  if (t.ab_f32) return dnnl_dt::f32;
  return t.f16 ? dnnl_dt::f16 : dnnl_dt::bf16;
}
dnnl_dt out_type(const DnnlTile& t) { return t.c16 && !t.ab_f32 ? in_type(t) : dnnl_dt::f32; }
const char* type_name(dnnl_dt d) {
  return d == dnnl_dt::f32 ? "f32" : d == dnnl_dt::f16 ? "f16" : "bf16";
}

// The tile's attributes: bf16 products, beta as a sum post-op, alpha as the weights' scale.
dnnl::primitive_attr make_attr(const DnnlTile& t) {
  dnnl::primitive_attr attr;
  if (t.ab_f32 && t.bf16_math) attr.set_fpmath_mode(dnnl::fpmath_mode::bf16);
  if (t.beta != 0.f) {
    dnnl::post_ops po;
    po.append_sum(t.beta);
    attr.set_post_ops(po);
  }
#if DNNL_VERSION_MAJOR >= 3
  if (t.alpha != 1.f) attr.set_scales_mask(DNNL_ARG_WEIGHTS, 0);
#else
  if (t.alpha != 1.f) attr.set_output_scales(0, {t.alpha});
#endif
  return attr;
}

// dst = alpha * (A B) [+ bias] + beta * dst; the caller never combines alpha != 1 with a bias
// (oneDNN 2's output scale would scale the bias too). oneDNN 3 takes alpha as the weights' scale.
void make_prim(ThreadState& s, const DnnlTile& t, Prim& p) {
  using dims = dnnl::memory::dims;
  const dnnl_dt in = in_type(t), cdt = out_type(t);
  p.a = dnnl::memory::desc(dims{t.m, t.k}, in, t.trans_a ? dims{1, t.lda} : dims{t.lda, 1});
  p.b = dnnl::memory::desc(dims{t.k, t.n}, in, t.trans_b ? dims{1, t.ldb} : dims{t.ldb, 1});
  p.c = dnnl::memory::desc(dims{t.m, t.n}, cdt, dims{t.ldc, 1});
  if (t.bias) p.bias = dnnl::memory::desc(dims{1, t.n}, cdt, dims{t.n, 1});
  p.alpha = t.alpha;
  const dnnl::primitive_attr attr = make_attr(t);
#if DNNL_VERSION_MAJOR >= 3
  auto describe = [&] {
    return t.bias ? dnnl::matmul::primitive_desc(s.eng, p.a, p.b, p.bias, p.c, attr)
                  : dnnl::matmul::primitive_desc(s.eng, p.a, p.b, p.c, attr);
  };
  dnnl::matmul::primitive_desc pd = describe();
  // oneDNN 3.2's AVX512-FP16 matmul takes an f16 bias only in its reference kernel, and an f32
  // one in its brgemm kernel: the same sums, as the bias is added to the f32 accumulator.
  if (t.bias && cdt != dnnl_dt::f32 && std::strncmp(pd.impl_info_str(), "ref", 3) == 0) {
    const dnnl::memory::desc own = p.bias;
    p.bias = dnnl::memory::desc(dims{1, t.n}, dnnl_dt::f32, dims{t.n, 1});
    dnnl::matmul::primitive_desc with_f32 = describe();
    p.bias_f32 = std::strncmp(with_f32.impl_info_str(), "ref", 3) != 0;
    if (p.bias_f32) {
      pd = with_f32;
    } else {
      p.bias = own;
    }
  }
#else
  const dnnl::matmul::desc d =
      t.bias ? dnnl::matmul::desc(p.a, p.b, p.bias, p.c) : dnnl::matmul::desc(p.a, p.b, p.c);
  const dnnl::matmul::primitive_desc pd(d, attr, s.eng);
#endif
  p.mm = dnnl::matmul(pd);
  p.reference = std::strncmp(pd.impl_info_str(), "ref", 3) == 0;
}

}  // namespace

bool dnnl_built() { return true; }

bool dnnl_avx512() {
  static const bool on = isa_has(dnnl_cpu_isa_avx512_core);
  return on;
}

int64_t dnnl_reference_skips() { return reference_skips.load(std::memory_order_relaxed); }

std::string dnnl_description() {
  const dnnl_version_t* v = dnnl_version();
  std::ostringstream os;
  os << "oneDNN " << v->major << "." << v->minor << "." << v->patch << " (CPU ISA "
     << dnnl_isa_name() << ")";
  return os.str();
}

std::string dnnl_f32_bf16_impl() {
  static const std::string impl = [] {
    using dims = dnnl::memory::dims;
    const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    const dnnl::memory::desc md(dims{256, 256}, dnnl_dt::f32, dims{256, 1});
    auto impl_of = [&](bool bf16) {
      dnnl::primitive_attr attr;
      if (bf16) attr.set_fpmath_mode(dnnl::fpmath_mode::bf16);
#if DNNL_VERSION_MAJOR >= 3
      const dnnl::matmul::primitive_desc pd(eng, md, md, md, attr);
#else
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, md), attr, eng);
#endif
      return std::string(pd.impl_info_str());
    };
    try {
      const std::string with = impl_of(true);
      return with == impl_of(false) ? std::string() : with;
    } catch (const dnnl::error& e) {
      MESHRT_CHECK(false, "oneDNN could not describe a 256^3 f32 matmul (status "
                              << static_cast<int>(e.status) << ": " << e.what()
                              << "); MESHRT_HOST_F32_GEMM=openblas avoids oneDNN");
    }
    return std::string();
  }();
  return impl;
}

bool dnnl_bf16_gemm_enabled() { return decision(false).enabled; }
bool dnnl_f16_gemm_enabled() { return decision(true).enabled; }

bool dnnl_tile(const DnnlTile& t) {
  MESHRT_CHECK(t.alpha == 1.f || t.bias == nullptr,
               "internal: oneDNN tile with alpha=" << t.alpha << " and a bias");
  try {
    ThreadState& s = state();
    const Key k = key_of(t);
    auto it = s.prims.find(k);
    if (it == s.prims.end()) {
      if (s.prims.size() >= 512) s.prims.clear();  // bound the cache on shape-churning callers
      it = s.prims.try_emplace(k).first;
      try {
        make_prim(s, t, it->second);
      } catch (...) {
        s.prims.erase(it);
        throw;
      }
    }
    const Prim& p = it->second;
    if (p.reference) {
      reference_skips.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    dnnl::memory am(p.a, s.eng, const_cast<void*>(t.a));
    dnnl::memory bm(p.b, s.eng, const_cast<void*>(t.b));
    dnnl::memory cm(p.c, s.eng, t.c);
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    if (t.bias) {
      const void* bias = t.bias;
      if (p.bias_f32) {
        s.bias.resize(static_cast<size_t>(t.n));
        const auto* h = static_cast<const uint16_t*>(t.bias);
        for (int64_t j = 0; j < t.n; ++j) {
          s.bias[static_cast<size_t>(j)] = t.f16 ? f16_bits_to_f32(h[j]) : bf16_bits_to_f32(h[j]);
        }
        bias = s.bias.data();
      }
      args.emplace(DNNL_ARG_BIAS, dnnl::memory(p.bias, s.eng, const_cast<void*>(bias)));
    }
#if DNNL_VERSION_MAJOR >= 3
    if (t.alpha != 1.f) {
      const dnnl::memory::desc sd(dnnl::memory::dims{1}, dnnl_dt::f32, dnnl::memory::dims{1});
      args.emplace(DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS,
                   dnnl::memory(sd, s.eng, const_cast<float*>(&p.alpha)));
    }
#endif
    p.mm.execute(s.st, args);
    s.st.wait();
    return true;
  } catch (const dnnl::error& e) {
    MESHRT_CHECK(false, "op gemm: oneDNN "
                            << type_name(in_type(t)) << " matmul failed (status "
                            << static_cast<int>(e.status) << ": " << e.what() << ") on m=" << t.m
                            << " n=" << t.n << " k=" << t.k << " lda=" << t.lda << " ldb=" << t.ldb
                            << " ldc=" << t.ldc << " trans_a=" << t.trans_a
                            << " trans_b=" << t.trans_b << " out=" << type_name(out_type(t)) << "; "
                            << (t.ab_f32 ? "MESHRT_HOST_F32_GEMM=openblas"
                                : t.f16  ? "MESHRT_HOST_F16_GEMM=f32"
                                         : "MESHRT_HOST_BF16_GEMM=f32")
                            << " uses OpenBLAS instead");
  }
  return false;
}

std::string host_gemm_16bit_info() {
  return "bf16: " + decision(false).why + "; f16: " + decision(true).why;
}

#else  // no oneDNN in this build

bool dnnl_built() { return false; }
bool dnnl_avx512() { return false; }

int64_t dnnl_reference_skips() { return reference_skips.load(std::memory_order_relaxed); }

std::string dnnl_description() { return "no oneDNN (built without it: install libdnnl-dev)"; }

std::string dnnl_f32_bf16_impl() { return ""; }
bool dnnl_bf16_gemm_enabled() { return false; }
bool dnnl_f16_gemm_enabled() { return false; }

bool dnnl_tile(const DnnlTile&) {
  MESHRT_CHECK(false, "internal: oneDNN tile called in a build without oneDNN");
  return false;
}

std::string host_gemm_16bit_info() {
  (void)forced_f32(false);
  return "bf16 and f16: f32 sgemm on converted panels (built without oneDNN: install libdnnl-dev "
         "and reconfigure)";
}

#endif

}  // namespace meshrt::kernels::host

namespace meshrt::ops {
std::string host_gemm_16bit_info() { return kernels::host::host_gemm_16bit_info(); }
}  // namespace meshrt::ops
