/* meshrt's stable C API: communicators, DLPack tensors, collectives, device meshes and sharded
 * transformer blocks for embedding engines.
 *
 * C99, no CUDA / MPI / NCCL types: a cudaStream_t, an ncclComm_t or an MPI_Comm* is passed as a
 * void* where a call documents it. Conventions:
 *  - Every call returns a meshrt_status_t; MESHRT_SUCCESS is 0. On failure,
 *    meshrt_last_error() returns the calling thread's full message (what failed, the values, what
 *    to change). No call throws a C++ exception or aborts the process on bad input.
 *  - Call meshrt_init(MESHRT_API_VERSION) once before creating communicators: a library built
 *    for another API version refuses it, naming both versions.
 *  - Handles (meshrt_comm_t, meshrt_stream_t, meshrt_event_t, meshrt_tensor_t, meshrt_mesh_t,
 *    meshrt_mlp_t, meshrt_attn_t) are opaque and checked on every call: a destroyed or
 * never-created handle gets MESHRT_ERROR_INVALID_USAGE, not a crash (a freed handle's address could
 * be reused by a new handle of the same kind; do not keep handles past destroy).
 *  - Tensors are DLPack tensors, used in place (zero copy); see "Tensors" below.
 *  - Asynchronous calls take a stream (NULL: the communicator's default stream) and may return an
 *    event; nothing waits behind the caller's back. */
#ifndef MESHRT_MESHRT_H_
#define MESHRT_MESHRT_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h> /* DLTensor, DLManagedTensor, DLDataType (DLPack >= 0.6) */

/* Bumped when a call, struct or meaning changes incompatibly. */
#define MESHRT_API_VERSION 1

#ifndef MESHRT_C_API
#if defined(__GNUC__) || defined(__clang__)
#define MESHRT_C_API __attribute__((visibility("default")))
#else
#define MESHRT_C_API
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status and errors ----------------------------------------------------------------- */

/* Which status a refusal gets (every call follows this rule; a call's comment names its status
 * only where it adds to it):
 *  - MESHRT_ERROR_INVALID_ARGUMENT: what the call was given is refused, and passing something
 *    else fixes it: a NULL pointer; a number, enum or config field out of range (a config's
 *    magic, size or version included); a tensor meshrt never takes (a dtype other than those of
 *    "Tensors", vector lanes, strides, a shape whose size overflows) or that does not fit the call
 *    (sizes or dtypes that differ, send and recv overlapping other than in an in-place form, a
 *    uint8 reduction, a tensor or stream on another device or of another rank); a bad value of
 *    a MESHRT_ environment variable (meshrt_init and every communicator init check them all).
 *  - MESHRT_ERROR_INVALID_USAGE: the arguments may be right but the call is not allowed now: a
 *    destroyed, never-created or wrong-kind handle (or a stream whose communicator was
 *    destroyed), a handle the caller does not own (a mesh's communicator), a call out of order
 *    (before meshrt_init, forward before bind_weights, backward without forward), an MPI init
 *    outside an MPI launch. meshrt_init's api_version other than the library's is this status
 *    too: the caller was built against another meshrt.h.
 *  - MESHRT_ERROR_UNSUPPORTED: a valid request this build, installation or launch cannot serve: no
 *    CUDA or MPI backend, a device type other than CPU and CUDA, DLPack major version other than
 *    1, a native stream of a CPU communicator, an MPI communicator other than MPI_COMM_WORLD, a
 *    unique id of another process.
 *  - The others say what failed while running: the system, a peer or the communicator, time, memory
 *    or meshrt itself. */
typedef enum meshrt_status {
  MESHRT_SUCCESS = 0,
  MESHRT_ERROR_INVALID_ARGUMENT = 1, /* a value or tensor the call refuses (the rule above) */
  MESHRT_ERROR_INVALID_USAGE = 2,    /* a dead handle, a call out of order (the rule above) */
  MESHRT_ERROR_UNSUPPORTED = 3,      /* not in this build / installation (the rule above) */
  MESHRT_ERROR_SYSTEM = 4,           /* the operating system or a library (files, MPI) failed */
  MESHRT_ERROR_INTERNAL = 5,         /* a bug in meshrt: please report the message */
  MESHRT_ERROR_COMM = 6,             /* a collective failed or a peer did; communicator aborted */
  MESHRT_ERROR_TIMEOUT = 7,          /* a rank never arrived (init, collective) in time */
  MESHRT_ERROR_OUT_OF_MEMORY = 8     /* an allocation failed */
} meshrt_status_t;

/* "success", "invalid argument", ... ("unknown status" for other values). Never NULL. */
MESHRT_C_API const char* meshrt_status_string(meshrt_status_t status);
/* The message of the last failed call on the calling thread ("" if none). Successful calls do
 * not clear it. Valid until the next failing call on this thread. */
MESHRT_C_API const char* meshrt_last_error(void);

/* Refuses (MESHRT_ERROR_INVALID_USAGE) an api_version other than the library's, naming both.
 * Idempotent; required before any communicator is created. */
MESHRT_C_API meshrt_status_t meshrt_init(int api_version);
/* The library's version (meshrt's project version, e.g. 0.1.0). Any pointer may be NULL. */
MESHRT_C_API meshrt_status_t meshrt_get_version(int* major, int* minor, int* patch);
/* The API version the library was built with (MESHRT_API_VERSION of its header). */
MESHRT_C_API int meshrt_get_api_version(void);

/* ---- logging --------------------------------------------------------------------------- */

typedef enum meshrt_log_level {
  MESHRT_LOG_TRACE = 0,
  MESHRT_LOG_DEBUG = 1,
  MESHRT_LOG_INFO = 2,
  MESHRT_LOG_WARN = 3,
  MESHRT_LOG_ERROR = 4,
  MESHRT_LOG_OFF = 5
} meshrt_log_level_t;

/* Called for each log line at `level` or above, from any thread (possibly several at once), with
 * the logging rank and the message (no timestamp or rank prefix; valid during the call). */
