// meshrt.hpp: the public C++ API of meshrt in one include: tensors, communicators and streams,
// device meshes and the sharded blocks, header-only over the C API (meshrt.h), in namespace
// meshrt (namespace api_v1, with a using-directive). Each part can also be included alone.
//
// These headers, meshrt.h, export.h and version.h are everything meshrt installs: the library's
// internal headers (runtime/, collectives/, dist/, ...) are not part of the package, and a
// configure-time check (cmake/cxx_api_headers.cmake) stops the build when an installed header
// includes anything but the standard library, another installed header or <dlpack/dlpack.h>.
#ifndef MESHRT_MESHRT_HPP_
#define MESHRT_MESHRT_HPP_

#include <meshrt/version.h>

#include <meshrt/blocks.hpp>
#include <meshrt/comm.hpp>
#include <meshrt/mesh.hpp>
#include <meshrt/tensor.hpp>

#endif  // MESHRT_MESHRT_HPP_
