#include "bench/collective/collective_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "bench/common/stats.h"
#include "collectives/bootstrap.h"
#include "collectives/communicator.h"
#include "collectives/exact_values.h"
#include "runtime/allocator.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/half.h"
#include "runtime/output_file.h"
#include "runtime/tensor.h"

namespace meshrt {

int64_t parse_bench_size(std::string_view s) {
  MESHRT_CHECK(!s.empty(), "empty size: use bytes with an optional K, M or G suffix, e.g. 64M");
  int64_t mult = 1;
  std::string_view digits = s;
  switch (s.back()) {
    case 'K':
    case 'k':
      mult = int64_t{1} << 10;
      digits.remove_suffix(1);
      break;
    case 'M':
    case 'm':
      mult = int64_t{1} << 20;
      digits.remove_suffix(1);
      break;
    case 'G':
    case 'g':
      mult = int64_t{1} << 30;
      digits.remove_suffix(1);
      break;
    default:
      break;
  }
  MESHRT_CHECK(
      !digits.empty() && digits.size() <= 15 &&
          std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }),
      "size '" << s << "' is not a byte count: use e.g. 8, 512K, 64M or 1G");
  int64_t bytes = 0;
  MESHRT_CHECK(!__builtin_mul_overflow(std::stoll(std::string(digits)), mult, &bytes),
               "size '" << s << "' is too large: use at most 8E bytes");
  return bytes;
}

namespace {

using bench::Clock;

// Element counts per rank, as nccl-tests lays them out for a size of `count` elements.
struct Layout {
  int64_t send = 0;
  int64_t recv = 0;
  int64_t param = 0;  // the count printed in the table and passed to the collective
};

Layout layout_for(CommOp op, int64_t count, int n, size_t es) {
  Layout l;
  switch (op) {
    case CommOp::AllReduce:
    case CommOp::Broadcast:
      l.send = l.recv = l.param = count;
      break;
    case CommOp::AllGather: {
      const int64_t base = count / (4 * n) * 4;
      l.send = l.param = base;
      l.recv = base * n;
      break;
    }
    case CommOp::ReduceScatter: {
      const int64_t base = count / (4 * n) * 4;
      l.recv = l.param = base;
      l.send = base * n;
      break;
    }
    case CommOp::AllToAll: {
      // Per-peer blocks aligned to 16 bytes.
      const int64_t align = std::max<int64_t>(1, 16 / static_cast<int64_t>(es));
      l.param = count / n / align * align;
      l.send = l.recv = l.param * n;
      break;
    }
    default:
      break;
  }
  return l;
}

// Bytes per iteration that algbw counts, and busbw / algbw (both exactly as nccl-tests).
double alg_bytes(CommOp op, const Layout& l, size_t es, int n) {
  const double b = static_cast<double>(l.param) * static_cast<double>(es);
  switch (op) {
    case CommOp::AllGather:
    case CommOp::ReduceScatter:
    case CommOp::AllToAll:
      return b * n;
    default:
      return b;
  }
}

double bus_factor(CommOp op, int n) {
  switch (op) {
    case CommOp::AllReduce:
      return 2.0 * (n - 1) / n;
    case CommOp::AllGather:
    case CommOp::ReduceScatter:
    case CommOp::AllToAll:
      return static_cast<double>(n - 1) / n;
    default:
      return 1.0;
  }
}

const char* nccl_type_name(DType dt) {
  switch (dt) {
    case DType::f32:
      return "float";
    case DType::bf16:
      return "bfloat16";
    case DType::f16:
      return "half";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
    case DType::u8:
      return "uint8";
  }
  return "?";
}

bool is_reduction(CommOp op) { return op == CommOp::AllReduce || op == CommOp::ReduceScatter; }

// Inputs and expected results: collectives/exact_values.h, so #wrong is a real check.
using exact::load;
using exact::pattern;
using exact::reduced;
using exact::store;

struct Timing {
  double avg_us = 0, min_us = 0, max_us = 0, shown_us = 0;
  double algbw = 0, busbw = 0;
  int64_t wrong = -1;                          // -1: not checked
  double lat_median_us = -1, lat_p99_us = -1;  // --latency: slowest rank's; -1 without
};

struct Row {
  int64_t bytes = 0;
  int64_t count = 0;
  Timing t[2];  // out-of-place, in-place
};

struct Settings {
  CommOp op;
  DType dt;
  ReduceOp redop;
  std::vector<int64_t> sizes;
};

std::string time_str(double us) {
  char buf[32];
  if (us >= 10000.0) {
    std::snprintf(buf, sizeof(buf), "%7.0f", us);
  } else if (us >= 100.0) {
    std::snprintf(buf, sizeof(buf), "%7.1f", us);
  } else {
    std::snprintf(buf, sizeof(buf), "%7.2f", us);
  }
  return buf;
}

// One rank's share of the run.
class RankBench {
 public:
  RankBench(const CollBenchOptions& o, const Settings& s, const RankPlacement& p, Communicator& c)
      : o_(o), s_(s), comm_(c), dev_(p.device), n_(c.size()), r_(c.rank()) {
    const DeviceRuntime& be = backend_for(dev_);
    stream_ = be.create_stream(dev_.index, "bench.comm");
    host_alloc_ = make_host_caching_allocator(dev_.is_cpu() ? dev_.index : 0);
    alloc_ = dev_.is_cpu() ? host_alloc_ : be.create_caching_allocator(dev_.index);
    es_ = dtype_size(s.dt);
  }

