// The host backend's op table: the instruction-set variant of the loop files (host/isa.h) that
// this CPU runs best, bound once from the op table to that variant's functions.
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>

#include "kernels/backend.h"
#include "runtime/env.h"
#include "runtime/error.h"

namespace meshrt::kernels::host {

// The ops the host kernels leave out, per op the dtypes (none: every op of the table, for its
// dtypes). MESHRT_BIND_BACKEND_OPS reads it.
constexpr DTypeSet gaps(Op) { return {}; }

// Each variant's op functions (defined in the loop files compiled for it, declared from the op
// table) and the function binding them into a table.
#define MESHRT_HOST_VARIANT_REGISTRY(ns)                    \
  namespace ns {                                            \
  MESHRT_DECLARE_BACKEND_OPS                                \
  void register_all(OpTable& b) { MESHRT_BIND_BACKEND_OPS } \
  }
MESHRT_HOST_VARIANT_REGISTRY(isa_baseline)
#if defined(MESHRT_HOST_ISA_HAVE_AVX2)
MESHRT_HOST_VARIANT_REGISTRY(isa_avx2)
#define MESHRT_AVX2_REGISTER_ &isa_avx2::register_all
#else
#define MESHRT_AVX2_REGISTER_ nullptr
#endif
#if defined(MESHRT_HOST_ISA_HAVE_AVX512)
MESHRT_HOST_VARIANT_REGISTRY(isa_avx512)
#define MESHRT_AVX512_REGISTER_ &isa_avx512::register_all
#else
#define MESHRT_AVX512_REGISTER_ nullptr
#endif

constexpr HostIsa kAll[] = {HostIsa::baseline, HostIsa::avx2, HostIsa::avx512};

namespace {

// Per variant, in HostIsa order: its name and its registration (null when not built).
struct Variant {
  const char* name;
  void (*register_all)(OpTable&);
};
constexpr Variant kVariants[] = {{"baseline", &isa_baseline::register_all},
                                 {"avx2", MESHRT_AVX2_REGISTER_},
                                 {"avx512", MESHRT_AVX512_REGISTER_}};
const Variant& variant(HostIsa isa) { return kVariants[static_cast<int>(isa)]; }

bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
#if defined(__clang__) && __clang_major__ < 16
  // clang before 16 has no "f16c" for this builtin (the sanitizer / fuzz builds use clang); every
  // CPU with AVX2 and FMA has F16C (Haswell and later, every Zen).
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("bmi2");
#else
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
#endif
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
  // The builtins also check that the OS saves the vector state (XCR0).
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd");
#else
  return false;
#endif
}
}  // namespace

const char* host_isa_name(HostIsa isa) { return variant(isa).name; }

HostIsa parse_host_isa_cap(const char* value) {
  const std::string v = value ? value : "";
  if (v.empty() || v == "auto") return HostIsa::avx512;
  for (HostIsa isa : kAll)
    if (v == host_isa_name(isa)) return isa;
  MESHRT_FAIL("MESHRT_HOST_ISA=" << v
                                 << " is not an instruction set of the host kernels; use auto, "
                                    "baseline (SSE2), avx2 (AVX2, FMA, F16C) or avx512 (AVX-512 "
                                    "F/VL/BW/DQ/CD)");
}

bool host_isa_built(HostIsa isa) { return variant(isa).register_all != nullptr; }

bool host_isa_runs_here(HostIsa isa) {
  switch (isa) {
    case HostIsa::baseline:
      return true;
    case HostIsa::avx2:
      return cpu_has_avx2();
    case HostIsa::avx512:
      return cpu_has_avx512();
  }
  return false;
}

HostIsa choose_host_isa(HostIsa cap) {
  HostIsa best = HostIsa::baseline;
  for (HostIsa isa : kAll)
    if (static_cast<int>(isa) <= static_cast<int>(cap) && host_isa_built(isa) &&
        host_isa_runs_here(isa))
      best = isa;
  return best;
}

HostIsa host_isa() {
  static const HostIsa isa = choose_host_isa(parse_host_isa_cap(env_or("MESHRT_HOST_ISA").c_str()));
  return isa;
}

const OpTable& backend(HostIsa isa) {
  MESHRT_CHECK(host_isa_built(isa), "host kernels: the " << host_isa_name(isa)
                                                         << " variant is not in this build "
                                                            "(kernels/CMakeLists.txt, "
                                                            "MESHRT_HOST_ISA_VARIANTS)");
  MESHRT_CHECK(host_isa_runs_here(isa),
               "host kernels: this CPU cannot run the " << host_isa_name(isa) << " variant");
  // Bound on first use, and only for a variant this CPU runs.
  static std::once_flag once[std::size(kAll)];
  static std::optional<OpTable> tables[std::size(kAll)];
  const auto i = static_cast<size_t>(isa);
  std::call_once(once[i], [&] {
    tables[i].emplace("host");
    variant(isa).register_all(*tables[i]);
  });
  return *tables[i];
}

const OpTable& backend() {
  static const OpTable& be = backend(host_isa());
  return be;
}

}  // namespace meshrt::kernels::host

namespace meshrt::ops {
std::string host_isa_info() {
  using namespace kernels::host;
  std::string built, runs;
  for (HostIsa isa : kAll) {
    if (host_isa_built(isa)) built += std::string(built.empty() ? "" : ", ") + host_isa_name(isa);
    if (host_isa_runs_here(isa)) runs = host_isa_name(isa);
  }
  std::string s = std::string(host_isa_name(host_isa())) + " (built: " + built +
                  "; this CPU runs up to " + runs;
  if (const std::string cap = env_or("MESHRT_HOST_ISA"); !cap.empty())
    s += "; MESHRT_HOST_ISA=" + cap;
  return s + ")";
}
}  // namespace meshrt::ops
