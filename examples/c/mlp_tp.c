/* meshrt's sharded MLP block from C: 2 engine threads (pthreads) form a tp=2 mesh, each binds its
 * shard of weights the engine owns (meshrt's [in, out] layout: used in place, no copy), runs one
 * forward and one backward, and checks the output, the input gradient and its weight-gradient
 * shards against a naive double-precision loop over the full weights. Exit code 0 when every
 * value matches. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshrt/meshrt.h"

#define TP 2
#define SEQ 4
#define BATCH 2
#define HIDDEN 8
#define FFN 12
#define ROWS (SEQ * BATCH)
#define EPS 1e-5

static meshrt_comm_t g_comms[TP];
static int g_errors[TP];
/* The full parameters, the same for every rank: w1 [HIDDEN, FFN], w2 [FFN, HIDDEN]. */
static float g_gamma[HIDDEN], g_beta[HIDDEN], g_w1[HIDDEN * FFN], g_b1[FFN], g_w2[FFN * HIDDEN],
    g_b2[HIDDEN], g_x[ROWS * HIDDEN], g_dy[ROWS * HIDDEN];
/* The naive loop's results. */
static double r_y[ROWS * HIDDEN], r_dx[ROWS * HIDDEN], r_gw1[HIDDEN * FFN], r_gb1[FFN],
    r_gw2[FFN * HIDDEN], r_gb2[HIDDEN], r_gg[HIDDEN], r_gbeta[HIDDEN];

#define CHECK_OK(rank, call)                                                                  \
  do {                                                                                        \
    meshrt_status_t st_ = (call);                                                             \
    if (st_ != MESHRT_SUCCESS) {                                                              \
      fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank, #call, meshrt_status_string(st_), \
              meshrt_last_error());                                                           \
      g_errors[rank]++;                                                                       \
      return NULL;                                                                            \
    }                                                                                         \
  } while (0)

static float pseudo(int seed, int i, float scale) {
  unsigned int z = (unsigned int)(seed * 7919 + i * 104729 + 17);
  z = (z ^ (z >> 13)) * 1274126177u;
  return scale * ((float)(z % 2001u) / 1000.0f - 1.0f);
}

static double gelu(double x, double* d) { /* tanh approximation and its derivative */
  const double k = sqrt(2.0 / 3.14159265358979323846), t = tanh(k * (x + 0.044715 * x * x * x));
  *d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
  return 0.5 * x * (1 + t);
}

/* y = x + fc2(gelu(fc1(layernorm(x)))) and its backward for dy, row by row. */
static void naive_block(void) {
  int r, i, j;
  for (r = 0; r < ROWS; ++r) {
    const float* x = g_x + r * HIDDEN;
    const float* dy = g_dy + r * HIDDEN;
    double mean = 0, var = 0, rstd, n[HIDDEN], ln[HIDDEN], h[FFN], g[FFN], dg[FFN], dh[FFN];
    double dln[HIDDEN], dn[HIDDEN], mdn = 0, mdnn = 0;
    for (i = 0; i < HIDDEN; ++i) mean += x[i] / (double)HIDDEN;
    for (i = 0; i < HIDDEN; ++i) var += (x[i] - mean) * (x[i] - mean) / HIDDEN;
    rstd = 1 / sqrt(var + EPS);
    for (i = 0; i < HIDDEN; ++i) {
      n[i] = (x[i] - mean) * rstd;
      ln[i] = n[i] * g_gamma[i] + g_beta[i];
    }
    for (j = 0; j < FFN; ++j) {
      h[j] = g_b1[j];
      for (i = 0; i < HIDDEN; ++i) h[j] += ln[i] * g_w1[i * FFN + j];
      g[j] = gelu(h[j], &dg[j]);
    }
    for (i = 0; i < HIDDEN; ++i) {
      double s = g_b2[i];
      for (j = 0; j < FFN; ++j) s += g[j] * g_w2[j * HIDDEN + i];
      r_y[r * HIDDEN + i] = x[i] + s;
      r_gb2[i] += dy[i];
    }
    for (j = 0; j < FFN; ++j) {
      double s = 0;
      for (i = 0; i < HIDDEN; ++i) {
        s += dy[i] * g_w2[j * HIDDEN + i];
        r_gw2[j * HIDDEN + i] += g[j] * dy[i];
      }
      dh[j] = s * dg[j];
      r_gb1[j] += dh[j];
    }
    for (i = 0; i < HIDDEN; ++i) {
      dln[i] = 0;
      for (j = 0; j < FFN; ++j) {
        dln[i] += dh[j] * g_w1[i * FFN + j];
        r_gw1[i * FFN + j] += ln[i] * dh[j];
      }
      r_gg[i] += dln[i] * n[i];
      r_gbeta[i] += dln[i];
      dn[i] = dln[i] * g_gamma[i];
      mdn += dn[i] / HIDDEN;
      mdnn += dn[i] * n[i] / HIDDEN;
    }
    for (i = 0; i < HIDDEN; ++i) r_dx[r * HIDDEN + i] = rstd * (dn[i] - mdn - n[i] * mdnn) + dy[i];
  }
}