typedef void (*meshrt_log_fn)(meshrt_log_level_t level, int rank, const char* message,
                              void* user_data);
/* Sends meshrt's log lines to fn instead of stderr and sets the process-wide level. fn NULL
 * restores stderr (the level still applies). */
MESHRT_C_API meshrt_status_t meshrt_set_log_callback(meshrt_log_fn fn, void* user_data,
                                                     meshrt_log_level_t level);

/* ---- handles ----------------------------------------------------------------------------- */

typedef struct meshrt_comm_s* meshrt_comm_t;
typedef struct meshrt_stream_s* meshrt_stream_t;
typedef struct meshrt_event_s* meshrt_event_t;
typedef struct meshrt_tensor_s* meshrt_tensor_t;

/* ---- communicators ---------------------------------------------------------------------- */

typedef enum meshrt_device_type {
  MESHRT_DEVICE_CPU = 0,
  MESHRT_DEVICE_CUDA = 1
} meshrt_device_type_t;

#define MESHRT_COMM_CONFIG_MAGIC 0x4d525443u /* "MRTC" */

/* Options of a new communicator. Initialise with MESHRT_COMM_CONFIG_INITIALIZER, then set
 * fields; `size` lets later versions append fields (a caller built against an older header
 * passes a smaller size and gets defaults for the rest). Pass NULL for all defaults. */
typedef struct meshrt_comm_config {
  size_t size;           /* sizeof(meshrt_comm_config_t) */
  unsigned int magic;    /* MESHRT_COMM_CONFIG_MAGIC */
  unsigned int version;  /* MESHRT_API_VERSION */
  double timeout_s;      /* a collective not done after this long fails (MESHRT_ERROR_TIMEOUT);
                            0 disables; < 0: MESHRT_COMM_TIMEOUT or 300; at most 1e9 (NaN,
                            +inf and larger values are refused) */
  double init_timeout_s; /* how long init waits for the other ranks (MESHRT_ERROR_TIMEOUT);
                            0: no limit; < 0: as timeout_s; at most 1e9 */
  int debug;             /* 1: ranks compare each call first; 0: no; < 0: MESHRT_COMM_DEBUG;
                            > 1 is refused */
  int device_type;       /* meshrt_device_type_t of the ranks (all ranks alike) */
  int device_index;      /* CUDA: this rank's GPU, < 0: the rank; CPU: ignored */
  const char* backend;   /* NULL or "auto": the best registered backend; or "host", "mpi", ... */
} meshrt_comm_config_t;

#define MESHRT_COMM_CONFIG_INITIALIZER                                                          \
  {                                                                                             \
    sizeof(meshrt_comm_config_t), MESHRT_COMM_CONFIG_MAGIC, MESHRT_API_VERSION, -1.0, -1.0, -1, \
        MESHRT_DEVICE_CPU, -1, NULL                                                             \
  }

/* An id naming one world, made by one rank and handed to the others (like ncclUniqueId). The
 * world's ranks are threads of the process that made it. */
#define MESHRT_UNIQUE_ID_BYTES 64
typedef struct meshrt_unique_id {
  char internal[MESHRT_UNIQUE_ID_BYTES];
} meshrt_unique_id_t;

MESHRT_C_API meshrt_status_t meshrt_get_unique_id(meshrt_unique_id_t* id);

/* Rank `rank` of the `nranks`-rank world named by `id` (nranks 1..1024), called once per rank,
 * each from its own thread (collective: returns once every rank arrived, or MESHRT_ERROR_TIMEOUT
 * naming the missing ranks after the config's init timeout; the world is then unusable for every
 * rank). */
MESHRT_C_API meshrt_status_t meshrt_comm_init_rank(meshrt_comm_t* comm, int nranks,
                                                   meshrt_unique_id_t id, int rank,
                                                   const meshrt_comm_config_t* config);
/* All `n` ranks of a new world at once, from one thread (comms[i] is rank i; n is 1..1024, the
 * ranks one process runs as threads, checked before comms[0..n) is written; a rank thread the
 * system refuses gives MESHRT_ERROR_SYSTEM and no handle). `devices` NULL: CPU ranks (or, with a
 * CUDA config, GPUs 0..n-1); else devices[i] is rank i's GPU (CUDA configs only: a CPU config
 * refuses a devices array; a GPU index past the device count is refused). */
MESHRT_C_API meshrt_status_t meshrt_comm_init_all(meshrt_comm_t* comms, int n, const int* devices,
                                                  const meshrt_comm_config_t* config);
/* This process's rank of an MPI job (mpirun / srun; one rank per process). mpi_comm: a pointer
 * to an MPI_Comm (MPI_Comm*) identical or congruent to MPI_COMM_WORLD, or NULL for
 * MPI_COMM_WORLD; other groups: create the world, then meshrt_comm_split. Collective.
 * MPI: meshrt issues MPI calls from its stream threads and needs MPI_THREAD_MULTIPLE. When MPI is
 * not initialised yet, this call initialises it (MPI_Init_thread with MPI_THREAD_MULTIPLE) and
 * meshrt finalises it at process exit (atexit; after a failed or aborted communicator it ends the
 * job with MPI_Abort instead, so that peers blocked in MPI do not hang). When the engine
 * initialised MPI first, it must have asked for MPI_THREAD_MULTIPLE (any lower level is refused,
 * naming it), and the engine finalises MPI, after destroying every meshrt communicator; meshrt
 * then never calls MPI_Finalize.
 * The MPI backend is a plugin: the first call loads libmeshrt-mpi.so from the folders of
 * MESHRT_BACKEND_PATH (':'-separated), then the folder of libmeshrt.so; when it cannot be loaded
 * the call fails with one line naming the library and the loader's reason. Programs that never
 * call this need no MPI library at all. */
MESHRT_C_API meshrt_status_t meshrt_comm_init_mpi(meshrt_comm_t* comm, void* mpi_comm,
                                                  const meshrt_comm_config_t* config);
