#include "train/checkpoint.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <map>
#include <memory>
#include <sstream>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist/agree.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "train/checkpoint_index.h"
#include "train/checkpoint_root.h"
#include "train/checkpoint_zero.h"
#include "train/crc32c.h"

namespace meshrt {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

constexpr const char* kFormat = "meshrt-checkpoint";
constexpr int kVersion = 1;      // whole (tp-sharded) tensors
constexpr int kZeroVersion = 2;  // ZeRO: each rank's dp shards of the flat buckets
constexpr const char* kIndex = detail::kCheckpointIndex;
constexpr const char* kLatest = detail::kCheckpointLatest;
constexpr uint64_t kMaxIndexBytes = 64ull << 20;

std::string step_name(int64_t step) { return detail::checkpoint_step_name(step); }
std::string rank_file(int rank) { return detail::checkpoint_rank_file(rank); }
int64_t parse_step_name(const std::string& n) { return detail::parse_checkpoint_step_name(n); }

std::string read_small_file(const std::string& path, uint64_t limit) {
  return detail::read_checkpoint_file(path, limit);
}

// The step folder name a `latest` pointer file holds, without its trailing newline.
std::string read_latest_pointer(const std::string& latest) {
  std::string n = read_small_file(latest, 256);
  while (!n.empty() && (n.back() == '\n' || n.back() == ' ')) n.pop_back();
  return n;
}

// Host memory filled by the CPU directly (pread, stores), outside any stream's order: a caching
// allocator's block may still be in use by work queued before it was freed.
const std::shared_ptr<Allocator>& host_plain() {
  static const std::shared_ptr<Allocator> a = make_host_plain_allocator();
  return a;
}

// Collective over the world: elementwise `op` of v over ranks (small host vectors).
std::vector<int64_t> agree(DeviceMesh& mesh, const std::vector<int64_t>& v, ReduceOp op) {
  return agree_values(mesh.ctx(), mesh.world(), v, op);
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  MESHRT_CHECK(fd >= 0,
               "checkpoint: cannot open directory " << dir << ": " << std::strerror(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  MESHRT_CHECK(rc == 0,
               "checkpoint: fsync of directory " << dir << " failed: " << std::strerror(e));
}

// Creates `path` (which must not exist: no following into whatever is there), writes, fsyncs.
void write_new_file(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  MESHRT_CHECK(fd >= 0, "checkpoint: cannot create " << path << ": " << std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = errno;
      ::close(fd);
      MESHRT_FAIL("checkpoint: write to " << path << " failed: " << std::strerror(e));
    }
    done += static_cast<size_t>(w);
  }
  const bool ok = ::fsync(fd) == 0;
  const int e = errno;
  const bool closed = ::close(fd) == 0;
  MESHRT_CHECK(ok && closed, "checkpoint: " << (ok ? "closing " : "fsync of ") << path
                                            << " failed: " << std::strerror(ok ? errno : e));
}

// Shard extent of a tensor on the rank at `coords` of a mesh with `dims`: shard_extent for any
// rank (the index records every rank's shards).
void extent_at(const Shape& full, const std::vector<MeshDim>& dims, const std::vector<int>& coords,
               const std::vector<Placement>& pl, Shape* local, Shape* off) {
  Shape l = full, o = full;
  for (int i = 0; i < o.ndim(); ++i) o[i] = 0;
  for (size_t m = 0; m < dims.size(); ++m) {
    if (!pl[m].is_shard()) continue;
    const int d = full.wrap_dim(pl[m].dim);
    o[d] += shard_offset(l[d], dims[m].size, coords[m]);
    l[d] = shard_size(l[d], dims[m].size, coords[m]);
  }
  *local = l;
  *off = o;
}

// The rank at `coords` writes a shard when it is the first of the replicas holding it: coordinate
// 0 on every mesh dim the tensor is not sharded over.
bool owns(const std::vector<Placement>& pl, const std::vector<int>& coords) {
  for (size_t m = 0; m < pl.size(); ++m)
    if (!pl[m].is_shard() && coords[m] != 0) return false;
  return true;
}

std::vector<int> coords_of(const std::vector<MeshDim>& dims, int rank) {
  std::vector<int> c(dims.size());
  for (size_t i = dims.size(); i-- > 0;) {
    c[i] = rank % dims[i].size;
    rank /= dims[i].size;
  }
  return c;
}

// A parameter and its optimizer state, each saved as its own tensor under one layout.
struct Saved {
  std::string key;
  Tensor local;
  const Param* p;
};

std::vector<Saved> saved_tensors(const std::vector<Param*>& params, const Optimizer* opt) {
  std::vector<Saved> out;
  for (size_t i = 0; i < params.size(); ++i) {
    const Param* p = params[i];
    out.push_back({p->name, p->value, p});
    if (!opt) continue;
    MESHRT_CHECK(i < opt->params().size() && opt->params()[i] == p,
                 "checkpoint: the optimizer's parameter " << i << " is not " << p->name);
    for (auto& [n, t] : opt->state(i)) out.push_back({p->name + "." + n, t, p});
  }
  return out;
}

// A tensor a checkpoint holds for the model, named as the index names it: a parameter's value
// (kind -1) or its optimizer state k, with its dtype (known without the tensor: a ZeRO 3
// parameter's value exists only while gathered).
struct Want {
  std::string key, kind;  // kind: "param" or the state's name
  Param* p;
  int state;
  DType dtype;
};

DType param_dtype(const Param* p, const Optimizer* opt) {
  if (p->value.defined()) return p->value.dtype();
  const GradSync* g = opt ? opt->zero_sync() : nullptr;
  for (int b = 0; g && b < g->num_buckets(); ++b)
    for (const Param* q : g->bucket(b))
      if (q == p) return g->bucket_dtype(b);
  MESHRT_FAIL("checkpoint: parameter " << p->name << " has no value (a ZeRO 3 shard without "
                                       << "its optimizer's GradSync)");
}

std::vector<Want> wanted_tensors(const std::vector<Param*>& params, const Optimizer* opt) {
  std::vector<Want> out;
  for (size_t i = 0; i < params.size(); ++i) {
    Param* p = params[i];
    out.push_back({p->name, "param", p, -1, param_dtype(p, opt)});
    if (!opt) continue;
    MESHRT_CHECK(i < opt->params().size() && opt->params()[i] == p,
                 "checkpoint: the optimizer's parameter " << i << " is not " << p->name);
    const auto names = opt->state_names();
    for (size_t k = 0; k < names.size(); ++k)
      out.push_back({p->name + "." + names[k], names[k], p, static_cast<int>(k), DType::f32});
  }
  return out;
}

json shape_json(const Shape& s) { return s.vec(); }

// Test hook MESHRT_CHECKPOINT_FAULT="rank=R[,mode=kill|throw]": rank R fails after writing part
// of its file (the header and its first tensor), as a crash during the write would.
struct Fault {
  int rank = -1;
  bool kill = false;
};

// The hook's setting, each part checked: refused naming the variable, the value and the form.
Fault parse_checkpoint_fault(const std::string& s, int world) {
  Fault f;
  if (s.empty()) return f;
  const auto bad = [&](const std::string& why) {
    MESHRT_FAIL("MESHRT_CHECKPOINT_FAULT='"
                << s << "': " << why << "; use rank=R[,mode=kill|throw] with R in [0, " << world
                << "), or unset it");
  };
  std::istringstream in(s);
  for (std::string part; std::getline(in, part, ',');) {
    const size_t eq = part.find('=');
    const std::string k = part.substr(0, eq),
                      v = eq == std::string::npos ? "" : part.substr(eq + 1);
    if (k == "rank") {
      char* end = nullptr;
      errno = 0;
      const long r = v.empty() ? -1 : std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || errno == ERANGE || r < 0 || r >= world)
        bad("rank '" + v + "' is not a rank of this run");
      f.rank = static_cast<int>(r);
    } else if (k == "mode" && (v == "kill" || v == "throw")) {
      f.kill = v == "kill";
    } else {
      bad("'" + part + "' is not rank=R or mode=kill|throw");
    }
  }
  if (f.rank < 0) bad("it names no rank");
  return f;
}

Fault fault_from_env(int world) {
  return parse_checkpoint_fault(env_or("MESHRT_CHECKPOINT_FAULT"), world);
}

}  // namespace

