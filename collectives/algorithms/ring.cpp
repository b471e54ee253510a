#include "collectives/algorithms/ring.h"

#include "collectives/comm_impl.h"

namespace meshrt::detail {

namespace {

Event run_ring_all_gather(Communicator& comm, const CommCall& c, Stream& s,
                          const EventList& after) {
  const int n = comm.size(), r = comm.rank();
  const int64_t count = c.count;
  const Tensor out = c.out.view(Shape{c.out.numel()});
  auto block = [&](int j) { return out.narrow(0, static_cast<int64_t>(j) * count, count); };
  for (const Event& e : after) s.wait(e);
  if (count == 0) return s.record();
  if (!c.in_place) block(r).copy_(c.in.view(Shape{count}), s);
  Event done = s.record();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (int k = 0; k + 1 < n; ++k) {
    const Tensor give = block((r - k + n) % n), take = block((r - k - 1 + n) % n);
    if (r % 2 == 0) {
      comm.send(give, next, s);
      done = comm.recv(take, prev, s);
    } else {
      comm.recv(take, prev, s);
      done = comm.send(give, next, s);
    }
  }
  return done;
}

}  // namespace

const Algorithm ring_all_gather{
    "ring",
    "n - 1 steps of send / recv around the ranks, each passing on the block it got last (any "
    "backend)",
    run_ring_all_gather};

}  // namespace meshrt::detail
