// The four norm ops of the op table over one backend's two norm passes, written once for every
// backend. A backend defines, in its namespace,
//   void norm_fwd(Context&, Stream&, const Tensor& x, const Tensor& gamma, const Tensor& beta,
//                 const Tensor& y, const Tensor& mean, const Tensor& rstd, float eps, bool rms);
//   void norm_bwd(Context&, Stream&, const Tensor& dy, const Tensor& x, const Tensor& gamma,
//                 const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
//                 const Tensor& dbeta, bool rms, bool accumulate);
// (RMSNorm: no mean and no beta, undefined Tensors) and then expands MESHRT_NORM_OPS there:
// layernorm_fwd / layernorm_bwd / rmsnorm_fwd / rmsnorm_bwd forward to them.
#pragma once

#include "kernels/backend.h"

#define MESHRT_NORM_OPS                                                                            \
  void layernorm_fwd(Context& ctx, Stream& s, const Tensor& x, const Tensor& gamma,                \
                     const Tensor& beta, const Tensor& y, const Tensor& mean, const Tensor& rstd,  \
                     float eps) {                                                                  \
    norm_fwd(ctx, s, x, gamma, beta, y, mean, rstd, eps, false);                                   \
  }                                                                                                \
  void layernorm_bwd(Context& ctx, Stream& s, const Tensor& dy, const Tensor& x,                   \
                     const Tensor& gamma, const Tensor& mean, const Tensor& rstd,                  \
                     const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,                  \
                     bool accumulate) {                                                            \
    norm_bwd(ctx, s, dy, x, gamma, mean, rstd, dx, dgamma, dbeta, false, accumulate);              \
  }                                                                                                \
  void rmsnorm_fwd(Context& ctx, Stream& s, const Tensor& x, const Tensor& gamma, const Tensor& y, \
                   const Tensor& rstd, float eps) {                                                \
    norm_fwd(ctx, s, x, gamma, Tensor(), y, Tensor(), rstd, eps, true);                            \
  }                                                                                                \
  void rmsnorm_bwd(Context& ctx, Stream& s, const Tensor& dy, const Tensor& x,                     \
                   const Tensor& gamma, const Tensor& rstd, const Tensor& dx,                      \
                   const Tensor& dgamma, bool accumulate) {                                        \
    norm_bwd(ctx, s, dy, x, gamma, Tensor(), rstd, dx, dgamma, Tensor(), true, accumulate);        \
  }