/* Rank `rank` of `nranks` processes (1..1048576) meeting through files in `dir` (a directory
 * every rank can read and write; MESHRT_RUN_ID keeps separate jobs apart). Collective;
 * MESHRT_ERROR_TIMEOUT names the ranks that never arrived. CPU processes of one node get the shm
 * backend (shared memory), on several nodes hier (shm in each node, TCP between the nodes), CUDA
 * ones NCCL. */
MESHRT_C_API meshrt_status_t meshrt_comm_init_file(meshrt_comm_t* comm, const char* dir, int nranks,
                                                   int rank, const meshrt_comm_config_t* config);
/* Rank `rank` of `nranks` processes (1..1048576) meeting over TCP at rank 0's `host`:`port`
 * (rank 0 listens there; an IPv4 address or host name every rank reaches, e.g. "127.0.0.1" on one
 * node). Collective; MESHRT_ERROR_TIMEOUT names the ranks that never connected within the init
 * timeout. As meshrt_comm_init_file: CPU processes of one node get the shm backend, on several
 * nodes hier, CUDA ones NCCL. */
MESHRT_C_API meshrt_status_t meshrt_comm_init_tcp(meshrt_comm_t* comm, const char* host, int port,
                                                  int nranks, int rank,
                                                  const meshrt_comm_config_t* config);
/* This process's rank as its launcher started it, one rank per process: under mpirun / srun (MPI
 * or Slurm variables) as meshrt_comm_init_mpi(comm, NULL, config); with torchrun's (or hand-set)
 * RANK and WORLD_SIZE as meshrt_comm_init_file on MESHRT_RENDEZVOUS=file:///dir, or as
 * meshrt_comm_init_tcp on MESHRT_RENDEZVOUS=tcp://host:port or else MASTER_ADDR and
 * MASTER_PORT + 1 (MASTER_PORT itself is torch's store). Collective. A process no launcher
 * started, or RANK without WORLD_SIZE, or RANK / WORLD_SIZE without a rendezvous address, is
 * MESHRT_ERROR_INVALID_USAGE naming the variables; a bad value (WORLD_SIZE=0, RANK=x,
 * MASTER_PORT=70000) MESHRT_ERROR_INVALID_ARGUMENT naming it. */
MESHRT_C_API meshrt_status_t meshrt_comm_init_env(meshrt_comm_t* comm,
                                                  const meshrt_comm_config_t* config);
/* Wraps an engine's ncclComm_t (passed as void*) on CUDA device `device`, not owned: meshrt
 * never destroys it (it does ncclCommAbort it when a collective times out or
 * meshrt_comm_abort is called). CUDA builds only: MESHRT_ERROR_UNSUPPORTED otherwise. */
MESHRT_C_API meshrt_status_t meshrt_comm_adopt_nccl(meshrt_comm_t* comm, void* nccl_comm,
                                                    int device, const meshrt_comm_config_t* config);

/* Waits for the communicator's work, then frees it (NULL is a no-op). Not collective. */
MESHRT_C_API meshrt_status_t meshrt_comm_destroy(meshrt_comm_t comm);
/* Fails pending and later work of the communicator and of every communicator sharing its
 * ranks (MESHRT_ERROR_COMM); safe from any thread. The handle stays valid until destroyed. */
MESHRT_C_API meshrt_status_t meshrt_comm_abort(meshrt_comm_t comm);
MESHRT_C_API meshrt_status_t meshrt_comm_rank(meshrt_comm_t comm, int* rank);
MESHRT_C_API meshrt_status_t meshrt_comm_size(meshrt_comm_t comm, int* size);
/* The rank's device: type and index (CPU ranks as threads: cpu:<rank>). */
MESHRT_C_API meshrt_status_t meshrt_comm_device(meshrt_comm_t comm, meshrt_device_type_t* type,
                                                int* index);
/* The collective backend the communicator runs on ("host", "shm", "tcp", "hier", "mpi",
 * "nccl"): *name stays valid for the life of the process. */
MESHRT_C_API meshrt_status_t meshrt_comm_backend(meshrt_comm_t comm, const char** name);

#define MESHRT_SPLIT_NO_COLOR (-1)
/* Collective over `comm` (blocks): ranks passing the same colour form a new communicator, ranked
 * by (key, old rank). A negative colour gives *new_comm = NULL. */
MESHRT_C_API meshrt_status_t meshrt_comm_split(meshrt_comm_t comm, int color, int key,
                                               meshrt_comm_t* new_comm);

/* ---- streams and events -------------------------------------------------------------------
 * A stream belongs to one communicator: the one it was created from (meshrt_stream_create,
 * meshrt_stream_wrap) or whose default stream it is. Pass it only to calls on that communicator
 * and on the meshes and blocks built on it; a mesh's sub-communicators and blocks use their own
 * streams (NULL: the mesh's default). Destroy a stream before its communicator. */

/* A new stream on the communicator's device (CPU: an in-order worker thread). */
MESHRT_C_API meshrt_status_t meshrt_stream_create(meshrt_comm_t comm, meshrt_stream_t* stream);
/* Wraps the engine's cudaStream_t (as void*), not owned (CUDA communicators only). */
MESHRT_C_API meshrt_status_t meshrt_stream_wrap(meshrt_comm_t comm, void* native,
                                                meshrt_stream_t* stream);
/* The communicator's default stream (what NULL means), owned by the communicator. */
MESHRT_C_API meshrt_status_t meshrt_comm_default_stream(meshrt_comm_t comm,
                                                        meshrt_stream_t* stream);
/* Blocks until the stream's work is done; returns the first error of that work and clears it. */
MESHRT_C_API meshrt_status_t meshrt_stream_synchronize(meshrt_stream_t stream);
/* Later work on `stream` starts after `event` completes. */
MESHRT_C_API meshrt_status_t meshrt_stream_wait_event(meshrt_stream_t stream, meshrt_event_t event);
/* Waits for the stream's work, then frees it (NULL is a no-op; default streams cannot be). */
MESHRT_C_API meshrt_status_t meshrt_stream_destroy(meshrt_stream_t stream);