  // Reduces a value over ranks exactly (as integer nanoseconds / counts).
  int64_t reduce_i64(int64_t v, ReduceOp op) {
    Tensor t = Tensor::empty(Shape{1}, DType::i64, alloc_, stream_.get());
    t.fill_(static_cast<double>(v), *stream_);
    comm_.all_reduce(t, op, *stream_).synchronize();
    Tensor h = dev_.is_cpu() ? t : t.to(host_alloc_, *stream_);
    stream_->synchronize();
    return static_cast<int64_t>(h.item(0));
  }

  void barrier() { comm_.barrier(*stream_).synchronize(); }

  // The per-rank bandwidth that bounds a shared-memory all-reduce's algbw: every rank memcpys
  // `bytes` at once, `iters` times back to back (timed like the collectives); the slowest rank's
  // time per copy counts; median over 7 repetitions.
  double memcpy_gbps(int64_t bytes) {
    if (!dev_.is_cpu() || bytes <= 0) return 0;
    Tensor a = Tensor::empty(Shape{bytes}, DType::u8, host_alloc_);
    Tensor b = Tensor::empty(Shape{bytes}, DType::u8, host_alloc_);
    std::memset(a.data_ptr(), 1, static_cast<size_t>(bytes));
    std::memset(b.data_ptr(), 2, static_cast<size_t>(bytes));
    std::vector<double> bw;
    const int iters = std::max(1, o_.iters);
    for (int rep = 0; rep < 7; ++rep) {
      barrier();
      auto t0 = Clock::now();
      for (int it = 0; it < iters; ++it) {
        std::memcpy(b.data_ptr(), a.data_ptr(), static_cast<size_t>(bytes));
      }
      int64_t ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count() / iters;
      int64_t worst = reduce_i64(ns, ReduceOp::Max);
      bw.push_back(static_cast<double>(bytes) / static_cast<double>(worst));  // bytes/ns = GB/s
    }
    return bench::median(bw);
  }

  Tensor device_tensor(int64_t n) { return Tensor::empty(Shape{n}, s_.dt, alloc_, stream_.get()); }

  // Writes pattern(seed, rank_of_values, offset + i) into t.
  void fill(const Tensor& t, uint64_t seed, int rank_of_values, int64_t offset = 0) {
    if (t.numel() == 0) return;
    Tensor h = Tensor::empty(Shape{t.numel()}, s_.dt, host_alloc_);
    for (int64_t i = 0; i < t.numel(); ++i)
      store(h.data_ptr(), s_.dt, i, pattern(seed, rank_of_values, offset + i));
    if (dev_.is_cpu()) {
      stream_->synchronize();
      std::memcpy(t.data_ptr(), h.data_ptr(), t.nbytes());
    } else {
      Tensor tt = t;
      tt.copy_(h, *stream_);
      stream_->synchronize();
    }
  }

