#include "train/token_data.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/input_file.h"
#include "runtime/philox.h"
#include "train/crc32c.h"

namespace meshrt {

TokenDType parse_token_dtype(std::string_view s) {
  if (s == "u16" || s == "uint16") return TokenDType::U16;
  if (s == "u32" || s == "uint32") return TokenDType::U32;
  MESHRT_FAIL("unknown --data-dtype '" << s << "': use u16 or u32");
}

namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);
// The file's first bytes read to find its format: any .npy header numpy writes (a few hundred
// bytes) and llm.c's 1 KiB one.
constexpr size_t kHeadBytes = size_t{1} << 20;
// Tokens decoded per read when scanning the whole file.
constexpr int64_t kScanTokens = int64_t{1} << 20;

// Little-endian unsigned integer of `n` bytes at `p` (x86 and ARM hosts are little-endian; .npy
// files that say otherwise are refused).
uint64_t load_le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// What a .npy header says: element type, order and shape.
struct NpyHeader {
  size_t data_offset = 0;
  int elem_bytes = 0;
  bool is_signed = false;
  std::string descr;
  int64_t count = 1;
};

// The value of `key` in the header dict, up to the next top-level ',' or '}' (shape keeps its
// parentheses).
std::string npy_field(const std::string& h, const std::string& key, const std::string& path) {
  const size_t k = h.find("'" + key + "'");
  MESHRT_CHECK(k != std::string::npos, path << ": the .npy header has no '" << key
                                            << "' entry; save the tokens with numpy.save");
  size_t v = h.find(':', k);
  MESHRT_CHECK(v != std::string::npos, path << ": malformed .npy header: " << h);
  ++v;
  while (v < h.size() && h[v] == ' ') ++v;
  size_t e = v;
  if (e < h.size() && h[e] == '(') {
    e = h.find(')', e);
    MESHRT_CHECK(e != std::string::npos, path << ": malformed .npy shape in header: " << h);
    return h.substr(v, e + 1 - v);
  }
  while (e < h.size() && h[e] != ',' && h[e] != '}') ++e;
  std::string s = h.substr(v, e - v);
  while (!s.empty() && s.back() == ' ') s.pop_back();
  if (s.size() >= 2 && (s.front() == '\'' || s.front() == '"')) s = s.substr(1, s.size() - 2);
  return s;
}

// `p`: the file's first `bytes` bytes (at most kHeadBytes) of `file_bytes`.
NpyHeader parse_npy(const unsigned char* p, size_t bytes, uint64_t file_bytes,
                    const std::string& path) {
  static const unsigned char kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  MESHRT_CHECK(bytes >= 10 && std::memcmp(p, kMagic, 6) == 0,
               path << ": not a NumPy .npy file (bad magic); write it with numpy.save, or give a "
                       "raw token file a name not ending in .npy");
  const int major = p[6];
  MESHRT_CHECK(major >= 1 && major <= 3,
               path << ": .npy format version " << major << " is not supported (1, 2 or 3)");
  const size_t len_bytes = major == 1 ? 2 : 4;
  MESHRT_CHECK(bytes >= 8 + len_bytes, path << ": truncated .npy header");
  const size_t hlen = load_le(p + 8, static_cast<int>(len_bytes));
  NpyHeader h;
  h.data_offset = 8 + len_bytes + hlen;
  MESHRT_CHECK(h.data_offset <= file_bytes, path << ": truncated .npy header (" << hlen
                                                 << " header bytes, file has " << file_bytes
                                                 << ")");
  MESHRT_CHECK(h.data_offset <= bytes, path << ": the .npy header has " << hlen
                                            << " bytes, more than the " << kHeadBytes
                                            << " meshrt reads; save the tokens with numpy.save");
  const std::string dict(reinterpret_cast<const char*>(p + 8 + len_bytes), hlen);
  h.descr = npy_field(dict, "descr", path);
  const std::string order = npy_field(dict, "fortran_order", path);
  MESHRT_CHECK(order == "False", path << ": the array is in Fortran order; save a C-order array "
                                         "(numpy.save(f, numpy.ascontiguousarray(tokens)))");
  MESHRT_CHECK(h.descr.size() == 3 && h.descr[2] >= '0' && h.descr[2] <= '9',
               path << ": unknown .npy dtype '" << h.descr << "'");
  const char endian = h.descr[0], kind = h.descr[1];
  const int size = h.descr[2] - '0';
  MESHRT_CHECK(kind == 'u' || kind == 'i',
               path << ": dtype '" << h.descr
                    << "' is not an integer type; save the tokens as numpy.uint16 or "
                       "numpy.uint32 (tokens.astype(numpy.uint16))");
  MESHRT_CHECK(size == 1 || size == 2 || size == 4 || size == 8,
               path << ": integer dtype '" << h.descr << "' has an unsupported size");
  MESHRT_CHECK(endian == '<' || endian == '|' || endian == '=',
               path << ": dtype '" << h.descr
                    << "' is big-endian; save little-endian tokens (tokens.astype('<u2'))");
  h.elem_bytes = size;
  h.is_signed = kind == 'i';
  // Shape "(N,)", "(A, B)" or "()": the tokens are the C-order flattening.
  const std::string shape = npy_field(dict, "shape", path);
  MESHRT_CHECK(shape.size() >= 2 && shape.front() == '(' && shape.back() == ')',
               path << ": malformed .npy shape '" << shape << "' (expected a tuple like (N,))");
  const char* s = shape.c_str() + 1;
  while (*s != '\0' && *s != ')') {
    if (*s == ' ' || *s == ',') {
      ++s;
      continue;
    }
    MESHRT_CHECK(*s >= '0' && *s <= '9', path << ": malformed .npy shape " << shape);
    errno = 0;
    char* end = nullptr;
    const long long d = std::strtoll(s, &end, 10);
    MESHRT_CHECK(end != s && d >= 0 && errno == 0 && !__builtin_mul_overflow(h.count, d, &h.count),
                 path << ": malformed or too large .npy shape " << shape);
    s = end;
  }
  return h;
}

