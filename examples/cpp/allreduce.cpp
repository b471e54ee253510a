// meshrt's public C++ API: 4 ranks as threads of one process join a world, all-gather their
// buffers, shift them around the ring with send / recv and all-reduce them in place (zero copy:
// meshrt works on the program's vectors), each result checked against a naive loop. Exit code 0
// when every value matches.
#include <meshrt/comm.hpp>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kRanks = 4;
constexpr int64_t kCount = 1024;

float value(int rank, int64_t i) { return static_cast<float>(rank * 1000 + i % 100); }

// One rank: returns the number of wrong elements.
int run_rank(const meshrt_unique_id_t& id, int rank) {
  meshrt::Comm comm = meshrt::Comm::init_rank(kRanks, id, rank);
  std::vector<float> x(kCount), all(kCount * kRanks);
  for (int64_t i = 0; i < kCount; ++i) x[i] = value(rank, i);
  meshrt::Tensor tx = meshrt::Tensor::borrow_cpu(x.data(), {kCount});
  meshrt::Tensor tall = meshrt::Tensor::borrow_cpu(all.data(), {kCount * kRanks});
  comm.all_gather(tx, tall).synchronize();
  // A ring shift, point to point: each rank sends its x to the next rank and receives the
  // previous rank's. A send completes once its peer received it, so it goes on a stream of its
  // own while the receive runs on the default stream.
  std::vector<float> prev(kCount);
  meshrt::Tensor tprev = meshrt::Tensor::borrow_cpu(prev.data(), {kCount});
  meshrt::Stream sends = comm.new_stream();
  meshrt::Event sent = comm.send(tx, (rank + 1) % kRanks, &sends);
  comm.recv(tprev, (rank + kRanks - 1) % kRanks).synchronize();
  sent.synchronize();
  comm.all_reduce(tx, tx, MESHRT_SUM).synchronize();  // in place
  int bad = 0;
  for (int64_t i = 0; i < kCount; ++i)
    if (prev[i] != value((rank + kRanks - 1) % kRanks, i)) ++bad;
  for (int64_t i = 0; i < kCount; ++i) {
    float want = 0;
    for (int r = 0; r < kRanks; ++r) {
      want += value(r, i);
      if (all[r * kCount + i] != value(r, i)) ++bad;
    }
    if (x[i] != want) ++bad;
  }
  return bad;
}

}  // namespace

int main() {
  const meshrt_unique_id_t id = meshrt::unique_id();
  std::vector<int> bad(kRanks, 0);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      try {
        bad[r] = run_rank(id, r);
      } catch (const meshrt::Error& e) {
        errors[r] = e.what();
        bad[r] = 1;
      }
    });
  }
  int total = 0;
  for (int r = 0; r < kRanks; ++r) {
    threads[r].join();
    if (!errors[r].empty()) std::fprintf(stderr, "rank %d: %s\n", r, errors[r].c_str());
    total += bad[r];
  }
  std::printf(
      "meshrt C++ API: %d ranks, all-gather + ring send / recv + in-place all-reduce of "
      "%lld floats\n",
      kRanks, static_cast<long long>(kCount));
  std::printf("%s: %d mismatches\n", total == 0 ? "OK" : "FAILED", total);
  return total == 0 ? 0 : 1;
}
