// DLManagedTensorVersioned (DLPack >= 1.0) for meshrt's C API.
//
// Debian's libdlpack-dev ships dlpack.h 0.6, which predates the versioned struct, so this file
// writes its ABI out from the DLPack 1.0 specification (not copied from dlpack.h): a version
// {uint32 major, uint32 minor}, the producer's manager_ctx, its deleter, uint64 flags and the
// DLTensor (same layout as in 0.6). With a dlpack.h >= 1.0 its own definition is used instead.
// Major version 1 is the only one accepted: a different major version means a different ABI.
#pragma once

#include <cstdint>

#include "meshrt/meshrt.h"

#if !defined(DLPACK_MAJOR_VERSION) || DLPACK_MAJOR_VERSION < 1
extern "C" {

struct MeshrtDLPackVersion {
  uint32_t major;
  uint32_t minor;
};

struct DLManagedTensorVersioned {
  MeshrtDLPackVersion version;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};

}  // extern "C"
#endif

namespace meshrt::capi {

// DLPack 1.0's flag bits.
constexpr uint64_t kDLPackFlagReadOnly = 1ull << 0;
constexpr uint64_t kDLPackFlagIsCopied = 1ull << 1;
// The version this library writes into exported tensors.
constexpr uint32_t kDLPackMajor = 1;
constexpr uint32_t kDLPackMinor = 0;

}  // namespace meshrt::capi