// Decodes one little-endian token of `elem_bytes` bytes.
int64_t decode_token(const unsigned char* q, int elem_bytes, bool is_signed) {
  switch (elem_bytes) {
    case 1:
      return is_signed ? static_cast<int8_t>(*q) : *q;
    case 2: {
      const auto v = static_cast<uint16_t>(load_le(q, 2));
      return is_signed ? static_cast<int16_t>(v) : v;
    }
    case 4: {
      const auto v = static_cast<uint32_t>(load_le(q, 4));
      return is_signed ? static_cast<int32_t>(v) : static_cast<int64_t>(v);
    }
    default:
      return static_cast<int64_t>(load_le(q, 8));
  }
}

}  // namespace

std::shared_ptr<const TokenFile> TokenFile::open(const std::string& path, TokenDType raw_dtype,
                                                 const std::string& flag) {
  std::shared_ptr<TokenFile> f(new TokenFile());
  f->path_ = path;
  f->flag_ = flag;
  // Refuses a FIFO (whose open would wait for a writer), a device or a directory up front.
  f->in_ = std::make_unique<InputFile>(path, flag);
  const uint64_t bytes = f->in_->size();
  if (bytes == 0) {
    // A pseudo-file (/proc, /sys) says 0 bytes and still reads: its size is unknown, and tokens
    // are read by offset within it.
    unsigned char one = 0;
    MESHRT_CHECK(f->in_->read_at(0, &one, 1) == 0,
                 flag << " " << path
                      << ": its size is unknown (the file system says 0 bytes, yet it reads: a "
                         "/proc or /sys pseudo-file?); copy it to a regular file first, e.g. cp "
                      << path << " tokens.bin");
    MESHRT_FAIL(flag << " " << path << " is empty; give a file of tokens");
  }
  std::vector<unsigned char> head(static_cast<size_t>(std::min<uint64_t>(bytes, kHeadBytes)));
  head.resize(f->in_->read_at(0, head.data(), head.size()));
  const unsigned char* p = head.data();
  const size_t got = head.size();
  MESHRT_CHECK(got > 0, flag << " " << path << " is empty; give a file of tokens");

  const bool npy = path.size() >= 4 && path.compare(path.size() - 4, 4, ".npy") == 0;
  uint64_t offset = 0;
  if (npy) {
    NpyHeader h = parse_npy(p, got, bytes, path);
    f->elem_bytes_ = h.elem_bytes;
    f->is_signed_ = h.is_signed;
    f->count_ = h.count;
    f->format_ = ".npy " + h.descr;
    offset = h.data_offset;
    const uint64_t have = (bytes - offset) / static_cast<uint64_t>(h.elem_bytes);
    MESHRT_CHECK(have >= static_cast<uint64_t>(h.count),
                 path << ": truncated: the .npy header says " << h.count << " tokens, the file "
                      << "holds " << have);
  } else if (got >= 4 && static_cast<int32_t>(load_le(p, 4)) == kLlmcMagic) {
    MESHRT_CHECK(got >= kLlmcHeaderBytes,
                 flag << " " << path << ": starts with llm.c's magic number " << kLlmcMagic
                      << " but has " << bytes << " bytes, less than llm.c's " << kLlmcHeaderBytes
                      << "-byte header: the file is truncated (write it again)");
    // llm.c: 256 int32 (magic, version, token count, ...), then the tokens.
    const int64_t version = static_cast<int32_t>(load_le(p + 4, 4));
    const int64_t n = static_cast<int32_t>(load_le(p + 8, 4));
    MESHRT_CHECK(version == 1 || version == 2,
                 path << ": llm.c header version " << version << " is unknown (1: u16, 2: u32)");
    f->elem_bytes_ = version == 1 ? 2 : 4;
    f->count_ = n;
    f->format_ = version == 1 ? "llm.c u16" : "llm.c u32";
    offset = kLlmcHeaderBytes;
    const uint64_t have = (bytes - offset) / static_cast<uint64_t>(f->elem_bytes_);
    MESHRT_CHECK(
        n >= 0 && have >= static_cast<uint64_t>(n),
        path << ": truncated: the llm.c header says " << n << " tokens, the file holds " << have);
  } else {
    f->elem_bytes_ = raw_dtype == TokenDType::U16 ? 2 : 4;
    f->format_ = raw_dtype == TokenDType::U16 ? "raw u16" : "raw u32";
    MESHRT_CHECK(bytes % static_cast<uint64_t>(f->elem_bytes_) == 0,
                 flag << " " << path << ": " << bytes << " bytes is not a whole number of "
                      << f->format_ << " tokens; is --data-dtype right (u16 or u32)?");
    f->count_ = static_cast<int64_t>(bytes / static_cast<uint64_t>(f->elem_bytes_));
  }
  f->file_bytes_ = bytes;
  f->data_offset_ = offset;

  // One pass for the largest token, so the vocabulary check at every run is O(1), and for the
  // stream's digest.
  int64_t mx = 0;
  uint32_t crc = 0;
  f->scan(0, [&](int64_t first, const int64_t* t, int64_t n) {
    crc = crc32c(crc, t, static_cast<size_t>(n) * sizeof(int64_t));
    for (int64_t i = 0; i < n; ++i) {
      mx = std::max(mx, t[i]);
      MESHRT_CHECK(t[i] >= 0, path << ": token " << t[i] << " at position " << first + i
                                   << " is negative; token ids are >= 0");
    }
    return true;
  });
  f->max_token_ = mx;
  f->crc_ = crc;
  return f;
}

