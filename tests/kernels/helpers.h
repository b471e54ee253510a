// Test helpers for the kernels suite: host tensors from vectors, double references, tolerances,
// finite differences.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "runtime/backend.h"
#include "runtime/context.h"
#include "runtime/half.h"

namespace kt {

using meshrt::Context;
using meshrt::Device;
using meshrt::DType;
using meshrt::Shape;
using meshrt::Stream;
using meshrt::Tensor;
using Vec = std::vector<double>;

// One host rank (its context and compute stream).
struct Host {
  explicit Host(int local_ranks = 1) : ctx(Device::cpu(), opts(local_ranks)) {}
  static meshrt::ContextOptions opts(int local_ranks) {
    meshrt::ContextOptions o;
    o.local_ranks = local_ranks;
    return o;
  }
  Stream& s() { return ctx.compute_stream(); }
  void sync() { ctx.synchronize(); }
  Context ctx;
};

// The value v takes once stored as dtype (what the kernel actually sees).
double round_to(double v, DType dt);

// Writes values (rounded to the dtype) into a new host tensor.
Tensor make(Host& h, const Shape& shape, DType dt, const Vec& values);
// Uniform values in [lo, hi) rounded to dt; deterministic in seed.
Vec uniform(int64_t n, uint64_t seed, double lo = -1.0, double hi = 1.0, DType dt = DType::f32);
Tensor rand_tensor(Host& h, const Shape& shape, DType dt, uint64_t seed, double lo = -1.0,
                   double hi = 1.0);
// Contents of a host tensor (after synchronising the host).
Vec read(Host& h, const Tensor& t);
// Overwrites a host tensor's contents (rounded to its dtype); synchronises first.
void write(Host& h, const Tensor& t, const Vec& values);

// Relative tolerance of a result stored as dt (f32 results get `f32_tol`).
double tol_for(DType dt, double f32_tol = 2e-5);

// The floor of a relative comparison: rms(ref) * rms_frac + abs, plus, with row_len > 0, the rms
// of the element's row (row_len consecutive elements) times row_frac.
struct Floor {
  double rms_frac = 0.1;
  double abs = 0;
  int64_t row_len = 0;
  double row_frac = 0;
};

// The worst |got - ref| / (|ref| + floor) over the elements (floor at least 1e-30), where it is,
// and whether got and ref disagree on which elements are NaN.
struct RelError {
  double worst = 0;
  size_t at = 0;
  bool nan_mismatch = false;
};
RelError rel_error(const Vec& got, const Vec& ref, const Floor& f);

// Checks |got - ref| <= tol * (|ref| + floor) elementwise, where floor = rms(ref) * floor_frac
// (absorbs cancellation near zero), or as `f` says. Reports the worst element.
void check_close(const Vec& got, const Vec& ref, double tol, const std::string& what,
                 double floor_frac = 0.1);
void check_close(const Vec& got, const Vec& ref, double tol, const std::string& what,
                 const Floor& f);

double dot(const Vec& a, const Vec& b);
double norm(const Vec& a);

// Central finite differences of a scalar loss along `dir`: (L(x + h dir) - L(x - h dir)) / 2h.
double fd_directional(const std::function<double(const Vec&)>& loss, const Vec& x, const Vec& dir,
                      double h);

// Checks an analytic gradient against central differences of `loss` around x: along three random
// directions and along a few coordinates.
void check_grad_fd(const std::function<double(const Vec&)>& loss, const Vec& x, const Vec& grad,
                   const std::string& what, double h = 1e-2, double tol = 2e-3);

std::string dt_name(DType dt);

}  // namespace kt
