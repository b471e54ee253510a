#include "collectives/data_check.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>

#include "collectives/comm_detail.h"
#include "runtime/error.h"
#include "runtime/half.h"

namespace meshrt::detail {

namespace {

constexpr int kWordsPerBlock = 3;

uint64_t mix(uint64_t h, uint64_t w) {
  h ^= w * 0x9e3779b97f4a7c15ull;
  h = (h << 31) | (h >> 33);
  return h * 0xbf58476d1ce4e5b9ull;
}

template <class T, class F>
void float_sums(const void* p, int64_t n, F to_double, double& sum, double& asum) {
  const T* x = static_cast<const T*>(p);
  double s = 0, a = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = to_double(x[i]);
    s += v;
    a += std::fabs(v);
  }
  sum = s;
  asum = a;
}

template <class T>
uint64_t int_sum(const void* p, int64_t n) {
  const T* x = static_cast<const T*>(p);
  uint64_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<uint64_t>(static_cast<int64_t>(x[i]));
  return s;
}

bool is_float(DType dt) { return dt == DType::f32 || dt == DType::bf16 || dt == DType::f16; }

// Blocks of the input and of the output the digest covers, for a group of n.
std::pair<int, int> block_counts(CommOp op, int n) {
  switch (op) {
    case CommOp::AllReduce:
    case CommOp::Broadcast:
      return {1, 1};
    case CommOp::ReduceScatter:
      return {n, 1};
    case CommOp::AllGather:
      return {1, n};
    case CommOp::AllToAll:
      return {n, n};
    default:
      return {0, 0};
  }
}

void append(std::vector<int64_t>& w, const Tensor& t, int blocks, int64_t count, DType dt) {
  const char* base = static_cast<const char*>(t.defined() ? t.data_ptr() : nullptr);
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dt);
  for (int b = 0; b < blocks; ++b) {
    BlockDigest d;
    if (base != nullptr && count > 0)
      d = digest_block(base + static_cast<size_t>(b) * bytes, dt, count);
    w.push_back(static_cast<int64_t>(d.hash));
    w.push_back(static_cast<int64_t>(d.sum));
    w.push_back(static_cast<int64_t>(d.asum));
  }
}

// Rank r's block b of its input (in = true) or output, read from the exchanged words.
struct Words {
  const std::vector<int64_t>& all;
  size_t per_rank;
  int k_in;
  BlockDigest get(int r, bool in, int b) const {
    const size_t at = static_cast<size_t>(r) * per_rank +
                      static_cast<size_t>((in ? 0 : k_in) + b) * kWordsPerBlock;
    return {static_cast<uint64_t>(all[at]), static_cast<uint64_t>(all[at + 1]),
            static_cast<uint64_t>(all[at + 2])};
  }
};

double as_double(uint64_t bits) { return std::bit_cast<double>(bits); }

// Unit round-off of a reduction's output type. The host and MPI backends reduce in f32 (16-bit
// types through f32) and round the result once, so an element is off by at most about n f32
// roundings of the inputs' magnitudes plus one rounding (two for avg) to the output type.
double unit_out(DType dt) {
  switch (dt) {
    case DType::bf16:
      return 1.0 / 256;
    case DType::f16:
      return 1.0 / 2048;
    default:
      return 1.0 / (1 << 24);
  }
}

std::string num(double v) {
  std::ostringstream os;
  os.precision(6);
  os << v;
  return os.str();
}

// Whether an output whose digest is `out` can be the reduction of inputs whose digests are
// `ins`; `why` says how it is not.
bool reduction_fits(const CommCall& c, int n, const BlockDigest& out,
                    const std::vector<BlockDigest>& ins, std::string& why) {
  if (is_float(c.dtype)) {
    double expect = 0, mag = 0, hi = -INFINITY, lo = INFINITY;
    for (const BlockDigest& d : ins) {
      const double s = as_double(d.sum);
      expect += s;
      mag += as_double(d.asum);
      hi = std::max(hi, s);
      lo = std::min(lo, s);
    }
    const double got = as_double(out.sum);
    if (!std::isfinite(expect) || !std::isfinite(mag)) return true;  // inputs not finite: no claim
    const double tol = ((n + 2) / double(1 << 24) + 2 * unit_out(c.dtype)) * mag + 1e-30;
    switch (c.redop) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: {
        if (c.redop == ReduceOp::Avg) expect /= n;
        const double t = c.redop == ReduceOp::Avg ? tol / n : tol;
        if (std::isfinite(got) && std::fabs(got - expect) <= t) return true;
        why = "its elements add up to " + num(got) + " where the ranks' inputs give " + num(expect);
        return false;
      }
      case ReduceOp::Max:
        // Every element is at least each rank's: the sum is at least each rank's sum.
        if (std::isfinite(got) && got >= hi - tol) return true;
        why = "its elements add up to " + num(got) + ", less than one rank's input (" + num(hi) +
              ") although the reduction is max";
        return false;
      case ReduceOp::Min:
        if (std::isfinite(got) && got <= lo + tol) return true;
        why = "its elements add up to " + num(got) + ", more than one rank's input (" + num(lo) +
              ") although the reduction is min";
        return false;
    }
    return true;
  }
  if (c.redop != ReduceOp::Sum || (c.dtype != DType::i32 && c.dtype != DType::i64)) return true;
  uint64_t expect = 0;
  for (const BlockDigest& d : ins) expect += d.sum;
  uint64_t got = out.sum;
  if (c.dtype == DType::i32) {
    expect &= 0xffffffffull;
    got &= 0xffffffffull;
  }
  if (got == expect) return true;
  why = "its elements add up to " + std::to_string(got) + " where the ranks' inputs give " +
        std::to_string(expect) + (c.dtype == DType::i32 ? " (mod 2^32)" : " (mod 2^64)");
  return false;
}