/* A contiguous f32 CPU tensor over `data` (ndim <= 3), borrowed by meshrt. */
typedef struct {
  int64_t shape[3];
  DLTensor dl;
  meshrt_tensor_t h;
} tensor_t;

static meshrt_status_t wrap(tensor_t* t, float* data, int ndim, int64_t d0, int64_t d1,
                            int64_t d2) {
  memset(t, 0, sizeof(*t));
  t->shape[0] = d0;
  t->shape[1] = d1;
  t->shape[2] = d2;
  t->dl.data = data;
  t->dl.device.device_type = kDLCPU;
  t->dl.ndim = ndim;
  t->dl.dtype.code = kDLFloat;
  t->dl.dtype.bits = 32;
  t->dl.dtype.lanes = 1;
  t->dl.shape = t->shape;
  return meshrt_tensor_from_dltensor(&t->dl, &t->h);
}

static int mismatches(const float* got, const double* want, int n) {
  int i, bad = 0;
  for (i = 0; i < n; ++i)
    if (fabs(got[i] - want[i]) > 1e-4 * (1 + fabs(want[i]))) bad++;
  return bad;
}

static void* rank_main(void* arg) {
  const int rank = (int)(size_t)arg;
  meshrt_mesh_t mesh = NULL;
  meshrt_mlp_t mlp = NULL;
  meshrt_mlp_config_t cfg = MESHRT_MLP_CONFIG_INITIALIZER;
  meshrt_mlp_params_t w = MESHRT_MLP_PARAMS_INITIALIZER, g = MESHRT_MLP_PARAMS_INITIALIZER;
  meshrt_event_t ev = NULL;
  int64_t off = 0, n = 0;
  int i, j, bad = 0;
  float *w1, *b1, *w2, *gw1, *gb1, *gw2, gg[HIDDEN] = {0}, gbeta[HIDDEN] = {0}, gb2[HIDDEN] = {0};
  float y[ROWS * HIDDEN], dx[ROWS * HIDDEN];
  double want_w1[HIDDEN * FFN], want_b1[FFN], want_w2[FFN * HIDDEN];
  tensor_t t[16];

  CHECK_OK(rank, meshrt_mesh_create(&mesh, g_comms[rank], "tp=2"));
  cfg.hidden = HIDDEN;
  cfg.ffn = FFN;
  cfg.eps = (float)EPS;
  cfg.weight_layout = MESHRT_WEIGHT_LAYOUT_IN_OUT;
  CHECK_OK(rank, meshrt_mlp_create(&mlp, mesh, &cfg));
  /* fc1 is colwise: this rank holds columns [off, off + n) of w1 and b1; fc2 is rowwise: the
   * same rows of w2. shard_info says which (uneven ffn: the first ranks hold one more). */
  CHECK_OK(rank, meshrt_mlp_shard_info(mlp, MESHRT_MLP_FC1_WEIGHT, &off, &n));
  w1 = malloc(sizeof(float) * HIDDEN * (size_t)n);
  gw1 = calloc((size_t)(HIDDEN * n), sizeof(float));
  b1 = malloc(sizeof(float) * (size_t)n);
  gb1 = calloc((size_t)n, sizeof(float));
  w2 = malloc(sizeof(float) * (size_t)n * HIDDEN);
  gw2 = calloc((size_t)(n * HIDDEN), sizeof(float));
  for (i = 0; i < HIDDEN; ++i)
    for (j = 0; j < n; ++j) {
      w1[i * n + j] = g_w1[i * FFN + off + j];
      want_w1[i * n + j] = r_gw1[i * FFN + off + j];
    }
  for (j = 0; j < n; ++j) {
    b1[j] = g_b1[off + j];
    want_b1[j] = r_gb1[off + j];
    for (i = 0; i < HIDDEN; ++i) {
      w2[j * HIDDEN + i] = g_w2[(off + j) * HIDDEN + i];
      want_w2[j * HIDDEN + i] = r_gw2[(off + j) * HIDDEN + i];
    }
  }
  CHECK_OK(rank, wrap(&t[0], g_gamma, 1, HIDDEN, 0, 0));
  CHECK_OK(rank, wrap(&t[1], g_beta, 1, HIDDEN, 0, 0));
  CHECK_OK(rank, wrap(&t[2], w1, 2, HIDDEN, n, 0));
  CHECK_OK(rank, wrap(&t[3], b1, 1, n, 0, 0));
  CHECK_OK(rank, wrap(&t[4], w2, 2, n, HIDDEN, 0));
  CHECK_OK(rank, wrap(&t[5], g_b2, 1, HIDDEN, 0, 0));
  CHECK_OK(rank, wrap(&t[6], gg, 1, HIDDEN, 0, 0));
  CHECK_OK(rank, wrap(&t[7], gbeta, 1, HIDDEN, 0, 0));
  CHECK_OK(rank, wrap(&t[8], gw1, 2, HIDDEN, n, 0));
  CHECK_OK(rank, wrap(&t[9], gb1, 1, n, 0, 0));
  CHECK_OK(rank, wrap(&t[10], gw2, 2, n, HIDDEN, 0));
  CHECK_OK(rank, wrap(&t[11], gb2, 1, HIDDEN, 0, 0));
  CHECK_OK(rank, wrap(&t[12], g_x, 3, SEQ, BATCH, HIDDEN));
  CHECK_OK(rank, wrap(&t[13], y, 3, SEQ, BATCH, HIDDEN));
  CHECK_OK(rank, wrap(&t[14], g_dy, 3, SEQ, BATCH, HIDDEN));
  CHECK_OK(rank, wrap(&t[15], dx, 3, SEQ, BATCH, HIDDEN));
  w.norm_weight = t[0].h;
  w.norm_bias = t[1].h;
  w.fc1_weight = t[2].h;
  w.fc1_bias = t[3].h;
  w.fc2_weight = t[4].h;
  w.fc2_bias = t[5].h;
  g.norm_weight = t[6].h;
  g.norm_bias = t[7].h;
  g.fc1_weight = t[8].h;
  g.fc1_bias = t[9].h;
  g.fc2_weight = t[10].h;
  g.fc2_bias = t[11].h;
  CHECK_OK(rank, meshrt_mlp_bind_weights(mlp, &w));

  /* Forward and backward on the mesh's default stream (NULL); the events say when each is done.
   * Gradients are added to the (zeroed) engine tensors. */
  CHECK_OK(rank, meshrt_mlp_forward(mlp, t[12].h, t[13].h, NULL, &ev));
  CHECK_OK(rank, meshrt_event_synchronize(ev));
  meshrt_event_destroy(ev);
  CHECK_OK(rank, meshrt_mlp_backward(mlp, t[14].h, t[15].h, &g, NULL, &ev));
  CHECK_OK(rank, meshrt_event_synchronize(ev));
  meshrt_event_destroy(ev);

  bad += mismatches(y, r_y, ROWS * HIDDEN);
  bad += mismatches(dx, r_dx, ROWS * HIDDEN);
  bad += mismatches(gg, r_gg, HIDDEN);
  bad += mismatches(gbeta, r_gbeta, HIDDEN);
  bad += mismatches(gw1, want_w1, HIDDEN * (int)n);
  bad += mismatches(gb1, want_b1, (int)n);
  bad += mismatches(gw2, want_w2, (int)n * HIDDEN);
  bad += mismatches(gb2, r_gb2, HIDDEN);
  g_errors[rank] += bad;
  printf(
      "rank %d: fc1 columns [%lld, %lld), y[0..2] = %.5f %.5f %.5f, dx[0] = %.5f, "
      "fc1 grad[0] = %.5f (naive loop agrees: %s)\n",
      rank, (long long)off, (long long)(off + n), y[0], y[1], y[2], dx[0], gw1[0],
      bad ? "no" : "yes");
  for (i = 0; i < 16; ++i) meshrt_tensor_destroy(t[i].h);
  CHECK_OK(rank, meshrt_mlp_destroy(mlp));
  CHECK_OK(rank, meshrt_mesh_destroy(mesh));
  free(w1);
  free(b1);
  free(w2);
  free(gw1);
  free(gb1);
  free(gw2);
  return NULL;
}

