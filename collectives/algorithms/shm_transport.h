// The shm backend's transport as its own algorithms see it (collectives/shm_comm.cpp implements it
// over the job's shared-memory segment), and those algorithms: one_step (one_step.cpp), staged
// (staged.cpp) and zero_copy (zero_copy.cpp). Ranks are processes of one node: they meet in the
// segment's staging buffers, or in their own buffers when those lie in shared host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/ordered_comm.h"

namespace meshrt::detail {

// Bytes of one staging buffer: large messages go through in chunks of this size, so copying in,
// reducing and copying out of consecutive chunks pipeline.
constexpr size_t kShmChunkBytes = size_t{1} << 20;

// Collectives go through the staging buffers in "uses": a rank writes its buffer of the use, posts
// a step, waits until every rank posted it, then reads its peers' (each rank has two buffers, used
// alternately: a rank reads use u before it posts any step of use u + 1, and writes use u + 2
// only after every rank's step in use u + 1, so nothing is overwritten while a peer still reads).
class ShmTransport {
 public:
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The next use of the staging buffers.
  virtual uint64_t next_use() = 0;
  // Rank r's staging buffer of `use` (kShmChunkBytes).
  virtual char* buffer(int r, uint64_t use) = 0;
  // A collective's first step: publishes the call in `use`, waits until every rank posted it and
  // compares the calls (CommError on a mismatch).
  virtual void enter(const Op& op, uint64_t use) = 0;
  // Posts this rank's next step and waits until every rank posted it (`what`: the timeout's words
  // for the ranks that did not).
  virtual void step_all(const Op& op, const char* what) = 0;
  // Every rank's input (`in_bytes`) and output (`out_bytes`) mapped into this process, when they
  // all lie in shared host memory and every rank could map every peer's (two steps: publish,
  // agree; the first is the collective's enter). False on every rank alike otherwise, having moved
  // nothing: the caller then runs a copying algorithm (whose enter comes next).
  virtual bool map_all_buffers(const CommCall& c, const Op& op, size_t in_bytes, size_t out_bytes,
                               std::vector<char*>& ins, std::vector<char*>& outs) = 0;

 protected:
  ~ShmTransport() = default;
};

// one_step (one_step.cpp): an all-reduce of at most one staging buffer, in one step.
void one_step_all_reduce(ShmTransport& t, const CommCall& c, const Op& op);

// staged (staged.cpp): chunk by chunk through the staging buffers (2 ranks or more).
void staged_all_reduce(ShmTransport& t, const CommCall& c, const Op& op);
void staged_reduce_scatter(ShmTransport& t, const CommCall& c, const Op& op);
void staged_all_gather(ShmTransport& t, const CommCall& c, const Op& op);
void staged_broadcast(ShmTransport& t, const CommCall& c, const Op& op);
void staged_all_to_all(ShmTransport& t, const CommCall& c, const Op& op);

// zero_copy (zero_copy.cpp): between the ranks' own buffers; false, having moved nothing, when
// they are not all shared and mapped (the caller then runs staged).
bool zero_copy_all_reduce(ShmTransport& t, const CommCall& c, const Op& op);
bool zero_copy_reduce_scatter(ShmTransport& t, const CommCall& c, const Op& op);
bool zero_copy_all_gather(ShmTransport& t, const CommCall& c, const Op& op);

}  // namespace meshrt::detail