  Tensor to_host(const Tensor& t) {
    if (dev_.is_cpu()) return t;
    Tensor h = Tensor::empty(Shape{t.numel()}, s_.dt, host_alloc_);
    h.copy_(t.view(Shape{t.numel()}), *stream_);
    stream_->synchronize();
    return h;
  }

  // Issues the collective once (in place or not) on the buffers.
  void issue(bool in_place, const Tensor& send, const Tensor& recv, const Layout& l) {
    Stream& s = *stream_;
    switch (s_.op) {
      case CommOp::AllReduce:
        in_place ? (void)comm_.all_reduce(recv, s_.redop, s)
                 : (void)comm_.all_reduce(send, recv, s_.redop, s);
        return;
      case CommOp::AllGather:
        comm_.all_gather(in_place ? recv.narrow(0, r_ * l.param, l.param) : send, recv, s);
        return;
      case CommOp::ReduceScatter:
        comm_.reduce_scatter(send, in_place ? send.narrow(0, r_ * l.param, l.param) : recv,
                             s_.redop, s);
        return;
      case CommOp::Broadcast:
        in_place ? (void)comm_.broadcast(recv, o_.root, s)
                 : (void)comm_.broadcast(send, recv, o_.root, s);
        return;
      case CommOp::AllToAll:
        comm_.all_to_all(in_place ? recv : send, recv, s);
        return;
      default:
        MESHRT_FAIL("collective bench: unsupported op " << comm_op_name(s_.op));
    }
  }

  // Each of -n iterations alone: issue, wait for it, next. The median and p99 of this rank's
  // times, then the slowest rank's of each (the ranks are not otherwise synchronised in between:
  // the collective itself is the synchronisation, as in osu_allreduce).
  void latency(bool in_place, const Tensor& send, const Tensor& recv, const Layout& l, Timing& t) {
    barrier();
    std::vector<double> ns;
    ns.reserve(static_cast<size_t>(o_.iters));
    for (int it = 0; it < o_.iters; ++it) {
      const auto t0 = Clock::now();
      issue(in_place, send, recv, l);
      stream_->synchronize();
      ns.push_back(static_cast<double>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count()));
    }
    t.lat_median_us =
        static_cast<double>(reduce_i64(std::llround(bench::median(ns)), ReduceOp::Max)) / 1e3;
    t.lat_p99_us =
        static_cast<double>(reduce_i64(std::llround(bench::percentile(ns, 0.99)), ReduceOp::Max)) /
        1e3;
  }

  // Fresh inputs, one run, wrong elements on this rank.
  int64_t check(bool in_place, const Tensor& send, const Tensor& recv, const Layout& l,
                uint64_t seed) {
    const int64_t N = l.param;
    switch (s_.op) {
      case CommOp::AllReduce:
        fill(in_place ? recv : send, seed, r_);
        break;
      case CommOp::AllGather:
        fill(recv, seed + 1000, 99);  // sentinel-ish values everywhere
        fill(in_place ? recv.narrow(0, r_ * N, N) : send, seed, r_);
        break;
      case CommOp::ReduceScatter:
        fill(send, seed, r_);
        break;
      case CommOp::Broadcast:
        fill(in_place ? recv : send, seed, r_ == o_.root ? r_ : r_ + 1000);
        break;
      case CommOp::AllToAll:
        fill(in_place ? recv : send, seed, r_);
        break;
      default:
        break;
    }
    issue(in_place, send, recv, l);
    stream_->synchronize();
    Tensor result = (s_.op == CommOp::ReduceScatter && in_place) ? send.narrow(0, r_ * N, N) : recv;
    Tensor h = to_host(result);
    int64_t wrong = 0;
    const int64_t total = h.numel();
    for (int64_t i = 0; i < total; ++i) {
      double want = 0;
      switch (s_.op) {
        case CommOp::AllReduce:
          want = reduced(s_.dt, s_.redop, seed, n_, i);
          break;
        case CommOp::AllGather:
          want = pattern(seed, static_cast<int>(i / N), i % N);
          break;
        case CommOp::ReduceScatter:
          want = reduced(s_.dt, s_.redop, seed, n_, r_ * N + i);
          break;
        case CommOp::Broadcast:
          want = pattern(seed, o_.root, i);
          break;
        case CommOp::AllToAll:
          want = pattern(seed, static_cast<int>(i / N), r_ * N + i % N);
          break;
        default:
          break;
      }
      if (load(h.data_ptr(), s_.dt, i) != want) ++wrong;
    }
    return wrong;
  }

