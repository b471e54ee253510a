#include "helpers.h"

#include <algorithm>

namespace kt {

double round_to(double v, DType dt) {
  float f = static_cast<float>(v);
  switch (dt) {
    case DType::bf16:
      return meshrt::bf16::from_float(f).to_float();
    case DType::f16:
      return meshrt::f16::from_float(f).to_float();
    case DType::f32:
      return f;
    default:
      return v;
  }
}

Tensor make(Host& h, const Shape& shape, DType dt, const Vec& values) {
  Tensor t = h.ctx.empty(shape, dt);
  write(h, t, values);
  return t;
}

Vec uniform(int64_t n, uint64_t seed, double lo, double hi, DType dt) {
  std::mt19937_64 rng(seed * 7919 + 17);
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(static_cast<size_t>(n));
  for (auto& x : v) x = round_to(dist(rng), dt);
  return v;
}

Tensor rand_tensor(Host& h, const Shape& shape, DType dt, uint64_t seed, double lo, double hi) {
  return make(h, shape, dt, uniform(shape.numel(), seed, lo, hi, dt));
}

Vec read(Host& h, const Tensor& t) {
  h.sync();
  return t.to_vector();
}

void write(Host& h, const Tensor& t, const Vec& values) {
  h.sync();
  REQUIRE(static_cast<int64_t>(values.size()) == t.numel());
  REQUIRE((t.numel() == 0 || t.is_contiguous()));
  void* p = t.data_ptr();
  for (size_t i = 0; i < values.size(); ++i) {
    float f = static_cast<float>(values[i]);
    int64_t j = static_cast<int64_t>(i);
    switch (t.dtype()) {
      case DType::f32:
        meshrt::store_f32(static_cast<float*>(p), j, f);
        break;
      case DType::bf16:
        meshrt::store_f32(static_cast<meshrt::bf16*>(p), j, f);
        break;
      case DType::f16:
        meshrt::store_f32(static_cast<meshrt::f16*>(p), j, f);
        break;
      case DType::i32:
        static_cast<int32_t*>(p)[i] = static_cast<int32_t>(values[i]);
        break;
      case DType::i64:
        static_cast<int64_t*>(p)[i] = static_cast<int64_t>(values[i]);
        break;
      case DType::u8:
        static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(values[i]);
        break;
    }
  }
}

double tol_for(DType dt, double f32_tol) {
  switch (dt) {
    case DType::bf16:
      return 1.6e-2;  // 2^-7 relative: one rounding of the output plus slack
    case DType::f16:
      return 2e-3;  // 2^-10 relative plus slack
    default:
      return f32_tol;
  }
}

RelError rel_error(const Vec& got, const Vec& ref, const Floor& f) {
  REQUIRE(got.size() == ref.size());
  auto rms = [&](size_t from, size_t n) {
    double ss = 0;
    for (size_t i = from; i < from + n; ++i) ss += ref[i] * ref[i];
    return n == 0 ? 0.0 : std::sqrt(ss / static_cast<double>(n));
  };
  const size_t row = f.row_len > 0 ? static_cast<size_t>(f.row_len) : ref.size();
  REQUIRE(ref.size() % std::max<size_t>(row, 1) == 0);
  const double global = rms(0, ref.size()) * f.rms_frac + f.abs;
  RelError r;
  double floor = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (i % row == 0)
      floor = std::max(global + (f.row_len > 0 ? rms(i, row) * f.row_frac : 0), 1e-30);
    if (std::isnan(got[i]) != std::isnan(ref[i])) r.nan_mismatch = true;
    if (std::isnan(ref[i])) continue;
    double e = std::abs(got[i] - ref[i]) / (std::abs(ref[i]) + floor);
    if (!(e <= r.worst)) {
      r.worst = e;
      r.at = i;
    }
  }
  return r;
}

void check_close(const Vec& got, const Vec& ref, double tol, const std::string& what,
                 const Floor& f) {
  const RelError r = rel_error(got, ref, f);
  const size_t wi = r.at;
  INFO(what << ": worst relative error " << r.worst << " at index " << wi << " (got "
            << (got.empty() ? 0 : got[wi]) << ", want " << (ref.empty() ? 0 : ref[wi])
            << "), tolerance " << tol << ", n=" << got.size());
  CHECK(!r.nan_mismatch);
  CHECK(r.worst <= tol);
}

void check_close(const Vec& got, const Vec& ref, double tol, const std::string& what,
                 double floor_frac) {
  check_close(got, ref, tol, what, Floor{floor_frac});
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double norm(const Vec& a) { return std::sqrt(dot(a, a)); }

double fd_directional(const std::function<double(const Vec&)>& loss, const Vec& x, const Vec& dir,
                      double h) {
  Vec xp = x, xm = x;
  for (size_t i = 0; i < x.size(); ++i) {
    xp[i] += h * dir[i];
    xm[i] -= h * dir[i];
  }
  return (loss(xp) - loss(xm)) / (2 * h);
}

void check_grad_fd(const std::function<double(const Vec&)>& loss, const Vec& x, const Vec& grad,
                   const std::string& what, double h, double tol) {
  REQUIRE(grad.size() == x.size());
  const double gnorm = norm(grad);
  std::vector<Vec> dirs;
  for (uint64_t r = 0; r < 3; ++r) {
    Vec d = uniform(static_cast<int64_t>(x.size()), 1000 + r);
    double n = norm(d);
    for (auto& v : d) v /= n;
    dirs.push_back(d);
  }
  // A few coordinates, including the largest-gradient one.
  size_t imax = 0;
  for (size_t i = 0; i < grad.size(); ++i)
    if (std::abs(grad[i]) > std::abs(grad[imax])) imax = i;
  for (size_t i : {size_t{0}, x.size() / 2, x.size() - 1, imax}) {
    Vec d(x.size(), 0.0);
    d[i] = 1.0;
    dirs.push_back(d);
  }
  for (size_t k = 0; k < dirs.size(); ++k) {
    double fd = fd_directional(loss, x, dirs[k], h);
    double an = dot(grad, dirs[k]);
    INFO(what << ": direction " << k << " finite difference " << fd << " vs analytic " << an
              << " (|grad| " << gnorm << ")");
    CHECK(std::abs(fd - an) <= tol * gnorm + 1e-2 * std::abs(an) + 1e-9);
  }
}

std::string dt_name(DType dt) { return meshrt::dtype_name(dt); }

}  // namespace kt
