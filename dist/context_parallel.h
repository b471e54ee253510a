// Context parallelism (cp), the core: the causal load-balance layout of a sequence over cp ranks,
// and attention whose sequence is sharded over a cp communicator (ring or all-gather exchange of
// K/V, partial results merged by their log-sum-exp). Not wired into the mesh, blocks, train or
// the CLI yet (docs/training.md, "Context parallelism (core)").
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "collectives/communicator.h"
#include "runtime/context.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace meshrt {

// The causal load-balance layout: a sequence of `seq` tokens is cut into 2 x cp equal chunks and
// rank i holds chunks i and 2cp-1-i (in that order), so every rank does the same attention work
// under the causal mask. Needs seq divisible by 2 x cp.
struct CpLayout {
  int64_t seq = 0;
  int cp = 1;

  // Validates: throws meshrt::Error naming seq and cp, and the rule, unless cp >= 1, seq >= 1
  // and seq % (2 x cp) == 0.
  static CpLayout make(int64_t seq, int cp);
  // Tokens per chunk: seq / (2 x cp). A rank holds 2 x chunk() = seq / cp tokens.
  int64_t chunk() const { return seq / (2 * cp); }
  int64_t local_seq() const { return seq / cp; }
  // The global chunk indices rank `rank` holds, in its local order: {rank, 2cp-1-rank}.
  std::array<int64_t, 2> chunks(int rank) const;
  // The global position of rank `rank`'s local token `local`.
  int64_t global_pos(int rank, int64_t local) const;
};

// Copies rank `rank`'s shard of `full` (its two chunks along dim `seq_dim`, which must have
// layout.seq entries) into `shard` (full's shape with layout.local_seq() along seq_dim).
// Enqueued on `stream`.
void cp_shard(const CpLayout& layout, int rank, const Tensor& full, int seq_dim,
              const Tensor& shard, Stream& stream);
// The inverse: writes rank `rank`'s shard into its rows of `full`.
void cp_unshard(const CpLayout& layout, int rank, const Tensor& shard, int seq_dim,
                const Tensor& full, Stream& stream);
// Gathers every rank's shard over the cp communicator (its size is layout.cp) into `full` on
// every rank, in sequence order. Enqueued on `stream`.
void cp_gather(Communicator& cp, const CpLayout& layout, const Tensor& shard, int seq_dim,
               const Tensor& full, Context& ctx, Stream& stream);

// How the ranks exchange K/V in cp attention.
// - Ring: K/V shards pass around the ring (send to rank + 1, receive from rank - 1), the transfer
//   of the next shard overlapping the attention of the one held; the backward passes the
//   accumulated dK/dV around with them, back to their owner.
// - AllGather: every rank gathers all K/V shards once and attends locally; dK/dV are summed to
//   their owners with a reduce-scatter.
enum class CpComm : uint8_t { Ring, AllGather };
const char* cp_comm_name(CpComm c);  // "ring" | "allgather"
// Parses ring|allgather; throws naming the value and the accepted ones otherwise.
CpComm parse_cp_comm(std::string_view s);

// While one lives, the compute stream's waits for the K/V exchanges of the cp attention this
// thread issues go through `wait` (which must make the compute stream wait for the event, e.g.
// CommScheduler::wait, timing it as exposed communication) instead of Stream::wait.
class CpWaitScope {
 public:
  explicit CpWaitScope(std::function<void(const Event&)> wait);
  ~CpWaitScope();
  CpWaitScope(const CpWaitScope&) = delete;
  CpWaitScope& operator=(const CpWaitScope&) = delete;

 private:
  std::function<void(const Event&)> wait_;
  const std::function<void(const Event&)>* prev_;
};

// Attention over a sequence sharded with CpLayout over the communicator `cp` (every rank calls
// it, in the same order). q, k, v, out: this rank's shard [batch, heads, 2 x chunk, head_dim]
// (its chunks i and 2cp-1-i); lse f32 [batch, heads, 2 x chunk]. out and lse are this rank's rows
// of attention_fwd over the whole sequence (causal: on global positions). Work is enqueued on
// ctx's compute stream and its "cp.send" / "cp.recv" side streams; results are ready when the
// compute stream reaches that point.
void cp_attention_fwd(Communicator& cp, Context& ctx, CpComm how, const Tensor& q, const Tensor& k,
                      const Tensor& v, const Tensor& out, const Tensor& lse, float softmax_scale,
                      bool causal = true);
// The backward: out and lse from cp_attention_fwd; dq, dk, dv (overwritten) are this rank's rows
// of attention_bwd's gradients over the whole sequence.
void cp_attention_bwd(Communicator& cp, Context& ctx, CpComm how, const Tensor& q, const Tensor& k,
                      const Tensor& v, const Tensor& out, const Tensor& dout, const Tensor& lse,
                      const Tensor& dq, const Tensor& dk, const Tensor& dv, float softmax_scale,
                      bool causal = true);

}  // namespace meshrt