void check_checkpoint_fault_env(int world) { (void)fault_from_env(world); }

bool checkpoint_due(const CheckpointOptions& o, int step, int last, bool stopping) {
  if (o.save.empty()) return false;
  return stopping || step == last || (o.save_every > 0 && step % o.save_every == 0);
}

void prepare_checkpoint_root(const std::string& root) {
  MESHRT_CHECK(!root.empty(), "--save: empty path");
  struct stat sb {};
  if (::stat(root.c_str(), &sb) == 0) {
    MESHRT_CHECK(S_ISDIR(sb.st_mode),
                 "--save " << root << ": exists and is not a directory ("
                           << (S_ISREG(sb.st_mode)                          ? "a regular file"
                               : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "a device node"
                                                                            : "not a directory")
                           << "); give a directory to hold the checkpoints");
  } else {
    std::error_code ec;
    // A link whose target is missing: create_directories would fail with a bare "File exists".
    MESHRT_CHECK(!fs::is_symlink(fs::symlink_status(root, ec)),
                 "--save " << root << ": a symbolic link to " << fs::read_symlink(root, ec).string()
                           << ", which does not exist; create that folder, point the link at "
                              "an existing folder, or give another --save path");
    fs::create_directories(root, ec);
    MESHRT_CHECK(!ec, "--save " << root << ": cannot create the directory: " << ec.message());
  }
  MESHRT_CHECK(::access(root.c_str(), W_OK | X_OK) == 0,
               "--save " << root << ": directory is not writable: " << std::strerror(errno));
  check_checkpoint_root_entries(root);
}

bool checkpoint_entry_name(const std::string& name) {
  if (parse_step_name(name) >= 0 || name == kLatest || name == detail::kCheckpointLockFile)
    return true;
  return detail::checkpoint_temporary_prefix(name);
}

void check_checkpoint_root_entries(const std::string& root) {
  // What a save replaces must be meshrt's: the `latest` pointer (a file naming a step folder) and
  // step-N folders. Anything else under those names is the user's: refused before the run, not
  // replaced (or failed on) after it.
  struct stat sb {};
  const std::string latest = root + "/" + kLatest;
  if (::lstat(latest.c_str(), &sb) == 0) {
    const std::string n = S_ISREG(sb.st_mode) ? read_latest_pointer(latest) : std::string();
    MESHRT_CHECK(S_ISREG(sb.st_mode) && parse_step_name(n) >= 0,
                 "--save " << root << ": " << latest
                           << " is not a checkpoint pointer meshrt wrote (a file naming a "
                              "step-N folder); a save would replace it: move it away or give "
                              "another --save folder");
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (parse_step_name(n) < 0) continue;
    MESHRT_CHECK(e.is_directory(ec) && !e.is_symlink(ec),
                 "--save " << root << ": " << e.path().string()
                           << " is not a checkpoint folder (a file or a link where meshrt keeps "
                              "step-N folders); move it away or give another --save folder");
    // The user's files in a step folder are kept through a save of that step and a prune, but
    // not those named as meshrt names its own.
    const std::string theirs = detail::unindexed_checkpoint_file(e.path().string());
    MESHRT_CHECK(theirs.empty(),
                 "--save " << root << ": " << e.path().string() << " holds " << theirs << " but no "
                           << kIndex
                           << ": not a checkpoint meshrt wrote, and a save of that step would "
                              "replace the file (--keep remove it); move it away or give another "
                              "--save folder");
  }
}