int main(void) {
  pthread_t threads[TP];
  meshrt_comm_config_t cfg = MESHRT_COMM_CONFIG_INITIALIZER;
  int major = 0, minor = 0, patch = 0, r, i, errors = 0;
  if (meshrt_init(MESHRT_API_VERSION) != MESHRT_SUCCESS) {
    fprintf(stderr, "meshrt_init: %s\n", meshrt_last_error());
    return 1;
  }
  meshrt_get_version(&major, &minor, &patch);
  printf("meshrt %d.%d.%d, C API %d: MLP block, tp=%d, [seq %d, batch %d, hidden %d], ffn %d\n",
         major, minor, patch, meshrt_get_api_version(), TP, SEQ, BATCH, HIDDEN, FFN);
  for (i = 0; i < HIDDEN; ++i) {
    g_gamma[i] = 1 + pseudo(1, i, 0.3f);
    g_beta[i] = pseudo(2, i, 0.3f);
    g_b2[i] = pseudo(6, i, 0.3f);
  }
  for (i = 0; i < HIDDEN * FFN; ++i) {
    g_w1[i] = pseudo(3, i, 0.4f);
    g_w2[i] = pseudo(5, i, 0.4f);
  }
  for (i = 0; i < FFN; ++i) g_b1[i] = pseudo(4, i, 0.3f);
  for (i = 0; i < ROWS * HIDDEN; ++i) {
    g_x[i] = pseudo(7, i, 1.5f);
    g_dy[i] = pseudo(8, i, 1.0f);
  }
  naive_block();
  cfg.timeout_s = 60;
  if (meshrt_comm_init_all(g_comms, TP, NULL, &cfg) != MESHRT_SUCCESS) {
    fprintf(stderr, "meshrt_comm_init_all: %s\n", meshrt_last_error());
    return 1;
  }
  for (r = 0; r < TP; ++r) pthread_create(&threads[r], NULL, rank_main, (void*)(size_t)r);
  for (r = 0; r < TP; ++r) pthread_join(threads[r], NULL);
  for (r = 0; r < TP; ++r) {
    meshrt_comm_destroy(g_comms[r]);
    errors += g_errors[r];
  }
  printf("%s: %d mismatches\n", errors ? "FAILED" : "OK", errors);
  return errors ? 1 : 0;
}
