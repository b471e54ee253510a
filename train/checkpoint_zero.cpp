#include "train/checkpoint_zero.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iomanip>
#include <set>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

#include "train/checkpoint_root.h"
#include "train/crc32c.h"
#include "train/optimizer.h"

namespace meshrt::detail {

std::string zero_tensor_name(size_t b, const std::string& kind) {
  return "zero.bucket" + std::to_string(b) + "." + kind;
}

Shape index_shape(const checkpoint_json& j, const std::string& where) {
  MESHRT_CHECK(j.is_array() && j.size() <= static_cast<size_t>(kMaxDims),
               where << ": not an array of at most " << kMaxDims << " extents");
  std::vector<int64_t> v;
  for (const auto& d : j) {
    MESHRT_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0,
                 where << ": extent " << json_value_text(d) << " is not a non-negative integer");
    v.push_back(d.get<int64_t>());
  }
  return Shape(v);
}

void check_index_shape_fits(const Shape& s, const std::string& where) {
  int64_t span = 1;
  for (int d = 0; d < s.ndim(); ++d)
    MESHRT_CHECK(!__builtin_mul_overflow(span, std::max<int64_t>(s[d], 1), &span),
                 where << ": shape " << s.str() << " overflows 64-bit sizes");
}

namespace {

// One bucket of the layout, checked: padded = shard * dp >= numel, each block inside its
// tensor, its elements inside the bucket.
CheckpointZeroBucket parse_zero_bucket(
    const IndexFields& f, int dp, const std::map<std::string, CheckpointIndexTensor>& tensors) {
  const std::string& where = f.where();
  CheckpointZeroBucket b;
  b.numel = index_count<int64_t>(f, "numel");
  b.padded = index_count<int64_t>(f, "padded");
  b.shard = index_count<int64_t>(f, "shard");
  b.dtype = f.string("dtype");
  int64_t prod = 0;
  MESHRT_CHECK(!__builtin_mul_overflow(b.shard, static_cast<int64_t>(dp), &prod) &&
                   prod == b.padded && b.numel <= b.padded,
               where << ": shard " << b.shard << " x dp " << dp << " is not the padded size "
                     << b.padded << " (>= numel " << b.numel << ")");
  const checkpoint_json& params = f.array("params");
  for (size_t i = 0; i < params.size(); ++i) {
    const IndexFields pf(params[i], where + ": params[" + std::to_string(i) + "]");
    CheckpointZeroParam p;
    p.name = pf.string("name");
    const std::string w = where + ": parameter '" + p.name + "'";
    auto it = tensors.find(p.name);
    MESHRT_CHECK(it != tensors.end(), w << " is not among the index's tensors");
    p.offset = index_count<int64_t>(pf, "offset");
    p.shape = index_shape(pf.at("shape", "an array of extents"), w + " shape");
    p.offsets = index_shape(pf.at("offsets", "an array of extents"), w + " offsets");
    check_index_shape_fits(p.shape, w);
    const Shape& full = it->second.shape;
    MESHRT_CHECK(p.shape.ndim() == full.ndim() && p.offsets.ndim() == full.ndim(),
                 w << ": block rank differs from the tensor's " << full.str());
    for (int d = 0; d < full.ndim(); ++d)
      MESHRT_CHECK(p.offsets[d] <= full[d] && p.shape[d] <= full[d] - p.offsets[d],
                   w << ": block at " << p.offsets.str() << " of shape " << p.shape.str()
                     << " runs past " << full.str());
    MESHRT_CHECK(p.offset <= b.numel && p.shape.numel() <= b.numel - p.offset,
                 w << ": elements [" << p.offset << ", +" << p.shape.numel()
                   << ") run past the bucket's " << b.numel);
    b.params.push_back(std::move(p));
  }
  return b;
}

// The names in array field `key` of `f`, each a string.
std::vector<std::string> index_strings(const IndexFields& f, const char* key) {
  std::vector<std::string> out;
  const checkpoint_json& a = f.array(key);
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_string())
      json_field_fail(f.where(), f.name(key) + "[" + std::to_string(i) + "]", json_value_text(a[i]),
                      "a string");
    out.push_back(a[i].get<std::string>());
  }
  return out;
}

}  // namespace

