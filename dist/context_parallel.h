// Context parallelism (cp), the core: the causal load-balance layout of a sequence over cp ranks,
// and attention whose sequence is sharded over a cp communicator (ring or all-gather exchange of
// K/V, partial results merged by their log-sum-exp). The mesh's cp dim (DeviceMesh kCpDim), the
// attention block, bench block and train use it (docs/training.md, "Context parallelism").
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/context.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace meshrt {

// The causal load-balance layout: a sequence of `seq` tokens is cut into 2 x cp equal chunks and
// rank i holds chunks i and 2cp-1-i (in that order), so every rank does the same attention work
// under the causal mask. Needs seq divisible by 2 x cp. Finer: `parts` chunks per rank (an even
// number; parts x cp chunks in all), the standard layout repeating that zigzag over each run of
// 2 x cp chunks. A balanced layout (CpLayout::balanced, for packed documents) gives each rank
// another set of the chunks: `assign`, empty for the standard one.
struct CpLayout {
  int64_t seq = 0;
  int cp = 1;
  int parts = 2;                                  // chunks per rank
  std::vector<std::vector<int64_t>> assign = {};  // [cp][parts]: rank i's chunks; empty: standard

  // Validates: throws meshrt::Error naming seq, cp, parts and the rule, unless cp >= 1,
  // parts >= 2 and even, seq >= 1 and seq % (parts x cp) == 0.
  static CpLayout make(int64_t seq, int cp, int parts = 2);
  // The layout of the same parts x cp chunks that best balances `chunk_work` (cp_chunk_work,
  // summed over a batch's rows). parts = 2: the chunks sorted by work, the k-th lightest paired
  // with the k-th heaviest (the pairing that minimises the heaviest rank's work); more parts:
  // the heaviest chunk first to the lightest rank with room (longest processing time first,
  // `parts` chunks each), or the standard layout where that is no better. Each rank's chunks in
  // position order, ranks in order of their first chunk. With the causal work of one document (or
  // documents longer than the sequence) and parts = 2 this is the standard pairing. Every rank must
  // build it from the same work (the whole batch's documents), and shard, gather and cp attention
  // with it.
  static CpLayout balanced(int64_t seq, int cp, const std::vector<int64_t>& chunk_work,
                           int parts = 2);
  // Tokens per chunk: seq / (parts x cp). A rank holds parts x chunk() = seq / cp tokens.
  int64_t chunk() const { return seq / (static_cast<int64_t>(parts) * cp); }
  int64_t num_chunks() const { return static_cast<int64_t>(parts) * cp; }
  int64_t local_seq() const { return seq / cp; }
  // The global chunk indices rank `rank` holds, in its local order: {rank, 2cp-1-rank, ...}.
  std::vector<int64_t> chunks(int rank) const;
  // The global position of rank `rank`'s local token `local`.
  int64_t global_pos(int rank, int64_t local) const;
};

// ---- packed documents: causal attention work per rank ----
// The work of a query row is the number of keys it sees: its position in its document + 1
// under the causal document mask. cp_chunk_work sums it over each of the parts x cp chunks of a
// sequence of `seq` tokens whose documents start at `doc_starts` (strictly increasing, in
// [0, seq); position 0 always starts one, listed or not). Refused, naming the values, otherwise.
std::vector<int64_t> cp_chunk_work(int64_t seq, int cp, const std::vector<int64_t>& doc_starts,
                                   int parts = 2);
// Each rank's work under `layout` (the sum of its chunks' work; layout.num_chunks() entries):
// [cp].
std::vector<int64_t> cp_rank_work(const CpLayout& layout, const std::vector<int64_t>& chunk_work);
// max / mean of the ranks' work (1 = balanced; 1 for no work at all).
double cp_imbalance(const std::vector<int64_t>& rank_work);

// Copies rank `rank`'s shard of `full` (its chunks along dim `seq_dim`, which must have
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
// it, in the same order). q, k, v, out: this rank's shard [batch, heads, parts x chunk, head_dim]
// (its chunks: i and 2cp-1-i in the standard layout); lse f32 [batch, heads, parts x chunk]. out
// and lse are this rank's rows of attention_fwd over the whole sequence (causal: on global
// positions). Work is enqueued on ctx's compute stream and its "cp.send" / "cp.recv" side streams;
// results are ready when the compute stream reaches that point. Packed documents: doc_ids, i32
// [batch, seq] on the host, is the document id of every position of the whole sequence (the same on
// every rank; non-decreasing along each row, each document one run of positions, any length,
// boundaries anywhere). Attention then stays inside each document (causal within it), and K/V
// chunks that share no document with a query chunk are skipped. It is read when the call is made
// (write it before: the data loader's ids). Undefined (the default): no document mask. Refused,
// naming the values, when its shape or order is wrong. layout: the one the shards were cut with
// (CpLayout::balanced's); nullptr: the standard one.
void cp_attention_fwd(Communicator& cp, Context& ctx, CpComm how, const Tensor& q, const Tensor& k,
                      const Tensor& v, const Tensor& out, const Tensor& lse, float softmax_scale,
                      bool causal = true, const Tensor& doc_ids = {},
                      const CpLayout* layout = nullptr);
// The backward: out and lse from cp_attention_fwd; dq, dk, dv (overwritten) are this rank's rows
// of attention_bwd's gradients over the whole sequence. doc_ids and layout as in the forward.
void cp_attention_bwd(Communicator& cp, Context& ctx, CpComm how, const Tensor& q, const Tensor& k,
                      const Tensor& v, const Tensor& out, const Tensor& dout, const Tensor& lse,
                      const Tensor& dq, const Tensor& dk, const Tensor& dv, float softmax_scale,
                      bool causal = true, const Tensor& doc_ids = {},
                      const CpLayout* layout = nullptr);

}  // namespace meshrt
