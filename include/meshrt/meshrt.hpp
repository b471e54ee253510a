// meshrt.hpp: the public C++ API of meshrt, everything an engine embedding libmeshrt may include.
//
// This list *is* the public header set: CMake (cmake/package.cmake) reads these #include lines,
// installs each header and everything it includes (the transitive closure) under
// <prefix>/include/meshrt/, and refuses to configure when the closure reaches a CUDA, MPI, NCCL,
// JSON, logging or CLI header. To make a header public, add it here (and mark its classes and
// free functions MESHRT_API).
#pragma once

#include "meshrt/export.h"
#include "meshrt/version.h"

// runtime: tensors, dtypes, devices, streams / events, allocators, the per-rank context, errors
#include "runtime/allocator.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

// kernels: the op set
#include "kernels/ops.h"

// collectives: communicators, thread ranks, bootstrap
#include "collectives/bootstrap.h"
#include "collectives/communicator.h"
#include "collectives/host_comm.h"

// mesh: device mesh, placements, parallel styles, layers and blocks, optimizers, checkpoints
#include "mesh/blocks.h"
#include "mesh/checkpoint.h"
#include "mesh/device_mesh.h"
#include "mesh/linear.h"
#include "mesh/optimizer.h"
#include "mesh/parallel.h"
#include "mesh/placement.h"
#include "mesh/style.h"
