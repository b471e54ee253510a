// The shared host/device math header (kernels/math.h) on its own: accuracy and special values.
#include <cmath>
#include <limits>

#include "helpers.h"
#include "kernels/math.h"

namespace km = meshrt::kmath;

TEST_CASE("exp_f32 is accurate to a few ulp and exact at the edges", "[math]") {
  double worst = 0;
  for (int i = 0; i <= 200000; ++i) {
    float x = -87.0f + 175.0f * static_cast<float>(i) / 200000.0f;
    double want = std::exp(static_cast<double>(x));
    double got = km::exp_f32(x);
    worst = std::max(worst, std::abs(got - want) / want);
  }
  INFO("worst relative error " << worst);
  CHECK(worst < 4 * 6e-8);
  CHECK(km::exp_f32(-km::kInf) == 0.0f);
  CHECK(km::exp_f32(-1000.f) == 0.0f);
  CHECK(km::exp_f32(0.f) == 1.0f);
  CHECK(std::isnan(km::exp_f32(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("tanh parts and GeLU match libm in double", "[math]") {
  double worst_t = 0, worst_g = 0, worst_dg = 0;
  for (int i = 0; i <= 20000; ++i) {
    float x = -12.f + 24.f * static_cast<float>(i) / 20000.f;
    double t = std::tanh(static_cast<double>(x));
    worst_t = std::max(worst_t, std::abs(km::tanh_f32(x) - t));
    km::TanhParts p = km::tanh_parts(x);
    worst_t = std::max(worst_t, std::abs(p.one_plus_t - (1 + t)) / (1 + t + 1e-30));
    worst_t = std::max(worst_t, std::abs(p.sech2 - (1 - t * t)) / (1 - t * t + 1e-30));
    double xd = x, u = std::sqrt(2 / M_PI) * (xd + 0.044715 * xd * xd * xd), tu = std::tanh(u);
    double g = 0.5 * xd * (1 + tu);
    double dg = 0.5 * (1 + tu) +
                0.5 * xd * (1 - tu * tu) * std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * xd * xd);
    // Relative error with an absolute floor of 0.1 (values are O(1) where the two terms of
    // gelu' cancel; there f32 can only promise absolute accuracy).
    worst_g = std::max(worst_g, std::abs(km::gelu_tanh(x) - g) / (std::abs(g) + 0.1));
    worst_dg = std::max(worst_dg, std::abs(km::gelu_tanh_grad(x) - dg) / (std::abs(dg) + 0.1));
  }
  INFO("tanh " << worst_t << " gelu " << worst_g << " gelu' " << worst_dg);
  CHECK(worst_t < 1e-6);
  CHECK(worst_g < 1e-5);
  CHECK(worst_dg < 1e-5);
  // Far tails: exp saturates on the negative side and the result goes to zero, never NaN / inf.
  for (float x : {-30.f, -100.f, -1e4f, -3e38f}) {
    INFO("x " << x << " gelu " << km::gelu_tanh(x));
    CHECK(std::isfinite(km::gelu_tanh(x)));
    CHECK(std::abs(km::gelu_tanh(x)) <= 1e-30f);
  }
  CHECK(km::gelu_tanh(30.f) == 30.f);
  CHECK(km::gelu_tanh(1e4f) == 1e4f);
  CHECK(std::isnan(km::gelu_tanh(std::numeric_limits<float>::quiet_NaN())));
  // Negative side, relative (no floor): 0.5 x (1 + tanh u) is tiny there. exp(-2u) amplifies
  // u's f32 rounding (relative 2^-24 of |2u|) into its relative error, hence the (1 + 2|u|).
  for (float x = -8.5f; x < 0.f; x += 0.37f) {
    const double xd = x, u = std::sqrt(2 / M_PI) * (xd + 0.044715 * xd * xd * xd);
    const double g = xd / (1 + std::exp(-2 * u));
    INFO("x " << x << " u " << u);
    CHECK(std::abs(km::gelu_tanh(x) - g) <= 2e-7 * (1 + 2 * std::abs(u)) * std::abs(g));
  }
}

TEST_CASE("Welford merges equal the two-pass statistics", "[math]") {
  kt::Vec v = kt::uniform(1001, 5, -3, 7);
  double mean = 0, m2 = 0;
  for (double x : v) mean += x;
  mean /= static_cast<double>(v.size());
  for (double x : v) m2 += (x - mean) * (x - mean);
  // Three uneven pieces, merged in two orders.
  km::Welford a, b, c;
  for (size_t i = 0; i < v.size(); ++i) {
    km::Welford& w = i < 17 ? a : (i < 600 ? b : c);
    km::welford_add(w, static_cast<float>(v[i]));
  }
  km::Welford empty;
  for (km::Welford w : {km::welford_merge(km::welford_merge(a, b), c),
                        km::welford_merge(c, km::welford_merge(empty, km::welford_merge(b, a)))}) {
    CHECK(w.count == 1001.f);
    CHECK(std::abs(w.mean - mean) < 1e-5);
    CHECK(std::abs(km::welford_var(w) - m2 / 1001.0) < 1e-4 * m2 / 1001.0);
  }
}

TEST_CASE("online softmax states merge like one pass, including -inf", "[math]") {
  kt::Vec v = kt::uniform(100, 6, -20, 20);
  double m = -1e300, l = 0;
  for (double x : v) m = std::max(m, x);
  for (double x : v) l += std::exp(x - m);
  km::SoftmaxState a, b;
  for (size_t i = 0; i < v.size(); ++i) km::softmax_add(i % 3 ? a : b, static_cast<float>(v[i]));
  km::softmax_add(a, -km::kInf);  // a masked entry changes nothing
  km::SoftmaxState r = km::softmax_merge(a, b);
  CHECK(r.m == static_cast<float>(m));
  CHECK(std::abs(r.l - l) < 1e-5 * l);
  CHECK(std::abs(km::softmax_lse(r) - (m + std::log(l))) < 1e-5);
  km::SoftmaxState e;  // empty row
  km::softmax_add(e, -km::kInf);
  CHECK(e.l == 0.f);
  CHECK(km::softmax_lse(e) == -km::kInf);
  CHECK(km::softmax_merge(e, r).l == r.l);
}

TEST_CASE("dropout keep decisions come from the Philox words of index / 4", "[math]") {
  for (uint64_t i = 0; i < 64; ++i) {
    meshrt::Philox4 r = meshrt::philox_draw(9, 3, i / 4);
    CHECK(km::dropout_keep(9, 3, i, 0.4f) == (meshrt::philox_u01(r.v[i % 4]) >= 0.4f));
  }
  CHECK(km::dropout_keep(1, 2, 5, 0.0f));
}
