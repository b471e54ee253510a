// meshrt's public C++ API: a tensor-parallel MLP block (tp = 2 ranks as threads). Each rank binds
// its shards of the full weights (meshrt's [in, out] layout, used in place), runs forward and
// backward, and checks y against a naive double-precision loop over the full weights and the
// fc2-bias gradient against its definition (the sum of dy over rows). Exit code 0 when all match.
#include <meshrt/blocks.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kTp = 2;
constexpr int64_t kSeq = 4, kBatch = 2, kHidden = 8, kFfn = 12, kRows = kSeq * kBatch;
constexpr float kEps = 1e-5f;

float pseudo(int seed, int64_t i, float scale) {
  auto z = static_cast<unsigned>(seed * 7919 + i * 104729 + 17);
  z = (z ^ (z >> 13)) * 1274126177u;
  return scale * (static_cast<float>(z % 2001u) / 1000.0f - 1.0f);
}

std::vector<float> filled(int seed, int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = pseudo(seed, i, scale);
  return v;
}

// The full parameters and data, the same on every rank: w1 [hidden, ffn], w2 [ffn, hidden].
const std::vector<float> gamma_ = filled(1, kHidden, 1), beta_ = filled(2, kHidden, 0.1f),
                         w1 = filled(3, kHidden*kFfn, 0.3f), b1 = filled(4, kFfn, 0.1f),
                         w2 = filled(5, kFfn*kHidden, 0.3f), b2 = filled(6, kHidden, 0.1f),
                         x_full = filled(7, kRows*kHidden, 1),
                         dy_full = filled(8, kRows*kHidden, 1);

// y = x + fc2(gelu_tanh(fc1(layernorm(x)))) for row r, column i.
double naive_y(int64_t r, int64_t i) {
  const float* x = &x_full[r * kHidden];
  double mean = 0, var = 0, ln[kHidden], s = b2[i];
  for (int64_t k = 0; k < kHidden; ++k) mean += x[k] / static_cast<double>(kHidden);
  for (int64_t k = 0; k < kHidden; ++k) var += (x[k] - mean) * (x[k] - mean) / kHidden;
  for (int64_t k = 0; k < kHidden; ++k) {
    ln[k] = (x[k] - mean) / std::sqrt(var + kEps) * gamma_[k] + beta_[k];
  }
  for (int64_t j = 0; j < kFfn; ++j) {
    double h = b1[j];
    for (int64_t k = 0; k < kHidden; ++k) h += ln[k] * w1[k * kFfn + j];
    const double g =
        0.5 * h *
        (1 + std::tanh(std::sqrt(2 / 3.14159265358979323846) * (h + 0.044715 * h * h * h)));
    s += g * w2[j * kHidden + i];
  }
  return x[i] + s;
}

// Rows [lo, lo + n) of a row-major [rows, cols] matrix, or its columns when `cols_of`.
std::vector<float> slice(const std::vector<float>& m, int64_t rows, int64_t cols, meshrt::Shard s,
                         bool cols_of) {
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const bool in = cols_of ? (c >= s.offset && c < s.offset + s.size)
                              : (r >= s.offset && r < s.offset + s.size);
      if (in) out.push_back(m[r * cols + c]);
    }
  }
  return out;
}

