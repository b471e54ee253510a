#include "tools/blas_env.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "runtime/affinity.h"
#include "runtime/env.h"
#include "runtime/error.h"

extern "C" {
char* openblas_get_corename(void);
char* openblas_get_config(void);
}

namespace meshrt::cli {

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
// Per host core: OpenBLAS's buffer (BUFFER_SIZE of its x86-64 builds, 128 MiB, malloc'd by every
// thread that calls it), a malloc arena (64 MiB) and a thread stack (8 MiB).
constexpr uint64_t kPerCore = 200 * kMiB;
// Besides: the main, rank and stream threads (counted as two more cores) and tensors (256 MiB).
constexpr uint64_t kExtraCores = 2;
constexpr uint64_t kTensors = 256 * kMiB;

// The process's address-space limit in bytes, 0 when there is none.
uint64_t address_limit() {
  struct rlimit rl {};
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 0;
  return static_cast<uint64_t>(rl.rlim_cur);
}

// Bytes mapped by this process now (VmSize), 0 when unknown.
uint64_t mapped_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmSize:", 0) == 0) return std::strtoull(line.c_str() + 7, nullptr, 10) * 1024;
  }
  return 0;
}

// Commands that run kernels (the others map no BLAS buffer beyond the libraries).
bool runs_kernels(int argc, char** argv) {
  if (argc < 2) return false;
  const std::string c = argv[1];
  return c == "train" || c == "bench" || c == "sweep" || c == "tune";
}

// OPENBLAS_CORETYPE for this CPU when OpenBLAS picked an old core's kernels, else nullptr.
const char* better_core() {
  if (std::getenv("OPENBLAS_CORETYPE")) return nullptr;  // the user decided
  const char* cfg = openblas_get_config();
  if (!cfg || !std::strstr(cfg, "DYNAMIC_ARCH")) return nullptr;  // the variable would be ignored
  const char* core = openblas_get_corename();
  const std::string c = core ? core : "";
  const bool old_core = c == "Prescott" || c == "Core2" || c == "Penryn" || c == "Dunnington" ||
                        c == "Nehalem" || c == "Atom";
  if (!old_core) return nullptr;
  return __builtin_cpu_supports("avx512f") ? "SkylakeX"
         : __builtin_cpu_supports("avx2")  ? "Haswell"
                                           : nullptr;
}

bool reexec_allowed() {
  try {
    return env_switch("MESHRT_BLAS_REEXEC");
  } catch (const Error&) {
    return false;  // refused with the other variables once the command starts (check_environment)
  }
}

// Refuses (exit status 1) an address-space limit below what a command that runs kernels needs.
void check_address_limit(uint64_t limit) {
  const uint64_t mapped = mapped_bytes();
  const uint64_t cores = process_cores().size();
  const uint64_t needed = detail::address_space_needed(mapped, cores);
  if (mapped == 0 || limit >= needed) return;
  const std::string msg =
      "meshrt: error: " + detail::address_limit_error(limit, needed, mapped, cores) + "\n";
  (void)!write(STDERR_FILENO, msg.data(), msg.size());
  _exit(1);  // no exit handlers: nothing ran yet
}

}  // namespace

namespace detail {

uint64_t address_space_needed(uint64_t mapped, uint64_t cores) {
  return mapped + (cores + kExtraCores) * kPerCore + kTensors;
}

std::string address_limit_error(uint64_t limit, uint64_t needed, uint64_t mapped, uint64_t cores) {
  const uint64_t need_kib = (needed + 1023) / 1024;
  std::ostringstream os;
  os << "the address-space limit (ulimit -v) is " << limit / 1024 << " KiB, but meshrt needs at "
     << "least " << need_kib << " KiB here: " << mapped / 1024
     << " KiB of libraries mapped at start, and " << kPerCore / kMiB << " MiB per host core ("
     << cores << " + " << kExtraCores << ": an OpenBLAS buffer of 128 MiB, a malloc arena, a "
     << "stack) plus " << kTensors / kMiB << " MiB for tensors; raise it (ulimit -v " << need_kib
     << ") or remove it (ulimit -v unlimited)";
  return os.str();
}

}  // namespace detail

void maybe_reexec_for_blas(int argc, char** argv) {
  const uint64_t limit = address_limit();
  const char* threads = std::getenv("OPENBLAS_NUM_THREADS");
  const bool one_thread = limit != 0 && !(threads && std::strcmp(threads, "1") == 0);
  const char* core = better_core();
  if ((one_thread || core) && reexec_allowed()) {
    if (one_thread) setenv("OPENBLAS_NUM_THREADS", "1", 1);
    if (core) setenv("OPENBLAS_CORETYPE", core, 1);
    setenv("MESHRT_BLAS_REEXEC", "0", 1);  // never loop
    execv("/proc/self/exe", argv);
    // exec failed: carry on (slower kernels: the kernels layer warns about them).
  }
  if (limit != 0 && runs_kernels(argc, argv)) check_address_limit(limit);
}

}  // namespace meshrt::cli