/* Blocks until the event's work is done; its status (e.g. MESHRT_ERROR_COMM for a failed
 * collective). */
MESHRT_C_API meshrt_status_t meshrt_event_synchronize(meshrt_event_t event);
/* *done = 1 when the event's work is done, else 0; never blocks. */
MESHRT_C_API meshrt_status_t meshrt_event_query(meshrt_event_t event, int* done);
/* Releases the handle without waiting: the work it marks runs on (synchronize first to wait for
 * it). NULL is a no-op. */
MESHRT_C_API meshrt_status_t meshrt_event_destroy(meshrt_event_t event);
/* Inline mode of the calling thread: on = 1 or 0 (the default); *previous (may be NULL) gets
 * the mode before. While on, a call this thread makes on a CPU stream that has nothing queued or
 * running runs there and then, on this thread, and returns when it completed (its event is done):
 * a small synchronous collective then costs no hand-off to the stream's thread and back. On a
 * busy stream the call queues behind that work as usual (never overtaking it) and returns at
 * once. CUDA streams ignore it. Turn it on only around calls the caller waits for right away: an
 * inline collective returns only once every rank issued it. */
MESHRT_C_API meshrt_status_t meshrt_thread_inline(int on, int* previous);

/* ---- tensors (DLPack) --------------------------------------------------------------------
 * Accepted: device kDLCPU (device_id 0: DLPack's one CPU device) or kDLCUDA (device_id below the
 * process's CUDA device count; the communicator's device when used), dtypes float32,
 * bfloat16, float16, int32, int64 (lanes 1; uint8 for data movement only), compact row-major
 * (C-contiguous) layout: strides NULL or equal to the row-major strides (extents of 1 may have
 * any stride); anything else is MESHRT_ERROR_INVALID_ARGUMENT naming the strides (copy to a
 * contiguous tensor first). byte_offset is honoured. Memory is used in place, never copied. */

/* DLPack >= 1.0's versioned managed tensor (defined by dlpack.h 1.0; declared here so this
 * header also works with older dlpack.h). */
struct DLManagedTensorVersioned;

/* Borrows the memory `t` points to: the engine keeps it alive until the tensor is destroyed and
 * the work using it has completed (its events). The DLTensor struct itself (its shape and strides
 * arrays included) is copied: it may be freed or reused as soon as the call returns. */
MESHRT_C_API meshrt_status_t meshrt_tensor_from_dltensor(const DLTensor* t,
                                                         meshrt_tensor_t* tensor);
/* Takes ownership of `t` on success: its deleter runs once the tensor is destroyed and the work
 * using it has completed. On failure the caller still owns it. */
MESHRT_C_API meshrt_status_t meshrt_tensor_from_dlpack(DLManagedTensor* t, meshrt_tensor_t* tensor);
/* Same for DLPack >= 1.0 (major version 1). A read-only tensor (flag bit 0) may only be read. */
MESHRT_C_API meshrt_status_t meshrt_tensor_from_dlpack_versioned(struct DLManagedTensorVersioned* t,
                                                                 meshrt_tensor_t* tensor);
/* A new contiguous tensor from the communicator's allocator on its device (uninitialised). */
MESHRT_C_API meshrt_status_t meshrt_tensor_empty(meshrt_comm_t comm, int ndim, const int64_t* shape,
                                                 DLDataType dtype, meshrt_tensor_t* tensor);
/* A DLPack view of the tensor for the engine: the memory stays alive until the returned tensor's
 * deleter is called (memory meshrt allocated then goes back to meshrt's allocator). The handle
 * stays valid and independent. */
MESHRT_C_API meshrt_status_t meshrt_tensor_to_dlpack(meshrt_tensor_t tensor, DLManagedTensor** out);
MESHRT_C_API meshrt_status_t
meshrt_tensor_to_dlpack_versioned(meshrt_tensor_t tensor, struct DLManagedTensorVersioned** out);
/* Releases the handle; the memory lives on while work using it runs (NULL is a no-op). */
MESHRT_C_API meshrt_status_t meshrt_tensor_destroy(meshrt_tensor_t tensor);

/* ---- collectives --------------------------------------------------------------------------
 * Enqueued on `stream` (NULL: the communicator's default stream); every rank issues the same
 * collectives in the same order. `event` (may be NULL) receives the completion event, which
 * carries the call's errors (a timeout, a peer's mismatch). Tensors are kept alive until the call
 * completes. Reductions: bf16 / f16 reduce in f32; integer sums wrap; avg divides by the size
 * (truncating for integers).
 * In place: send and recv may be the same memory only in the forms given at each call (all_reduce,
 * broadcast, all_to_all: send == recv; all_gather: send is this rank's block of recv;
 * reduce_scatter: recv is this rank's block of send); any other overlap of send and recv is
 * MESHRT_ERROR_INVALID_ARGUMENT. Tensors with 0 elements are accepted (sizes still have to
 * match): the call is a collective like any other, which every rank issues in its place in the
 * order, and it moves no data. */

typedef enum meshrt_reduce_op {
  MESHRT_SUM = 0,
  MESHRT_AVG = 1,
  MESHRT_MAX = 2,
  MESHRT_MIN = 3
} meshrt_reduce_op_t;

/* recv = op over ranks of send (same count); send == recv is in place. */
MESHRT_C_API meshrt_status_t meshrt_all_reduce(meshrt_comm_t comm, meshrt_tensor_t send,
                                               meshrt_tensor_t recv, meshrt_reduce_op_t op,
                                               meshrt_stream_t stream, meshrt_event_t* event);
/* recv (size x send's elements) = every rank's send in rank order. In place: send is rank r's
 * block of recv, elements [r n, (r + 1) n) with n = send's elements. */