  // `n` iterations back to back, at most kQueueDepth ahead of the stream, as a CUDA launch queue
  // bounds them: a host stream would otherwise hold every queued iteration (about 3 KB each, so
  // -n 10^8 took 20 GB).
  void issue_many(int n, bool in_place, const Tensor& send, const Tensor& recv, const Layout& l) {
    constexpr int kMark = 256, kQueueDepth = 4 * kMark;
    std::deque<Event> marks;
    for (int it = 0; it < n; ++it) {
      issue(in_place, send, recv, l);
      if ((it + 1) % kMark != 0) continue;
      marks.push_back(stream_->record());
      if (static_cast<int>(marks.size()) * kMark > kQueueDepth) {
        marks.front().synchronize();
        marks.pop_front();
      }
    }
  }

  Row run_size(int64_t bytes, int size_index) {
    Row row;
    const int64_t count = bytes / static_cast<int64_t>(es_);
    const Layout l = layout_for(s_.op, count, n_, es_);
    row.bytes = std::max(l.send, l.recv) * static_cast<int64_t>(es_);
    row.count = l.param;
    Tensor send = device_tensor(l.send);
    Tensor recv = device_tensor(l.recv);
    fill(send, o_.seed, r_);
    fill(recv, o_.seed, r_);
    for (int ip = 0; ip < 2; ++ip) {
      const bool in_place = ip == 1;
      issue_many(o_.warmup, in_place, send, recv, l);
      stream_->synchronize();
      barrier();
      auto t0 = Clock::now();
      issue_many(o_.iters, in_place, send, recv, l);
      stream_->synchronize();
      const int64_t ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count() /
          std::max(1, o_.iters);
      Timing& t = row.t[ip];
      t.avg_us = static_cast<double>(reduce_i64(ns, ReduceOp::Sum)) / n_ / 1e3;
      t.min_us = static_cast<double>(reduce_i64(ns, ReduceOp::Min)) / 1e3;
      t.max_us = static_cast<double>(reduce_i64(ns, ReduceOp::Max)) / 1e3;
      const int64_t rank0 = reduce_i64(r_ == 0 ? ns : 0, ReduceOp::Sum);
      switch (o_.average) {
        case 0:
          t.shown_us = static_cast<double>(rank0) / 1e3;
          break;
        case 2:
          t.shown_us = t.min_us;
          break;
        case 3:
          t.shown_us = t.max_us;
          break;
        default:
          t.shown_us = t.avg_us;
      }
      const double sec = t.shown_us / 1e6;
      t.algbw = sec > 0 ? alg_bytes(s_.op, l, es_, n_) / 1e9 / sec : 0;
      t.busbw = t.algbw * bus_factor(s_.op, n_);
      if (o_.latency) latency(in_place, send, recv, l, t);
      if (o_.check) {
        const uint64_t seed = o_.seed + 7919u * static_cast<uint64_t>(size_index) + 31u * ip + 1;
        t.wrong = reduce_i64(check(in_place, send, recv, l, seed), ReduceOp::Sum);
      }
    }
    return row;
  }

 private:
  const CollBenchOptions& o_;
  const Settings& s_;
  Communicator& comm_;
  Device dev_;
  int n_;
  int r_;
  size_t es_ = 4;
  std::unique_ptr<Stream> stream_;
  std::shared_ptr<Allocator> host_alloc_;
  std::shared_ptr<Allocator> alloc_;
};

