#include "dist/agree.h"

#include <algorithm>
#include <memory>

#include "runtime/allocator.h"
#include "runtime/error.h"

namespace meshrt {

namespace {

const std::shared_ptr<Allocator>& host_plain() {
  static const std::shared_ptr<Allocator> a = make_host_plain_allocator();
  return a;
}

}  // namespace

std::vector<int64_t> agree_values(Context& ctx, Communicator& world, const std::vector<int64_t>& v,
                                  ReduceOp op) {
  Stream& cs = ctx.compute_stream();
  const auto n = static_cast<int64_t>(v.size());
  Tensor h = Tensor::empty({n}, DType::i64, host_plain());
  std::copy(v.begin(), v.end(), h.data<int64_t>());
  Tensor d = ctx.zeros({n}, DType::i64);
  d.copy_(h, cs);
  cs.synchronize();  // h is freed on return
  cs.wait(world.all_reduce(d, op, cs));
  Tensor r = d.to(ctx.host_allocator(), cs);
  cs.synchronize();
  return {r.data<int64_t>(), r.data<int64_t>() + n};
}

void agree_error(Context& ctx, Communicator& world, const std::string& err, const std::string& area,
                 const std::string& what) {
  const int rank = world.rank(), size = world.size();
  const auto f = agree_values(ctx, world, {err.empty() ? 0 : size - rank}, ReduceOp::Max);
  if (f[0] == 0) return;
  const int failed = size - static_cast<int>(f[0]);
  constexpr size_t kMaxText = 2048;
  std::vector<int64_t> text(kMaxText, 0);
  if (rank == failed)
    for (size_t i = 0; i < err.size() && i < kMaxText; ++i)
      text[i] = static_cast<unsigned char>(err[i]);
  text = agree_values(ctx, world, text, ReduceOp::Sum);
  if (!err.empty()) throw AgreedError(err);
  std::string msg;
  for (int64_t c : text) {
    if (c == 0) break;
    msg.push_back(static_cast<char>(c));
  }
  const std::string head = area.empty() ? "" : area + ": ";
  if (!head.empty() && msg.rfind(head, 0) == 0) msg.erase(0, head.size());
  throw AgreedError(head + "rank " + std::to_string(failed) + " " + what + ": " + msg);
}

}  // namespace meshrt
