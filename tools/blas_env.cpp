#include "tools/blas_env.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/env.h"
#include "runtime/error.h"

extern "C" {
char* openblas_get_corename(void);
char* openblas_get_config(void);
}

namespace meshrt::cli {

void maybe_reexec_for_blas(int argc, char** argv) {
  (void)argc;
  if (std::getenv("OPENBLAS_CORETYPE")) return;  // the user decided
  try {
    if (!env_switch("MESHRT_BLAS_REEXEC")) return;
  } catch (const Error&) {
    return;  // refused with the other variables once the command starts (check_environment)
  }
  const char* cfg = openblas_get_config();
  if (!cfg || !std::strstr(cfg, "DYNAMIC_ARCH")) return;  // the variable would be ignored
  const char* core = openblas_get_corename();
  const std::string c = core ? core : "";
  const bool old_core = c == "Prescott" || c == "Core2" || c == "Penryn" || c == "Dunnington" ||
                        c == "Nehalem" || c == "Atom";
  if (!old_core) return;
  const char* want = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                     : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                       : nullptr;
  if (!want) return;
  setenv("OPENBLAS_CORETYPE", want, 1);
  setenv("MESHRT_BLAS_REEXEC", "0", 1);  // never loop
  execv("/proc/self/exe", argv);
  // exec failed: carry on with the slow kernels (the kernels layer warns about them).
}

}  // namespace meshrt::cli