TokenFile::~TokenFile() = default;

std::string TokenFile::format() const { return format_; }

std::string TokenFile::digest() const {
  char b[24];
  std::snprintf(b, sizeof b, "crc32c:%08x", static_cast<unsigned>(crc_));
  return b;
}

void TokenFile::read_raw(int64_t first, int64_t n, int64_t* out) const {
  const auto eb = static_cast<size_t>(elem_bytes_);
  std::vector<unsigned char> buf(static_cast<size_t>(n) * eb);
  const uint64_t at = data_offset_ + static_cast<uint64_t>(first) * eb;
  const size_t got = in_->read_at(at, buf.data(), buf.size());
  MESHRT_CHECK(got == buf.size(),
               flag_ << " " << path_ << ": tokens " << first << ".." << first + n - 1 << " (bytes "
                     << at << ".." << at + buf.size() - 1 << ") are no longer in "
                     << "the file: it had " << file_bytes_ << " bytes when the run opened it and "
                     << "was truncated since; do not rewrite a data file during a run (write a "
                        "new file and rename it over the old one), then resume the run");
  for (int64_t i = 0; i < n; ++i)
    out[i] = decode_token(buf.data() + static_cast<size_t>(i) * eb, elem_bytes_, is_signed_);
}

void TokenFile::scan(int64_t from,
                     const std::function<bool(int64_t, const int64_t*, int64_t)>& f) const {
  std::vector<int64_t> chunk(static_cast<size_t>(std::min(kScanTokens, count_)));
  for (int64_t first = from; first < count_; first += kScanTokens) {
    const int64_t n = std::min(kScanTokens, count_ - first);
    read_raw(first, n, chunk.data());
    if (!f(first, chunk.data(), n)) return;
  }
}

