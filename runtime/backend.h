// DeviceRuntime: what runtime/ needs from a device family (streams, memory, copies, fills).
// Internal: users query devices through runtime/device.h.
#pragma once

#include <memory>
#include <string>

#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/plugin_api.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"
#include "runtime/tensor_desc.h"

namespace meshrt {

class MESHRT_PLUGIN_API DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual DeviceType type() const = 0;
  // Number of usable devices; 0 with `why` filled in when none can be used.
  virtual int device_count(std::string* why) const = 0;
  virtual std::unique_ptr<Stream> create_stream(int device, std::string name) const = 0;
  // Wraps a native stream handed in by an embedding engine (not owned).
  virtual std::unique_ptr<Stream> wrap_stream(int device, void* native, std::string name) const = 0;
  virtual std::shared_ptr<Allocator> create_caching_allocator(int device) const = 0;
  // Copies bytes between this backend's device and host (either side may be host), on stream.
  virtual void memcpy_async(void* dst, Device dst_dev, const void* src, Device src_dev,
                            size_t bytes, Stream& stream) const = 0;
  // Elementwise strided copy with dtype conversion; both descs on this backend's device.
  virtual void copy_strided(const TensorDesc& dst, const TensorDesc& src, Stream& s) const = 0;
  virtual void fill(const TensorDesc& dst, double value, Stream& s) const = 0;
  virtual void init_philox(const TensorDesc& dst, const PhiloxInit& init, const Shape& full_shape,
                           const Shape& offsets, Stream& s) const = 0;
  // "CUDA runtime 13.0, driver ..., cuBLASLt ..., NCCL ..." (what can be queried).
  virtual std::string versions() const = 0;
};

// The host backend (always present).
MESHRT_PLUGIN_API const DeviceRuntime& host_backend();
// The CUDA backend (runtime/cuda_plugin.h), or nullptr in a build without CUDA or when its plugin
// cannot be loaded (cuda_available() says why).
MESHRT_PLUGIN_API const DeviceRuntime* cuda_backend();
// Backend for a device; throws naming the device when that backend is not built or usable.
MESHRT_PLUGIN_API const DeviceRuntime& backend_for(Device d);

}  // namespace meshrt
