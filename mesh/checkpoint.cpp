#include "mesh/checkpoint.h"

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

#include "mesh/checkpoint_index.h"
#include "mesh/checkpoint_root.h"
#include "mesh/crc32c.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace meshrt {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

constexpr const char* kFormat = "meshrt-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kIndex = detail::kCheckpointIndex;
constexpr const char* kLatest = detail::kCheckpointLatest;
constexpr uint64_t kMaxIndexBytes = 64ull << 20;

std::string step_name(int64_t step) { return detail::checkpoint_step_name(step); }
std::string rank_file(int rank) { return detail::checkpoint_rank_file(rank); }
int64_t parse_step_name(const std::string& n) { return detail::parse_checkpoint_step_name(n); }
std::string read_small_file(const std::string& path, uint64_t limit) {
  return detail::read_checkpoint_file(path, limit);
}

// Host memory filled by the CPU directly (pread, stores), outside any stream's order: a caching
// allocator's block may still be in use by work queued before it was freed.
const std::shared_ptr<Allocator>& host_plain() {
  static const std::shared_ptr<Allocator> a = make_host_plain_allocator();
  return a;
}

// Collective over the world: elementwise `op` of v over ranks (small host vectors).
std::vector<int64_t> agree(DeviceMesh& mesh, const std::vector<int64_t>& v, ReduceOp op) {
  Context& ctx = mesh.ctx();
  Stream& cs = ctx.compute_stream();
  const auto n = static_cast<int64_t>(v.size());
  Tensor h = Tensor::empty({n}, DType::i64, host_plain());
  std::copy(v.begin(), v.end(), h.data<int64_t>());
  Tensor d = ctx.zeros({n}, DType::i64);
  d.copy_(h, cs);
  cs.synchronize();  // h is freed on return
  cs.wait(mesh.world().all_reduce(d, op, cs));
  Tensor r = d.to(ctx.host_allocator(), cs);
  cs.synchronize();
  return {r.data<int64_t>(), r.data<int64_t>() + n};
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

json shape_json(const Shape& s) { return s.vec(); }

// Test hook MESHRT_CHECKPOINT_FAULT="rank=R,mode=kill|throw": rank R fails after writing part
// of its file (the header and its first tensor), as a crash during the write would.
struct Fault {
  int rank = -1;
  bool kill = false;
};

Fault fault_from_env() {
  Fault f;
  const std::string s = env_or("MESHRT_CHECKPOINT_FAULT");
  if (s.empty()) return f;
  auto get = [&](const std::string& k) {
    auto p = s.find(k + "=");
    if (p == std::string::npos) return std::string();
    auto q = s.find(',', p);
    return s.substr(p + k.size() + 1,
                    q == std::string::npos ? std::string::npos : q - p - 1 - k.size());
  };
  if (!get("rank").empty()) f.rank = std::stoi(get("rank"));
  f.kill = get("mode") == "kill";
  return f;
}

}  // namespace

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
    fs::create_directories(root, ec);
    MESHRT_CHECK(!ec, "--save " << root << ": cannot create the directory: " << ec.message());
  }
  MESHRT_CHECK(::access(root.c_str(), W_OK | X_OK) == 0,
               "--save " << root << ": directory is not writable: " << std::strerror(errno));
}