MESHRT_C_API meshrt_status_t meshrt_all_gather(meshrt_comm_t comm, meshrt_tensor_t send,
                                               meshrt_tensor_t recv, meshrt_stream_t stream,
                                               meshrt_event_t* event);
/* recv (send's elements / size) = this rank's block of op over ranks of send. In place: recv is
 * rank r's block of send, elements [r n, (r + 1) n) with n = recv's elements. */
MESHRT_C_API meshrt_status_t meshrt_reduce_scatter(meshrt_comm_t comm, meshrt_tensor_t send,
                                                   meshrt_tensor_t recv, meshrt_reduce_op_t op,
                                                   meshrt_stream_t stream, meshrt_event_t* event);
/* recv = root's send (send is read on root only; NULL or == recv: in place). */
MESHRT_C_API meshrt_status_t meshrt_broadcast(meshrt_comm_t comm, meshrt_tensor_t send,
                                              meshrt_tensor_t recv, int root,
                                              meshrt_stream_t stream, meshrt_event_t* event);
/* Block j of send goes to rank j; block i of recv comes from rank i (blocks of send's elements /
 * size; size must divide it). In place: send == recv. */
MESHRT_C_API meshrt_status_t meshrt_all_to_all(meshrt_comm_t comm, meshrt_tensor_t send,
                                               meshrt_tensor_t recv, meshrt_stream_t stream,
                                               meshrt_event_t* event);
/* Point to point; a send completes once the peer received it, so a rank that sends to and
 * receives from a peer posts the two on different streams. */
MESHRT_C_API meshrt_status_t meshrt_send(meshrt_comm_t comm, meshrt_tensor_t tensor, int peer,
                                         meshrt_stream_t stream, meshrt_event_t* event);
MESHRT_C_API meshrt_status_t meshrt_recv(meshrt_comm_t comm, meshrt_tensor_t tensor, int peer,
                                         meshrt_stream_t stream, meshrt_event_t* event);
MESHRT_C_API meshrt_status_t meshrt_barrier(meshrt_comm_t comm, meshrt_stream_t stream,
                                            meshrt_event_t* event);

/* ---- device mesh ---------------------------------------------------------------------------
 * An n-D grid of the ranks of a communicator with named dims ("dp=2,tp=2"): row-major, last dim
 * innermost, so a tp group is a run of consecutive ranks. The blocks below shard over dim "tp"
 * (a mesh without one has tp size 1). */

typedef struct meshrt_mesh_s* meshrt_mesh_t;

/* Collective over `comm` (every rank, same spec, same order relative to other collectives):
 * splits one sub-communicator per dim. Spec: "name=size,..." with names [a-z_][a-z0-9_]*, sizes
 * >= 1, no repeats, at most 4096 bytes, and the product equal to comm's size; otherwise
 * MESHRT_ERROR_INVALID_ARGUMENT with both numbers. The ranks first all-gather their specs (on
 * comm's default stream): when they differ, or a rank passed NULL, every rank returns
 * MESHRT_ERROR_INVALID_ARGUMENT at once, naming each spec and the ranks that passed it. The mesh
 * keeps `comm` alive (it may be destroyed first) and runs on comm's default stream. */
MESHRT_C_API meshrt_status_t meshrt_mesh_create(meshrt_mesh_t* mesh, meshrt_comm_t comm,
                                                const char* spec);
/* Frees the mesh and the dim communicators meshrt_mesh_comm handed out (NULL is a no-op). Blocks
 * created on it keep what they use alive until destroyed. */
MESHRT_C_API meshrt_status_t meshrt_mesh_destroy(meshrt_mesh_t mesh);
/* The communicator of the ranks that differ from this one only along dim `dim` (not collective).
 * Owned by the mesh: the same handle on every call, valid until meshrt_mesh_destroy;
 * meshrt_comm_destroy refuses it. Its default stream is the mesh's. */
MESHRT_C_API meshrt_status_t meshrt_mesh_comm(meshrt_mesh_t mesh, const char* dim,
                                              meshrt_comm_t* comm);
/* Number of dims, and the world size. Either pointer may be NULL. */
MESHRT_C_API meshrt_status_t meshrt_mesh_shape(meshrt_mesh_t mesh, int* ndim, int* world_size);
/* Size of dim `dim` and this rank's coordinate along it (1 and 0 for a dim the mesh lacks, so a
 * dp-only mesh has tp size 1). Either pointer may be NULL. */
MESHRT_C_API meshrt_status_t meshrt_mesh_dim(meshrt_mesh_t mesh, const char* dim, int* size,
                                             int* coord);

/* ---- sharded MLP block ---------------------------------------------------------------------
 * y = x + fc2(gelu(fc1(norm(x)))) over the mesh's tp dim (Megatron): norm weights replicated,
 * fc1 colwise (weight [hidden, ffn] split by columns, its bias split alike), fc2 rowwise (weight
 * [ffn, hidden] split by rows, its bias replicated). An ffn that tp does not divide is split
 * unevenly: the first ffn % tp ranks hold one more column / row; meshrt_mlp_shard_info says which.
 * Activations are sequence-first [seq, batch, hidden]; under sequence parallel each rank passes
 * and gets its contiguous sequence shard [seq / tp, batch, hidden] (seq % tp == 0): tp rank r
 * holds positions [r seq / tp, (r + 1) seq / tp) of the sequence.
 * Norms, per row of `hidden` values x (statistics in f32 whatever the dtype):
 *   LayerNorm: y = (x - mean) / sqrt(var + eps) * gamma + beta, mean = sum(x) / hidden and the
 *              biased variance var = sum((x - mean)^2) / hidden (not / (hidden - 1)); eps is
 *              added to the variance, inside the square root.
 *   RMSNorm:   y = x / sqrt(sum(x^2) / hidden + eps) * gamma (no mean subtracted, no beta). */

typedef struct meshrt_mlp_s* meshrt_mlp_t;