void print_header(std::ostream& out, const CollBenchOptions& o, const Launch& launch,
                  const Settings& s) {
  char buf[512];
  out << "# meshrt collective bench: " << comm_op_name(s.op) << ", " << launch.describe() << "\n";
  std::snprintf(buf, sizeof(buf),
                "# minBytes %lld maxBytes %lld step: %s warmup iters: %d iters: %d "
                "validation: %d\n",
                static_cast<long long>(o.min_bytes), static_cast<long long>(o.max_bytes),
                o.step_bytes > 0 ? (std::to_string(o.step_bytes) + "(bytes)").c_str()
                                 : (std::to_string(o.step_factor) + "(factor)").c_str(),
                o.warmup, o.iters, o.check ? 1 : 0);
  out << buf << "#\n# Using devices\n";
  for (const RankPlacement& p : launch.local()) {
    std::snprintf(buf, sizeof(buf), "#  Rank %2d Pid %6d device %s\n", p.rank,
                  static_cast<int>(getpid()), p.device.str().c_str());
    out << buf;
  }
  out << "#\n";
  out << "#                                                       out-of-place                     "
         "  in-place          \n";
  std::snprintf(buf, sizeof(buf),
                "#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size",
                "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
                "algbw", "busbw", "#wrong");
  out << buf;
  std::snprintf(
      buf, sizeof(buf), "#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "(B)",
      "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  out << buf << std::flush;
}

void print_row(std::ostream& out, const Row& row, const Settings& s, const CollBenchOptions& o) {
  char buf[512];
  const char* redop = is_reduction(s.op) ? reduce_op_name(s.redop) : "none";
  const int root = s.op == CommOp::Broadcast ? o.root : -1;
  std::snprintf(buf, sizeof(buf), "%12lld  %12lld  %8s  %6s  %6d",
                static_cast<long long>(row.bytes), static_cast<long long>(row.count),
                nccl_type_name(s.dt), redop, root);
  out << buf;
  for (const Timing& t : row.t) {
    std::string wrong = t.wrong < 0 ? "N/A" : std::to_string(t.wrong);
    std::snprintf(buf, sizeof(buf), "  %7s  %6.2f  %6.2f  %5s", time_str(t.shown_us).c_str(),
                  t.algbw, t.busbw, wrong.c_str());
    out << buf;
  }
  out << "\n" << std::flush;
}

// The memory traffic (bytes read + written) one rank needs at least for `op` on a row of `bytes`
// (the larger of its send and receive buffers) with `n` ranks, copying through shared memory:
// what it must read of the inputs and write of the outputs. A memcpy of B bytes is 2B of traffic,
// so the op cannot beat traffic / 2 / (the memcpy bandwidth every rank gets at once).
double memcpy_traffic_bytes(CommOp op, int n, double bytes, bool in_place) {
  const double others = n > 1 ? (n - 1.0) / n : 0.0;
  switch (op) {
    case CommOp::AllReduce:
      return 2 * bytes;  // its 1/n of every input read, its reduced 1/n written to every output
    case CommOp::ReduceScatter:
      return bytes * (1 + 1.0 / n);  // its block of every input read, its block written
    case CommOp::AllGather:
    case CommOp::AllToAll:
      return 2 * bytes * (in_place ? others : 1.0);  // in place its own block stays
    case CommOp::Broadcast:
      return 2 * bytes;  // a non-root rank reads the root's buffer and writes its own
    default:
      return 0;
  }
}

// Measured time against that bound, as a fraction (1 = at the memcpy bound).
double memcpy_fraction(CommOp op, int n, const Row& r, int place, double memcpy_gbps) {
  const double t = r.t[place].avg_us * 1e-6;
  if (memcpy_gbps <= 0 || t <= 0) return 0;
  return memcpy_traffic_bytes(op, n, static_cast<double>(r.bytes), place == 1) / 2 /
         (memcpy_gbps * 1e9) / t;
}

// --latency's lines under the table.
void print_latency(std::ostream& out, const std::vector<Row>& rows, const CollBenchOptions& o) {
  char buf[256];
  out << "# latency, each iteration alone, us (median / p99 of " << o.iters
      << ", slowest rank), out-of-place | in-place:\n";
  for (const Row& r : rows) {
    std::snprintf(buf, sizeof(buf), "# %12lld  %9.2f / %9.2f | %9.2f / %9.2f\n",
                  static_cast<long long>(r.bytes), r.t[0].lat_median_us, r.t[0].lat_p99_us,
                  r.t[1].lat_median_us, r.t[1].lat_p99_us);
    out << buf;
  }
}

nlohmann::json timing_json(const Timing& t) {
  nlohmann::json j = {{"time_us", {{"avg", t.avg_us}, {"min", t.min_us}, {"max", t.max_us}}},
                      {"time_us_reported", t.shown_us},
                      {"algbw_gbps", t.algbw},
                      {"busbw_gbps", t.busbw},
                      {"wrong", t.wrong}};
  if (t.lat_median_us >= 0) {
    j["latency_us"] = {{"median", t.lat_median_us}, {"p99", t.lat_p99_us}};
  }
  return j;
}

// The settings of a run, checking every option that needs no launch.
Settings settings_for(const CollBenchOptions& o) {
  Settings s;
  s.op = parse_comm_op(o.op);
  s.dt = parse_dtype(o.dtype);
  MESHRT_CHECK(comm_dtype_supported(s.dt, is_reduction(s.op)),
               "--datatype " << o.dtype << " is not supported for " << o.op
                             << ": use f32, bf16, f16, i32 or i64");
  s.redop = parse_reduce_op(o.redop);
  MESHRT_CHECK(o.min_bytes >= 0 && o.max_bytes >= o.min_bytes,
               "sizes: -b " << o.min_bytes << " must be >= 0 and <= -e " << o.max_bytes);
  MESHRT_CHECK(o.step_bytes > 0 || o.step_factor > 1.0,
               "step: use -f with a factor > 1 or -i with a positive byte increment");
  MESHRT_CHECK(o.iters >= 1 && o.warmup >= 0,
               "iterations: -n " << o.iters << " must be >= 1 and -w " << o.warmup << " >= 0");
  MESHRT_CHECK(o.average >= 0 && o.average <= 3,
               "-a " << o.average << ": use 0 (rank 0), 1 (average), 2 (minimum) or 3 (maximum)");
  // A size is a whole number of elements: -b 3 of f32 would be 0 elements, measured as nothing.
  const auto es = static_cast<int64_t>(dtype_size(s.dt));
  for (const auto& [flag, v] :
       {std::pair<const char*, int64_t>{"-b", o.min_bytes}, {"-e", o.max_bytes}})
    MESHRT_CHECK(v % es == 0, flag << " " << v << ": not a whole number of " << dtype_name(s.dt)
                                   << " elements (" << es << " bytes each); use a multiple of "
                                   << es << ", e.g. " << flag << " " << (v / es + 1) * es);
  MESHRT_CHECK(o.step_bytes <= 0 || o.step_bytes % es == 0,
               "-i " << o.step_bytes << ": not a whole number of " << dtype_name(s.dt)
                     << " elements (" << es << " bytes each); use a multiple of " << es);
  // Sizes in between (from -f) are rounded down to whole elements, as the table shows.
  constexpr size_t kMaxSizes = 1000;
  for (int64_t b = o.min_bytes; b <= o.max_bytes;) {
    MESHRT_CHECK(s.sizes.size() < kMaxSizes,
                 "sizes: -b " << o.min_bytes << " to -e " << o.max_bytes << " in steps of "
                              << (o.step_bytes > 0 ? "-i " + std::to_string(o.step_bytes)
                                                   : "-f " + std::to_string(o.step_factor))
                              << " is more than " << kMaxSizes
                              << " sizes; use a larger step or a smaller range");
    const int64_t whole = b / es * es;
    if (s.sizes.empty() || s.sizes.back() != whole) s.sizes.push_back(whole);
    const double grown = std::ceil(static_cast<double>(b) * o.step_factor);
    int64_t next = o.step_bytes > 0  ? (b > INT64_MAX - o.step_bytes ? INT64_MAX : b + o.step_bytes)
                   : grown >= 9.2e18 ? INT64_MAX
                                     : static_cast<int64_t>(grown);
    if (next <= b) next = b + es;
    if (b == INT64_MAX) break;
    b = next;
  }
  return s;
}

// Every rank of this machine holds the largest size's send and receive buffers (and, with
// --memcpy-bound, two copies of -e): refuse what the host cannot hold before allocating.
void coll_check_host_memory(const CollBenchOptions& o, const Settings& s, const Launch& launch) {
  const auto es = static_cast<int64_t>(dtype_size(s.dt));
  const Layout l = layout_for(s.op, o.max_bytes / es, launch.world_size(), dtype_size(s.dt));
  const int local = launch.kind() == LaunchKind::Threads ? static_cast<int>(launch.local().size())
                                                         : launch.local().front().local_size;
  const double need = (static_cast<double>(l.send + l.recv) * static_cast<double>(es) +
                       (o.memcpy_bound ? 2.0 * static_cast<double>(o.max_bytes) : 0.0)) *
                      local;
  const int64_t have = bench::physical_memory_bytes();
  MESHRT_CHECK(have == 0 || need < 0.8 * static_cast<double>(have),
               "-e " << o.max_bytes << ": " << local << " rank(s) on this machine need "
                     << bench::human_bytes(need) << " for their buffers and it has "
                     << bench::human_bytes(static_cast<double>(have)) << " of memory; lower -e");
}

// The totals over every size and both placements.
struct CollTotals {
  int64_t wrong = 0;
  double bus_sum = 0;
  int bus_n = 0;
  double avg_busbw() const { return bus_n ? bus_sum / bus_n : 0.0; }
};

CollTotals coll_totals(const std::vector<Row>& rows) {
  CollTotals t;
  for (const Row& r : rows) {
    for (const Timing& x : r.t) {
      t.wrong += std::max<int64_t>(0, x.wrong);
      t.bus_sum += x.busbw;
      ++t.bus_n;
    }
  }
  return t;
}

// The summary after the table: wrong values, average bus bandwidth, the time spread over ranks,
// and with --memcpy-bound each size against the memcpy bound.
void coll_print_summary(std::ostream& out, const CollBenchOptions& o, const Settings& s, int world,
                        const std::vector<Row>& rows, const CollTotals& tot, double memcpy_bw) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "# Out of bounds values : %lld %s\n",
                static_cast<long long>(tot.wrong), tot.wrong == 0 ? "OK" : "FAILED");
  out << buf;
  std::snprintf(buf, sizeof(buf), "# Avg bus bandwidth    : %g \n", tot.avg_busbw());
  out << buf;
  out << "#\n# time over ranks, us (min / avg / max), out-of-place | in-place:\n";
  for (const Row& r : rows) {
    std::snprintf(buf, sizeof(buf), "# %12lld  %9.1f / %9.1f / %9.1f | %9.1f / %9.1f / %9.1f\n",
                  static_cast<long long>(r.bytes), r.t[0].min_us, r.t[0].avg_us, r.t[0].max_us,
                  r.t[1].min_us, r.t[1].avg_us, r.t[1].max_us);
    out << buf;
  }
  if (o.latency) print_latency(out, rows, o);
  if (o.memcpy_bound) {
    std::snprintf(buf, sizeof(buf),
                  "# memcpy bandwidth: %.2f GB/s per rank with all %d ranks copying %lld bytes at "
                  "once (slowest rank, median of 7; bounds a shared-memory all-reduce's algbw)\n",
                  memcpy_bw, world, static_cast<long long>(o.max_bytes));
    out << buf;
    out << "# vs the memcpy bound (the traffic a rank needs at that bandwidth / its average time), "
           "out-of-place | in-place:\n";
    for (const Row& r : rows) {
      std::snprintf(buf, sizeof(buf), "# %12lld  %5.0f%% | %5.0f%%\n",
                    static_cast<long long>(r.bytes),
                    100 * memcpy_fraction(s.op, world, r, 0, memcpy_bw),
                    100 * memcpy_fraction(s.op, world, r, 1, memcpy_bw));
      out << buf;
    }
  }
  out << std::flush;
}

