// Statistics, timers and number formatting shared by every benchmark (one definition each).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace meshrt::bench {

using Clock = std::chrono::steady_clock;

// Milliseconds between two steady-clock points.
double ms_since(Clock::time_point t0, Clock::time_point t1);
// CPU time this thread has used, in milliseconds.
double thread_cpu_ms();
// Waits until no other thread of this process is running or runnable (a peer library's workers
// spinning after its call, as OpenBLAS's do), at most max_ms; false when they still were.
// Linux (/proc/self/task); elsewhere it returns true at once.
bool wait_for_idle_threads(int max_ms);

// Linear-interpolated percentile (q in [0, 1]) of unsorted values; 0 for none.
double percentile(std::vector<double> v, double q);
double median(std::vector<double> v);

// printf-style formatting of one number ("%.2f").
std::string fmt(const char* format, double v);
// 1536 -> "1.5 KiB"; 3e9 FLOP -> "3.00 GFLOP".
std::string human_bytes(double bytes);
std::string human_flops(double flop);

// The machine's physical memory in bytes; 0 when unknown. Runs check what they will allocate
// against it up front, so an impossible size fails with a message instead of the kernel's OOM kill.
int64_t physical_memory_bytes();

}  // namespace meshrt::bench
