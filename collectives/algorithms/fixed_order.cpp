#include "collectives/algorithms/fixed_order.h"

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

// Whether the order of the additions can change the result (f32 sum / avg): the rest keeps the
// backend's own algorithm. Throws for what the host additions cannot take.
bool order_matters(Communicator& comm, const CommCall& c) {
  MESHRT_CHECK(c.in.device().is_cpu(),
               comm_op_name(c.op) << " on group '" << comm.name()
                                  << "': MESHRT_ALGO forces fixed_order, which adds on the host, "
                                     "but the tensor is on "
                                  << c.in.device().str()
                                  << "; drop fixed_order from MESHRT_ALGO for device tensors");
  MESHRT_CHECK(!is_half_float(c.dtype) || c.redop == ReduceOp::Max || c.redop == ReduceOp::Min,
               comm_op_name(c.op) << " on group '" << comm.name()
                                  << "': MESHRT_ALGO forces fixed_order, which reduces f32 only, "
                                     "but the tensor is "
                                  << dtype_name(c.dtype)
                                  << "; reduce in f32 or drop fixed_order from MESHRT_ALGO");
  return c.dtype == DType::f32 && (c.redop == ReduceOp::Sum || c.redop == ReduceOp::Avg);
}

// `n` elements of `in` summed into `out` (n / size of them for a reduce-scatter), n a multiple
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
    return all ? comm.all_reduce(c.in, c.out, c.redop, s, after)
               : comm.reduce_scatter(c.in, c.out, c.redop, s, after);
  }
  for (const Event& e : after) s.wait(e);
  const int p = comm.size();
  const int64_t n = c.in.numel();  // all-reduce: count; reduce-scatter: count x ranks
  const Tensor in = c.in.view(Shape{n}), out = c.out.view(Shape{c.out.numel()});
  if (p == 1) {
    if (!c.in_place) out.copy_(in, s);
    return s.record();
  }
  if (!all || n % p == 0) {  // reduce-scatter inputs always divide into the ranks
    run_tree(comm, c, in, out, s);
    return s.record();
  }
  // An all-reduce of n elements not divisible by the ranks: through zero-padded buffers (the
  // padding's sums are dropped; every other element's additions are the same).
  const int64_t padded = (n / p + 1) * p;
  const std::shared_ptr<Allocator> alloc = make_host_plain_allocator();
  const Tensor pin = Tensor::empty({padded}, DType::f32, alloc, &s);
  const Tensor pout = Tensor::empty({padded}, DType::f32, alloc, &s);
  pin.narrow(0, n, padded - n).zero_(s);
  pin.narrow(0, 0, n).copy_(in, s);
  run_tree(comm, c, pin, pout, s);
  out.copy_(pout.narrow(0, 0, n), s);
  return s.record();
}

}  // namespace

const Algorithm fixed_order_reduction{
    "fixed_order",
    "f32 sums in one fixed binary tree over rank index through all_to_all (+ all_gather): the "
    "same bits on every backend and message split (host tensors, any backend)",
    run_fixed_order};

}  // namespace meshrt::detail