typedef enum meshrt_norm_kind {
  MESHRT_NORM_LAYERNORM = 0, /* gamma and beta */
  MESHRT_NORM_RMSNORM = 1    /* gamma only */
} meshrt_norm_kind_t;

typedef enum meshrt_gelu_kind {
  MESHRT_GELU_TANH = 0, /* 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) */
  MESHRT_GELU_ERF = 1   /* 0.5 x (1 + erf(x / sqrt(2))) */
} meshrt_gelu_kind_t;

typedef enum meshrt_weight_layout {
  /* meshrt's [in, out] (y = x W): bound weights are used in place, never copied, so the engine's
   * updates are seen by the next forward; gradients are accumulated straight into the engine's
   * tensors. */
  MESHRT_WEIGHT_LAYOUT_IN_OUT = 0,
  /* PyTorch nn.Linear's [out, in] (y = x W^T): the 2-D weights are copied transposed into
   * meshrt-owned memory at bind time and again at each meshrt_mlp_sync_weights (call it after
   * changing them); weight gradients are transposed back into the engine's [out, in] tensors.
   * 1-D tensors (norm, biases) are used in place as with IN_OUT. */
  MESHRT_WEIGHT_LAYOUT_OUT_IN = 1
} meshrt_weight_layout_t;

/* Initialise with MESHRT_MLP_CONFIG_INITIALIZER, then set fields; `size` lets later versions
 * append fields (an older caller's smaller size, ending at one of its fields, gets defaults for
 * the rest). meshrt_mlp_create checks every field: flags 0 or 1, enums in range, sizes >= 1 whose
 * largest weight's bytes fit in int64, eps finite in (0, 1]; a refusal names the field as
 * "meshrt_mlp_config.<field>". */
typedef struct meshrt_mlp_config {
  size_t size;           /* sizeof(meshrt_mlp_config_t) */
  int64_t hidden;        /* model width; tp must divide it */
  int64_t ffn;           /* inner width; >= tp (uneven shards allowed) */
  DLDataType dtype;      /* of weights and activations: float32, bfloat16 or float16 */
  int norm;              /* meshrt_norm_kind_t */
  float eps;             /* norm epsilon: finite, in (0, 1] */
  int gelu;              /* meshrt_gelu_kind_t */
  int bias;              /* 1: fc1 and fc2 have biases; 0: none */
  int sequence_parallel; /* 1: activations are sequence shards over tp (Megatron SP) */
  int weight_layout;     /* meshrt_weight_layout_t of fc1 / fc2 weights and their gradients */
} meshrt_mlp_config_t;

#define MESHRT_MLP_CONFIG_INITIALIZER                                                         \
  {                                                                                           \
    sizeof(meshrt_mlp_config_t), 1024, 4096, {kDLFloat, 32, 1}, MESHRT_NORM_LAYERNORM, 1e-5f, \
        MESHRT_GELU_TANH, 1, 0, MESHRT_WEIGHT_LAYOUT_IN_OUT                                   \
  }

/* The block's parameter tensors (this rank's shards), for binding weights and receiving
 * gradients. A tensor the config does not use (norm_bias with RMSNorm, biases with bias = 0) must
 * be NULL. `size` as in the config. */
typedef struct meshrt_mlp_params {
  size_t size;                 /* sizeof(meshrt_mlp_params_t) */
  meshrt_tensor_t norm_weight; /* [hidden], replicated */
  meshrt_tensor_t norm_bias;   /* [hidden], replicated; LayerNorm only */
  meshrt_tensor_t fc1_weight;  /* IN_OUT [hidden, ffn_shard], OUT_IN [ffn_shard, hidden] */
  meshrt_tensor_t fc1_bias;    /* [ffn_shard] */
  meshrt_tensor_t fc2_weight;  /* IN_OUT [ffn_shard, hidden], OUT_IN [hidden, ffn_shard] */
  meshrt_tensor_t fc2_bias;    /* [hidden], replicated */
} meshrt_mlp_params_t;

#define MESHRT_MLP_PARAMS_INITIALIZER \
  { sizeof(meshrt_mlp_params_t), NULL, NULL, NULL, NULL, NULL, NULL }

typedef enum meshrt_mlp_param {
  MESHRT_MLP_NORM_WEIGHT = 0,
  MESHRT_MLP_NORM_BIAS = 1,
  MESHRT_MLP_FC1_WEIGHT = 2,
  MESHRT_MLP_FC1_BIAS = 3,
  MESHRT_MLP_FC2_WEIGHT = 4,
  MESHRT_MLP_FC2_BIAS = 5
} meshrt_mlp_param_t;

/* Checks the config against the mesh (hidden % tp, ffn >= tp, dtype, enums) and makes the block;
 * not collective. Weights must be bound before the first forward. The block keeps the mesh
 * alive. */
MESHRT_C_API meshrt_status_t meshrt_mlp_create(meshrt_mlp_t* mlp, meshrt_mesh_t mesh,
                                               const meshrt_mlp_config_t* config);
/* Waits for the block's work, then frees it (NULL is a no-op). */
MESHRT_C_API meshrt_status_t meshrt_mlp_destroy(meshrt_mlp_t mlp);
/* Where this rank's shard of parameter `which` sits in the full tensor, along its sharded
 * dimension in meshrt's [in, out] terms: fc1 weight: columns [offset, offset + size) of the
 * [hidden, ffn] weight (OUT_IN: rows of the [ffn, hidden] one); fc1 bias: the same range; fc2
 * weight: rows [offset, offset + size) of [ffn, hidden] (OUT_IN: columns of [hidden, ffn]).
 * Replicated ones (norm, fc2 bias): offset 0, size = the full length. Either pointer may be
 * NULL. */
MESHRT_C_API meshrt_status_t meshrt_mlp_shard_info(meshrt_mlp_t mlp, meshrt_mlp_param_t which,
                                                   int64_t* offset, int64_t* size);
