// Named ranges on the calling thread for GPU profilers: in a CUDA build every range is an NVTX
// range in the "meshrt" domain (Nsight Systems shows it on the thread's timeline and attaches the
// kernels and NCCL calls launched inside it), with a 64-bit payload (bytes or FLOPs). The mesh
// layer's collectives and the block benchmark's pieces (per layer attn.fwd, mlp.bwd, ...) open
// them. In a host-only build they cost one relaxed load unless an observer is installed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace meshrt::ranges {

// Whether ranges go anywhere (CUDA build, or an observer installed). Callers that build names
// only need to do so when this is true.
bool enabled();
// Opens a range named `name` on this thread; `payload` (bytes or FLOPs, 0 for none) goes with it.
void push(const std::string& name, uint64_t payload = 0);
// Closes this thread's innermost open range.
void pop();

// Sees every push (push = true, with its name and payload) and pop (push = false, empty name) on
// the thread that made it, in addition to NVTX; a pop only when it saw the matching push. For
// tests and tools: install it before the threads that open ranges start and remove it (nullptr,
// or ObserverGuard) after they end; it must stay callable until then.
using Observer = std::function<void(bool push, const std::string& name, uint64_t payload)>;
void set_observer(Observer observer);

// Installs an observer for the lifetime of a scope (removed on every exit path).
class ObserverGuard {
 public:
  explicit ObserverGuard(Observer observer) { set_observer(std::move(observer)); }
  ~ObserverGuard() { set_observer(nullptr); }
  ObserverGuard(const ObserverGuard&) = delete;
  ObserverGuard& operator=(const ObserverGuard&) = delete;
};

// A range for the lifetime of a scope; opens nothing when ranges are not enabled at construction.
class Scoped {
 public:
  explicit Scoped(const std::string& name, uint64_t payload = 0) : open_(enabled()) {
    if (open_) push(name, payload);
  }
  ~Scoped() {
    if (open_) pop();
  }
  Scoped(const Scoped&) = delete;
  Scoped& operator=(const Scoped&) = delete;

 private:
  bool open_;
};

namespace detail {
// Whether ranges go to NVTX: the CUDA backend (runtime/cuda_plugin.h) is linked in or its plugin
// is loaded. A range pushed before the plugin loads is popped from NVTX without having been pushed
// there, which NVTX ignores.
bool nvtx_built();
}  // namespace detail

}  // namespace meshrt::ranges