namespace {

// Collective (dist/agree.h): when some rank's `err` is set, throws AgreedError on every rank, the
// others' message "checkpoint: rank N <what>: " and the failing rank's.
void agree_error(DeviceMesh& mesh, const std::string& err, const std::string& what) {
  meshrt::agree_error(mesh.ctx(), mesh.world(), err, "checkpoint", what);
}

using detail::CheckpointTemporary;
constexpr size_t kSuffix = detail::kCheckpointTemporaryIdLength;  // mkdtemp's XXXXXX

// Rank 0: with the folder locked, removes what killed jobs left and makes this save's temporary
// directory (a unique name from mkdtemp).
std::string make_save_dir(const std::string& root, const std::string& name) {
  prepare_checkpoint_root(root);
  detail::remove_stale_checkpoint_temporaries(root);
  std::string templ =
      root + "/" + detail::checkpoint_temporary_name(CheckpointTemporary::Save, name, "XXXXXX");
  MESHRT_CHECK(::mkdtemp(templ.data()), "checkpoint: cannot create a temporary directory in "
                                            << root << ": " << std::strerror(errno));
  // mkdtemp makes it private; the checkpoint is as readable as the root.
  MESHRT_CHECK(::chmod(templ.c_str(), 0755) == 0,
               "checkpoint: chmod " << templ << ": " << std::strerror(errno));
  return templ;
}

// Collective: rank 0's temporary directory name, on every rank.
std::string share_save_dir(DeviceMesh& mesh, const std::string& root, const std::string& name,
                           const std::string& tmp0) {
  std::vector<int64_t> suffix(kSuffix, 0);
  if (mesh.rank() == 0)
    for (size_t i = 0; i < kSuffix; ++i) suffix[i] = tmp0[tmp0.size() - kSuffix + i];
  suffix = agree(mesh, suffix, ReduceOp::Sum);
  std::string id;
  for (int64_t c : suffix) id.push_back(static_cast<char>(c));
  return root + "/" + detail::checkpoint_temporary_name(CheckpointTemporary::Save, name, id);
}

struct RankFileInfo {
  uint32_t crc = 0;
  uint64_t bytes = 0;
};

// This rank's tensors (`mine`) and the optimizer step, to tmp/rank-N.safetensors. Returns its
// size and checksum.
RankFileInfo write_rank_file(const std::string& tmp, const CheckpointMeta& meta, DeviceMesh& mesh,
                             NamedTensors mine, const Optimizer* opt,
                             std::map<std::string, std::string> metadata) {
  const int rank = mesh.rank();
  Tensor step_t = Tensor::empty({1}, DType::i64, host_plain());
  step_t.data<int64_t>()[0] = opt ? opt->steps() : meta.step;
  mine.emplace_back("optimizer.step", step_t);
  RankFileInfo out;
  const Fault fault = fault_from_env(mesh.world_size());
  int calls = 0;
  SafetensorsWriteOptions wo;
  wo.durable = true;
  wo.what = "checkpoint";
  wo.on_bytes = [&](const void* data, size_t n) {
    if (fault.rank == rank && ++calls == 4) {
      if (fault.kill) std::raise(SIGKILL);
      MESHRT_FAIL("checkpoint: injected fault on rank " << rank << " (MESHRT_CHECKPOINT_FAULT)");
    }
    out.crc = crc32c(out.crc, data, n);
    out.bytes += n;
  };
  metadata["format"] = kFormat;
  metadata["step"] = std::to_string(meta.step);
  metadata["rank"] = std::to_string(rank);
  save_safetensors(tmp + "/" + rank_file(rank), mine, mesh.ctx().compute_stream(), metadata, wo);
  return out;
}

// The shards this rank owns (one copy of each replica) of whole (tp-local) tensors.
NamedTensors owned_tensors(const std::vector<Saved>& all, DeviceMesh& mesh) {
  NamedTensors mine;
  for (const Saved& s : all)
    if (owns(s.p->placements, mesh.coords())) mine.emplace_back(s.key, s.local);
  return mine;
}

// ZeRO: this rank's dp shard of every bucket's flat parameter buffer and optimizer states, read
// where they live (nothing is gathered).
NamedTensors zero_rank_tensors(const Optimizer& opt, DeviceMesh& mesh) {
  GradSync& g = *opt.zero_sync();
  g.wait_gathers();  // stages 1 and 2: the step's all-gathers write the buffers read here
  mesh.ctx().compute_stream().synchronize();
  const auto names = opt.state_names();
  NamedTensors out;
  for (int b = 0; b < g.num_buckets(); ++b) {
    const auto bs = static_cast<size_t>(b);
    out.emplace_back(detail::zero_tensor_name(bs, "param"), g.param_shard(b));
    for (size_t k = 0; k < names.size(); ++k)
      out.emplace_back(detail::zero_tensor_name(bs, names[k]), opt.shard_state(b, k));
  }
  return out;
}

// Collective: every tp rank's bucket layout as numbers (from its dp rank 0), on every rank. Per
// tp rank: the bucket count, per bucket (numel, padded, dtype), per parameter (bucket, offset).
std::vector<int64_t> exchange_zero_layout(DeviceMesh& mesh, const std::vector<Param*>& params,
                                          const Optimizer& opt) {
  const GradSync& g = *opt.zero_sync();
  const size_t np = params.size(), slot = 1 + 5 * np;
  const int tp = mesh.size(kTpDim);
  std::vector<int64_t> v(slot * static_cast<size_t>(tp), 0);
  MESHRT_CHECK(static_cast<size_t>(g.num_buckets()) <= np,
               "checkpoint: " << g.num_buckets() << " buckets for " << np << " parameters");
  if (mesh.coord(kDpDim) == 0) {
    int64_t* o = v.data() + slot * static_cast<size_t>(mesh.coord(kTpDim));
    o[0] = g.num_buckets();
    for (int b = 0; b < g.num_buckets(); ++b) {
      int64_t* ob = o + 1 + 3 * b;
      ob[0] = g.bucket_numel(b);
      ob[1] = g.padded_numel(b);
      ob[2] = static_cast<int64_t>(g.bucket_dtype(b));
      const auto& ps = g.bucket(b);
      for (size_t slot_i = 0; slot_i < ps.size(); ++slot_i) {
        const auto i = static_cast<size_t>(std::find(params.begin(), params.end(), ps[slot_i]) -
                                           params.begin());
        MESHRT_CHECK(i < np, "checkpoint: bucket " << b << " holds " << ps[slot_i]->name
                                                   << ", which is not among the saved parameters");
        o[1 + 3 * np + 2 * i] = b;
        o[1 + 3 * np + 2 * i + 1] = g.bucket_offset(b, static_cast<int>(slot_i));
      }
    }
  }
  return agree(mesh, v, ReduceOp::Sum);
}

// Rank 0: the layout of a ZeRO-sharded checkpoint from exchange_zero_layout's numbers.
detail::CheckpointZeroLayout zero_layout(DeviceMesh& mesh, const std::vector<Param*>& params,
                                         const Optimizer& opt, const std::vector<int64_t>& v) {
  detail::CheckpointZeroLayout z;
  z.stage = opt.zero_sync()->zero();
  z.dp = mesh.size(kDpDim);
  z.tp = mesh.size(kTpDim);
  z.state = opt.state_names();
  const size_t np = params.size(), slot = 1 + 5 * np;
  for (int t = 0; t < z.tp; ++t) {
    const int64_t* o = v.data() + slot * static_cast<size_t>(t);
    std::vector<int> c(mesh.dims().size(), 0);
    if (mesh.has_dim(kTpDim)) c[static_cast<size_t>(mesh.dim_index(kTpDim))] = t;
    detail::CheckpointZeroTpRank tr;
    for (int d = 0; d < z.dp; ++d) {
      c[static_cast<size_t>(mesh.dim_index(kDpDim))] = d;
      tr.files.push_back(rank_file(mesh.rank_of(c)));
    }
    c[static_cast<size_t>(mesh.dim_index(kDpDim))] = 0;
    for (int64_t b = 0; b < o[0]; ++b) {
      detail::CheckpointZeroBucket bk;
      bk.numel = o[1 + 3 * b];
      bk.padded = o[1 + 3 * b + 1];
      bk.shard = bk.padded / z.dp;
      bk.dtype = safetensors_dtype_name(static_cast<DType>(o[1 + 3 * b + 2]));
      tr.buckets.push_back(bk);
    }
    for (size_t i = 0; i < np; ++i) {
      detail::CheckpointZeroParam p;
      p.name = params[i]->name;
      p.offset = o[1 + 3 * np + 2 * i + 1];
      extent_at(params[i]->full_shape, mesh.dims(), c, params[i]->placements, &p.shape, &p.offsets);
      tr.buckets[static_cast<size_t>(o[1 + 3 * np + 2 * i])].params.push_back(p);
    }
    for (auto& bk : tr.buckets)
      std::sort(bk.params.begin(), bk.params.end(),
                [](const auto& a, const auto& b) { return a.offset < b.offset; });
    z.tp_ranks.push_back(std::move(tr));
  }
  return z;
}

// The index: the meta, every rank file's size and checksum (info: ok, bytes, crc per rank) and
// every tensor (`with_shards`: where its shards are; a ZeRO-sharded checkpoint's layout says it).
json build_index(const CheckpointMeta& meta, DeviceMesh& mesh, const std::vector<Want>& all,
                 const Optimizer* opt, const std::vector<int64_t>& info, bool with_shards) {
  const int world = mesh.world_size();
  json idx;
  idx["format"] = kFormat;
  idx["version"] = with_shards ? kVersion : kZeroVersion;
  idx["step"] = meta.step;
  idx["run"] = meta.run;
  idx["skipped_steps"] = meta.skipped_steps;
  idx["mesh"] = mesh.str();
  idx["world_size"] = world;
  json cfg = json::object();
  for (auto& [k, v] : meta.config) cfg[k] = v;
  idx["config"] = cfg;
  idx["data"] = {{"seed", meta.seed},
                 {"step", meta.step},
                 {"note", "samples are a pure function of (seed, step, dp rank)"}};
  if (!meta.data_digest.empty()) idx["data"]["tokens_digest"] = meta.data_digest;
  idx["rng"] = {{"generator", "philox4x32-10"}, {"seed", meta.seed}, {"offset", meta.step}};
  idx["optimizer"] = {{"step", opt ? opt->steps() : meta.step}};
  idx["checksum"] = "crc32c";
  json files = json::object();
  for (int r = 0; r < world; ++r) {
    std::ostringstream h;
    h << std::hex << std::setw(8) << std::setfill('0')
      << static_cast<uint32_t>(info[3 * static_cast<size_t>(r) + 2]);
    files[rank_file(r)] = {{"bytes", info[3 * static_cast<size_t>(r) + 1]}, {"crc32c", h.str()}};
  }
  idx["files"] = files;
  json tensors = json::object();
  for (const Want& s : all) {
    json shards = json::array();
    for (int r = 0; r < world && with_shards; ++r) {
      const auto c = coords_of(mesh.dims(), r);
      if (!owns(s.p->placements, c)) continue;
      Shape l, o;
      extent_at(s.p->full_shape, mesh.dims(), c, s.p->placements, &l, &o);
      shards.push_back(
          {{"file", rank_file(r)}, {"offsets", shape_json(o)}, {"shape", shape_json(l)}});
    }
    json pl = json::array();
    for (auto& p : s.p->placements) pl.push_back(p.str());
    tensors[s.key] = {{"dtype", safetensors_dtype_name(s.dtype)},
                      {"shape", shape_json(s.p->full_shape)},
                      {"placements", pl},
                      {"shards", shards}};
  }
  idx["tensors"] = tensors;
  return idx;
}

// Rank 0: writes the index into tmp, renames tmp to root/name (a checkpoint of the same step is
// moved aside first and retired once the new one is in place), points `latest` at it, prunes.
void publish(const std::string& root, const std::string& tmp, const std::string& name,
             const std::string& index, const std::string& run, int keep) {
  const std::string final_dir = root + "/" + name;
  const std::string id = tmp.substr(tmp.size() - kSuffix);
  write_new_file(tmp + "/" + kIndex, index);
  fsync_dir(tmp);
  std::string old;
  std::error_code ec;
  const auto st = fs::symlink_status(final_dir, ec);
  if (fs::exists(st)) {
    MESHRT_CHECK(fs::is_directory(st), "checkpoint: " << final_dir
                                                      << " exists and is not a directory; move "
                                                         "it away to save step "
                                                      << name);
    old = root + "/" + detail::checkpoint_temporary_name(CheckpointTemporary::Replaced, name, id);
    MESHRT_CHECK(std::rename(final_dir.c_str(), old.c_str()) == 0,
                 "checkpoint: cannot move " << final_dir << " aside: " << std::strerror(errno));
  }
  MESHRT_CHECK(
      std::rename(tmp.c_str(), final_dir.c_str()) == 0,
      "checkpoint: rename " << tmp << " -> " << final_dir << " failed: " << std::strerror(errno));
  fsync_dir(root);
  const std::string ptr =
      root + "/" + detail::checkpoint_temporary_name(CheckpointTemporary::Latest, "", id);
  write_new_file(ptr, name + "\n");
  MESHRT_CHECK(
      std::rename(ptr.c_str(), (root + "/" + kLatest).c_str()) == 0,
      "checkpoint: cannot update " << root << "/" << kLatest << ": " << std::strerror(errno));
  fsync_dir(root);
  if (!old.empty()) detail::retire_replaced_checkpoint(old, final_dir);
  detail::prune_checkpoints(root, run, keep, name);
}

}  // namespace