/* Binds this rank's shards (shapes in meshrt_mlp_params_t, the config's dtype, the mesh's
 * device; anything else is MESHRT_ERROR_INVALID_ARGUMENT naming the expected shape). The block
 * holds the tensors (the handles may be destroyed after the call; a managed tensor's deleter then
 * runs once the block lets go), but a borrowed DLTensor's memory must stay valid until the block
 * is destroyed or bound again. May be called again to bind other tensors (after the block's
 * earlier work has completed). */
MESHRT_C_API meshrt_status_t meshrt_mlp_bind_weights(meshrt_mlp_t mlp,
                                                     const meshrt_mlp_params_t* weights);
/* OUT_IN: copies (transposes) the bound weights again, after the engine changed them; enqueued on
 * `stream` like forward. IN_OUT: nothing to do. */
MESHRT_C_API meshrt_status_t meshrt_mlp_sync_weights(meshrt_mlp_t mlp, meshrt_stream_t stream,
                                                     meshrt_event_t* event);
/* y = block(x), x and y [seq (or seq / tp under SP), batch, hidden]; y is written (it may not
 * alias x). Collective over the tp group. x is read again by meshrt_mlp_backward: keep it
 * unchanged and alive until then. Asynchronous on `stream` (NULL: the mesh's default stream);
 * `event` (may be NULL) completes when y is written and carries the call's errors. */
MESHRT_C_API meshrt_status_t meshrt_mlp_forward(meshrt_mlp_t mlp, meshrt_tensor_t x,
                                                meshrt_tensor_t y, meshrt_stream_t stream,
                                                meshrt_event_t* event);
/* Backward of the last forward: dx (x's shape) is written; the gradients are ADDED to the
 * tensors in `grads` (zero them to start a step; shapes and layout as in bind), every tensor the
 * config uses being required. The replicated gradients (norm, fc2 bias) come out complete and
 * identical on the tp ranks: under sequence parallel each rank's part (its sequence shard) is
 * summed over tp (all-reduced) before it is added; without it every tp rank already sees the
 * whole sequence and the whole output gradient, so each computes the full gradient itself and
 * nothing is summed (it is not tp times the gradient). Nothing is reduced over dp: that is the
 * engine's data-parallel step. Asynchronous like forward. */
MESHRT_C_API meshrt_status_t meshrt_mlp_backward(meshrt_mlp_t mlp, meshrt_tensor_t dy,
                                                 meshrt_tensor_t dx,
                                                 const meshrt_mlp_params_t* grads,
                                                 meshrt_stream_t stream, meshrt_event_t* event);

/* ---- sharded attention block ---------------------------------------------------------------
 * y = x + proj(attention(qkv(norm(x)))) over the mesh's tp dim (Megatron): norm weights
 * replicated; the fused QKV projection colwise with whole heads per rank (weight [hidden,
 * 3 hidden], its bias [3 hidden]); multi-head scaled dot-product attention (scale
 * 1 / sqrt(head_dim), causal unless the config says otherwise) on the rank's heads; the output
 * projection rowwise (weight [hidden, hidden] split by rows, its bias replicated). heads % tp == 0
 * and hidden % heads == 0. Activations as in the MLP block: [seq, batch, hidden], sequence shards
 * [seq / tp, batch, hidden] under sequence parallel. The norm kind, eps, bias, weight layout and
 * sequence parallel mean what they mean for the MLP block. Under sequence parallel the shards are
 * gathered before the QKV projection, so attention runs over the whole sequence and causal
 * positions are global: rank r's local row i is position r seq / tp + i, and it attends to every
 * position <= that one on all ranks. */

typedef struct meshrt_attn_s* meshrt_attn_t;

/* Order of the fused QKV projection's output features (columns in [in, out] terms), given for
 * this rank's shard, which always holds whole heads: heads [h0, h0 + hl) with hl = heads / tp and
 * h0 = tp_rank * hl (see meshrt_attn_shard_info), head_dim d = hidden / heads. */
typedef enum meshrt_qkv_layout {
  /* Megatron's per-head [q | k | v]: feature (h, j, e) of the shard, j = 0 (q), 1 (k), 2 (v), at
   * h * 3d + j * d + e. meshrt's own order: bound IN_OUT weights are used in place. */
  MESHRT_QKV_LAYOUT_PER_HEAD = 0,
  /* GPT-2 / Hugging Face's [Q | K | V]: the shard is [Q_r | K_r | V_r], the rank's heads of Q,
   * then of K, then of V: feature (h, j, e) at j * hl * d + h * d + e. In the full [Q | K | V]
   * tensor (3 hidden features) the rank's shard is therefore three runs of hl * d features, at
   * j * hidden + h0 * d for j = 0 (q), 1 (k), 2 (v); meshrt_attn_shard_info counts in meshrt's
   * per-head order instead. The QKV weight and bias are copied (permuted) into meshrt's order at
   * bind and at each meshrt_attn_sync_weights, and their gradients permuted back. */
  MESHRT_QKV_LAYOUT_BLOCKED = 1
} meshrt_qkv_layout_t;

/* Context parallelism: on a mesh with a cp dim of size cp > 1 every activation of the attention
 * block (x, y, dy, dx) is this rank's cp shard of the sequence. The seq tokens are cut into 2 cp
 * chunks of c = seq / (2 cp) tokens; cp rank i (meshrt_mesh_dim(mesh, "cp", ...)'s coord) holds
 * chunk i then chunk 2 cp - 1 - i: its local row j is global position i c + j for j < c and
 * (2 cp - 1 - i) c + (j - c) for j >= c (so every rank does the same causal work). Under sequence
 * parallel tp rank t then holds rows [t (seq / cp) / tp, (t + 1) (seq / cp) / tp) of that shard.
 * seq must divide by 2 cp. The weight gradients are this rank's tokens' part: sum them over cp
 * (as over dp, e.g. meshrt_all_reduce on meshrt_mesh_comm(mesh, "cp", ...)). */
