// Data checks under MESHRT_COMM_DEBUG=1: every rank digests what it contributes to a collective
// (its input blocks) and what it received (its output blocks), the ranks exchange the digests
// after the collective, and every rank runs the same verdict: the ranks whose data is not what
// the others sent are named. Host-memory backends (host, MPI) run it inside the collective's
// turn (collectives/ordered_comm.cpp); see docs/architecture.md "Data checks".
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "collectives/comm_impl.h"

namespace meshrt::detail {

// One block of a tensor: a 64-bit hash of its bytes, and its element sum and absolute sum
// (floating types: as doubles; integer types: the sum modulo 2^64 and 0).
struct BlockDigest {
  uint64_t hash = 0;
  uint64_t sum = 0;   // the double's bits, or the wrapped integer sum
  uint64_t asum = 0;  // the double's bits (floating types)
};

// The digest of `count` elements of `dtype` at `p`.
BlockDigest digest_block(const void* p, DType dtype, int64_t count);

// Whether the call carries data the check can verify (every collective but barrier / split).
bool data_checked(CommOp op);

// One rank's digests of one call: `before` (from its input, taken before the collective runs)
// and `after` (from its output); `words()` is what the ranks exchange, the same length on every
// rank of the group (words_per_rank).
class DataDigest {
 public:
  void before(const CommCall& c, int group_size);
  void after(const CommCall& c, int group_size);
  const std::vector<int64_t>& words() const { return words_; }
  static size_t words_per_rank(CommOp op, int group_size);

 private:
  std::vector<int64_t> words_;
};

// The verdict on every rank's words (`all`: rank r's at r * words_per_rank): which group ranks
// hold data other than what the ranks sent. `culprits` empty when the data agrees; `message`
// then empty too, else naming the call, each culprit (via `label`) and the evidence.
struct DataVerdict {
  std::vector<int> culprits;  // group ranks
  std::string message;
};
DataVerdict verify_data(const CommCall& c, int group_size, const std::string& group,
                        const std::vector<int64_t>& all,
                        const std::function<std::string(int)>& label);

// What MESHRT_FAULT=corrupt does to a rank's result: the first element's bytes are flipped.
void corrupt_first_element(void* p, DType dtype);

}  // namespace meshrt::detail