CheckpointZeroLayout parse_zero_layout(
    const IndexFields& f, const std::map<std::string, uint64_t>& files,
    const std::map<std::string, CheckpointIndexTensor>& tensors) {
  CheckpointZeroLayout z;
  const std::string& w = f.where();
  z.stage = index_count<int>(f, "stage");
  z.dp = index_count<int>(f, "dp");
  z.tp = index_count<int>(f, "tp");
  MESHRT_CHECK(z.stage >= 1 && z.stage <= 3 && z.dp >= 1 && z.tp >= 1,
               w << ": stage " << z.stage << ", dp " << z.dp << ", tp " << z.tp
                 << " (expected stage 1-3, dp and tp >= 1)");
  for (const std::string& n : index_strings(f, "state")) {
    MESHRT_CHECK(is_optimizer_state_name(n), w << ": unknown optimizer state '" << n << "'");
    z.state.push_back(n);
  }
  const checkpoint_json& tps = f.array("tp_ranks");
  MESHRT_CHECK(tps.size() == static_cast<size_t>(z.tp),
               w << ": tp_ranks does not list the " << z.tp << " tp ranks");
  for (const auto& jt : tps) {
    CheckpointZeroTpRank t;
    const IndexFields tf(jt, w + ": tp rank " + std::to_string(z.tp_ranks.size()));
    t.files = index_strings(tf, "files");
    MESHRT_CHECK(t.files.size() == static_cast<size_t>(z.dp),
                 tf.where() << ": files does not list the " << z.dp << " dp ranks' files");
    for (const std::string& file : t.files)
      MESHRT_CHECK(files.count(file),
                   tf.where() << ": file '" << file << "' is not among the index's files");
    const checkpoint_json& buckets = tf.array("buckets");
    for (const auto& jb : buckets)
      t.buckets.push_back(parse_zero_bucket(
          IndexFields(jb, tf.where() + ": bucket " + std::to_string(t.buckets.size())), z.dp,
          tensors));
    z.tp_ranks.push_back(std::move(t));
  }
  return z;
}

checkpoint_json zero_layout_json(const CheckpointZeroLayout& z) {
  checkpoint_json tps = checkpoint_json::array();
  for (const auto& t : z.tp_ranks) {
    checkpoint_json buckets = checkpoint_json::array();
    for (const auto& b : t.buckets) {
      checkpoint_json ps = checkpoint_json::array();
      for (const auto& p : b.params)
        ps.push_back({{"name", p.name},
                      {"offset", p.offset},
                      {"shape", p.shape.vec()},
                      {"offsets", p.offsets.vec()}});
      buckets.push_back({{"numel", b.numel},
                         {"padded", b.padded},
                         {"shard", b.shard},
                         {"dtype", b.dtype},
                         {"params", ps}});
    }
    tps.push_back({{"files", t.files}, {"buckets", buckets}});
  }
  return {{"stage", z.stage}, {"dp", z.dp}, {"tp", z.tp}, {"state", z.state}, {"tp_ranks", tps}};
}

void verify_checkpoint_file(const std::string& path, uint64_t bytes, uint32_t want) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MESHRT_CHECK(fd >= 0, "checkpoint: cannot open " << path << ": " << std::strerror(errno));
  std::vector<char> buf(std::min<uint64_t>(std::max<uint64_t>(bytes, 1), 8ull << 20));
  uint32_t crc = 0;
  uint64_t total = 0;
  ssize_t n;
  while ((n = ::read(fd, buf.data(), buf.size())) > 0) {
    crc = crc32c(crc, buf.data(), static_cast<size_t>(n));
    total += static_cast<uint64_t>(n);
  }
  ::close(fd);
  MESHRT_CHECK(total == bytes, "checkpoint: " << path << " is " << total
                                              << " bytes but the index says " << bytes
                                              << " (truncated or overwritten)");
  MESHRT_CHECK(crc == want, "checkpoint: " << path << " fails its checksum (crc32c " << std::hex
                                           << crc << ", index says " << want << std::dec
                                           << "): the file is corrupt");
}

