#include "runtime/ranges.h"

#include <atomic>
#include <memory>
#include <mutex>

#include "runtime/cuda_plugin.h"

namespace meshrt::ranges {
namespace {

// The observer lives in a shared_ptr swapped atomically (under a mutex for the writers), so a
// thread that loaded it keeps it alive while it calls it.
std::mutex g_mu;
std::shared_ptr<const Observer> g_observer;
std::atomic<bool> g_has_observer{false};

std::shared_ptr<const Observer> observer() {
  if (!g_has_observer.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard<std::mutex> lk(g_mu);
  return g_observer;
}

}  // namespace

namespace detail {
bool nvtx_built() { return meshrt::detail::cuda_plugin_if_loaded() != nullptr; }
}  // namespace detail

bool enabled() { return detail::nvtx_built() || g_has_observer.load(std::memory_order_relaxed); }

// Ranges of this thread the observer saw open and not yet closed: a pop goes to the observer
// only when it saw the push, so installing or removing an observer while ranges are open never
// shows it an unmatched pop.
thread_local int t_observed_open = 0;

void push(const std::string& name, uint64_t payload) {
  if (const auto* cuda = meshrt::detail::cuda_plugin_if_loaded()) cuda->nvtx_push(name, payload);
  if (auto o = observer()) {
    (*o)(true, name, payload);
    ++t_observed_open;
  }
}

void pop() {
  if (const auto* cuda = meshrt::detail::cuda_plugin_if_loaded()) cuda->nvtx_pop();
  if (t_observed_open == 0) return;
  --t_observed_open;
  if (auto o = observer()) (*o)(false, std::string(), 0);
}

void set_observer(Observer obs) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_observer = obs ? std::make_shared<const Observer>(std::move(obs)) : nullptr;
  g_has_observer.store(g_observer != nullptr, std::memory_order_release);
}

}  // namespace meshrt::ranges