bool checkpoint_saves_shards(const DeviceMesh& mesh, const Optimizer* opt) {
  if (!opt || !opt->sharded() || mesh.size(kDpDim) < 2) return false;
  for (const MeshDim& d : mesh.dims())
    if (d.name != kDpDim && d.name != kTpDim && d.size > 1) return false;
  return true;
}

std::string save_checkpoint(const std::string& root, const CheckpointMeta& meta, DeviceMesh& mesh,
                            const std::vector<Param*>& params, const Optimizer* opt, int keep) {
  const int rank = mesh.rank(), world = mesh.world_size();
  const std::string name = step_name(meta.step);
  // Rank 0 holds the folder's lock for the save (the job's hold when it has one).
  std::shared_ptr<CheckpointLock> lock;
  std::string err, tmp0;
  if (rank == 0) {
    try {
      MESHRT_CHECK(!meta.run.empty(), "checkpoint: no run id (CheckpointMeta::run) to save under");
      prepare_checkpoint_root(root);
      lock = lock_checkpoint_root(root);
      tmp0 = make_save_dir(root, name);
    } catch (const std::exception& e) {
      err = error_message(e);
    }
  }
  agree_error(mesh, err, "could not prepare " + root);
  const std::string tmp = share_save_dir(mesh, root, name, tmp0);

  // Every rank writes the shards it owns; with ZeRO on dp > 1 its dp shards of the buckets.
  const bool zero = checkpoint_saves_shards(mesh, opt);
  const std::vector<int64_t> layout =
      zero ? exchange_zero_layout(mesh, params, *opt) : std::vector<int64_t>();
  RankFileInfo mine;
  try {
    if (zero)
      mine = write_rank_file(tmp, meta, mesh, zero_rank_tensors(*opt, mesh), opt,
                             {{"zero_stage", std::to_string(opt->zero_sync()->zero())},
                              {"dp_rank", std::to_string(mesh.coord(kDpDim))},
                              {"tp_rank", std::to_string(mesh.coord(kTpDim))}});
    else
      mine = write_rank_file(tmp, meta, mesh, owned_tensors(saved_tensors(params, opt), mesh), opt,
                             {});
  } catch (const std::exception& e) {
    err = error_message(e);
  }
  std::vector<int64_t> info(3 * static_cast<size_t>(world), 0);
  info[3 * static_cast<size_t>(rank)] = err.empty() ? 1 : 0;
  info[3 * static_cast<size_t>(rank) + 1] = static_cast<int64_t>(mine.bytes);
  info[3 * static_cast<size_t>(rank) + 2] = mine.crc;
  info = agree(mesh, info, ReduceOp::Sum);
  bool failed = false;
  for (int r = 0; r < world; ++r) failed |= info[3 * static_cast<size_t>(r)] != 1;
  if (failed && rank == 0) detail::remove_checkpoint_files(tmp, /*temporaries=*/true);
  if (failed)
    agree_error(mesh, err,
                "failed to write its file in " + tmp + " (the previous checkpoint is kept)");

  // Rank 0 writes the index, publishes the directory, then the pointer, then prunes.
  if (rank == 0) {
    try {
      json idx = build_index(meta, mesh, wanted_tensors(params, opt), opt, info, !zero);
      if (zero) idx["zero"] = detail::zero_layout_json(zero_layout(mesh, params, *opt, layout));
      publish(root, tmp, name, idx.dump(1) + "\n", meta.run, keep);
    } catch (const std::exception& e) {
      err = error_message(e);
    }
  }
  agree_error(mesh, err, "could not publish " + root + "/" + name);
  return root + "/" + name;
}

