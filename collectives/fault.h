// Fault injection (MESHRT_FAULT / --fault): a spec, its parser, and what the Communicator shell
// does with it. Internal to collectives/ (not installed).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "collectives/communicator.h"

namespace meshrt::detail {

enum class FaultKind : uint8_t { None = 0, Crash, Hang, Slow, Skip, Corrupt };
const char* fault_kind_name(FaultKind k);  // "crash", ...

// `kind@rank=R,step=S[,op=NAME][,ms=T]`.
// rank: the global (world) rank the fault hits. step: the S-th collective (all_reduce,
// all_gather, reduce_scatter, broadcast, all_to_all, barrier; not send / recv / split) that
// rank issues, counted from 1 over all its communicators (world and every group split from it);
// with op=NAME only collectives of that op count. ms: slow only, the delay in milliseconds.
struct FaultSpec {
  FaultKind kind = FaultKind::None;
  int rank = -1;
  uint64_t step = 0;
  bool has_op = false;
  CommOp op = CommOp::AllReduce;
  int64_t ms = 0;
  bool active() const { return kind != FaultKind::None; }
  // Back to the spec form: "slow@rank=1,step=3,op=all_reduce,ms=200".
  std::string str() const;
};

// Parses a fault spec; "" gives an inactive spec. Throws meshrt::Error saying what to change on
// any malformed input. Pure: no I/O, no globals, bounded work, only std::string allocations.
FaultSpec parse_fault_spec(std::string_view spec);

}  // namespace meshrt::detail
