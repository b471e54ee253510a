// An engine using meshrt's installed public C++ API (<meshrt/meshrt.hpp>, header-only over the C
// API): two ranks as threads of this process join one world, all-reduce a vector of their own in
// place (meshrt borrows it, no copy) and check every element of the sum exactly.
#include <meshrt/meshrt.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#if defined(MESHRT_CONSUMER_HAS_C_API)
extern "C" const char* consumer_c_version(void);
#endif

namespace {

constexpr int kRanks = 2;
constexpr int64_t kElems = 1000;

// Rank r holds r * 1000 + i at index i; the sum over ranks is 1000 + 2 i, exact in f32.
float value(int rank, int64_t i) { return static_cast<float>(rank * 1000 + i); }

std::vector<float> run_rank(const meshrt_unique_id_t& id, int rank) {
  meshrt::Comm comm = meshrt::Comm::init_rank(kRanks, id, rank);
  std::vector<float> v(kElems);
  for (int64_t i = 0; i < kElems; ++i) v[static_cast<size_t>(i)] = value(rank, i);
  meshrt::Tensor t = meshrt::Tensor::borrow_cpu(v.data(), {kElems});
  comm.all_reduce(t, t, MESHRT_SUM).synchronize();
  return v;
}

}  // namespace

int main() {
  std::printf("meshrt %s (header %d.%d.%d)\n", MESHRT_VERSION_STRING, MESHRT_VERSION_MAJOR,
              MESHRT_VERSION_MINOR, MESHRT_VERSION_PATCH);
#if defined(MESHRT_CONSUMER_HAS_C_API)
  std::printf("C API header compiled as C (%s)\n", consumer_c_version());
#endif
  const meshrt_unique_id_t id = meshrt::unique_id();
  std::vector<std::vector<float>> results(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      try {
        results[static_cast<size_t>(r)] = run_rank(id, r);
      } catch (const meshrt::Error& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();

  int bad = 0;
  for (int r = 0; r < kRanks; ++r) {
    if (!errors[static_cast<size_t>(r)].empty()) {
      std::printf("rank %d failed: %s\n", r, errors[static_cast<size_t>(r)].c_str());
      return 1;
    }
    const std::vector<float>& v = results[static_cast<size_t>(r)];
    for (int64_t i = 0; i < kElems; ++i) {
      float want = 0;
      for (int q = 0; q < kRanks; ++q) want += value(q, i);
      if (v.size() != static_cast<size_t>(kElems) || v[static_cast<size_t>(i)] != want) {
        if (bad++ < 5)
          std::printf("rank %d: element %lld is wrong\n", r, static_cast<long long>(i));
      }
    }
  }
  if (bad) {
    std::printf("all_reduce: %d wrong elements\n", bad);
    return 1;
  }
  std::printf("all_reduce over %d thread ranks: %lld elements exact (first %g, last %g)\n", kRanks,
              static_cast<long long>(kElems), static_cast<double>(results[0].front()),
              static_cast<double>(results[0].back()));
  std::printf("OK\n");
  return 0;
}