typedef enum meshrt_cp_comm {
  MESHRT_CP_COMM_RING = 0,     /* K/V blocks pass around the cp ring, overlapped (the default) */
  MESHRT_CP_COMM_ALLGATHER = 1 /* K/V gathered once per forward (and dK/dV reduce-scattered) */
} meshrt_cp_comm_t;

typedef struct meshrt_attn_config {
  size_t size;           /* sizeof(meshrt_attn_config_t) */
  int64_t hidden;        /* model width */
  int64_t heads;         /* attention heads; tp must divide it, it must divide hidden */
  DLDataType dtype;      /* of weights and activations: float32, bfloat16 or float16 */
  int norm;              /* meshrt_norm_kind_t */
  float eps;             /* norm epsilon: finite, in (0, 1] */
  int bias;              /* 1: qkv and proj have biases; 0: none */
  int causal;            /* 1: position i attends to positions <= i; 0: to all */
  int sequence_parallel; /* 1: activations are sequence shards over tp (Megatron SP) */
  int weight_layout;     /* meshrt_weight_layout_t of the qkv / proj weights and their gradients */
  int qkv_layout;        /* meshrt_qkv_layout_t of the qkv weight, its bias and their gradients */
  int cp_comm; /* meshrt_cp_comm_t: the K/V exchange on a mesh with cp > 1 (a config from an
                * older header, whose size ends at qkv_layout, gets MESHRT_CP_COMM_RING) */
} meshrt_attn_config_t;

#define MESHRT_ATTN_CONFIG_INITIALIZER                                                             \
  {                                                                                                \
    sizeof(meshrt_attn_config_t), 1024, 16, {kDLFloat, 32, 1}, MESHRT_NORM_LAYERNORM, 1e-5f, 1, 1, \
        0, MESHRT_WEIGHT_LAYOUT_IN_OUT, MESHRT_QKV_LAYOUT_PER_HEAD, MESHRT_CP_COMM_RING            \
  }

/* The block's parameter tensors (this rank's shards); NULL where the config has none, as for the
 * MLP block. */
typedef struct meshrt_attn_params {
  size_t size;                 /* sizeof(meshrt_attn_params_t) */
  meshrt_tensor_t norm_weight; /* [hidden], replicated */
  meshrt_tensor_t norm_bias;   /* [hidden], replicated; LayerNorm only */
  meshrt_tensor_t qkv_weight;  /* IN_OUT [hidden, 3 hl d], OUT_IN [3 hl d, hidden] */
  meshrt_tensor_t qkv_bias;    /* [3 hl d] */
  meshrt_tensor_t proj_weight; /* IN_OUT [hl d, hidden], OUT_IN [hidden, hl d] */
  meshrt_tensor_t proj_bias;   /* [hidden], replicated */
} meshrt_attn_params_t;

#define MESHRT_ATTN_PARAMS_INITIALIZER \
  { sizeof(meshrt_attn_params_t), NULL, NULL, NULL, NULL, NULL, NULL }

typedef enum meshrt_attn_param {
  MESHRT_ATTN_NORM_WEIGHT = 0,
  MESHRT_ATTN_NORM_BIAS = 1,
  MESHRT_ATTN_QKV_WEIGHT = 2,
  MESHRT_ATTN_QKV_BIAS = 3,
  MESHRT_ATTN_PROJ_WEIGHT = 4,
  MESHRT_ATTN_PROJ_BIAS = 5
} meshrt_attn_param_t;

/* As meshrt_mlp_create (checks every field as it does, and heads % tp, hidden % heads; a refusal
 * names the field as "meshrt_attn_config.<field>"). */
MESHRT_C_API meshrt_status_t meshrt_attn_create(meshrt_attn_t* attn, meshrt_mesh_t mesh,
                                                const meshrt_attn_config_t* config);
MESHRT_C_API meshrt_status_t meshrt_attn_destroy(meshrt_attn_t attn);
/* Where this rank's shard of `which` sits along its sharded dimension of the full tensor, in
 * elements: qkv weight / bias: features [offset, offset + size) = 3 d x heads [h0, h0 + hl) of
 * the full tensor in the PER_HEAD order (the shard holds those heads in either layout; a BLOCKED
 * full tensor holds them at the three runs given at MESHRT_QKV_LAYOUT_BLOCKED); proj weight:
 * rows [offset, offset + size) = d x heads [h0, h0 + hl) of [hidden, hidden] (OUT_IN: columns).
 * Replicated ones: 0 and hidden. */
MESHRT_C_API meshrt_status_t meshrt_attn_shard_info(meshrt_attn_t attn, meshrt_attn_param_t which,
                                                    int64_t* offset, int64_t* size);
/* As meshrt_mlp_bind_weights: IN_OUT + PER_HEAD tensors are used in place; OUT_IN weights and
 * BLOCKED qkv tensors are copied into meshrt's layout. */
MESHRT_C_API meshrt_status_t meshrt_attn_bind_weights(meshrt_attn_t attn,
                                                      const meshrt_attn_params_t* weights);
/* Copies the bound weights again where bind copied them (after the engine changed them). */
MESHRT_C_API meshrt_status_t meshrt_attn_sync_weights(meshrt_attn_t attn, meshrt_stream_t stream,
                                                      meshrt_event_t* event);
/* As meshrt_mlp_forward / meshrt_mlp_backward. */
MESHRT_C_API meshrt_status_t meshrt_attn_forward(meshrt_attn_t attn, meshrt_tensor_t x,
                                                 meshrt_tensor_t y, meshrt_stream_t stream,
                                                 meshrt_event_t* event);
MESHRT_C_API meshrt_status_t meshrt_attn_backward(meshrt_attn_t attn, meshrt_tensor_t dy,
                                                  meshrt_tensor_t dx,
                                                  const meshrt_attn_params_t* grads,
                                                  meshrt_stream_t stream, meshrt_event_t* event);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MESHRT_MESHRT_H_ */
