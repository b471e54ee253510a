#include "collectives/algorithms/fixed_order.h"

#include <algorithm>
#include <cstring>

#include "collectives/comm_impl.h"
#include "collectives/fixed_order.h"
#include "collectives/host_reduce.h"
#include "runtime/error.h"

namespace meshrt::detail {

namespace {

// acc += x on the host, one f32 rounding per element, on `s`.
FixedOrderOps host_ops() {
  FixedOrderOps o;
  o.allocator = make_host_plain_allocator();
  o.add = [](const Tensor& acc, const Tensor& x, Stream& s) {
    s.enqueue([acc, x] {
      const void* srcs[2] = {acc.data_ptr(), x.data_ptr()};
      host_reduce(DType::f32, ReduceOp::Sum, srcs, 2, acc.data_ptr(), acc.numel(), 1);
    });
  };
  return o;
}

// Whether the order of the additions can change the result (float sum / avg): the rest keeps the
// backend's own algorithm. Throws for device tensors, which the host additions cannot take.
bool order_matters(Communicator& comm, const CommCall& c) {
  MESHRT_CHECK(c.in.device().is_cpu(),
               comm_op_name(c.op) << " on group '" << comm.name()
                                  << "': MESHRT_ALGO forces fixed_order, which adds on the host, "
                                     "but the tensor is on "
                                  << c.in.device().str()
                                  << "; drop fixed_order from MESHRT_ALGO for device tensors");
  return (c.dtype == DType::f32 || is_half_float(c.dtype)) &&
         (c.redop == ReduceOp::Sum || c.redop == ReduceOp::Avg);
}

// `n` f32 elements of `in` summed into `out` (n / size of them for a reduce-scatter), n a multiple
// of the ranks; avg divides the sum once.
void run_tree(Communicator& comm, const CommCall& c, const Tensor& in, const Tensor& out,
              Stream& s) {
  std::vector<int64_t> bounds;
  for (int r = 0; r <= comm.size(); ++r) bounds.push_back(r);  // one leaf per rank
  if (c.op == CommOp::AllReduce)
    fixed_order_all_reduce(comm, {in}, bounds, out, s, host_ops());
  else
    fixed_order_reduce_scatter(comm, {in}, bounds, out, s, host_ops());
  if (c.redop == ReduceOp::Avg)
    s.enqueue([out, n = comm.size()] { host_divide(DType::f32, out.data_ptr(), out.numel(), n); });
}

Event run_fixed_order(Communicator& comm, const CommCall& c, Stream& s, const EventList& after) {
  const bool all = c.op == CommOp::AllReduce;
  if (!order_matters(comm, c)) {
    if (all && c.in_place) return comm.all_reduce(c.out, c.redop, s, after);
    return all ? comm.all_reduce(c.in, c.out, c.redop, s, after)
               : comm.reduce_scatter(c.in, c.out, c.redop, s, after);
  }
  for (const Event& e : after) s.wait(e);
  const int p = comm.size();
  const int64_t n = c.in.numel();  // all-reduce: count; reduce-scatter: count x ranks
  const Tensor in = c.in.view(Shape{n}), out = c.out.view(Shape{c.out.numel()});
  if (p == 1) {  // one leaf: the input itself
    if (!c.in_place) out.copy_(in, s);
    return s.record();
  }
  if (c.dtype == DType::f32 && (!all || n % p == 0)) {  // reduce-scatter inputs always divide
    run_tree(comm, c, in, out, s);
    return s.record();
  }
  // bf16 / f16 (widened to f32, rounded once at the end), or an all-reduce whose n elements do
  // not divide into the ranks: through f32 buffers padded with zeros (the padding's sums are
  // dropped; every other element's additions are the same).
  const int64_t padded = all ? (n + p - 1) / p * p : n, n_out = out.numel();
  const std::shared_ptr<Allocator> alloc = make_host_plain_allocator();
  const Tensor win = Tensor::empty({padded}, DType::f32, alloc, &s);
  const Tensor wout = Tensor::empty({all ? padded : n_out}, DType::f32, alloc, &s);
  const DType dt = c.dtype;
  s.enqueue([in, win, n, padded, dt] {
    auto* w = static_cast<float*>(win.data_ptr());
    if (dt == DType::f32)
      std::memcpy(w, in.data_ptr(), static_cast<size_t>(n) * sizeof(float));
    else
      host_to_f32(dt, in.data_ptr(), w, n);
    std::fill(w + n, w + padded, 0.f);
  });
  run_tree(comm, c, win, wout, s);
  s.enqueue([out, wout, n_out, dt] {
    const auto* w = static_cast<const float*>(wout.data_ptr());
    if (dt == DType::f32)
      std::memcpy(out.data_ptr(), w, static_cast<size_t>(n_out) * sizeof(float));
    else
      host_from_f32(dt, w, out.data_ptr(), n_out);
  });
  return s.record();
}

}  // namespace

const Algorithm fixed_order_reduction{
    "fixed_order",
    "f32 sums in one fixed binary tree over rank index through all_to_all (+ all_gather): the "
    "same bits on every backend and message split (host tensors, any backend)",
    run_fixed_order};

}  // namespace meshrt::detail
