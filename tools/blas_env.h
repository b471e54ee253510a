// Prepares OpenBLAS before anything runs, re-executing the CLI once where a setting must be in the
// environment when OpenBLAS loads (it reads OPENBLAS_CORETYPE and OPENBLAS_NUM_THREADS only then):
// - OpenBLAS 0.3.21's DYNAMIC_ARCH table predates recent Xeons and falls back to its 'Prescott'
//   (SSE3) kernels there, ~5x slower than the AVX2 / AVX-512 ones: OPENBLAS_CORETYPE is set
//   (unless the user set it);
// - under an address-space limit (ulimit -v), OpenBLAS's worker threads, started when it loads,
//   each malloc a 128 MiB buffer and retry forever when that fails, and the exit then waits for
//   them: OPENBLAS_NUM_THREADS=1 (meshrt runs OpenBLAS single-threaded anyway: kernels/host/
//   parallel.h), so there are none. A limit below what a command that runs kernels needs (the
//   libraries mapped at start, and per host core an OpenBLAS buffer, a malloc arena and a stack)
//   is then refused with one line naming `ulimit -v` and the amount needed: a caller's OpenBLAS
//   buffer that cannot be had spins just the same.
// MESHRT_BLAS_REEXEC=0 turns the re-execution off.
#pragma once

#include <cstdint>
#include <string>

namespace meshrt::cli {

// Returns only when no re-exec is needed or it failed (then everything still works, slower), and
// the address-space limit (if any) is enough; else exits with status 1 after saying so.
void maybe_reexec_for_blas(int argc, char** argv);

namespace detail {
// The address space (bytes) a command that runs kernels needs with `mapped` bytes mapped at start
// and `cores` host cores.
uint64_t address_space_needed(uint64_t mapped, uint64_t cores);
// The error for a limit of `limit` bytes below `needed` (`mapped`, `cores` as above).
std::string address_limit_error(uint64_t limit, uint64_t needed, uint64_t mapped, uint64_t cores);
}  // namespace detail

}  // namespace meshrt::cli
