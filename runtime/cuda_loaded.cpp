// cuda_plugin() of libmeshrt.so in a CUDA build: the table of the libmeshrt-cuda.so plugin, loaded
// on first use (runtime/plugin.h). The static builds use backends/cuda/cuda_plugin.cpp's linked-in
// table instead; a build without CUDA runtime/cuda_absent.cpp's none.
#include <atomic>
#include <mutex>

#include "runtime/cuda_plugin.h"
#include "runtime/error.h"
#include "runtime/plugin.h"

namespace meshrt::detail {

namespace {

struct CudaLoad {
  std::once_flag once;
  std::atomic<const CudaPlugin*> table{nullptr};
  std::string why;  // written once, before `once` completes
};

CudaLoad& cuda_load() {
  static CudaLoad l;
  return l;
}

}  // namespace

const CudaPlugin* cuda_plugin(std::string* why) {
  CudaLoad& l = cuda_load();
  std::call_once(l.once, [&l] {
    try {
      l.table.store(static_cast<const CudaPlugin*>(load_plugin("cuda")));
    } catch (const Error& e) {
      l.why = e.message();
    }
  });
  const CudaPlugin* t = l.table.load();
  if (!t && why) *why = l.why;
  return t;
}

const CudaPlugin* cuda_plugin_if_loaded() { return cuda_load().table.load(); }

std::string cuda_plugin_origin() { return loaded_plugin_path("cuda"); }

}  // namespace meshrt::detail