// Receivers r whose block j does not hash to what sender j sent: culprits are those receivers,
// or, with more than two ranks, a sender whose block is wrong at every other rank.
void check_blocks(int n, const std::function<uint64_t(int, int)>& got,
                  const std::function<uint64_t(int, int)>& sent,
                  const std::function<std::string(int)>& label, std::vector<int>& culprits,
                  std::ostringstream& ev) {
  std::vector<std::vector<int>> bad_from(static_cast<size_t>(n));  // receiver -> senders
  std::vector<int> bad_at(static_cast<size_t>(n), 0);              // sender -> receivers
  for (int r = 0; r < n; ++r) {
    for (int j = 0; j < n; ++j) {
      if (got(r, j) != sent(j, r)) {
        bad_from[static_cast<size_t>(r)].push_back(j);
        ++bad_at[static_cast<size_t>(j)];
      }
    }
  }
  if (n > 2) {
    for (int j = 0; j < n; ++j) {
      bool everywhere = bad_at[static_cast<size_t>(j)] >= n - 1;
      for (int r = 0; r < n && everywhere; ++r) {
        const auto& b = bad_from[static_cast<size_t>(r)];
        if (r != j && (b.size() != 1 || b[0] != j)) everywhere = false;
      }
      if (everywhere) {
        culprits.push_back(j);
        ev << label(j) << " sent data that arrived different from its checksum at every other "
           << "rank";
        return;
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    const auto& b = bad_from[static_cast<size_t>(r)];
    if (b.empty()) continue;
    if (!culprits.empty()) ev << "; ";
    culprits.push_back(r);
    ev << label(r) << " received ";
    for (size_t i = 0; i < b.size(); ++i) {
      ev << (i ? (i + 1 == b.size() ? " and " : ", ") : "") << "the block from "
         << (b[i] == r ? "itself" : label(b[i]));
    }
    ev << " different from what was sent";
  }
}

}  // namespace

BlockDigest digest_block(const void* p, DType dtype, int64_t count) {
  BlockDigest d;
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  const auto* b = static_cast<const unsigned char*>(p);
  uint64_t h = 0x6d657368ull ^ bytes;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, b + i, 8);
    h = mix(h, w);
  }
  uint64_t tail = 0;
  if (i < bytes) std::memcpy(&tail, b + i, bytes - i);
  d.hash = mix(h, tail) ^ (h >> 32);
  double s = 0, a = 0;
  switch (dtype) {
    case DType::f32:
      float_sums<float>(
          p, count, [](float v) { return double(v); }, s, a);
      break;
    case DType::bf16:
      float_sums<uint16_t>(
          p, count, [](uint16_t v) { return double(bf16_bits_to_f32(v)); }, s, a);
      break;
    case DType::f16:
      float_sums<uint16_t>(
          p, count, [](uint16_t v) { return double(f16_bits_to_f32(v)); }, s, a);
      break;
    case DType::i32:
      d.sum = int_sum<int32_t>(p, count);
      return d;
    case DType::i64:
      d.sum = int_sum<int64_t>(p, count);
      return d;
    case DType::u8:
      d.sum = int_sum<uint8_t>(p, count);
      return d;
  }
  d.sum = std::bit_cast<uint64_t>(s);
  d.asum = std::bit_cast<uint64_t>(a);
  return d;
}

bool data_checked(CommOp op) { return block_counts(op, 1).first > 0; }

size_t DataDigest::words_per_rank(CommOp op, int group_size) {
  auto [ki, ko] = block_counts(op, group_size);
  return static_cast<size_t>(ki + ko) * kWordsPerBlock;
}

void DataDigest::before(const CommCall& c, int n) {
  words_.clear();
  words_.reserve(words_per_rank(c.op, n));
  append(words_, c.in, block_counts(c.op, n).first, c.count, c.dtype);
}

void DataDigest::after(const CommCall& c, int n) {
  append(words_, c.out, block_counts(c.op, n).second, c.count, c.dtype);
  MESHRT_CHECK(words_.size() == words_per_rank(c.op, n),
               "data check: " << words_.size() << " digest words for " << c.str() << ", expected "
                              << words_per_rank(c.op, n));
}