const SafetensorsReader& CheckpointFiles::get(const std::string& file) {
  auto& r = open_[file];
  if (!r) {
    const std::string path = dir_ + "/" + file;
    MESHRT_CHECK(idx_.file_bytes.count(file),
                 "checkpoint: " << path << " is not listed in " << dir_ << "/" << kCheckpointIndex);
    verify_checkpoint_file(path, idx_.file_bytes.at(file), idx_.file_crc.at(file));
    r = std::make_unique<SafetensorsReader>(path);
  }
  return *r;
}

ZeroShardSource::ZeroShardSource(const CheckpointIndex& idx, CheckpointFiles& files, size_t tp_rank)
    : idx_(idx), files_(files), tp_rank_(tp_rank) {
  const auto& tps = idx.zero.tp_ranks;
  for (size_t t = 0; t < tps.size(); ++t)
    for (size_t b = 0; b < tps[t].buckets.size(); ++b)
      for (const auto& p : tps[t].buckets[b].params) locs_[p.name].push_back({t, b, &p});
}

void check_finite_elements(const void* p, int64_t n, DType dtype, const std::string& file,
                           const std::string& tensor) {
  // An all-ones exponent is an infinity or a NaN, in every float format.
  auto first_bad = [&](auto word, uint64_t exponent) -> int64_t {
    using W = decltype(word);
    const auto* w = static_cast<const unsigned char*>(p);
    for (int64_t i = 0; i < n; ++i) {
      W v;
      std::memcpy(&v, w + static_cast<size_t>(i) * sizeof(W), sizeof(W));
      if ((static_cast<uint64_t>(v) & exponent) == exponent) return i;
    }
    return -1;
  };
  int64_t bad = -1;
  if (dtype == DType::f32) bad = first_bad(uint32_t{}, 0x7f800000u);
  if (dtype == DType::bf16) bad = first_bad(uint16_t{}, 0x7f80u);
  if (dtype == DType::f16) bad = first_bad(uint16_t{}, 0x7c00u);
  MESHRT_CHECK(bad < 0, "checkpoint: " << file << " holds non-finite values (NaN or infinity) in "
                                       << "tensor '" << tensor
                                       << "': it was saved from a run whose weights had diverged, "
                                          "or changed since; resume an earlier checkpoint, or "
                                          "start without --resume");
}

void ZeroShardSource::read_flat(size_t t, size_t b, const std::string& kind, size_t es, int64_t x,
                                int64_t y, char* dst, const std::string& tensor) {
  const CheckpointZeroTpRank& tr = idx_.zero.tp_ranks[t];
  const CheckpointZeroBucket& bk = tr.buckets[b];
  const std::string name = zero_tensor_name(b, kind);
  const int64_t s = bk.shard;
  for (int64_t d = s > 0 ? x / s : 0; x < y && d * s < y; ++d) {
    const std::string& file = tr.files[static_cast<size_t>(d)];
    const SafetensorsReader& r = files_.get(file);
    const auto* e = r.find(name);
    MESHRT_CHECK(e && e->shape.numel() == s && dtype_size(e->dtype) == es,
                 "checkpoint: " << r.path() << " has no tensor '" << name << "' of " << s
                                << " elements of " << es << " bytes as its index says");
    const int64_t lo = std::max(x, d * s), hi = std::min(y, (d + 1) * s);
    char* to = dst + static_cast<size_t>(lo - x) * es;
    r.read(*e, static_cast<uint64_t>(lo - d * s) * es, static_cast<uint64_t>(hi - lo) * es, to);
    check_finite_elements(to, hi - lo, e->dtype, r.path(), tensor);
  }
}