int64_t TokenFile::token(int64_t i) const {
  MESHRT_CHECK(i >= 0 && i < count_,
               flag_ << " " << path_ << ": token " << i << " asked for, the file holds " << count_);
  int64_t t = 0;
  read_raw(i, 1, &t);
  return t;
}

void TokenFile::read(int64_t first, int64_t n, int64_t* out) const {
  MESHRT_CHECK(first >= 0 && n >= 0 && first <= count_ - n,
               flag_ << " " << path_ << ": tokens " << first << ".." << first + n - 1
                     << " asked for, the file holds " << count_);
  read_raw(first, n, out);
  for (int64_t i = 0; i < n; ++i)
    MESHRT_CHECK(out[i] >= 0 && out[i] <= max_token_,
                 flag_ << " " << path_ << ": token " << out[i] << " at position " << first + i
                       << " is outside 0.." << max_token_ << ", the range the file held when "
                       << "the run opened it: it was rewritten since; do not rewrite a data file "
                          "during a run (write a new file and rename it over the old one), then "
                          "resume the run");
}

int64_t TokenFile::end_of_text(int64_t explicit_id) const {
  // llm.c's GPT-2 token files (header version 1, u16) put <|endoftext|> between documents.
  constexpr int64_t kGpt2EndOfText = 50256;
  int64_t eot = explicit_id;
  if (eot < 0) {
    MESHRT_CHECK(explicit_id == -1 && format_ == "llm.c u16",
                 flag_ << " " << path_ << " (" << format_ << ") has no end-of-text token of its "
                       << "own (only llm.c's u16 files do: 50256); give the id that ends each "
                          "document explicitly");
    eot = kGpt2EndOfText;
  }
  bool found = false;
  if (eot <= max_token_)
    scan(0, [&](int64_t, const int64_t* t, int64_t n) {
      found = std::find(t, t + n, eot) != t + n;
      return !found;
    });
  MESHRT_CHECK(found, flag_ << " " << path_ << ": the end-of-text token " << eot
                            << " never occurs in the file (" << count_ << " tokens, the largest "
                            << max_token_ << "), so it would hold one document; give the id "
                            << "that ends its documents");
  return eot;
}

std::vector<int64_t> document_starts(const int64_t* tokens, int64_t n, int64_t eot) {
  std::vector<int64_t> starts;
  if (n > 0) starts.push_back(0);
  for (int64_t i = 0; i + 1 < n; ++i)
    if (tokens[i] == eot) starts.push_back(i + 1);
  return starts;
}

std::vector<int32_t> document_ids(const int64_t* tokens, int64_t n, int64_t eot) {
  std::vector<int32_t> ids(static_cast<size_t>(std::max<int64_t>(n, 0)));
  int32_t doc = 0;
  for (int64_t i = 0; i < n; ++i) {
    ids[static_cast<size_t>(i)] = doc;
    if (tokens[i] == eot) ++doc;
  }
  return ids;
}

std::shared_ptr<PackedDocs> packed_documents(Context& ctx, const Tensor& ids, int64_t eot, int cp,
                                             int parts) {
  MESHRT_CHECK(ids.ndim() == 2 && ids.dtype() == DType::i64 && ids.is_contiguous() && cp >= 1,
               "packed documents: ids " << ids.str() << " must be contiguous [seq, batch] i64 (cp "
                                        << cp << ")");
  const int64_t seq = ids.size(0), n = ids.size(1);
  Tensor host = ids;
  if (!ids.device().is_cpu()) {
    host = ids.to(ctx.host_allocator(), ctx.compute_stream());
    ctx.compute_stream().synchronize();
  }
  const int64_t* p = host.data<int64_t>();
  auto docs = std::make_shared<PackedDocs>();
  docs->ids = Tensor::empty({n, seq}, DType::i32, ctx.host_allocator());
  std::vector<int64_t> row(static_cast<size_t>(seq)),
      work(static_cast<size_t>(parts) * static_cast<size_t>(cp), 0);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < seq; ++i) row[static_cast<size_t>(i)] = p[i * n + j];
    const std::vector<int32_t> d = document_ids(row.data(), seq, eot);
    std::copy(d.begin(), d.end(), docs->ids.data<int32_t>() + j * seq);
    if (cp == 1) continue;
    const std::vector<int64_t> w =
        cp_chunk_work(seq, cp, document_starts(row.data(), seq, eot), parts);
    for (size_t c = 0; c < w.size(); ++c) work[c] += w[c];
  }
  if (cp > 1) {
    docs->layout = CpLayout::balanced(seq, cp, work, parts);
    docs->imbalance = cp_imbalance(cp_rank_work(docs->layout, work));
    docs->standard_imbalance = cp_imbalance(cp_rank_work(CpLayout::make(seq, cp, parts), work));
  } else if (ctx.device().is_cpu())
    docs->device_ids = docs->ids;
  else
    docs->device_ids = docs->ids.to(ctx.allocator_ptr(), ctx.compute_stream());
  return docs;
}

