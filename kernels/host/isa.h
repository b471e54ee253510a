// Instruction-set variants of the host kernel loops, chosen at run time.
//
// kernels/CMakeLists.txt compiles each loop file (elementwise.cpp, norm.cpp, ...) once per
// variant, with MESHRT_HOST_ISA_VARIANT set to the variant's number. The file's code sits between
// MESHRT_HOST_ISA_BEGIN and MESHRT_HOST_ISA_END, which put it in the variant's namespace
// (isa_baseline, isa_avx2, isa_avx512) and give every function defined there (lambdas included)
// the variant's target attribute. The headers the file includes before BEGIN (math.h, half.h,
// the standard library) stay baseline code: GCC and clang inline them into the variant's loops and
// compile them there for its ISA, and a copy left out of line is baseline code that any CPU runs.
// reduce.h differs per variant (F16C row conversions in avx2 / avx512) and so has internal
// linkage. So the variants share no symbol compiled for a wider ISA, and one binary runs on any
// x86-64 CPU. host/backend.cpp picks the widest variant the CPU runs (MESHRT_HOST_ISA caps it).
// Included by the loop files only.
#pragma once

#include "kernels/backend.h"

#if !defined(MESHRT_HOST_ISA_VARIANT)
#error \
    "kernels/host/isa.h: MESHRT_HOST_ISA_VARIANT is set by kernels/CMakeLists.txt for the loop files"
#endif

// The target strings: x86-64-v3 and x86-64-v4's ISA extensions. "arch=" is not set: GCC inlines
// a baseline function into one with a target attribute only when both have the same arch.
#define MESHRT_ISA_TARGET_AVX2 "avx2,fma,f16c,bmi,bmi2,lzcnt,movbe,popcnt,sse4.2"
#define MESHRT_ISA_TARGET_AVX512 \
  "avx2,fma,f16c,bmi,bmi2,lzcnt,movbe,popcnt,sse4.2,avx512f,avx512vl,avx512bw,avx512dq,avx512cd"

#if defined(__clang__)
#define MESHRT_ISA_PUSH_(t) \
  _Pragma(MESHRT_ISA_STR_(clang attribute push(__attribute__((target(t))), apply_to = function)))
#define MESHRT_ISA_POP_ _Pragma("clang attribute pop")
#else
#define MESHRT_ISA_PUSH_(t) _Pragma("GCC push_options") _Pragma(MESHRT_ISA_STR_(GCC target(t)))
#define MESHRT_ISA_POP_ _Pragma("GCC pop_options")
#endif
#define MESHRT_ISA_STR_(...) #__VA_ARGS__

#if MESHRT_HOST_ISA_VARIANT == 0
#define MESHRT_HOST_ISA_BEGIN \
  namespace isa_baseline {    \
  MESHRT_DECLARE_BACKEND_OPS
#define MESHRT_HOST_ISA_END }
#elif MESHRT_HOST_ISA_VARIANT == 1
#define MESHRT_HOST_ISA_BEGIN              \
  MESHRT_ISA_PUSH_(MESHRT_ISA_TARGET_AVX2) \
  namespace isa_avx2 {                     \
  MESHRT_DECLARE_BACKEND_OPS
#define MESHRT_HOST_ISA_END \
  }                         \
  MESHRT_ISA_POP_
#elif MESHRT_HOST_ISA_VARIANT == 2
#define MESHRT_HOST_ISA_BEGIN                \
  MESHRT_ISA_PUSH_(MESHRT_ISA_TARGET_AVX512) \
  namespace isa_avx512 {                     \
  MESHRT_DECLARE_BACKEND_OPS
#define MESHRT_HOST_ISA_END \
  }                         \
  MESHRT_ISA_POP_
#else
#error "kernels/host/isa.h: unknown MESHRT_HOST_ISA_VARIANT"
#endif
