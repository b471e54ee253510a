// Test harness: runs a function on n host ranks (threads) with their contexts and communicators.
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "collectives/host_comm.h"
#include "runtime/context.h"
#include "runtime/logging.h"
#include "train/train.h"

namespace meshrt::test {

// Catch2 v2 assertions are not thread-safe: rank threads assert through these, one at a time.
// Never put a collective inside them (the lock would stop the other ranks from joining it).
inline std::mutex& catch_mutex() {
  static std::mutex m;
  return m;
}

inline void run_ranks(int n, const std::function<void(int, Communicator&, Context&)>& fn) {
  auto comms = make_host_communicators(n);
  std::vector<std::exception_ptr> errs(static_cast<size_t>(n));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      set_log_rank(r, n);
      try {
        ContextOptions o;
        o.rank = r;
        o.world_size = n;
        o.local_ranks = n;
        Context ctx(Device::cpu(r), o);
        fn(r, *comms[static_cast<size_t>(r)], ctx);
        ctx.synchronize();
      } catch (...) {
        errs[static_cast<size_t>(r)] = std::current_exception();
        comms[static_cast<size_t>(r)]->abort("rank " + std::to_string(r) + " failed in a test");
      }
    });
  for (auto& t : ts) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

// max |a - b| / max |ref|: the norm-relative error used for sharded-vs-unsharded comparisons.
inline double rel_err(const std::vector<double>& got, const std::vector<double>& ref) {
  double md = 0, mr = 1e-30;
  for (size_t i = 0; i < ref.size(); ++i) {
    md = std::max(md, std::abs(got[i] - ref[i]));
    mr = std::max(mr, std::abs(ref[i]));
  }
  return md / mr;
}

// A small model for the tests: init_std 0.1, and biases and norm gains drawn with param_noise so
// every parameter matters.
inline ModelConfig small_model_config(int64_t hidden, int64_t heads, int64_t ffn, int layers,
                                      int64_t vocab, uint64_t seed = 1, float param_noise = 0.1f) {
  ModelConfig m;
  m.block.hidden = hidden;
  m.block.heads = heads;
  m.block.ffn = ffn;
  m.block.init_std = 0.1f;
  m.block.param_noise = param_noise;
  m.block.seed = seed;
  m.layers = layers;
  m.vocab = vocab;
  return m;
}

// Runs train(cfg) on `world` thread ranks and returns rank 0's steps.
inline std::vector<StepStats> train_stats(int world, const TrainConfig& cfg) {
  std::vector<StepStats> out;
  std::mutex mu;
  run_ranks(world, [&](int r, Communicator& w, Context& ctx) {
    auto st = train(cfg, ctx, w, nullptr);
    if (r != 0) return;
    std::lock_guard<std::mutex> lk(mu);
    out = std::move(st);
  });
  return out;
}

// Rank 0's per-step losses of train_stats.
inline std::vector<double> train_losses(int world, const TrainConfig& cfg) {
  std::vector<double> out;
  for (const StepStats& s : train_stats(world, cfg)) out.push_back(s.loss);
  return out;
}

}  // namespace meshrt::test

#define RANK_REQUIRE(...)                                                \
  do {                                                                   \
    std::lock_guard<std::mutex> rank_lk_(::meshrt::test::catch_mutex()); \
    REQUIRE(__VA_ARGS__);                                                \
  } while (0)
#define RANK_REQUIRE_THROWS_WITH(expr, matcher)                          \
  do {                                                                   \
    std::lock_guard<std::mutex> rank_lk_(::meshrt::test::catch_mutex()); \
    REQUIRE_THROWS_WITH(expr, matcher);                                  \
  } while (0)
