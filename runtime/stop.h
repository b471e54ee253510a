// A process-wide stop request: set from a signal handler (tools/signals.h turns SIGINT / SIGTERM
// into one), read by the waits that have nothing to finish first (the file rendezvous gives up
// at once) and by commands that stop at their next safe point (meshrt train: after the step).
#pragma once

#include "meshrt/export.h"

namespace meshrt {

// Async-signal-safe. The first request wins; `sig` > 0 (the signal's number).
MESHRT_API void request_stop(int sig) noexcept;
// The signal that asked to stop, 0 when none was asked.
MESHRT_API int stop_request() noexcept;
MESHRT_API void clear_stop_request() noexcept;

// Whether a handler that turns SIGINT / SIGTERM into a stop request at the next safe point is
// installed (tools/signals.h's StopSignals): SIGTERM is then a request, not a fault, and the
// flight recorder (collectives/flight.h) writes no record for it.
MESHRT_API void set_graceful_stop(bool on) noexcept;
MESHRT_API bool graceful_stop() noexcept;

}  // namespace meshrt