void write_coll_json(const CollBenchOptions& o, const Settings& s, const Launch& launch,
                     const std::vector<Row>& rows, const CollTotals& tot, double memcpy_bw) {
  nlohmann::json j;
  j["op"] = comm_op_name(s.op);
  j["backend"] = launch.backend();
  j["launch"] = launch.describe();
  j["world_size"] = launch.world_size();
  j["dtype"] = dtype_name(s.dt);
  j["redop"] = is_reduction(s.op) ? reduce_op_name(s.redop) : "none";
  j["root"] = s.op == CommOp::Broadcast ? o.root : -1;
  j["warmup"] = o.warmup;
  j["iters"] = o.iters;
  j["average"] = o.average;
  if (o.memcpy_bound) j["memcpy_gbps_per_rank"] = memcpy_bw;
  j["results"] = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json row = {{"size_bytes", r.bytes},
                          {"count", r.count},
                          {"out_of_place", timing_json(r.t[0])},
                          {"in_place", timing_json(r.t[1])}};
    if (o.memcpy_bound) {
      const int n = launch.world_size();
      for (int place = 0; place < 2; ++place)
        row[place ? "in_place" : "out_of_place"]["memcpy_bound_fraction"] =
            memcpy_fraction(s.op, n, r, place, memcpy_bw);
    }
    j["results"].push_back(row);
  }
  j["wrong_total"] = tot.wrong;
  j["avg_busbw_gbps"] = tot.avg_busbw();
  write_output_file(o.json_path, j.dump(2) + "\n", "--json");
}

}  // namespace

