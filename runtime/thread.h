// Starting threads: every thread meshrt starts goes through these, so that a thread the system
// cannot create (std::thread throws std::system_error: EAGAIN at the `ulimit -u` process limit,
// or when its stack cannot be mapped under `ulimit -v`) is a meshrt::SystemError naming what could
// not start, the system's reason and what to change, never std::terminate; and an exception that
// leaves the thread's function is caught and logged as an internal error, never std::terminate.
#pragma once

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/plugin_api.h"

namespace meshrt {

// A thread running fn. When it cannot be created, throws SystemError "could not start <what>:
// <reason>; <hint>" (hint: what to change, e.g. "raise ulimit -u").
MESHRT_PLUGIN_API std::thread start_thread(std::function<void()> fn, const std::string& what,
                                           const std::string& hint);

// n threads, thread i running fn(i); none calls fn before all n exist. When thread i cannot be
// created, the threads already started return without calling fn and are joined, and SystemError
// "could not start thread i+1 of n for <what>: <reason>; <hint>" is thrown, so that no thread
// waits for a peer that never started. The caller joins the threads returned.
std::vector<std::thread> start_threads(int n, std::function<void(int)> fn, const std::string& what,
                                       const std::string& hint);

namespace detail {

// For tests: of the later thread starts whose `what` contains `what_part`, the first `after`
// succeed and the next one fails as if the system refused it (EAGAIN); then starts succeed
// again. fail_thread_start("", -1) turns it off.
void fail_thread_start(const std::string& what_part, int after);

}  // namespace detail

}  // namespace meshrt
