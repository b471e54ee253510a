// A calling thread's inline mode for host streams (meshrt_thread_inline of the C API).
#pragma once

#include "meshrt/export.h"

namespace meshrt {

// Off by default. While on, an enqueue from this thread onto a host stream that has nothing
// queued or running runs the task on this thread before it returns (no hand-off to the stream's
// worker and back: a small synchronous collective's latency); onto a busy stream it queues as
// usual, behind that work. Tasks a stream runs never inline. CUDA streams ignore it. Returns the
// mode before. Implemented with the host streams (runtime/host_stream.cpp).
MESHRT_API bool set_thread_inline(bool on);

}  // namespace meshrt