void check_collective_options(const CollBenchOptions& o) {
  settings_for(o);
  check_output_path(o.json_path, "--json");  // up front: not a directory found after the run
}

int run_collective_bench(const CollBenchOptions& o, std::ostream& out) {
  const Settings s = settings_for(o);

  LaunchOptions lo;
  lo.devices = o.devices;
  lo.devices_defaulted = o.devices_defaulted;
  lo.backend = o.backend;
  std::unique_ptr<Launch> launch = bootstrap(lo);
  MESHRT_CHECK(s.op != CommOp::Broadcast || (o.root >= 0 && o.root < launch->world_size()),
               "--root " << o.root << " outside [0, " << launch->world_size() << ")");
  if (launch->local().front().device.is_cpu()) coll_check_host_memory(o, s, *launch);

  std::mutex mu;
  std::vector<Row> rows;
  double memcpy_bw = 0;
  const bool printer_here = launch->local().front().rank == 0;
  if (printer_here) print_header(out, o, *launch, s);
  launch->run([&](const RankPlacement& p, Communicator& comm) {
    RankBench rb(o, s, p, comm);
    double mbw = o.memcpy_bound ? rb.memcpy_gbps(o.max_bytes) : 0;
    if (p.rank == 0) memcpy_bw = mbw;
    for (size_t i = 0; i < s.sizes.size(); ++i) {
      Row row = rb.run_size(s.sizes[i], static_cast<int>(i));
      if (p.rank == 0) {
        std::lock_guard<std::mutex> lk(mu);
        rows.push_back(row);
        print_row(out, row, s, o);
      }
    }
  });

  if (!printer_here) return 0;  // another process prints and reports
  const CollTotals tot = coll_totals(rows);
  coll_print_summary(out, o, s, launch->world_size(), rows, tot, memcpy_bw);
  if (!o.json_path.empty()) write_coll_json(o, s, *launch, rows, tot, memcpy_bw);
  return tot.wrong == 0 ? 0 : 1;
}

}  // namespace meshrt