std::shared_ptr<CheckpointLock> open_checkpoint_root(const std::string& root,
                                                     const std::string& run, bool overwrite,
                                                     const std::string& resumed_dir,
                                                     DeviceMesh& mesh) {
  std::shared_ptr<CheckpointLock> lock;
  std::string err;
  if (mesh.rank() == 0) {
    try {
      prepare_checkpoint_root(root);
      lock = lock_checkpoint_root(root);
      check_checkpoint_root_owner(root, run, overwrite, resumed_dir);
      detail::remove_stale_checkpoint_temporaries(root);
    } catch (const std::exception& e) {
      err = error_message(e);
      lock.reset();
    }
  }
  agree_error(mesh, err, "refused --save " + root);
  return lock;
}

std::string resolve_checkpoint(const std::string& path) {
  struct stat sb {};
  MESHRT_CHECK(::stat(path.c_str(), &sb) == 0, "--resume " << path << ": " << std::strerror(errno));
  MESHRT_CHECK(S_ISDIR(sb.st_mode), "--resume " << path << ": not a directory");
  const std::string latest = path + "/" + kLatest;
  if (::lstat(latest.c_str(), &sb) == 0) {
    const std::string n = read_latest_pointer(latest);
    MESHRT_CHECK(parse_step_name(n) >= 0,
                 "--resume: " << latest << " does not name a checkpoint (holds '" << n << "')");
    return path + "/" + n;
  }
  MESHRT_CHECK(::lstat((path + "/" + kIndex).c_str(), &sb) == 0,
               "--resume " << path << ": not a meshrt checkpoint (no '" << kLatest << "' pointer "
                           << "and no " << kIndex << ")");
  return path;
}

namespace {

using ShardRef = detail::CheckpointShardRef;
using IndexTensor = detail::CheckpointIndexTensor;

// Copies the part of saved shard `s` (tensor `e` of file `r`) that overlaps this rank's block
// [off, off + local) into `dst` (the block, contiguous), refusing non-finite values. Returns the
// elements copied.
int64_t copy_overlap(const SafetensorsReader& r, const SafetensorsReader::Entry& e,
                     const ShardRef& s, const Shape& off, const Shape& local, char* dst) {
  const size_t es = dtype_size(e.dtype);
  return detail::for_each_overlap_run(
      s.offsets, s.shape, off, local, [&](int64_t from, int64_t to, int64_t run) {
        char* at = dst + static_cast<size_t>(to) * es;
        r.read(e, static_cast<uint64_t>(from) * es, static_cast<uint64_t>(run) * es, at);
        detail::check_finite_elements(at, run, e.dtype, r.path(), e.name);
      });
}

}  // namespace

namespace {

// The index of checkpoint `dir`, read and validated.
detail::CheckpointIndex read_index(const std::string& dir, const CheckpointMeta& expect) {
  const std::string index_path = dir + "/" + kIndex;
  // Everything up to the file checks is a function of the index and the model, equal on every
  // rank, so every rank throws the same error without communicating.
  return detail::parse_checkpoint_index(read_small_file(index_path, kMaxIndexBytes), index_path,
                                        dir, expect);
}

}  // namespace