namespace {

int64_t flat_index(const std::vector<int64_t>& i, const Shape& shape) {
  int64_t f = 0;
  for (int d = 0; d < shape.ndim(); ++d) f = f * shape[d] + i[static_cast<size_t>(d)];
  return f;
}

}  // namespace

void ZeroShardSource::read(const std::string& name, const std::string& kind, size_t es,
                           const Shape& off, const Shape& local, int64_t a, int64_t e, char* dst) {
  auto it = locs_.find(name);
  MESHRT_CHECK(it != locs_.end(), "checkpoint: the ZeRO layout of the index holds no parameter '"
                                      << name << "' that the model needs");
  // The same block: a range of its buffer (this rank's tp rank's copy of a replicated one).
  const Loc* same = nullptr;
  for (const Loc& l : it->second)
    if (l.p->offsets == off && l.p->shape == local && (!same || l.tp == tp_rank_)) same = &l;
  const std::string tensor = kind == "param" ? name : name + "." + kind;
  if (same) {
    read_flat(same->tp, same->bucket, kind, es, same->p->offset + a, same->p->offset + e, dst,
              tensor);
    return;
  }
  // Another tp layout: assemble the block from the saved blocks overlapping it, each read over
  // the flat range spanning the overlap.
  const int nd = local.ndim();
  std::vector<char> whole(static_cast<size_t>(local.numel()) * es);
  int64_t covered = 0;
  std::vector<const CheckpointZeroParam*> done;  // replicas of a block are read once
  for (const Loc& l : it->second) {
    const Shape &so = l.p->offsets, &ss = l.p->shape;
    if (std::any_of(done.begin(), done.end(), [&](const CheckpointZeroParam* q) {
          return q->offsets == so && q->shape == ss;
        }))
      continue;
    done.push_back(l.p);
    std::vector<int64_t> lo(static_cast<size_t>(nd)), hi(static_cast<size_t>(nd));
    bool empty = ss.numel() == 0;
    for (int d = 0; d < nd; ++d) {
      lo[static_cast<size_t>(d)] = std::max(so[d], off[d]);
      hi[static_cast<size_t>(d)] = std::min(so[d] + ss[d], off[d] + local[d]);
      empty |= hi[static_cast<size_t>(d)] <= lo[static_cast<size_t>(d)];
    }
    if (empty) continue;
    std::vector<int64_t> f(static_cast<size_t>(nd)), g(static_cast<size_t>(nd));
    for (int d = 0; d < nd; ++d) {
      f[static_cast<size_t>(d)] = lo[static_cast<size_t>(d)] - so[d];
      g[static_cast<size_t>(d)] = hi[static_cast<size_t>(d)] - 1 - so[d];
    }
    const int64_t first = flat_index(f, ss), last = flat_index(g, ss);
    std::vector<char> buf(static_cast<size_t>(last - first + 1) * es);
    read_flat(l.tp, l.bucket, kind, es, l.p->offset + first, l.p->offset + last + 1, buf.data(),
              tensor);
    covered += for_each_overlap_run(so, ss, off, local, [&](int64_t from, int64_t to, int64_t run) {
      std::memcpy(whole.data() + static_cast<size_t>(to) * es,
                  buf.data() + static_cast<size_t>(from - first) * es,
                  static_cast<size_t>(run) * es);
    });
  }
  MESHRT_CHECK(covered == local.numel(), "checkpoint: the saved blocks of '"
                                             << name << "' cover " << covered << " of the "
                                             << local.numel() << " elements this rank needs");
  std::memcpy(dst, whole.data() + static_cast<size_t>(a) * es, static_cast<size_t>(e - a) * es);
}

}  // namespace meshrt::detail
