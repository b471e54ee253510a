// An engine using meshrt's installed C++ API: two ranks as threads of this process, each with its
// own Context (device cpu:<rank>, compute stream, allocator), all-reduce a tensor and check every
// element of the sum exactly.
#include <meshrt/meshrt.hpp>

#include <cstdio>
#include <exception>
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

}  // namespace

int main() {
  std::printf("meshrt %s (header %d.%d.%d)\n", MESHRT_VERSION_STRING, MESHRT_VERSION_MAJOR,
              MESHRT_VERSION_MINOR, MESHRT_VERSION_PATCH);
#if defined(MESHRT_CONSUMER_HAS_C_API)
  std::printf("C API header compiled as C (%s)\n", consumer_c_version());
#endif
  std::vector<std::unique_ptr<meshrt::Communicator>> comms =
      meshrt::make_host_communicators(kRanks, "world");
  std::vector<std::vector<double>> results(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      try {
        meshrt::Context ctx(meshrt::Device::cpu(r), {.rank = r, .world_size = kRanks});
        meshrt::Tensor t = ctx.empty(meshrt::Shape{kElems}, meshrt::DType::f32);
        ctx.compute_stream().synchronize();  // host tensor: written directly below
        float* p = t.data<float>();
        for (int64_t i = 0; i < kElems; ++i) p[i] = value(r, i);
        comms[static_cast<size_t>(r)]
            ->all_reduce(t, meshrt::ReduceOp::Sum, ctx.compute_stream())
            .synchronize();
        results[static_cast<size_t>(r)] = t.to_vector();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = meshrt::error_message(e);
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
    const std::vector<double>& v = results[static_cast<size_t>(r)];
    for (int64_t i = 0; i < kElems; ++i) {
      double want = 0;
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
              static_cast<long long>(kElems), results[0].front(), results[0].back());
  std::printf("OK\n");
  return 0;
}