CheckpointMeta read_checkpoint_meta(const std::string& path, const CheckpointMeta& expect) {
  return read_index(resolve_checkpoint(path), expect).meta;
}

namespace {

// The model's tensors are in the index with their full shapes and dtypes; the files it lists exist
// with their sizes.
void check_against_index(const detail::CheckpointIndex& idx, const std::vector<Want>& want,
                         const std::string& dir, const std::string& index_path) {
  for (const Want& s : want) {
    auto it = idx.tensors.find(s.key);
    MESHRT_CHECK(it != idx.tensors.end(), "checkpoint: " << index_path << " has no tensor '"
                                                         << s.key << "' that the model needs");
    MESHRT_CHECK(it->second.shape == s.p->full_shape,
                 "checkpoint: " << index_path << ": tensor '" << s.key << "' has shape "
                                << it->second.shape.str() << " but the model's is "
                                << s.p->full_shape.str());
    MESHRT_CHECK(it->second.dtype == safetensors_dtype_name(s.dtype),
                 "checkpoint: " << index_path << ": tensor '" << s.key << "' is "
                                << it->second.dtype << " but the model's is "
                                << safetensors_dtype_name(s.dtype));
  }
  for (auto& [f, n] : idx.file_bytes) {
    const std::string fp = dir + "/" + f;
    struct stat sb {};
    MESHRT_CHECK(::stat(fp.c_str(), &sb) == 0,
                 "checkpoint: " << fp << " (listed in " << index_path
                                << ") is missing: " << std::strerror(errno));
    MESHRT_CHECK(S_ISREG(sb.st_mode), "checkpoint: " << fp << " is not a regular file");
    MESHRT_CHECK(static_cast<uint64_t>(sb.st_size) == n,
                 "checkpoint: " << fp << " is " << sb.st_size << " bytes but the index says " << n
                                << " (truncated or overwritten)");
  }
}

// Where loaded elements go: elements [a, e) (row-major, of the parameter's tp-local block) of
// wanted tensor `want`, into `dst` (flat, e - a elements).
struct Dest {
  size_t want;
  int64_t a, e;
  Tensor dst;
};

// Whole tensors, or with a ZeRO optimizer this rank's shard pieces (stage 3 after dropping the
// gathered parameters: the shards are what it keeps).
std::vector<Dest> load_destinations(const std::vector<Want>& want, const Optimizer* opt) {
  std::vector<Dest> out;
  GradSync* g = opt ? opt->zero_sync() : nullptr;
  if (!g) {
    for (size_t i = 0; i < want.size(); ++i) {
      const Want& w = want[i];
      Tensor t = w.p->value;
      if (w.state >= 0) {
        const size_t pi = static_cast<size_t>(
            std::find(opt->params().begin(), opt->params().end(), w.p) - opt->params().begin());
        t = opt->state(pi).at(static_cast<size_t>(w.state)).second;
      }
      MESHRT_CHECK(t.defined() && t.is_contiguous(),
                   "checkpoint: tensor '" << w.key << "' is not a contiguous tensor to load into");
      out.push_back({i, 0, t.numel(), t.view({t.numel()})});
    }
    return out;
  }
  g->shard_params();  // stage 3: keep the shards (no-op when not gathered or at other stages)
  std::map<const Param*, size_t> first;
  for (size_t i = want.size(); i-- > 0;) first[want[i].p] = i;
  const size_t kinds = 1 + opt->state_names().size();
  for (int b = 0; b < g->num_buckets(); ++b)
    for (const ShardPiece& pc : g->shard_pieces(b)) {
      auto it = first.find(pc.param);
      if (it == first.end()) continue;
      for (size_t k = 0; k < kinds; ++k)
        out.push_back({it->second + k, pc.offset, pc.offset + pc.len,
                       k == 0 ? pc.value : opt->shard_state(b, k - 1).narrow(0, pc.at, pc.len)});
    }
  return out;
}

// Version 1: elements [a, e) of this rank's block of `w` from the whole-tensor shards that
// overlap it.
void read_whole_format(std::map<std::string, std::unique_ptr<SafetensorsReader>>& readers,
                       const std::string& dir, const std::string& index_path, const IndexTensor& t,
                       const Want& w, const Shape& local, int64_t a, int64_t e, char* dst) {
  const size_t es = dtype_size(w.dtype);
  std::vector<char> whole(static_cast<size_t>(local.numel()) * es);
  int64_t covered = 0;
  for (const ShardRef& sh : t.shards) {
    auto& rd = readers[sh.file];
    if (!rd) rd = std::make_unique<SafetensorsReader>(dir + "/" + sh.file);
    const auto* en = rd->find(w.key);
    MESHRT_CHECK(en && en->shape == sh.shape && safetensors_dtype_name(en->dtype) == t.dtype,
                 "checkpoint: " << dir << "/" << sh.file << " has no " << t.dtype << " tensor '"
                                << w.key << "' of shape " << sh.shape.str()
                                << " as its index says");
    covered += copy_overlap(*rd, *en, sh, w.p->offsets, local, whole.data());
  }
  MESHRT_CHECK(covered == local.numel(),
               "checkpoint: " << index_path << ": the shards of '" << w.key << "' cover " << covered
                              << " of the " << local.numel() << " elements this rank needs");
  std::memcpy(dst, whole.data() + static_cast<size_t>(a) * es, static_cast<size_t>(e - a) * es);
}

// Version 1: file i's checksum, then its header, verified on rank i % world (each file read whole
// once). Agreed before any rank parses a file it reads (stage_loads), so a changed byte is named
// by its checksum, not by the header error another rank would meet first.
void verify_whole_format_files(const detail::CheckpointIndex& idx, const std::string& dir,
                               const DeviceMesh& mesh) {
  if (idx.version != 1) return;
  const int rank = mesh.rank(), world = mesh.world_size();
  int i = 0;
  for (auto& [f, n] : idx.file_bytes) {
    if (i++ % world != rank) continue;
    detail::verify_checkpoint_file(dir + "/" + f, n, idx.file_crc.at(f));
    SafetensorsReader r(dir + "/" + f);
  }
}

// Reads every destination's elements into host buffers (nothing of the model is modified).
// Version 2: each rank verifies the files it reads, when it first opens them.
std::vector<Tensor> stage_loads(const detail::CheckpointIndex& idx, const std::string& dir,
                                const std::string& index_path, DeviceMesh& mesh,
                                const std::vector<Want>& want, const std::vector<Dest>& dests) {
  std::map<std::string, std::unique_ptr<SafetensorsReader>> readers;
  detail::CheckpointFiles files(dir, idx);
  detail::ZeroShardSource zero(idx, files, static_cast<size_t>(mesh.coord(kTpDim)));
  std::vector<Tensor> staged;
  for (const Dest& d : dests) {
    const Want& w = want[d.want];
    Shape local, off;
    extent_at(w.p->full_shape, mesh.dims(), mesh.coords(), w.p->placements, &local, &off);
    Tensor h = Tensor::empty({d.e - d.a}, w.dtype, host_plain());
    auto* dst = static_cast<char*>(h.data_ptr());
    if (idx.version == 1)
      read_whole_format(readers, dir, index_path, idx.tensors.at(w.key), w, local, d.a, d.e, dst);
    else
      zero.read(w.p->name, w.kind, dtype_size(w.dtype), w.p->offsets, local, d.a, d.e, dst);
    staged.push_back(h);
  }
  return staged;
}

}  // namespace

