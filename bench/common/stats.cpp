#include "bench/common/stats.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

namespace meshrt::bench {

double ms_since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

bool wait_for_idle_threads(int max_ms) {
  const std::string self = std::to_string(static_cast<long>(gettid()));
  for (int waited_ms = 0;; ++waited_ms) {
    bool busy = false;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task", ec)) {
      if (e.path().filename() == self) continue;
      // The state is the field after the name, which ends at the last ')'.
      std::ifstream f(e.path() / "stat");
      const std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      const size_t close = stat.rfind(')');
      if (close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'R') {
        busy = true;
        break;
      }
    }
    if (ec || !busy) return true;
    if (waited_ms >= max_ms) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

double median(std::vector<double> v) { return percentile(std::move(v), 0.5); }

std::string fmt(const char* format, double v) {
  char b[64];
  std::snprintf(b, sizeof(b), format, v);
  return b;
}

std::string human_bytes(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) {
    b /= 1024;
    ++i;
  }
  return fmt(i == 0 ? "%.0f" : "%.1f", b) + " " + u[i];
}

std::string human_flops(double f) {
  if (f >= 1e12) return fmt("%.2f", f / 1e12) + " TFLOP";
  if (f >= 1e9) return fmt("%.2f", f / 1e9) + " GFLOP";
  return fmt("%.2f", f / 1e6) + " MFLOP";
}

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

}  // namespace meshrt::bench
