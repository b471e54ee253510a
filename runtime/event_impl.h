// EventImpl: what a backend's event implements (host and CUDA streams); internal to runtime/.
#pragma once

#include <memory>
#include <utility>

#include "runtime/device.h"
#include "runtime/stream.h"

namespace meshrt {

class EventImpl {
 public:
  virtual ~EventImpl() = default;
  virtual void synchronize() = 0;
  virtual bool query() = 0;
  // Milliseconds from `start` to this event; both must be complete and timing-enabled.
  virtual float elapsed_ms_since(const EventImpl& start) const = 0;
};

// Wraps an EventImpl into the user's Event and back (Event keeps both directions private).
struct EventAccess {
  static Event wrap(std::shared_ptr<EventImpl> impl) { return Event(std::move(impl)); }
  static const std::shared_ptr<EventImpl>& impl(const Event& e) { return e.impl_; }
};

}  // namespace meshrt