namespace {

// Collective: when some rank's `err` is set, throws on every rank. The failing rank throws its
// own error; the others `what` (naming the lowest failing rank) followed by that rank's error
// text, so a thread or process that did not fail still says why.
void agree_error(DeviceMesh& mesh, const std::string& err, const std::string& what) {
  const int rank = mesh.rank(), world = mesh.world_size();
  const auto f = agree(mesh, {err.empty() ? 0 : world - rank}, ReduceOp::Max);
  if (f[0] == 0) return;
  const int failed = world - static_cast<int>(f[0]);
  constexpr size_t kMaxText = 2048;
  std::vector<int64_t> text(kMaxText, 0);
  if (rank == failed)
    for (size_t i = 0; i < err.size() && i < kMaxText; ++i)
      text[i] = static_cast<unsigned char>(err[i]);
  text = agree(mesh, text, ReduceOp::Sum);
  MESHRT_CHECK(err.empty(), err);
  std::string msg;
  for (int64_t c : text) {
    if (c == 0) break;
    msg.push_back(static_cast<char>(c));
  }
  if (msg.rfind("checkpoint: ", 0) == 0) msg.erase(0, 12);
  MESHRT_FAIL("checkpoint: rank " << failed << " " << what << ": " << msg);
}

constexpr int kSuffix = 6;  // mkdtemp's XXXXXX

// Rank 0: with the folder locked, removes what killed jobs left and makes this save's temporary
// directory (a unique name from mkdtemp).
std::string make_save_dir(const std::string& root, const std::string& name) {
  prepare_checkpoint_root(root);
  detail::remove_stale_checkpoint_temporaries(root);
  std::string templ = root + "/.tmp-" + name + "-XXXXXX";
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
    for (int i = 0; i < kSuffix; ++i)
      suffix[static_cast<size_t>(i)] = tmp0[tmp0.size() - kSuffix + static_cast<size_t>(i)];
  suffix = agree(mesh, suffix, ReduceOp::Sum);
  std::string tmp = root + "/.tmp-" + name + "-";
  for (int64_t c : suffix) tmp.push_back(static_cast<char>(c));
  return tmp;
}

struct RankFileInfo {
  uint32_t crc = 0;
  uint64_t bytes = 0;
};

// This rank's shards (those it owns: one copy of each replica) and the optimizer step, to
// tmp/rank-N.safetensors. Returns its size and checksum.
RankFileInfo write_rank_file(const std::string& tmp, const CheckpointMeta& meta, DeviceMesh& mesh,
                             const std::vector<Saved>& all, const Optimizer* opt) {
  const int rank = mesh.rank();
  NamedTensors mine;
  for (const Saved& s : all)
    if (owns(s.p->placements, mesh.coords())) mine.emplace_back(s.key, s.local);
  Tensor step_t = Tensor::empty({1}, DType::i64, host_plain());
  step_t.data<int64_t>()[0] = opt ? opt->steps() : meta.step;
  mine.emplace_back("optimizer.step", step_t);
  RankFileInfo out;
  const Fault fault = fault_from_env();
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
  save_safetensors(
      tmp + "/" + rank_file(rank), mine, mesh.ctx().compute_stream(),
      {{"format", kFormat}, {"step", std::to_string(meta.step)}, {"rank", std::to_string(rank)}},
      wo);
  return out;
}

// The index: the meta, every rank file's size and checksum (info: ok, bytes, crc per rank) and
// every tensor's shards.
json build_index(const CheckpointMeta& meta, DeviceMesh& mesh, const std::vector<Saved>& all,
                 const Optimizer* opt, const std::vector<int64_t>& info) {
  const int world = mesh.world_size();
  json idx;
  idx["format"] = kFormat;
  idx["version"] = kVersion;
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
  for (const Saved& s : all) {
    json shards = json::array();
    for (int r = 0; r < world; ++r) {
      const auto c = coords_of(mesh.dims(), r);
      if (!owns(s.p->placements, c)) continue;
      Shape l, o;
      extent_at(s.p->full_shape, mesh.dims(), c, s.p->placements, &l, &o);
      shards.push_back(
          {{"file", rank_file(r)}, {"offsets", shape_json(o)}, {"shape", shape_json(l)}});
    }
    json pl = json::array();
    for (auto& p : s.p->placements) pl.push_back(p.str());
    tensors[s.key] = {{"dtype", safetensors_dtype_name(s.local.dtype())},
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
    old = root + "/.old-" + name + "-" + id;
    MESHRT_CHECK(std::rename(final_dir.c_str(), old.c_str()) == 0,
                 "checkpoint: cannot move " << final_dir << " aside: " << std::strerror(errno));
  }
  MESHRT_CHECK(
      std::rename(tmp.c_str(), final_dir.c_str()) == 0,
      "checkpoint: rename " << tmp << " -> " << final_dir << " failed: " << std::strerror(errno));
  fsync_dir(root);
  const std::string ptr = root + "/.latest-" + id;
  write_new_file(ptr, name + "\n");
  MESHRT_CHECK(
      std::rename(ptr.c_str(), (root + "/" + kLatest).c_str()) == 0,
      "checkpoint: cannot update " << root << "/" << kLatest << ": " << std::strerror(errno));
  fsync_dir(root);
  if (!old.empty()) detail::retire_replaced_checkpoint(old, final_dir);
  detail::prune_checkpoints(root, run, keep, name);
}

}  // namespace

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
      err = e.what();
    }
  }
  agree_error(mesh, err, "could not prepare " + root);
  const std::string tmp = share_save_dir(mesh, root, name, tmp0);

  // Every rank writes the shards it owns.
  const auto all = saved_tensors(params, opt);
  RankFileInfo mine;
  try {
    mine = write_rank_file(tmp, meta, mesh, all, opt);
  } catch (const std::exception& e) {
    err = e.what();
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
      publish(root, tmp, name, build_index(meta, mesh, all, opt, info).dump(1) + "\n", meta.run,
              keep);
    } catch (const std::exception& e) {
      err = e.what();
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
      err = e.what();
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
    std::string n = read_small_file(latest, 256);
    while (!n.empty() && (n.back() == '\n' || n.back() == ' ')) n.pop_back();
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

Shape shape_from(const json& j, const std::string& where) {
  MESHRT_CHECK(j.is_array() && j.size() <= static_cast<size_t>(kMaxDims),
               where << ": not an array of at most " << kMaxDims << " extents");
  std::vector<int64_t> v;
  for (auto& d : j) {
    MESHRT_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0,
                 where << ": extent " << d.dump() << " is not a non-negative integer");
    v.push_back(d.get<int64_t>());
  }
  return Shape(v);
}

