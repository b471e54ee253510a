/* meshrt's C API from C: 4 engine threads (pthreads) join one world with a unique id, then run
 * an all-reduce and an all-gather on their own buffers (DLPack, zero copy), each checked against
 * a naive loop. Exit code 0 when every value matches. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshrt/meshrt.h"

#define NRANKS 4
#define COUNT 1024

static meshrt_unique_id_t g_id;
static int g_errors[NRANKS];

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

static float value(int rank, int i) { return (float)(rank * 1000 + i % 100); }

static DLTensor cpu_f32(float* data, int64_t* shape) {
  DLTensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

static void* rank_main(void* arg) {
  const int rank = (int)(size_t)arg;
  meshrt_comm_t comm = NULL;
  meshrt_comm_config_t cfg = MESHRT_COMM_CONFIG_INITIALIZER;
  float* x = malloc(sizeof(float) * COUNT);
  float* gathered = malloc(sizeof(float) * COUNT * NRANKS);
  int64_t n = COUNT, ng = (int64_t)COUNT * NRANKS;
  DLTensor dx = cpu_f32(x, &n), dg = cpu_f32(gathered, &ng);
  meshrt_tensor_t tx = NULL, tin = NULL, tg = NULL;
  meshrt_event_t reduced = NULL, gathered_ev = NULL;
  float* original = malloc(sizeof(float) * COUNT);
  int i, r, bad = 0;

  cfg.timeout_s = 60;
  CHECK_OK(rank, meshrt_comm_init_rank(&comm, NRANKS, g_id, rank, &cfg));
  for (i = 0; i < COUNT; ++i) x[i] = original[i] = value(rank, i);
  {
    DLTensor din = cpu_f32(original, &n);
    CHECK_OK(rank, meshrt_tensor_from_dltensor(&din, &tin));
  }
  CHECK_OK(rank, meshrt_tensor_from_dltensor(&dx, &tx));
  CHECK_OK(rank, meshrt_tensor_from_dltensor(&dg, &tg));
  /* Both on the default stream (NULL); the events say when each result is ready. */
  CHECK_OK(rank, meshrt_all_reduce(comm, tx, tx, MESHRT_SUM, NULL, &reduced));
  CHECK_OK(rank, meshrt_all_gather(comm, tin, tg, NULL, &gathered_ev));
  CHECK_OK(rank, meshrt_event_synchronize(reduced));
  CHECK_OK(rank, meshrt_event_synchronize(gathered_ev));

  for (i = 0; i < COUNT; ++i) { /* naive all-reduce */
    float want = 0;
    for (r = 0; r < NRANKS; ++r) want += value(r, i);
    if (x[i] != want) bad++;
  }
  for (r = 0; r < NRANKS; ++r) /* naive all-gather */
    for (i = 0; i < COUNT; ++i)
      if (gathered[r * COUNT + i] != value(r, i)) bad++;
  g_errors[rank] += bad;
  if (rank == 0) {
    printf("rank 0: all_reduce x[0..3] = %.0f %.0f %.0f %.0f (naive loop agrees: %s)\n", x[0], x[1],
           x[2], x[3], bad ? "no" : "yes");
    printf("rank 0: all_gather block starts = %.0f %.0f %.0f %.0f\n", gathered[0], gathered[COUNT],
           gathered[2 * COUNT], gathered[3 * COUNT]);
  }
  meshrt_event_destroy(reduced);
  meshrt_event_destroy(gathered_ev);
  meshrt_tensor_destroy(tx);
  meshrt_tensor_destroy(tin);
  meshrt_tensor_destroy(tg);
  CHECK_OK(rank, meshrt_comm_destroy(comm));
  free(x);
  free(gathered);
  free(original);
  return NULL;
}

int main(void) {
  pthread_t threads[NRANKS];
  int major = 0, minor = 0, patch = 0, r, errors = 0;
  if (meshrt_init(MESHRT_API_VERSION) != MESHRT_SUCCESS) {
    fprintf(stderr, "meshrt_init: %s\n", meshrt_last_error());
    return 1;
  }
  meshrt_get_version(&major, &minor, &patch);
  printf("meshrt %d.%d.%d, C API %d: %d ranks as threads\n", major, minor, patch,
         meshrt_get_api_version(), NRANKS);
  if (meshrt_get_unique_id(&g_id) != MESHRT_SUCCESS) return 1;
  for (r = 0; r < NRANKS; ++r) pthread_create(&threads[r], NULL, rank_main, (void*)(size_t)r);
  for (r = 0; r < NRANKS; ++r) pthread_join(threads[r], NULL);
  for (r = 0; r < NRANKS; ++r) errors += g_errors[r];
  printf("%s: %d mismatches\n", errors ? "FAILED" : "OK", errors);
  return errors ? 1 : 0;
}