CheckpointMeta load_checkpoint(const std::string& path, const CheckpointMeta& expect,
                               DeviceMesh& mesh, const std::vector<Param*>& params,
                               Optimizer* opt) {
  Stream& cs = mesh.ctx().compute_stream();
  // Every rank's reading, agreed on before anything is modified: the index and the files it lists
  // (each rank sees them itself: on several nodes they may differ), the checksums, then this
  // rank's elements into host buffers.
  std::string err, dir = path, index_path;
  detail::CheckpointIndex idx;
  std::vector<Want> want;
  std::vector<Dest> dests;
  std::vector<Tensor> staged;
  try {
    dir = resolve_checkpoint(path);
    index_path = dir + "/" + kIndex;
    idx = read_index(dir, expect);
    want = wanted_tensors(params, opt);
    check_against_index(idx, want, dir, index_path);
    dests = load_destinations(want, opt);
    verify_whole_format_files(idx, dir, mesh);
  } catch (const std::exception& e) {
    err = error_message(e);
  }
  agree_error(mesh, err, "rejected the checkpoint " + dir);
  try {
    staged = stage_loads(idx, dir, index_path, mesh, want, dests);
  } catch (const std::exception& e) {
    err = error_message(e);
  }
  agree_error(mesh, err, "rejected the checkpoint " + dir);
  for (size_t i = 0; i < dests.size(); ++i) dests[i].dst.copy_(staged[i], cs);
  if (GradSync* g = opt ? opt->zero_sync() : nullptr) {
    // Stages 1 and 2 keep whole parameters: each rank loaded its shard; gather the rest.
    for (int b = 0; b < g->num_buckets(); ++b) g->gather_params(b);
    g->wait_gathers();
  }
  if (opt) opt->set_steps(idx.optimizer_step);
  cs.synchronize();
  return idx.meta;
}

