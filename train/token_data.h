// Token files for training (raw uint16 / uint32, llm.c's headed .bin, NumPy .npy of integers, read
// with pread: a file truncated or rewritten during a run is an error, not a SIGBUS) and the
// deterministic sampler that draws training windows from them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/blocks.h"
#include "runtime/context.h"

namespace meshrt {

// Element type of a raw token file (no header): nanoGPT's .bin is u16, llm.c's tokens after its
// header are u16 (version 1) or u32 (version 2).
enum class TokenDType : uint8_t { U16, U32 };
TokenDType parse_token_dtype(std::string_view s);  // "u16" | "u32" (also uint16, uint32)

class InputFile;

class TokenFile {
 public:
  // Opens `path` (kept open for the run: a file renamed over it does not change what is read) and
  // scans it once for its largest token (a negative one in a signed .npy
  // is an error naming its position). The format comes from the file: ".npy" by its header; a .bin
  // starting with llm.c's magic (20240520) by that header; anything else is raw `raw_dtype`.
  // Errors name the file and what to change. `flag` names the option in messages ("--data").
  static std::shared_ptr<const TokenFile> open(const std::string& path, TokenDType raw_dtype,
                                               const std::string& flag = "--data");
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  const std::string& flag() const { return flag_; }
  int64_t size() const { return count_; }  // tokens
  int64_t max_token() const { return max_token_; }
  std::string format() const;  // "raw u16", "llm.c u32", ".npy <u2", ...
  // The identity of the token stream read at the open: "crc32c:XXXXXXXX" of the tokens' values
  // (as 64-bit integers: the same tokens in another format have the same digest). A checkpoint
  // records it; --resume refuses another stream of the same length (or the file rewritten).
  std::string digest() const;
  int64_t token(int64_t i) const;  // token i (one read: for checks, not for batches)

  // Tokens [first, first + n) into out. Throws, naming the file and what to do, where it no longer
  // holds them (truncated since the open) or holds a token outside the range the open found
  // (rewritten in place): such a token would index past the embedding table.
  void read(int64_t first, int64_t n, int64_t* out) const;

  // Packed documents (train --doc-mask): the token that ends each document. explicit_id >= 0:
  // that id, refused (naming it, the file and its largest token) unless the file holds it at
  // least once; -1: the format's own, llm.c's u16 files (GPT-2's tokenizer) 50256
  // (<|endoftext|>), and for any other format an error asking for an explicit id.
  int64_t end_of_text(int64_t explicit_id) const;

  // Throws unless every token is < vocab (naming the first position that is not: the slow path
  // rescans, the check itself is O(1)) and the file holds one window of seq + 1 tokens.
  void check(int64_t vocab, int64_t seq) const;

 private:
  TokenFile() = default;
  // Calls f(first, tokens, n) for consecutive chunks of the tokens from `from` on, until the end
  // or until f returns false. Tokens are decoded but not range-checked.
  void scan(int64_t from, const std::function<bool(int64_t, const int64_t*, int64_t)>& f) const;
  // Decodes n tokens starting at token `first` into out (throws where the file has shrunk).
  void read_raw(int64_t first, int64_t n, int64_t* out) const;

  std::string path_, flag_;
  std::unique_ptr<InputFile> in_;
  uint64_t file_bytes_ = 0;   // at open
  uint64_t data_offset_ = 0;  // first token's byte
  int64_t count_ = 0;
  int elem_bytes_ = 2;
  bool is_signed_ = false;
  std::string format_;
  int64_t max_token_ = 0;
  uint32_t crc_ = 0;  // crc32c of the tokens' values, at the open
};

// Sample `i` (a global index: step x global batch + position in the batch) is the window of
// seq + 1 tokens starting at a Philox draw of (seed, stream, i) over the file: a pure function of
// those, so any mesh and any resumed run draw the same global batch at a step. ids = window[0,
// seq), targets = window[1, seq]; both [seq, n] i64 on the context's device, samples
// first_sample .. first_sample + n - 1.
void make_token_batch(Context& ctx, const TokenFile& file, uint64_t seed, uint64_t stream,
                      int64_t first_sample, int64_t n, int64_t seq, Tensor* ids, Tensor* targets);

// Document boundaries of a window of packed tokens: a document ends with (and includes) each
// `eot` token, the next starts after it; the window's first token starts one. The positions
// where documents start, 0 first (cp_chunk_work's doc_starts), and the document id of every
// position (0, 1, ...: non-decreasing, the doc_ids of doc-masked attention).
std::vector<int64_t> document_starts(const int64_t* tokens, int64_t n, int64_t eot);
std::vector<int32_t> document_ids(const int64_t* tokens, int64_t n, int64_t eot);

// The packed documents of a batch: ids [seq, n] i64 (make_token_batch's, on any device: read
// back to the host) whose documents end with `eot`, as PackedDocs (model/blocks.h): the document
// ids [n, seq] on the host (and, cp = 1, on ctx's device) and, cp > 1, the layout that balances
// the causal work of the batch's documents over the cp ranks in `parts` chunks each
// (CpLayout::balanced; seq must divide by parts x cp) with its imbalance and the standard
// layout's. Every cp rank of a replica builds the same from the same batch.
std::shared_ptr<PackedDocs> packed_documents(Context& ctx, const Tensor& ids, int64_t eot, int cp,
                                             int parts = 2);

// Streams of make_token_batch: training and validation draw independently.
inline constexpr uint64_t kTrainTokenStream = 0x7a11;
inline constexpr uint64_t kValTokenStream = 0x7a12;

}  // namespace meshrt
