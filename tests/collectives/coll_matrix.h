// The op x dtype x in-place x size matrix, run by every rank of a communicator (any backend).
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "coll_test_util.h"
#include "collectives/communicator.h"
#include "runtime/stream.h"

namespace meshrt::test {

inline const std::vector<DType>& comm_dtypes() {
  static const std::vector<DType> d = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64};
  return d;
}

// Moves test data between the host and the communicator's device (a no-op on the CPU).
class DeviceData {
 public:
  DeviceData(Stream& s, std::shared_ptr<Allocator> alloc) : s_(s), alloc_(std::move(alloc)) {}
  Tensor make(int64_t n, DType dt) { return Tensor::empty(Shape{n}, dt, alloc_, &s_); }
  void fill(const Tensor& t, uint64_t seed, int rank) {
    if (t.device().is_cpu()) return fill_pattern(t, seed, rank);
    Tensor h = host_tensor(t.numel(), t.dtype());
    fill_pattern(h, seed, rank);
    Tensor d = t;
    d.copy_(h, s_);
    s_.synchronize();
  }
  void fill_const(const Tensor& t, double v) {
    if (t.device().is_cpu()) return fill_value(t, v);
    Tensor d = t;
    d.fill_(v, s_);
    s_.synchronize();
  }
  Tensor host(const Tensor& t) {
    if (t.device().is_cpu()) return t;
    Tensor h = host_tensor(t.numel(), t.dtype());
    h.copy_(t, s_);
    s_.synchronize();
    return h;
  }

 private:
  Stream& s_;
  std::shared_ptr<Allocator> alloc_;
};

// Runs every collective on `comm` for every dtype, in place and out of place, for each element
// count in `sizes`, checking each result exactly. Every rank must call this with the same
// arguments. Returns the number of collectives run; failures go to `f`. `avg_check`, when set,
// checks Avg results instead of the exact sum / n (NCCL averages differently: nccl_avg.h).
using AvgCheck = std::function<bool(Failures&, const std::string& what, const Tensor& got, DType,
                                    uint64_t seed, int n, int64_t first, int64_t count)>;
