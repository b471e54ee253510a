// The one table of collective algorithms, the choice it makes and MESHRT_ALGO's parser.
#include <algorithm>

#include "collectives/algorithms/algorithm.h"
#include "collectives/algorithms/fixed_order.h"
#include "collectives/algorithms/ring.h"
#include "runtime/error.h"

namespace meshrt::detail {

namespace algos {
const Algorithm eager{"eager",
                      "each rank copies its input into its slot and reduces every slot in rank "
                      "order: one wait (threads)",
                      nullptr, 4096};
const Algorithm flat{"flat",
                     "one level: every rank reads its peers' buffers directly (threads), or the "
                     "flat MPI / TCP world (hier)"};
const Algorithm one_step{"one_step",
                         "the whole message through the segment's staging buffers in one step, "
                         "every rank reducing all of it in rank order (shm)",
                         nullptr, int64_t{1} << 20};
const Algorithm staged{"staged",
                       "1 MiB chunks through the segment's staging buffers, each rank reducing "
                       "its 1/n slice (shm)"};
const Algorithm zero_copy{"zero_copy",
                          "between the ranks' own buffers mapped from shared host memory; staged "
                          "where a buffer is not shared (shm)"};
const Algorithm two_level{"two_level",
                          "the node's shm collective, MPI or TCP across the nodes on the node's "
                          "share, the node's shm collective (hier)"};
const Algorithm native{"native", "the library's own choice (MPI, NCCL)"};
const Algorithm socket_ring{"socket_ring",
                            "ring reduce-scatter and / or ring all-gather over the peers' "
                            "sockets: an all-reduce moves 2 (n-1)/n of the data per rank (tcp)"};
const Algorithm pairwise{"pairwise",
                         "in step k every rank sends to rank + k while it receives from rank - k "
                         "(tcp)"};
const Algorithm linear{"linear",
                       "the root sends the whole buffer to every other rank in turn (tcp)"};
const Algorithm binomial{"binomial",
                         "a binomial tree from the root: log2(n) steps of the whole buffer (tcp)"};
const Algorithm ring_pipeline{"ring_pipeline",
                              "256 KiB chunks along the ring from the root, each rank passing one "
                              "on while it receives the next: the root sends the buffer once "
                              "(tcp)"};
}  // namespace algos

namespace {

constexpr uint32_t kAllReduce = op_bit(CommOp::AllReduce);
constexpr uint32_t kAllGather = op_bit(CommOp::AllGather);
constexpr uint32_t kReduceScatter = op_bit(CommOp::ReduceScatter);
constexpr uint32_t kBroadcast = op_bit(CommOp::Broadcast);
constexpr uint32_t kAllToAll = op_bit(CommOp::AllToAll);

// The engine's copying path below this many bytes summed over the ranks (shm_comm.cpp's
// one-step all-reduce; reduce-scatter and all-gather skip the two extra steps of mapping).
constexpr int64_t kShmSmallBytes = int64_t{8} << 10;

// tcp's broadcast: a binomial tree up to this many bytes, the pipelined ring beyond.
constexpr int64_t kTcpSmallBroadcast = int64_t{256} << 10;

bool backend_matches(const AlgoRow& r, std::string_view backend) {
  return std::string_view(r.backend) == "*" || r.backend == backend;
}

// "a, b or c"
std::string name_list(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

// Every algorithm of `op` (op < 0: of any op) in any row, sorted by name.
std::vector<std::string> names_for(int op) {
  std::vector<std::string> names;
  for (const AlgoRow& r : algo_table()) {
    if (op >= 0 && (r.ops & (1u << static_cast<unsigned>(op))) == 0) continue;
    if (std::find(names.begin(), names.end(), r.algorithm->name) == names.end())
      names.push_back(r.algorithm->name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

const Algorithm* find_algorithm(std::string_view name, int op) {
  for (const AlgoRow& r : algo_table()) {
    if (op >= 0 && (r.ops & (1u << static_cast<unsigned>(op))) == 0) continue;
    if (name == r.algorithm->name) return r.algorithm;
  }
  return nullptr;
}

std::string size_text(int64_t b) {
  if (b >= (int64_t{1} << 20) && b % (int64_t{1} << 20) == 0)
    return std::to_string(b >> 20) + " MiB";
  if (b >= 1024 && b % 1024 == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

}  // namespace

// Rows in order: the first row of a (backend, op) whose limit holds is the default. The limits
// are the engines' measured crossovers (bench/results/collectives-host.md).
const std::vector<AlgoRow>& algo_table() {
  static const std::vector<AlgoRow> t = {
      // threads: small all-reduces through the slots' eager buffers, the rest direct.
      {"host", kAllReduce, &algos::eager, 4096},
      {"host", kTableOps, &algos::flat},
      // shm: tiny all-reduces in one step; large collectives between the ranks' own buffers.
      {"shm", kAllReduce, &algos::one_step, kShmSmallBytes, true},
      {"shm", kAllGather | kReduceScatter, &algos::staged, kShmSmallBytes},
      {"shm", kAllReduce | kAllGather | kReduceScatter, &algos::zero_copy},
      {"shm", kTableOps, &algos::staged},
      // two nodes or more: two levels where they are exact, flat MPI for the rest.
      {"hier", kAllReduce | kAllGather | kReduceScatter, &algos::two_level, kAnySize, false, 2},
      {"hier", kTableOps, &algos::flat},
      // tcp: rings over the sockets, pairwise all-to-all; small broadcasts down a tree, large
      // ones along the ring (linear, the former one, only forced).
      {"tcp", kAllReduce | kAllGather | kReduceScatter, &algos::socket_ring},
      {"tcp", kBroadcast, &algos::binomial, kTcpSmallBroadcast},
      {"tcp", kBroadcast, &algos::ring_pipeline},
      {"tcp", kBroadcast, &algos::linear, kAnySize, false, 1, true},
      {"tcp", kAllToAll, &algos::pairwise},
      {"mpi", kTableOps, &algos::native},
      {"nccl", kTableOps, &algos::native},
      // Composed algorithms, on every backend; MESHRT_ALGO only.
      {"*", kAllGather, &ring_all_gather, kAnySize, false, 1, true},
      {"*", kAllReduce | kReduceScatter, &fixed_order_reduction, kAnySize, false, 1, true},
  };
  return t;
}

AlgoOverride parse_algo_override(std::string_view spec) {
  AlgoOverride o;
  const std::string whole(spec);
  auto refuse = [&](const std::string& why) -> Error {
    return Error("MESHRT_ALGO='" + whole + "': " + why +
                 " (form: op:algorithm[,op:algorithm...], or one algorithm for every op that has "
                 "it; docs/environment.md)");
  };
  size_t at = 0;
  while (at <= spec.size() && !spec.empty()) {
    const size_t comma = std::min(spec.find(',', at), spec.size());
    const std::string_view item = spec.substr(at, comma - at);
    at = comma + 1;
    if (item.empty()) throw refuse("an empty entry");
    const size_t colon = item.find(':');
    if (colon == std::string_view::npos) {  // one algorithm for every op that has it
      const Algorithm* a = find_algorithm(item, -1);
      if (!a) {
        throw refuse("unknown algorithm '" + std::string(item) + "'; use " +
                     name_list(names_for(-1)));
      }
      for (unsigned b = 0; b <= static_cast<unsigned>(CommOp::Split); ++b)
        if ((kTableOps & (1u << b)) && find_algorithm(item, static_cast<int>(b))) o.forced[b] = a;
      continue;
    }
    const std::string op_name(item.substr(0, colon));
    const std::string_view name = item.substr(colon + 1);
    CommOp op;
    try {
      op = parse_comm_op(op_name);
    } catch (const Error&) {
      throw refuse("unknown op '" + op_name +
                   "'; use all_reduce, all_gather, reduce_scatter, broadcast or all_to_all");
    }
    const Algorithm* a = find_algorithm(name, static_cast<int>(op));
    if (!a) {
      throw refuse("'" + std::string(name) + "' is not an algorithm of " + comm_op_name(op) +
                   "; use " + name_list(names_for(static_cast<int>(op))));
    }
    o.forced[static_cast<size_t>(op)] = a;
  }
  return o;
}

AlgoPlan::AlgoPlan(const AlgoWorld& world, std::string_view override_spec) {
  const AlgoOverride o = parse_algo_override(override_spec);
  for (unsigned b = 0; b <= static_cast<unsigned>(CommOp::Split); ++b) {
    if ((kTableOps & (1u << b)) == 0) continue;
    std::vector<Choice>& cs = choices_[b];
    const Algorithm* forced = o.forced[b];
    bool offered = false;
    for (const AlgoRow& r : algo_table())
      offered = offered ||
                ((r.ops & (1u << b)) && backend_matches(r, world.backend) && r.algorithm == forced);
    if (forced && offered)  // a backend without the forced algorithm keeps its own choice
      cs.push_back({forced->capacity > 0 ? forced->capacity : kAnySize, forced});
    for (const AlgoRow& r : algo_table()) {
      if ((r.ops & (1u << b)) == 0 || !backend_matches(r, world.backend) || r.forced_only ||
          world.nodes < r.min_nodes)
        continue;
      const int64_t up_to = r.per_rank && r.up_to != kAnySize ? r.up_to / world.ranks : r.up_to;
      cs.push_back({up_to, r.algorithm});
      if (up_to == kAnySize) break;
    }
    for (const Choice& c : cs)
      if (c.algorithm->run) composed_ops_ |= 1u << b;
  }
}

std::vector<const Algorithm*> algorithms_of(std::string_view backend, CommOp op) {
  std::vector<const Algorithm*> out;
  for (const AlgoRow& r : algo_table()) {
    if ((r.ops & op_bit(op)) == 0 || !backend_matches(r, backend)) continue;
    if (std::find(out.begin(), out.end(), r.algorithm) == out.end()) out.push_back(r.algorithm);
  }
  return out;
}

std::string algo_table_text(const AlgoWorld& world, std::string_view override_spec) {
  const AlgoPlan plan(world, override_spec);
  const int64_t sizes[] = {8, 4096, 256 << 10, 64 << 20};
  const CommOp ops[] = {CommOp::AllReduce, CommOp::AllGather, CommOp::ReduceScatter,
                        CommOp::Broadcast, CommOp::AllToAll};
  const Algorithm* first = plan.pick(CommOp::AllReduce, 8);
  bool uniform = true;
  for (CommOp op : ops)
    for (int64_t s : sizes) uniform = uniform && plan.pick(op, s) == first;
  std::string out = "  " + std::string(world.backend) + " (" + std::to_string(world.ranks) +
                    " ranks, " + std::to_string(world.nodes) +
                    (world.nodes == 1 ? " node)" : " nodes)");
  if (uniform) return out + ": " + first->name + " for every op and size\n";
  // One line of cells, 16 wide then 11 each (or one more than the longest name), without
  // trailing blanks.
  size_t w = 11;
  for (CommOp op : ops)
    for (int64_t s : sizes) w = std::max(w, std::string_view(plan.pick(op, s)->name).size() + 1);
  auto line = [w](const std::string& head, const std::vector<std::string>& cells) {
    std::string l = "    " + head + std::string(head.size() < 16 ? 16 - head.size() : 1, ' ');
    for (const std::string& c : cells) l += c + std::string(w - c.size(), ' ');
    while (l.back() == ' ') l.pop_back();
    return l + "\n";
  };
  std::vector<std::string> cells;
  for (int64_t s : sizes) cells.push_back(size_text(s));
  out += "\n" + line("op \\ bytes", cells);
  for (CommOp op : ops) {
    cells.clear();
    for (int64_t s : sizes) cells.push_back(plan.pick(op, s)->name);
    out += line(comm_op_name(op), cells);
  }
  return out;
}

}  // namespace meshrt::detail
