#include "runtime/stop.h"

#include <atomic>

namespace meshrt {

namespace {
std::atomic<int> g_stop{0};
std::atomic<bool> g_graceful{false};
static_assert(std::atomic<int>::is_always_lock_free, "signal handlers need a lock-free atomic");
}  // namespace

void request_stop(int sig) noexcept {
  int none = 0;
  g_stop.compare_exchange_strong(none, sig > 0 ? sig : 1);
}
int stop_request() noexcept { return g_stop.load(); }
void clear_stop_request() noexcept { g_stop.store(0); }
void set_graceful_stop(bool on) noexcept { g_graceful.store(on); }
bool graceful_stop() noexcept { return g_graceful.load(); }

}  // namespace meshrt