inline int64_t run_matrix(Communicator& comm, Stream& s, const std::vector<int64_t>& sizes,
                          Failures& f, uint64_t seed0 = 1,
                          std::shared_ptr<Allocator> alloc = nullptr,
                          const AvgCheck& avg_check = nullptr) {
  DeviceData dd(s, alloc ? alloc : test_allocator());
  const int n = comm.size();
  const int r = comm.rank();
  uint64_t seed = seed0;
  int64_t ops = 0;
  struct OpCase {
    CommOp op;
    ReduceOp redop;
  };
  const std::vector<OpCase> cases = {
      {CommOp::AllReduce, ReduceOp::Sum},     {CommOp::AllReduce, ReduceOp::Avg},
      {CommOp::AllReduce, ReduceOp::Max},     {CommOp::AllReduce, ReduceOp::Min},
      {CommOp::ReduceScatter, ReduceOp::Sum}, {CommOp::ReduceScatter, ReduceOp::Avg},
      {CommOp::ReduceScatter, ReduceOp::Max}, {CommOp::ReduceScatter, ReduceOp::Min},
      {CommOp::AllGather, ReduceOp::Sum},     {CommOp::Broadcast, ReduceOp::Sum},
      {CommOp::AllToAll, ReduceOp::Sum}};
  for (const OpCase& oc : cases) {
    for (DType dt : comm_dtypes()) {
      for (int in_place = 0; in_place < 2; ++in_place) {
        for (int64_t N : sizes) {
          ++seed;
          const int root = static_cast<int>(seed % static_cast<uint64_t>(n));
          std::ostringstream ws;
          ws << "n=" << n << " rank " << r << " " << comm_op_name(oc.op) << " "
             << reduce_op_name(oc.redop) << " " << dtype_name(dt) << " "
             << (in_place ? "in-place" : "out-of-place") << " count=" << N;
          const std::string what = ws.str();
          try {
            switch (oc.op) {
              case CommOp::AllReduce: {
                Tensor in = dd.make(N, dt);
                dd.fill(in, seed, r);
                Tensor out = in_place ? in : dd.make(N, dt);
                if (!in_place) dd.fill_const(out, 99);
                comm.all_reduce(in, out, oc.redop, s).synchronize();
                if (avg_check && oc.redop == ReduceOp::Avg) {
                  avg_check(f, what, dd.host(out), dt, seed, n, 0, N);
                } else {
                  check_values(f, what, dd.host(out), 0, N,
                               [&](int64_t i) { return reduced(dt, oc.redop, seed, n, i); });
                }
                if (!in_place) {
                  check_values(f, what + " (input untouched)", dd.host(in), 0, N,
                               [&](int64_t i) { return pattern(seed, r, i); });
                }
                break;
              }
              case CommOp::ReduceScatter: {
                Tensor in = dd.make(N * n, dt);
                dd.fill(in, seed, r);
                Tensor out = in_place ? in.narrow(0, r * N, N) : dd.make(N, dt);
                comm.reduce_scatter(in, out, oc.redop, s).synchronize();
                if (avg_check && oc.redop == ReduceOp::Avg) {
                  avg_check(f, what, dd.host(out), dt, seed, n, r * N, N);
                } else {
                  check_values(f, what, dd.host(out), 0, N, [&](int64_t i) {
                    return reduced(dt, oc.redop, seed, n, r * N + i);
                  });
                }
                break;
              }
              case CommOp::AllGather: {
                Tensor out = dd.make(N * n, dt);
                dd.fill_const(out, 99);
                Tensor in = in_place ? out.narrow(0, r * N, N) : dd.make(N, dt);
                dd.fill(in, seed, r);
                comm.all_gather(in, out, s).synchronize();
                Tensor oh = dd.host(out);
                for (int j = 0; j < n; ++j) {
                  check_values(f, what + " block " + std::to_string(j), oh, j * N, N,
                               [&](int64_t i) { return pattern(seed, j, i); });
                }
                break;
              }
              case CommOp::Broadcast: {
                Tensor in = dd.make(N, dt);
                if (r == root) {
                  dd.fill(in, seed, r);
                } else {
                  dd.fill_const(in, 77);
                }
                Tensor out = in_place ? in : dd.make(N, dt);
                if (!in_place) dd.fill_const(out, 99);
                comm.broadcast(in, out, root, s).synchronize();
                check_values(f, what + " root " + std::to_string(root), dd.host(out), 0, N,
                             [&](int64_t i) { return pattern(seed, root, i); });
                break;
              }
              case CommOp::AllToAll: {
                Tensor in = dd.make(N * n, dt);
                dd.fill(in, seed, r);
                Tensor out = in_place ? in : dd.make(N * n, dt);
                comm.all_to_all(in, out, s).synchronize();
                Tensor oh = dd.host(out);
                for (int j = 0; j < n; ++j) {
                  check_values(f, what + " block " + std::to_string(j), oh, j * N, N,
                               [&](int64_t i) { return pattern(seed, j, r * N + i); });
                }
                break;
              }
              default:
                break;
            }
          } catch (const std::exception& e) {
            f.add(what + ": threw " + e.what());
            throw;
          }
          ++ops;
        }
      }
    }
  }
  return ops;
}

// Every rank sends to the next and receives from the previous, on their own streams, counts 0, 5
// and 200001 of i32: the ring's received values checked exactly.
inline void check_ring_send_recv(Communicator& w, Failures& f) {
  const int n = w.size(), r = w.rank();
  auto ss = make_host_stream("send");
  auto sr = make_host_stream("recv");
  for (int64_t count : {int64_t{0}, int64_t{5}, int64_t{200001}}) {
    Tensor out = host_tensor(count, DType::i32), in = host_tensor(count, DType::i32);
    fill_pattern(out, static_cast<uint64_t>(count), r);
    Event es = w.send(out, (r + 1) % n, *ss);
    Event er = w.recv(in, (r + n - 1) % n, *sr);
    es.synchronize();
    er.synchronize();
    check_values(f, "ring count " + std::to_string(count), in, 0, count, [&](int64_t i) {
      return pattern(static_cast<uint64_t>(count), (r + n - 1) % n, i);
    });
  }
}

}  // namespace meshrt::test