namespace detail {

namespace {

// The value a config key added after the first checkpoints means in an index without it (so
// those still resume where it would match), or "" (then a missing key is refused).
std::string older_default(const std::string& key) { return key == "deterministic" ? "off" : ""; }

// "0000abcd": 1 to 8 hex digits, nothing else.
uint32_t parse_crc(const std::string& h, const std::string& where) {
  MESHRT_CHECK(!h.empty() && h.size() <= 8 &&
                   h.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos,
               where << ": crc32c '" << h << "' is not 1 to 8 hex digits");
  return static_cast<uint32_t>(std::stoul(h, nullptr, 16));
}

// The run the index records (step, data seed, mesh, lineage, skipped steps, config), each field
// checked, and the checksum kind.
CheckpointMeta parse_index_meta(const IndexFields& f) {
  CheckpointMeta got;
  got.step = index_count<int>(f, "step");
  got.seed = index_count<uint64_t>(f.object("data"), "seed");
  // Older indexes have no digest of the tokens (any stream of the recorded length resumes).
  got.data_digest = f.object("data").string_or("tokens_digest", "");
  got.mesh = f.string("mesh");
  got.run = f.string_or("run", "");  // older indexes have none
  // Older indexes have no skipped-step count either (0).
  if (f.has("skipped_steps")) got.skipped_steps = index_count<int>(f, "skipped_steps");
  const IndexFields config = f.object("config");
  for (const auto& [k, v] : config.raw().items())
    got.config.emplace_back(k, config.string(k.c_str()));
  const std::string sum = f.string("checksum");
  if (sum != "crc32c")
    f.fail("checksum", f.raw().at("checksum"),
           "\"crc32c\" (the only checksum this meshrt verifies; written by another tool?)");
  return got;
}

// The rank files the index lists (names inside `dir`, sizes and checksums), one per rank.
void parse_index_files(const IndexFields& f, const std::string& dir, CheckpointIndex& out) {
  const int world = static_cast<int>(f.integer("world_size", 1, 1 << 20));
  const IndexFields files = f.object("files");
  for (const auto& [name, entry] : files.raw().items()) {
    MESHRT_CHECK(name.find('/') == std::string::npos && name != ".." && name != "." &&
                     !name.empty() && name.find('\0') == std::string::npos,
                 f.where() << " names file '" << name << "' outside " << dir);
    const IndexFields e(entry, f.where() + ": file '" + name + "'");
    out.file_bytes[name] = index_count<uint64_t>(e, "bytes");
    out.file_crc[name] = parse_crc(e.string("crc32c"), e.where());
  }
  MESHRT_CHECK(out.file_bytes.size() == static_cast<size_t>(world),
               f.where() << ": field 'files' lists " << out.file_bytes.size()
                         << " files but field 'world_size' is " << world
                         << " (one file per rank): the index is not meshrt's or was edited");
}

// One tensor of the index: dtype, full shape, and (version 1) its shards in the listed files.
CheckpointIndexTensor parse_index_tensor(const IndexFields& f, const CheckpointIndex& out) {
  const std::string& where = f.where();
  CheckpointIndexTensor t;
  t.dtype = f.string("dtype");
  t.shape = index_shape(f.at("shape", "an array of extents"), where + " shape");
  check_index_shape_fits(t.shape, where);
  const json& shards = f.array("shards");
  for (size_t i = 0; i < shards.size(); ++i) {
    const IndexFields sf(shards[i], where + ": shard " + std::to_string(i));
    CheckpointShardRef r;
    r.file = sf.string("file");
    MESHRT_CHECK(out.file_bytes.count(r.file),
                 where << ": shard in '" << r.file << "', which the index does not list");
    r.offsets = index_shape(sf.at("offsets", "an array of extents"), where + " offsets");
    r.shape = index_shape(sf.at("shape", "an array of extents"), where + " shard shape");
    MESHRT_CHECK(r.offsets.ndim() == t.shape.ndim() && r.shape.ndim() == t.shape.ndim(),
                 where << ": a shard's rank differs from the tensor's");
    for (int d = 0; d < t.shape.ndim(); ++d)
      MESHRT_CHECK(r.offsets[d] <= t.shape[d] && r.shape[d] <= t.shape[d] - r.offsets[d],
                   where << ": shard at " << r.offsets.str() << " of shape " << r.shape.str()
                         << " runs past " << t.shape.str());
    t.shards.push_back(r);
  }
  return t;
}

// The token stream a resume trains on against the one the checkpoint recorded.
void check_resumed_data(const std::string& where, const CheckpointMeta& got,
                        const CheckpointMeta& expect) {
  if (expect.data_digest.empty() || got.data_digest.empty() || expect.other_data_ok) return;
  MESHRT_CHECK(got.data_digest == expect.data_digest,
               where << " was saved training on tokens whose digest is " << got.data_digest
                     << ", and this run's --data holds tokens whose digest is "
                     << expect.data_digest
                     << " (another file of the same length, or the file rewritten since); "
                        "resume with the data it was saved with, or pass --resume-other-data to "
                        "continue training on this data");
}

}  // namespace

CheckpointIndex parse_checkpoint_index(const std::string& text, const std::string& index_path,
                                       const std::string& dir, const CheckpointMeta& expect) {
  const std::string where = "checkpoint: " + index_path;
  json idx = parse_ordered_json_or_discarded(text, where);
  MESHRT_CHECK(!idx.is_discarded() && idx.is_object(),
               where << " is not JSON; not a meshrt checkpoint");
  MESHRT_CHECK(idx.contains("format") && idx["format"] == kFormat,
               where << " is not a meshrt checkpoint index (format "
                     << (idx.contains("format") ? json_value_text(idx["format"]) : "missing")
                     << ", expected \"" << kFormat << "\"); written by another tool?");
  MESHRT_CHECK(idx["version"] == kVersion || idx["version"] == kZeroVersion,
               where << " has version " << json_value_text(idx["version"]) << "; this meshrt reads "
                     << kVersion << " and " << kZeroVersion);
  const IndexFields f(idx, where);
  CheckpointIndex out;
  out.version = idx["version"] == kZeroVersion ? kZeroVersion : kVersion;
  out.meta = parse_index_meta(f);
  const CheckpointMeta& got = out.meta;
  for (const auto& want : expect.config) {
    const std::string &k = want.first, &v = want.second;
    auto it =
        std::find_if(got.config.begin(), got.config.end(), [&](auto& kv) { return kv.first == k; });
    if (it == got.config.end() && !older_default(k).empty() && older_default(k) == v)
      continue;  // saved before k existed: what it meant then
    MESHRT_CHECK(it != got.config.end(),
                 where << " does not record '" << k << "' (this run has " << k << "=" << v << ")");
    MESHRT_CHECK(it->second == v, where << " was saved with " << k << "=" << it->second
                                        << " but this run has " << k << "=" << v
                                        << "; use the same " << k << " to resume");
  }
  check_resumed_data(where, got, expect);
  parse_index_files(f, dir, out);
  const IndexFields tensors = f.object("tensors");
  for (const auto& [name, t] : tensors.raw().items())
    out.tensors[name] = parse_index_tensor(IndexFields(t, where + ": tensor '" + name + "'"), out);
  out.optimizer_step = index_count<int64_t>(f.object("optimizer"), "step");
  if (out.version == kZeroVersion)
    out.zero = parse_zero_layout(IndexFields(f.at("zero", "an object"), where + ": zero"),
                                 out.file_bytes, out.tensors);
  return out;
}

int64_t for_each_overlap_run(const Shape& ao, const Shape& as, const Shape& bo, const Shape& bs,
                             const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  const int nd = as.ndim();
  const auto u = [](int d) { return static_cast<size_t>(d); };
  std::vector<int64_t> lo(u(nd)), hi(u(nd));
  int64_t count = 1;
  for (int d = 0; d < nd; ++d) {
    lo[u(d)] = std::max(ao[d], bo[d]);
    hi[u(d)] = std::min(ao[d] + as[d], bo[d] + bs[d]);
    if (hi[u(d)] <= lo[u(d)]) return 0;
    count *= hi[u(d)] - lo[u(d)];
  }
  // Dims after k are covered whole in both blocks, so one run spans them.
  int k = nd - 1;
  while (k >= 0 && lo[u(k)] == ao[k] && lo[u(k)] == bo[k] && hi[u(k)] == ao[k] + as[k] &&
         hi[u(k)] == bo[k] + bs[k])
    --k;
  if (k < 0) {
    fn(0, 0, count);
    return count;
  }
  std::vector<int64_t> astride(u(nd), 1), bstride(u(nd), 1);
  for (int d = nd - 2; d >= 0; --d) {
    astride[u(d)] = astride[u(d) + 1] * as[d + 1];
    bstride[u(d)] = bstride[u(d) + 1] * bs[d + 1];
  }
  const int64_t run = (hi[u(k)] - lo[u(k)]) * astride[u(k)];
  std::vector<int64_t> idx(lo.begin(), lo.begin() + k);  // odometer over dims < k
  while (true) {
    int64_t fa = (lo[u(k)] - ao[k]) * astride[u(k)], fb = (lo[u(k)] - bo[k]) * bstride[u(k)];
    for (int d = 0; d < k; ++d) {
      fa += (idx[u(d)] - ao[d]) * astride[u(d)];
      fb += (idx[u(d)] - bo[d]) * bstride[u(d)];
    }
    fn(fa, fb, run);
    int d = k - 1;
    while (d >= 0 && ++idx[u(d)] == hi[u(d)]) {
      idx[u(d)] = lo[u(d)];
      --d;
    }
    if (d < 0) break;
  }
  return count;
}

}  // namespace detail

}  // namespace meshrt