int run_rank(const meshrt_unique_id_t& id, int rank) {
  meshrt::Comm comm = meshrt::Comm::init_rank(kTp, id, rank);
  meshrt::Mesh mesh(comm, "tp=2");
  meshrt_mlp_config_t cfg = meshrt::mlp_config();
  cfg.hidden = kHidden;
  cfg.ffn = kFfn;
  cfg.eps = kEps;
  meshrt::Mlp mlp(mesh, cfg);
  const meshrt::Shard s1 = mlp.shard(MESHRT_MLP_FC1_WEIGHT), s2 = mlp.shard(MESHRT_MLP_FC2_WEIGHT);
  // This rank's shards, owned by the program and bound in place.
  std::vector<float> g = gamma_, be = beta_, w1s = slice(w1, kHidden, kFfn, s1, true),
                     b1s = slice(b1, 1, kFfn, s1, true), w2s = slice(w2, kFfn, kHidden, s2, false),
                     b2s = b2, x = x_full, dy = dy_full, y(x.size()), dx(x.size());
  std::vector<float> gg(kHidden), gbe(kHidden), gw1(w1s.size()), gb1(b1s.size()), gw2(w2s.size()),
      gb2(kHidden);
  using T = meshrt::Tensor;
  T tg = T::borrow_cpu(g.data(), {kHidden}), tbe = T::borrow_cpu(be.data(), {kHidden}),
    tw1 = T::borrow_cpu(w1s.data(), {kHidden, s1.size}), tb1 = T::borrow_cpu(b1s.data(), {s1.size}),
    tw2 = T::borrow_cpu(w2s.data(), {s2.size, kHidden}), tb2 = T::borrow_cpu(b2s.data(), {kHidden});
  meshrt_mlp_params_t w = meshrt::mlp_params();
  w.norm_weight = tg.get();
  w.norm_bias = tbe.get();
  w.fc1_weight = tw1.get();
  w.fc1_bias = tb1.get();
  w.fc2_weight = tw2.get();
  w.fc2_bias = tb2.get();
  mlp.bind_weights(w);
  T tgg = T::borrow_cpu(gg.data(), {kHidden}), tgbe = T::borrow_cpu(gbe.data(), {kHidden}),
    tgw1 = T::borrow_cpu(gw1.data(), {kHidden, s1.size}),
    tgb1 = T::borrow_cpu(gb1.data(), {s1.size}),
    tgw2 = T::borrow_cpu(gw2.data(), {s2.size, kHidden}),
    tgb2 = T::borrow_cpu(gb2.data(), {kHidden});
  meshrt_mlp_params_t grads = meshrt::mlp_params();
  grads.norm_weight = tgg.get();
  grads.norm_bias = tgbe.get();
  grads.fc1_weight = tgw1.get();
  grads.fc1_bias = tgb1.get();
  grads.fc2_weight = tgw2.get();
  grads.fc2_bias = tgb2.get();
  const std::vector<int64_t> act{kSeq, kBatch, kHidden};
  T tx = T::borrow_cpu(x.data(), act), ty = T::borrow_cpu(y.data(), act),
    tdy = T::borrow_cpu(dy.data(), act), tdx = T::borrow_cpu(dx.data(), act);
  mlp.forward(tx, ty).synchronize();
  mlp.backward(tdy, tdx, grads).synchronize();
  int bad = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t i = 0; i < kHidden; ++i) {
      if (std::fabs(y[r * kHidden + i] - naive_y(r, i)) > 1e-4) ++bad;
    }
  }
  for (int64_t i = 0; i < kHidden; ++i) {
    double want = 0;
    for (int64_t r = 0; r < kRows; ++r) want += dy_full[r * kHidden + i];
    if (std::fabs(gb2[i] - want) > 1e-4) ++bad;
  }
  return bad;
}

}  // namespace

int main() {
  const meshrt_unique_id_t id = meshrt::unique_id();
  std::vector<int> bad(kTp, 0);
  std::vector<std::string> errors(kTp);
  std::vector<std::thread> threads;
  for (int r = 0; r < kTp; ++r) {
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
  for (int r = 0; r < kTp; ++r) {
    threads[r].join();
    if (!errors[r].empty()) std::fprintf(stderr, "rank %d: %s\n", r, errors[r].c_str());
    total += bad[r];
  }
  std::printf("meshrt C++ API: MLP block, tp=%d, [%lld, %lld, %lld], forward + backward\n", kTp,
              static_cast<long long>(kSeq), static_cast<long long>(kBatch),
              static_cast<long long>(kHidden));
  std::printf("%s: %d mismatches\n", total == 0 ? "OK" : "FAILED", total);
  return total == 0 ? 0 : 1;
}