DataVerdict verify_data(const CommCall& c, int n, const std::string& group,
                        const std::vector<int64_t>& all,
                        const std::function<std::string(int)>& label) {
  DataVerdict v;
  const size_t per = DataDigest::words_per_rank(c.op, n);
  MESHRT_CHECK(all.size() == per * static_cast<size_t>(n),
               "data check of " << c.str() << " on group '" << group << "': " << all.size()
                                << " words exchanged, expected " << per * static_cast<size_t>(n));
  const Words w{all, per, block_counts(c.op, n).first};
  std::ostringstream ev;
  switch (c.op) {
    case CommOp::AllReduce: {
      std::vector<BlockDigest> ins;
      for (int r = 0; r < n; ++r) ins.push_back(w.get(r, true, 0));
      std::vector<int> sum_bad;
      for (int r = 0; r < n; ++r) {
        std::string why;
        if (!reduction_fits(c, n, w.get(r, false, 0), ins, why)) {
          sum_bad.push_back(r);
          ev << (sum_bad.size() > 1 ? "; " : "") << label(r) << ": " << why;
        }
      }
      // Every rank must hold the same bits.
      std::map<uint64_t, std::vector<int>> by_hash;
      for (int r = 0; r < n; ++r) by_hash[w.get(r, false, 0).hash].push_back(r);
      if (by_hash.size() == 1) {
        v.culprits = sum_bad;
        if (!sum_bad.empty() && static_cast<int>(sum_bad.size()) == n) {
          ev << " (every rank holds the same result: a rank's contribution was altered after its "
                "checksum was taken)";
        }
        break;
      }
      // Results differ. The ranks whose sums fit and that agree with each other are right.
      std::vector<int> good_hash_ranks;
      for (const auto& [h, ranks] : by_hash) {
        bool fits = true;
        for (int r : ranks)
          fits = fits && std::find(sum_bad.begin(), sum_bad.end(), r) == sum_bad.end();
        if (fits && ranks.size() > good_hash_ranks.size()) good_hash_ranks = ranks;
      }
      const bool majority = 2 * good_hash_ranks.size() > static_cast<size_t>(n);
      if (!sum_bad.empty() || majority) {
        for (int r = 0; r < n; ++r) {
          if (std::find(good_hash_ranks.begin(), good_hash_ranks.end(), r) == good_hash_ranks.end())
            v.culprits.push_back(r);
        }
        ev << (sum_bad.empty() ? "" : "; ") << format_ranks(v.culprits)
           << (v.culprits.size() == 1 ? " holds" : " hold") << " a result different from "
           << format_ranks(good_hash_ranks) << "'s";
      } else {
        for (int r = 0; r < n; ++r) v.culprits.push_back(r);
        ev << "the ranks' results differ (";
        bool first = true;
        for (const auto& [h, ranks] : by_hash) {
          ev << (first ? "" : "; ") << format_ranks(ranks) << ": hash " << std::hex << h
             << std::dec;
          first = false;
        }
        ev << ") and no result is held by a majority or fits the inputs better";
      }
      break;
    }
    case CommOp::ReduceScatter:
      for (int r = 0; r < n; ++r) {
        std::vector<BlockDigest> ins;
        for (int s = 0; s < n; ++s) ins.push_back(w.get(s, true, r));
        std::string why;
        if (!reduction_fits(c, n, w.get(r, false, 0), ins, why)) {
          ev << (v.culprits.empty() ? "" : "; ") << label(r) << "'s block: " << why;
          v.culprits.push_back(r);
        }
      }
      break;
    case CommOp::Broadcast: {
      const uint64_t sent = w.get(c.root, true, 0).hash;
      for (int r = 0; r < n; ++r) {
        if (w.get(r, false, 0).hash == sent) continue;
        ev << (v.culprits.empty() ? "" : "; ") << label(r) << " received data different from what "
           << (r == c.root ? "it" : label(c.root)) << " sent";
        v.culprits.push_back(r);
      }
      break;
    }
    case CommOp::AllGather:
      check_blocks(
          n, [&](int r, int j) { return w.get(r, false, j).hash; },
          [&](int j, int) { return w.get(j, true, 0).hash; }, label, v.culprits, ev);
      break;
    case CommOp::AllToAll:
      check_blocks(
          n, [&](int r, int j) { return w.get(r, false, j).hash; },
          [&](int j, int r) { return w.get(j, true, r).hash; }, label, v.culprits, ev);
      break;
    default:
      break;
  }
  if (v.culprits.empty()) return v;
  std::ostringstream os;
  os << "data check (MESHRT_COMM_DEBUG=1): " << c.str() << " on group '" << group << "' (seq "
     << c.seq << "): the ranks' data disagree; culprit: ";
  for (size_t i = 0; i < v.culprits.size(); ++i) os << (i ? ", " : "") << label(v.culprits[i]);
  os << " (" << ev.str() << ")";
  v.message = os.str();
  return v;
}

void corrupt_first_element(void* p, DType dtype) {
  auto* b = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < dtype_size(dtype); ++i) b[i] ^= 0x5a;
}

}  // namespace meshrt::detail