// Copies the part of saved shard `s` (tensor `e` of file `r`) that overlaps this rank's block
// [off, off + local) into `dst` (the block, contiguous). Returns the elements copied.
int64_t copy_overlap(const SafetensorsReader& r, const SafetensorsReader::Entry& e,
                     const ShardRef& s, const Shape& off, const Shape& local, char* dst) {
  const int nd = local.ndim();
  const size_t es = dtype_size(e.dtype);
  std::vector<int64_t> lo(static_cast<size_t>(nd)), hi(static_cast<size_t>(nd));
  int64_t count = 1;
  for (int d = 0; d < nd; ++d) {
    lo[static_cast<size_t>(d)] = std::max(off[d], s.offsets[d]);
    hi[static_cast<size_t>(d)] = std::min(off[d] + local[d], s.offsets[d] + s.shape[d]);
    if (hi[static_cast<size_t>(d)] <= lo[static_cast<size_t>(d)]) return 0;
    count *= hi[static_cast<size_t>(d)] - lo[static_cast<size_t>(d)];
  }
  // Dims after k are covered whole in both blocks, so one run spans them: read it in one piece.
  int k = nd - 1;
  while (k >= 0 && lo[static_cast<size_t>(k)] == s.offsets[k] &&
         lo[static_cast<size_t>(k)] == off[k] &&
         hi[static_cast<size_t>(k)] == s.offsets[k] + s.shape[k] &&
         hi[static_cast<size_t>(k)] == off[k] + local[k])
    --k;
  std::vector<int64_t> sstride(static_cast<size_t>(nd), 1), dstride(static_cast<size_t>(nd), 1);
  for (int d = nd - 2; d >= 0; --d) {
    sstride[static_cast<size_t>(d)] = sstride[static_cast<size_t>(d) + 1] * s.shape[d + 1];
    dstride[static_cast<size_t>(d)] = dstride[static_cast<size_t>(d) + 1] * local[d + 1];
  }
  if (k < 0) {
    r.read(e, 0, static_cast<uint64_t>(count) * es, dst);
    return count;
  }
  const int64_t run =
      (hi[static_cast<size_t>(k)] - lo[static_cast<size_t>(k)]) * sstride[static_cast<size_t>(k)];
  std::vector<int64_t> idx(lo.begin(), lo.begin() + k);  // odometer over dims < k
  while (true) {
    int64_t so = (lo[static_cast<size_t>(k)] - s.offsets[k]) * sstride[static_cast<size_t>(k)];
    int64_t dof = (lo[static_cast<size_t>(k)] - off[k]) * dstride[static_cast<size_t>(k)];
    for (int d = 0; d < k; ++d) {
      so += (idx[static_cast<size_t>(d)] - s.offsets[d]) * sstride[static_cast<size_t>(d)];
      dof += (idx[static_cast<size_t>(d)] - off[d]) * dstride[static_cast<size_t>(d)];
    }
    r.read(e, static_cast<uint64_t>(so) * es, static_cast<uint64_t>(run) * es,
           dst + static_cast<size_t>(dof) * es);
    int d = k - 1;
    while (d >= 0 && ++idx[static_cast<size_t>(d)] == hi[static_cast<size_t>(d)]) {
      idx[static_cast<size_t>(d)] = lo[static_cast<size_t>(d)];
      --d;
    }
    if (d < 0) break;
  }
  return count;
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

CheckpointMeta load_checkpoint(const std::string& path, const CheckpointMeta& expect,
                               DeviceMesh& mesh, const std::vector<Param*>& params,
                               Optimizer* opt) {
  Context& ctx = mesh.ctx();
  Stream& cs = ctx.compute_stream();
  const std::string dir = resolve_checkpoint(path);
  const std::string index_path = dir + "/" + kIndex;
  const detail::CheckpointIndex idx = read_index(dir, expect);
  const CheckpointMeta& got = idx.meta;
  const auto& file_bytes = idx.file_bytes;
  const auto& file_crc = idx.file_crc;
  const auto& tensors = idx.tensors;
  const auto want = saved_tensors(params, opt);
  for (const Saved& s : want) {
    auto it = tensors.find(s.key);
    MESHRT_CHECK(it != tensors.end(), "checkpoint: " << index_path << " has no tensor '" << s.key
                                                     << "' that the model needs");
    MESHRT_CHECK(it->second.shape == s.p->full_shape,
                 "checkpoint: " << index_path << ": tensor '" << s.key << "' has shape "
                                << it->second.shape.str() << " but the model's is "
                                << s.p->full_shape.str());
    MESHRT_CHECK(it->second.dtype == safetensors_dtype_name(s.local.dtype()),
                 "checkpoint: " << index_path << ": tensor '" << s.key << "' is "
                                << it->second.dtype << " but the model's is "
                                << safetensors_dtype_name(s.local.dtype()));
  }
  for (auto& [f, n] : file_bytes) {
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

  // Per rank work, agreed on before anything is modified: checksums (file i on rank i % world,
  // so each file is read whole once) and this rank's byte ranges into host buffers.
  const int rank = mesh.rank(), world = mesh.world_size();
  std::string err;
  std::vector<Tensor> staged;
  try {
    int i = 0;
    for (auto& [f, n] : file_bytes) {
      if (i++ % world != rank) continue;
      SafetensorsReader r(dir + "/" + f);  // also validates the header
      std::vector<char> buf(std::min<uint64_t>(n, 8ull << 20));
      uint32_t crc = 0;
      const int fd = ::open((dir + "/" + f).c_str(), O_RDONLY | O_CLOEXEC);
      MESHRT_CHECK(fd >= 0, "checkpoint: cannot open " << dir << "/" << f);
      uint64_t total = 0;
      ssize_t got_n;
      while ((got_n = ::read(fd, buf.data(), buf.size())) > 0) {
        crc = crc32c(crc, buf.data(), static_cast<size_t>(got_n));
        total += static_cast<uint64_t>(got_n);
      }
      ::close(fd);
      MESHRT_CHECK(total == n && crc == file_crc.at(f),
                   "checkpoint: " << dir << "/" << f << " fails its checksum (crc32c " << std::hex
                                  << crc << ", index says " << file_crc.at(f) << std::dec
                                  << "): the file is corrupt");
    }
    std::map<std::string, std::unique_ptr<SafetensorsReader>> readers;
    for (const Saved& s : want) {
      const IndexTensor& t = tensors.at(s.key);
      Tensor h = Tensor::empty(s.local.shape(), s.local.dtype(), host_plain());
      int64_t covered = 0;
      for (const ShardRef& sh : t.shards) {
        auto& rd = readers[sh.file];
        if (!rd) rd = std::make_unique<SafetensorsReader>(dir + "/" + sh.file);
        const auto* e = rd->find(s.key);
        MESHRT_CHECK(e && e->shape == sh.shape && safetensors_dtype_name(e->dtype) == t.dtype,
                     "checkpoint: " << dir << "/" << sh.file << " has no " << t.dtype << " tensor '"
                                    << s.key << "' of shape " << sh.shape.str()
                                    << " as its index says");
        covered += copy_overlap(*rd, *e, sh, s.p->offsets, s.local.shape(),
                                static_cast<char*>(h.data_ptr()));
      }
      MESHRT_CHECK(covered == s.local.numel(), "checkpoint: " << index_path << ": the shards of '"
                                                              << s.key << "' cover " << covered
                                                              << " of the " << s.local.numel()
                                                              << " elements this rank needs");
      staged.push_back(h);
    }
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree_error(mesh, err, "rejected the checkpoint " + dir);
  for (size_t i = 0; i < want.size(); ++i) want[i].local.copy_(staged[i], cs);
  if (opt) opt->set_steps(idx.optimizer_step);
  cs.synchronize();
  return got;
}

namespace detail {

namespace {

// Element count of `s` and every stride fit in int64 (zero extents or not).
void check_shape_fits(const Shape& s, const std::string& where) {
  int64_t span = 1;
  for (int d = 0; d < s.ndim(); ++d)
    MESHRT_CHECK(!__builtin_mul_overflow(span, std::max<int64_t>(s[d], 1), &span),
                 where << ": shape " << s.str() << " overflows 64-bit sizes");
}

// Field `name` of `j`: a non-negative integer that fits T. A float (1e20), a string, a negative
// or too large value is refused naming the field instead of wrapping.
template <class T>
T index_count(const json& j, const char* name, const std::string& where) {
  MESHRT_CHECK(j.is_object() && j.contains(name), where << ": field '" << name << "' is missing");
  const json& v = j.at(name);
  MESHRT_CHECK(v.is_number_unsigned() &&
                   v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max()),
               where << ": field '" << name << "' is " << v.dump() << ", not an integer in [0, "
                     << std::numeric_limits<T>::max() << "]");
  return static_cast<T>(v.get<uint64_t>());
}

// "0000abcd": 1 to 8 hex digits, nothing else.
uint32_t parse_crc(const std::string& h, const std::string& where) {
  MESHRT_CHECK(!h.empty() && h.size() <= 8 &&
                   h.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos,
               where << ": crc32c '" << h << "' is not 1 to 8 hex digits");
  return static_cast<uint32_t>(std::stoul(h, nullptr, 16));
}

}  // namespace

CheckpointIndex parse_checkpoint_index(const std::string& text, const std::string& index_path,
                                       const std::string& dir, const CheckpointMeta& expect) {
  json idx = json::parse(text, nullptr, /*allow_exceptions=*/false);
  MESHRT_CHECK(!idx.is_discarded() && idx.is_object(),
               "checkpoint: " << index_path << " is not JSON; not a meshrt checkpoint");
  MESHRT_CHECK(idx.contains("format") && idx["format"] == kFormat,
               "checkpoint: " << index_path << " is not a meshrt checkpoint index (format "
                              << (idx.contains("format") ? idx["format"].dump() : "missing")
                              << ", expected \"" << kFormat << "\"); written by another tool?");
  MESHRT_CHECK(idx["version"] == kVersion, "checkpoint: " << index_path << " has version "
                                                          << idx["version"].dump()
                                                          << "; this meshrt reads " << kVersion);
  CheckpointIndex out;
  CheckpointMeta& got = out.meta;
  try {
    got.step = index_count<int>(idx, "step", "checkpoint: " + index_path);
    got.seed =
        index_count<uint64_t>(idx.at("data"), "seed", "checkpoint: " + index_path + ": data");
    got.mesh = idx.at("mesh").get<std::string>();
    if (idx.contains("run")) got.run = idx.at("run").get<std::string>();  // older indexes have none
    // Older indexes have no skipped-step count either (0).
    if (idx.contains("skipped_steps"))
      got.skipped_steps = index_count<int>(idx, "skipped_steps", "checkpoint: " + index_path);
    MESHRT_CHECK(idx.at("config").is_object(),
                 "checkpoint: " << index_path << ": config is not an object");
    for (auto it = idx.at("config").begin(); it != idx.at("config").end(); ++it)
      got.config.emplace_back(it.key(), it.value().get<std::string>());
  } catch (const json::exception& e) {
    MESHRT_FAIL("checkpoint: " << index_path << " is malformed: " << e.what());
  }
  for (const auto& want : expect.config) {
    const std::string &k = want.first, &v = want.second;
    auto it =
        std::find_if(got.config.begin(), got.config.end(), [&](auto& kv) { return kv.first == k; });
    MESHRT_CHECK(it != got.config.end(), "checkpoint: " << index_path << " does not record '" << k
                                                        << "' (this run has " << k << "=" << v
                                                        << ")");
    MESHRT_CHECK(it->second == v, "checkpoint: " << index_path << " was saved with " << k << "="
                                                 << it->second << " but this run has " << k << "="
                                                 << v << "; use the same " << k << " to resume");
  }
  try {
    MESHRT_CHECK(idx.at("files").is_object() && idx.at("tensors").is_object(),
                 "checkpoint: " << index_path << ": files and tensors must be objects");
    for (auto it = idx.at("files").begin(); it != idx.at("files").end(); ++it) {
      const std::string f = it.key();
      MESHRT_CHECK(f.find('/') == std::string::npos && f != ".." && f != "." && !f.empty() &&
                       f.find('\0') == std::string::npos,
                   "checkpoint: " << index_path << " names file '" << f << "' outside " << dir);
      out.file_bytes[f] = index_count<uint64_t>(it.value(), "bytes",
                                                "checkpoint: " + index_path + ": file '" + f + "'");
      out.file_crc[f] = parse_crc(it.value().at("crc32c").get<std::string>(),
                                  "checkpoint: " + index_path + ": file '" + f + "'");
    }
    for (auto it = idx.at("tensors").begin(); it != idx.at("tensors").end(); ++it) {
      const std::string where = "checkpoint: " + index_path + ": tensor '" + it.key() + "'";
      IndexTensor t;
      t.dtype = it.value().at("dtype").get<std::string>();
      t.shape = shape_from(it.value().at("shape"), where + " shape");
      check_shape_fits(t.shape, where);
      MESHRT_CHECK(it.value().at("shards").is_array(), where << ": shards is not an array");
      for (auto& s : it.value().at("shards")) {
        ShardRef r;
        r.file = s.at("file").get<std::string>();
        MESHRT_CHECK(out.file_bytes.count(r.file),
                     where << ": shard in '" << r.file << "', which the index does not list");
        r.offsets = shape_from(s.at("offsets"), where + " offsets");
        r.shape = shape_from(s.at("shape"), where + " shard shape");
        MESHRT_CHECK(r.offsets.ndim() == t.shape.ndim() && r.shape.ndim() == t.shape.ndim(),
                     where << ": a shard's rank differs from the tensor's");
        for (int d = 0; d < t.shape.ndim(); ++d)
          MESHRT_CHECK(r.offsets[d] <= t.shape[d] && r.shape[d] <= t.shape[d] - r.offsets[d],
                       where << ": shard at " << r.offsets.str() << " of shape " << r.shape.str()
                             << " runs past " << t.shape.str());
        t.shards.push_back(r);
      }
      out.tensors[it.key()] = t;
    }
    out.optimizer_step = index_count<int64_t>(idx.at("optimizer"), "step",
                                              "checkpoint: " + index_path + ": optimizer");
  } catch (const json::exception& e) {
    MESHRT_FAIL("checkpoint: " << index_path << " is malformed: " << e.what());
  }
  return out;
}

}  // namespace detail

}  // namespace meshrt
