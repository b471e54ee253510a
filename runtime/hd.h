// MESHRT_HD: marks functions usable from both host and device code (plain inline on host builds).
#pragma once

#if defined(__CUDACC__)
#define MESHRT_HD __host__ __device__ __forceinline__
#else
#define MESHRT_HD inline
#endif
