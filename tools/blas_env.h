// Picks OpenBLAS's kernels before anything runs: OpenBLAS 0.3.21's DYNAMIC_ARCH table predates
// recent Xeons and falls back to its 'Prescott' (SSE3) kernels there, ~5x slower than the AVX2 /
// AVX-512 ones. OpenBLAS reads OPENBLAS_CORETYPE only when it loads, so the CLI re-executes itself
// once with it set (unless the user set it, or MESHRT_BLAS_REEXEC=0).
#pragma once

namespace meshrt::cli {

// Returns only when no re-exec is needed or it failed (then everything still works, slower).
void maybe_reexec_for_blas(int argc, char** argv);

}  // namespace meshrt::cli