void TokenFile::check(int64_t vocab, int64_t seq) const {
  if (max_token_ >= vocab) {
    int64_t i = -1, t = 0;
    scan(0, [&](int64_t first, const int64_t* c, int64_t n) {
      const int64_t* e = std::find_if(c, c + n, [&](int64_t v) { return v >= vocab; });
      if (e == c + n) return true;
      i = first + (e - c);
      t = *e;
      return false;
    });
    MESHRT_CHECK(i >= 0, flag_ << " " << path_ << ": its largest token was " << max_token_
                               << " when the run opened it, and none is >= --vocab " << vocab
                               << " now: the file was rewritten since; keep it unchanged");
    // A raw file of 16-bit tokens read as u32 pairs two tokens into one past 65535.
    const bool maybe_u16 = format_ == "raw u32" && max_token_ > 65535;
    // From 2^31 - 1 up, raising --vocab is no advice (an embedding of 2^31 rows at hidden 768
    // in f32 is 6 TiB): the bytes are not token ids as read.
    constexpr int64_t kLargestVocab = std::numeric_limits<int32_t>::max();
    MESHRT_CHECK(max_token_ < kLargestVocab,
                 flag_ << " " << path_ << ": token " << t << " at position " << i
                       << " is >= --vocab " << vocab << ", and the file's largest token is "
                       << max_token_ << ", past any vocabulary (at most " << kLargestVocab
                       << " ids): the file does not hold token ids as read (" << format_
                       << "); check that it is a token file and, for a raw file, its "
                          "--data-dtype (u16 or u32)");
    MESHRT_FAIL(flag_ << " " << path_ << ": token " << t << " at position " << i
                      << " is >= --vocab " << vocab << "; raise --vocab to at least "
                      << max_token_ + 1 << " (the file's largest token is " << max_token_ << ")"
                      << (maybe_u16 ? ", or, if the file holds 16-bit tokens, read it with "
                                      "--data-dtype u16 (read as u32, two 16-bit tokens make one "
                                      "past 65535)"
                                    : ""));
  }
  MESHRT_CHECK(count_ >= seq + 1, flag_ << " " << path_ << " holds " << count_
                                        << " tokens and one sample needs --seq + 1 = " << seq + 1
                                        << "; use a longer file or a smaller --seq");
}

void make_token_batch(Context& ctx, const TokenFile& file, uint64_t seed, uint64_t stream,
                      int64_t first_sample, int64_t n, int64_t seq, Tensor* ids, Tensor* targets) {
  MESHRT_CHECK(n >= 1 && seq >= 1 && file.size() >= seq + 1,
               "token batch: n=" << n << ", seq=" << seq << ", " << file.size() << " tokens");
  auto host = ctx.host_allocator();
  Tensor hi = Tensor::empty({seq, n}, DType::i64, host),
         ht = Tensor::empty({seq, n}, DType::i64, host);
  int64_t* pi = hi.data<int64_t>();
  int64_t* pt = ht.data<int64_t>();
  const auto starts = static_cast<uint64_t>(file.size() - seq);
  std::vector<int64_t> window(static_cast<size_t>(seq + 1));
  for (int64_t j = 0; j < n; ++j) {
    const Philox4 r = philox_draw(seed, stream, static_cast<uint64_t>(first_sample + j));
    const uint64_t word = (static_cast<uint64_t>(r.v[1]) << 32) | r.v[0];
    file.read(static_cast<int64_t>(word % starts), seq + 1, window.data());
    for (int64_t k = 0; k < seq; ++k) {
      pi[k * n + j] = window[static_cast<size_t>(k)];
      pt[k * n + j] = window[static_cast<size_t>(k + 1)];
    }
  }
  if (ctx.device().is_cpu()) {
    *ids = hi;
    *targets = ht;
  } else {
    *ids = hi.to(ctx.allocator_ptr(), ctx.compute_stream());
    *targets = ht.to(ctx.allocator_ptr(), ctx.compute_stream());
    ctx.compute_stream().synchronize();
  }
}

}  // namespace meshrt
