#include "tools/train.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <csignal>
#include <exception>
#include <functional>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <sstream>
#include <type_traits>

#include "bench/common/stats.h"
#include "collectives/bootstrap.h"
#include "collectives/config_check.h"
#include "dist/device_mesh.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/output_file.h"
#include "tools/cli/cli_checks.h"
#include "tools/cli/command.h"
#include "tools/signals.h"
#include "train/token_data.h"
#include "train/train.h"
#include "train/train_checkpoint.h"
#include "train/train_deterministic.h"
#include "train/train_guard.h"

namespace meshrt::cli {

namespace {

// What a run records of itself: --mem-stats, --metrics, --peak-tflops and the straggler watch.
void add_watch_flags(CLI::App* c, TrainCliOptions& o) {
  c->add_flag("--mem-stats", o.mem_stats,
              "Append rank 0's allocator statistics to each step line: bytes allocated, peak "
              "allocated, reserved (tools/soak.sh checks they stay flat)");
  c->add_option("--mem-limit-mb", o.mem_limit_mb,
                "CPU: the host memory in MiB the run may use, checked before anything is "
                "allocated (default: 80% of physical memory)")
      ->check(kPositive);
  c->add_option(
       "--metrics", o.metrics,
       "Write one JSON Lines record per step to FILE (loss, lr, per-rank times and memory; "
       "docs/training.md); continued by --resume")
      ->check(kNonEmpty);
  c->add_option("--peak-tflops", o.peak_tflops,
                "Dense peak of one device in TFLOP/s: adds MFU (model FLOPs / peak) to --metrics")
      ->check(cli::peak_tflops(true));
  c->add_option("--straggler-threshold", o.straggler_threshold,
                "Warn once when a rank's compute exceeds this x the median rank's for "
                "--straggler-steps steps in a row (a ratio > 1; default 1.2; watched with "
                "--metrics or either flag)")
      ->check(at_least(1, false));
  c->add_option("--straggler-steps", o.straggler_steps,
                "Steps in a row over --straggler-threshold before warning (default 3)")
      ->check(cli::int_at_least(1, o.straggler_steps));
}

}  // namespace

CLI::App* add_train_command(CLI::App& app, TrainCliOptions& o) {
  return add_train_flags(
      app.add_subcommand(
          "train",
          "Train the small decoder model (embedding, N transformer blocks, LM head with loss "
          "parallel) on synthetic tokens or a token file (--data) over a dp x cp x tp mesh; "
          "one line per step. SIGINT / SIGTERM / SIGHUP stop after the current step (exit status "
          "128 + signal)"),
      o);
}

namespace {

// The model's shape and dtype.
void add_model_flags(CLI::App* c, TrainCliOptions& o) {
  c->add_option("--batch", o.batch, "Global batch (samples per step, all dp replicas)")
      ->capture_default_str()
      ->check(cli::int_at_least(1, o.batch));
  cli::ModelFlags m;
  m.seq = {&o.seq, "Sequence length"};
  m.hidden = {&o.hidden, "Hidden size"};
  m.ffn = {&o.ffn, "MLP inner size (default 4 x hidden)"};
  m.heads = {&o.heads, "Attention heads"};
  m.layers = &o.layers;
  m.layers_help = "Transformer blocks";
  m.vocab = {&o.vocab, "Vocabulary size"};
  m.dtype = &o.dtype;
  m.show_defaults = true;
  cli::add_model_flags(*c, m);
}

// Steps, optimizer, schedule, accumulation, gradient sync and tp overlap.
void add_optimizer_flags(CLI::App* c, TrainCliOptions& o) {
  c->add_option("--steps", o.steps, "Training steps")
      ->capture_default_str()
      ->check(cli::int_at_least(1, o.steps));
  c->add_option("--seed", o.seed, "Seed of weights and data")
      ->capture_default_str()
      ->check(cli::int_at_least(0, o.seed));
  c->add_option("--lr", o.lr, "Learning rate")->capture_default_str()->check(non_negative());
  c->add_option("--optimizer", o.optimizer, "sgd | adamw")->capture_default_str();
  // Learning-rate schedule and weight decay (docs/training.md); checked again in validate_train.
  c->add_option("--lr-schedule", o.lr_schedule,
                "constant | cosine | linear: after --warmup-steps, decay from --lr to --min-lr at "
                "--steps")
      ->capture_default_str();
  c->add_option("--warmup-steps", o.warmup_steps,
                "Linear warmup: step i < W uses lr * (i + 1) / W (must be below --steps)")
      ->capture_default_str()
      ->check(cli::int_at_least(0, o.warmup_steps));
  c->add_option("--min-lr", o.min_lr, "Learning rate at the end of a cosine or linear decay")
      ->capture_default_str()
      ->check(non_negative());
  c->add_option("--weight-decay", o.weight_decay,
                "Weight decay of matrices (AdamW: decoupled, p *= 1 - lr * wd; SGD: L2)")
      ->capture_default_str()
      ->check(non_negative());
  c->add_option("--clip", o.clip, "Clip gradients to this global norm (0: off)")
      ->capture_default_str()
      ->check(non_negative());
  c->add_option("--micro-batches", o.micro_batches, "Gradient accumulation micro-batches per step")
      ->capture_default_str()
      ->check(cli::int_at_least(1, o.micro_batches));
  c->add_option("--grad-sync", o.grad_sync,
                "sync | async (staleness-aware delayed gradients) | local (local SGD)")
      ->capture_default_str();
  // Each step of staleness holds one more full gradient set: 1024 is far past any useful delay.
  c->add_option("--staleness", o.staleness,
                "async: apply gradients K steps late, lr / K (0..1024; K + 1 gradient sets held)")
      ->capture_default_str()
      ->check(cli::int_in(0, 1024));
  c->add_option("--sync-every", o.sync_every, "local: average parameters every H steps")
      ->capture_default_str()
      ->check(cli::int_at_least(1, o.sync_every));
  c->add_option("--bucket-mb", o.bucket_mb, "Gradient bucket size in MiB")
      ->capture_default_str()
      ->check(kPositive);
  c->add_flag("--bf16-grads", o.bf16_grads, "Communicate f32 gradients as bf16");
  c->add_flag("--deterministic", o.deterministic,
              "Bitwise identical results on any dp size, micro-batching, --bucket-mb, --overlap, "
              "--zero and backend (docs/training.md#deterministic-training)");
  c->add_option("--deterministic-grain", o.deterministic_grain,
                "--deterministic: sequences per grain (one forward / backward each); the batch "
                "must divide by dp x this (default: the largest of at most 256 tokens that every "
                "dp of 1 to 4 dividing --batch allows; 2 at --batch 8 --seq 64)")
      ->check(cli::int_at_least(1, o.deterministic_grain));
  c->add_option("--zero", o.zero,
                "ZeRO stage over dp: 0 replicated, 1 shard the optimizer state, 2 also the "
                "gradients, 3 also the parameters (docs/zero.md)")
      ->capture_default_str();
  c->add_option("--overlap", o.overlap, "tp overlap: none | async | chunked")
      ->capture_default_str();
  c->add_flag("--compare,!--no-compare", o.compare,
              "async/local: also run synchronous DP and print the trade (default on)");
}

// Checkpoints: --save, --save-every, --keep, --overwrite, --resume.
void add_checkpoint_flags(CLI::App* c, TrainCliOptions& o) {
  CLI::Option* save =
      c->add_option("--save", o.save,
                    "Checkpoint directory: step-N/ per checkpoint (a safetensors file per rank and "
                    "index.json) and a 'latest' pointer; written at the last step")
          ->check(kNonEmpty);
  c->add_option("--save-every", o.save_every, "Also write a checkpoint every N steps")
      ->check(cli::int_at_least(1, o.save_every))
      ->needs(save);
  c->add_option("--keep", o.keep,
                "Keep only the newest N checkpoints of this run (default all); meshrt removes only "
                "the files it wrote")
      ->check(cli::int_at_least(1, o.keep))
      ->needs(save);
  c->add_flag("--overwrite", o.overwrite,
              "Write into a --save folder that holds another run's checkpoints (replacing those "
              "of the same step; --keep never removes the others). Without it such a folder is "
              "refused unless --resume continues it");
  CLI::Option* resume =
      c->add_option("--resume", o.resume,
                    "Continue from a checkpoint (a --save directory or one step-N/ in it), on any "
                    "mesh; --steps counts from the start of the original run")
          ->check(kNonEmpty);
  c->add_flag("--resume-other-data", o.resume_other_data,
              "Resume although --data holds another token stream than the checkpoint's (another "
              "file of the same length, or the file rewritten); without it that is refused")
      ->needs(resume);
}

// Token files and validation.
void add_data_flags(CLI::App* c, TrainCliOptions& o) {
  c->add_option("--data", o.data,
                "Token file to train on: raw u16/u32 (.bin, nanoGPT), llm.c .bin (by its header) "
                "or .npy of integers; kept open for the run (default: synthetic tokens)")
      ->check(kNonEmpty);
  c->add_option("--val-data", o.val_data, "Validation token file (same formats as --data)")
      ->check(kNonEmpty);
  c->add_option("--data-dtype", o.data_dtype, "Element type of raw token files: u16 | u32")
      ->capture_default_str();
  c->add_flag("--doc-mask", o.doc_mask,
              "Packed documents: attention stays inside each document (causal within it), under "
              "any cp; a document ends with --eot-token (default: the token file's own, 50256 "
              "in llm.c's GPT-2 files)");
  c->add_option("--eot-token", o.eot_token,
                "The token id that ends each document under --doc-mask (needed for synthetic "
                "tokens and for token files without an end-of-text token of their own)")
      ->check(cli::int_at_least(0, o.eot_token));
  c->add_option("--cp-chunks", o.cp_chunks,
                "Chunks per cp rank of --doc-mask's balanced layout (even; --seq divisible by "
                "it x cp): finer chunks balance packed documents' attention work better")
      ->capture_default_str()
      ->check(cli::int_at_least(2, o.cp_chunks));
  c->add_option("--eval-every", o.eval_every,
                "Validation loss every N steps (0: after the last step); needs --val-data")
      ->capture_default_str()
      ->check(cli::int_at_least(0, o.eval_every));
  c->add_option("--eval-batches", o.eval_batches, "Global batches per validation loss")
      ->capture_default_str()
      ->check(cli::int_at_least(1, o.eval_batches));
}

}  // namespace

CLI::App* add_train_flags(CLI::App* c, TrainCliOptions& o) {
  CLI::Option* devices =
      c->add_option("--devices", o.devices,
                    "Ranks: cpu:N (threads) | cuda:all | cuda:0-3 (under mpirun: cpu or cuda)")
          ->capture_default_str()
          ->check(kNonEmpty);
  c->callback([&o, c, devices] {
    o.devices_given = devices->count() > 0;
    o.given.clear();
    for (const CLI::Option* opt : c->get_options())
      if (opt->count() > 0) o.given.insert(opt->get_name());
  });
  c->add_option("--mesh", o.mesh,
                "Mesh, dims dp, cp and tp, e.g. dp=2,tp=2 or dp=2,cp=2 (default dp=<world size>; "
                "cp: context parallel, --seq divisible by 2 x cp)")
      ->check(kNonEmpty);
  c->add_option("--cp-comm", o.cp_comm,
                "cp attention's K/V exchange: ring (send/recv overlapped with attention) | "
                "allgather (gathered once per layer)")
      ->capture_default_str();
  bench::add_fault_flag(*c);
  bench::add_backend_flag(*c, o.backend);
  c->add_flag("--sp", o.sp, "Sequence parallel in the tp blocks");
  add_model_flags(c, o);
  add_optimizer_flags(c, o);
  add_checkpoint_flags(c, o);
  add_data_flags(c, o);
  add_watch_flags(c, o);
  c->add_flag("--skip-nonfinite", o.skip_nonfinite,
              "Skip steps with a non-finite loss or gradient (no update; counted) instead of "
              "stopping");
  return c;
}

namespace {

std::string option_text(const std::string& v) { return v.empty() ? "(none)" : v; }
std::string option_text(bool v) { return v ? "on" : "off"; }
template <class T>
requires std::is_arithmetic_v<T> std::string option_text(T v) {
  char b[64];
  const auto r = std::to_chars(b, b + sizeof(b), v);  // shortest form that reads back as v
  return std::string(b, r.ptr);
}

// One line per option of add_train_command that changes what the ranks compute or exchange.
struct SharedOption {
  const char* name;
  std::string (*value)(const TrainCliOptions&);
};
#define MESHRT_SHARED(name, member)                                      \
  SharedOption {                                                         \
    name, [](const TrainCliOptions& o) { return option_text(o.member); } \
  }
const SharedOption kSharedOptions[] = {
    MESHRT_SHARED("devices", devices),
    MESHRT_SHARED("mesh", mesh),
    MESHRT_SHARED("cp-comm", cp_comm),
    MESHRT_SHARED("doc-mask", doc_mask),
    MESHRT_SHARED("eot-token", eot_token),
    MESHRT_SHARED("cp-chunks", cp_chunks),
    MESHRT_SHARED("backend", backend),
    MESHRT_SHARED("sp", sp),
    MESHRT_SHARED("batch", batch),
    MESHRT_SHARED("seq", seq),
    MESHRT_SHARED("hidden", hidden),
    MESHRT_SHARED("heads", heads),
    MESHRT_SHARED("ffn", ffn),
    MESHRT_SHARED("layers", layers),
    MESHRT_SHARED("vocab", vocab),
    MESHRT_SHARED("dtype", dtype),
    MESHRT_SHARED("steps", steps),
    MESHRT_SHARED("seed", seed),
    MESHRT_SHARED("lr", lr),
    MESHRT_SHARED("optimizer", optimizer),
    MESHRT_SHARED("lr-schedule", lr_schedule),
    MESHRT_SHARED("warmup-steps", warmup_steps),
    MESHRT_SHARED("min-lr", min_lr),
    MESHRT_SHARED("weight-decay", weight_decay),
    MESHRT_SHARED("clip", clip),
    MESHRT_SHARED("micro-batches", micro_batches),
    MESHRT_SHARED("grad-sync", grad_sync),
    MESHRT_SHARED("staleness", staleness),
    MESHRT_SHARED("sync-every", sync_every),
    MESHRT_SHARED("bucket-mb", bucket_mb),
    MESHRT_SHARED("mem-limit-mb", mem_limit_mb),
    MESHRT_SHARED("bf16-grads", bf16_grads),
    MESHRT_SHARED("deterministic", deterministic),
    MESHRT_SHARED("deterministic-grain", deterministic_grain),
    MESHRT_SHARED("zero", zero),
    MESHRT_SHARED("overlap", overlap),
    MESHRT_SHARED("compare", compare),
    MESHRT_SHARED("save", save),
    MESHRT_SHARED("save-every", save_every),
    MESHRT_SHARED("keep", keep),
    MESHRT_SHARED("overwrite", overwrite),
    MESHRT_SHARED("resume", resume),
    MESHRT_SHARED("resume-other-data", resume_other_data),
    MESHRT_SHARED("data", data),
    MESHRT_SHARED("val-data", val_data),
    MESHRT_SHARED("data-dtype", data_dtype),
    MESHRT_SHARED("eval-every", eval_every),
    MESHRT_SHARED("eval-batches", eval_batches),
    MESHRT_SHARED("skip-nonfinite", skip_nonfinite),
    // Watching adds a collective a step: every rank must do it alike.
    MESHRT_SHARED("straggler-threshold", straggler_threshold),
    MESHRT_SHARED("straggler-steps", straggler_steps),
};
#undef MESHRT_SHARED

}  // namespace

std::vector<std::pair<std::string, std::string>> train_shared_options(const TrainCliOptions& o) {
  std::vector<std::pair<std::string, std::string>> f;
  for (const SharedOption& s : kSharedOptions)
    f.emplace_back(std::string("--") + s.name, s.value(o));
  return f;
}

// --fault sets MESHRT_FAULT, which acts on the rank it names only; --mem-stats adds rank 0's
// allocator figures to its own lines; --metrics is written by rank 0 alone, and --peak-tflops only
// scales what it writes.
std::vector<std::string> train_local_options() {
  return {"fault", "mem-stats", "metrics", "peak-tflops"};
}

namespace {

// Refuses flag `flag` (given on the command line) where this run would ignore it: "FLAG VALUE
// would be ignored: WHY" (WHY ends with what to change).
void refuse_ignored(const TrainCliOptions& o, const std::string& flag, const std::string& value,
                    bool ignored, const std::string& why) {
  MESHRT_CHECK(!ignored || o.given.count(flag) == 0,
               flag << (value.empty() ? "" : " " + value) << " would be ignored: " << why);
}

std::string tc_num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// The flags that act on the mesh's dp or tp dimension, on a mesh where that dimension is 1.
void check_mesh_flags(const TrainCliOptions& o, const TrainConfig& cfg, int world) {
  const std::string spec =
      cfg.mesh.empty() ? std::string(kDpDim) + "=" + std::to_string(world) : cfg.mesh;
  int dp = 1, tp = 1, cp = 1;
  for (const MeshDim& d : parse_mesh_spec(spec, world)) {
    if (d.name == kDpDim) dp = d.size;
    if (d.name == kTpDim) tp = d.size;
    if (d.name == kCpDim) cp = d.size;
  }
  const std::string mesh = "--mesh " + spec + (cfg.mesh.empty() ? " (the default)" : "");
  refuse_ignored(o, "--cp-comm", o.cp_comm, cp == 1,
                 "it picks how context parallelism exchanges K/V and " + mesh +
                     " has cp=1; drop --cp-comm or give a mesh with cp > 1 (e.g. --mesh cp=2)");
  const std::string more_tp =
      " or give a mesh with tp > 1 (e.g. --mesh tp=" + std::to_string(world > 1 ? world : 2) + ")";
  const std::string more_dp =
      " or give a mesh with dp > 1 (e.g. --mesh dp=" + std::to_string(world > 1 ? world : 2) + ")";
  refuse_ignored(o, "--sp", "", tp == 1,
                 "sequence parallelism splits the tp blocks' activations and " + mesh +
                     " has tp=1; drop --sp" + more_tp);
  refuse_ignored(o, "--overlap", o.overlap, tp == 1,
                 "it schedules the tp collectives and " + mesh +
                     " has tp=1 (there are none); drop --overlap" + more_tp);
  refuse_ignored(o, "--bucket-mb", tc_num(o.bucket_mb), dp == 1,
                 "it sizes the dp gradient buckets and " + mesh +
                     " has dp=1 (no gradient is exchanged); drop --bucket-mb" + more_dp);
  refuse_ignored(o, "--bf16-grads", "", dp == 1,
                 "it halves the dp gradient exchange and " + mesh +
                     " has dp=1 (no gradient is exchanged); drop --bf16-grads" + more_dp);
}

}  // namespace

void check_train_flags(const TrainCliOptions& o) {
  const GradSyncMode mode = parse_grad_sync(o.grad_sync);
  refuse_ignored(o, "--data-dtype", o.data_dtype, o.data.empty(),
                 "it is the element type of a raw --data / --val-data token file, and this run "
                 "trains on synthetic tokens; drop --data-dtype or give --data FILE");
  refuse_ignored(o, "--eot-token", std::to_string(o.eot_token), !o.doc_mask,
                 "it is the token that ends each document under --doc-mask; add --doc-mask or "
                 "drop --eot-token");
  refuse_ignored(o, "--deterministic-grain", std::to_string(o.deterministic_grain),
                 !o.deterministic,
                 "it sizes the grains of --deterministic; add --deterministic or drop it");
  refuse_ignored(o, "--staleness", std::to_string(o.staleness), mode != GradSyncMode::Async,
                 "it delays the gradients of --grad-sync async, and --grad-sync is " + o.grad_sync +
                     "; drop --staleness or use --grad-sync async");
  refuse_ignored(o, "--sync-every", std::to_string(o.sync_every), mode != GradSyncMode::Local,
                 "it is the averaging period of --grad-sync local, and --grad-sync is " +
                     o.grad_sync + "; drop --sync-every or use --grad-sync local");
  refuse_ignored(o, "--eval-batches", std::to_string(o.eval_batches), o.val_data.empty(),
                 "it sizes the validation loss on --val-data, and no --val-data is given; drop "
                 "--eval-batches or give --val-data FILE");
  refuse_ignored(o, "--peak-tflops", tc_num(o.peak_tflops), o.metrics.empty(),
                 "MFU goes into the --metrics file, and no --metrics is given; drop "
                 "--peak-tflops or give --metrics FILE");
  // Given as --compare or --no-compare: named as typed.
  MESHRT_CHECK(mode != GradSyncMode::Sync || o.given.count("--compare") == 0,
               (o.compare ? "--compare" : "--no-compare")
                   << " would be ignored: it chooses whether a --grad-sync async or local run is "
                      "compared with a synchronous one, and this run is synchronous (--grad-sync "
                      "sync); drop it or use --grad-sync async or local");
}

TrainConfig train_config(const TrainCliOptions& o, GradSyncMode mode) {
  TrainConfig c;
  ModelSpec m;  // the model (model/model_spec.h), into the executors' config
  m.hidden = o.hidden;
  m.heads = o.heads;
  m.ffn = ffn_or_default(o.hidden, o.ffn);  // refuses a --hidden it would overflow
  m.dtype = parse_model_dtype(o.dtype);
  m.layers = o.layers;
  m.vocab = o.vocab;
  m.seq = o.seq;
  apply_model_spec(c.model.block, m);
  c.model.block.seed = o.seed;
  c.model.layers = m.layers;
  c.model.vocab = m.vocab;
  c.mesh = o.mesh;
  c.tp.sequence_parallel = o.sp;
  try {
    c.model.block.cp_comm = parse_cp_comm(o.cp_comm);
  } catch (const Error& e) {
    MESHRT_FAIL("--cp-comm: " << e.message());
  }
  c.tp.overlap = parse_overlap(o.overlap);
  c.batch = o.batch;
  c.seq = m.seq;
  c.steps = o.steps;
  c.seed = o.seed;
  c.micro_batches = o.micro_batches;
  c.optim.kind = parse_optimizer(o.optimizer);
  c.optim.lr = o.lr;
  c.optim.clip_norm = o.clip;
  c.optim.weight_decay = o.weight_decay;
  c.lr_schedule = parse_lr_schedule(o.lr_schedule);
  c.warmup_steps = o.warmup_steps;
  c.min_lr = o.min_lr;
  c.dp.bucket_mb = o.bucket_mb;
  c.dp.bf16_comm = o.bf16_grads;
  c.deterministic = o.deterministic;
  c.deterministic_grain = o.given.count("--deterministic-grain") != 0
                              ? o.deterministic_grain
                              : default_deterministic_grain(o.batch, o.seq);
  c.dp.zero = o.zero;
  c.grad_sync = mode;
  c.staleness = o.staleness;
  c.sync_every = o.sync_every;
  c.checkpoint.save = o.save;
  c.checkpoint.save_every = o.save_every;
  c.checkpoint.keep = o.keep;
  c.checkpoint.resume = o.resume;
  c.checkpoint.overwrite = o.overwrite;
  c.checkpoint.resume_other_data = o.resume_other_data;
  c.eval_every = o.eval_every;
  c.eval_batches = o.eval_batches;
  c.skip_nonfinite = o.skip_nonfinite;
  c.mem_stats = o.mem_stats;
  c.metrics = o.metrics;
  c.peak_tflops = o.peak_tflops;
  c.watch_stragglers = o.straggler_threshold > 0 || o.straggler_steps > 0;
  if (o.straggler_threshold > 0) c.straggler_threshold = o.straggler_threshold;
  if (o.straggler_steps > 0) c.straggler_steps = o.straggler_steps;
  MESHRT_CHECK(o.bucket_mb > 0, "--bucket-mb " << o.bucket_mb << " must be positive");
  // Mapped and scanned once per process; the rank threads share the mapping.
  const TokenDType raw = parse_token_dtype(o.data_dtype);
  MESHRT_CHECK(o.val_data.empty() || !o.data.empty(),
               "--val-data " << o.val_data << " needs --data FILE to train on");
  if (!o.data.empty()) c.data = TokenFile::open(o.data, raw, "--data");
  if (!o.val_data.empty()) c.val_data = TokenFile::open(o.val_data, raw, "--val-data");
  c.cp_chunks = o.cp_chunks;
  if (o.doc_mask) {
    MESHRT_CHECK(c.data || o.eot_token >= 0,
                 "--doc-mask on synthetic tokens needs --eot-token ID (the synthetic walk has no "
                 "end-of-text token of its own), or give --data FILE");
    try {
      c.doc_eot = c.data ? c.data->end_of_text(o.eot_token) : o.eot_token;
    } catch (const Error& e) {
      MESHRT_FAIL("--doc-mask: " << e.message() << " (--eot-token ID)");
    }
  }
  c.stop_requested = [] { return StopSignals::received(); };
  return c;
}

namespace {

// Refuses, before anything is allocated, a run the host cannot hold (as `bench block` does):
// otherwise the kernel kills it without a message, or the allocator fails mid-run.
// --mem-limit-mb replaces the limit (80% of physical memory) with the given one.
void check_host_memory(const TrainConfig& cfg, const Launch& launch, double mem_limit_mb) {
  if (!launch.local().front().device.is_cpu()) return;
  const int local = launch.kind() == LaunchKind::Threads ? static_cast<int>(launch.local().size())
                                                         : launch.local().front().local_size;
  const TrainMemory m = estimate_train_memory(cfg, launch.world_size());
  const double need = m.total() * local;
  const double have = static_cast<double>(bench::physical_memory_bytes());
  const double limit = mem_limit_mb > 0 ? mem_limit_mb * 1024 * 1024 : 0.8 * have;
  using bench::human_bytes;
  std::ostringstream lim;
  if (mem_limit_mb > 0)
    lim << "the limit is --mem-limit-mb " << mem_limit_mb << " (" << human_bytes(limit) << ")";
  else
    lim << "the machine has " << human_bytes(have) << " (80% usable)";
  MESHRT_CHECK(limit <= 0 || need < limit,
               "this run needs about "
                   << human_bytes(need) << " of host memory for " << local << " rank(s) (per rank: "
                   << human_bytes(m.weights) << " weights, " << human_bytes(m.grads)
                   << " gradients, " << human_bytes(m.optimizer) << " optimizer state, "
                   << human_bytes(m.activations) << " activations) and " << lim.str()
                   << "; shard over dp (--zero 1|2|3), reduce --hidden, --ffn, --layers or "
                      "--vocab, shard over tp (--mesh), or lower --batch or --seq (or raise "
                      "--micro-batches)");
}

// As bench block: --zero on a mesh with dp=1 would be ignored (the library runs it as zero 0).
void check_zero_over_dp(const TrainConfig& cfg, int world) {
  const std::string mesh =
      cfg.mesh.empty() ? std::string(kDpDim) + "=" + std::to_string(world) : cfg.mesh;
  int dp = 1;
  for (const MeshDim& d : parse_mesh_spec(mesh, world))
    if (d.name == kDpDim) dp = d.size;
  check_zero_has_dp(cfg.dp.zero, dp, mesh);
}

struct Summary {
  double median_ms = 0, dp_comm = 0, dp_exposed = 0, final_loss = 0;
};

Summary summarize(const std::vector<StepStats>& st) {
  Summary s;
  std::vector<double> t;
  // Skip the first step (allocator and thread warm-up) when there are others.
  for (size_t i = st.size() > 1 ? 1 : 0; i < st.size(); ++i) {
    t.push_back(st[i].step_ms);
    s.dp_comm += st[i].dp_comm_ms;
    s.dp_exposed += st[i].dp_exposed_ms;
  }
  std::sort(t.begin(), t.end());
  s.median_ms = t[t.size() / 2];
  s.final_loss = st.back().loss;
  return s;
}

// Outputs that would land among checkpoints: --metrics in a step folder or on `latest` of the
// --save or --resume folder, or anywhere in the step folder being resumed (beside the checkpoints
// is fine); --save inside the folder being resumed, or the step folder itself (a later --resume of
// the folder would find the new checkpoints nested in the old). --save may be the folder --resume
// continues.
void check_outputs_spare_checkpoints(const std::string& metrics, const std::string& save,
                                     const std::string& resume) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool step = !resume.empty() && fs::exists(fs::path(resume) / "index.json", ec);
  const auto entries = step ? std::function<bool(const std::string&)>{}
                            : std::function<bool(const std::string&)>(checkpoint_entry_name);
  const char* holds = step ? "the checkpoint being resumed" : "the checkpoints being resumed";
  check_outputs_outside({{"--metrics", metrics}}, "--save", save, "checkpoints",
                        checkpoint_entry_name);
  check_outputs_outside({{"--metrics", metrics}}, "--resume", resume, holds, entries);
  if (save.empty() || resume.empty()) return;
  if (!step && fs::weakly_canonical(save, ec) == fs::weakly_canonical(resume, ec)) return;
  check_outputs_outside({{"--save", save}}, "--resume", resume, holds);
}

}  // namespace

void check_train_config(const TrainConfig& cfg, int world) {
  validate_train(cfg, world);
  check_zero_over_dp(cfg, world);
}

RunResult run_train_once(const TrainConfig& cfg, const TrainCliOptions& o, std::ostream* os,
                         const std::function<void(int world)>& precheck) {
  LaunchOptions lo;
  lo.devices = o.devices;
  lo.devices_defaulted = !o.devices_given;
  lo.backend = o.backend;
  auto launch = bootstrap(lo);
  // Before any rank starts. Every process fails alike (the options agree), or, where its own
  // files or folders differ, with the first failing rank's error: mpirun prints it once.
  std::string err;
  try {
    if (precheck) precheck(launch->world_size());
    check_train_config(cfg, launch->world_size());
    check_host_memory(cfg, *launch, o.mem_limit_mb);
    check_outputs_spare_inputs({{"--metrics", cfg.metrics}},
                               {{"--data", o.data}, {"--val-data", o.val_data}});
    check_outputs_spare_checkpoints(cfg.metrics, cfg.checkpoint.save, cfg.checkpoint.resume);
    // The --save folder first: --metrics may go into the folder it makes.
    if (!cfg.checkpoint.save.empty()) prepare_checkpoint_root(cfg.checkpoint.save);
    check_output_path(cfg.metrics, "--metrics");
    if (!cfg.checkpoint.resume.empty())
      read_checkpoint_meta(cfg.checkpoint.resume, train_checkpoint_meta(cfg, 0));
  } catch (const Error& e) {
    err = e.message();
  }
  try {
    launch->agree_checks(err);
  } catch (const Error& e) {
    throw bench::UniformError(e);
  }
  RunResult out;
  std::mutex mu;
  std::exception_ptr nonfinite;
  const int first = launch->local().front().rank;
  launch->run([&](const RankPlacement& rp, Communicator& world) {
    ContextOptions co;
    co.rank = rp.rank;
    co.world_size = rp.world_size;
    co.local_ranks = rp.local_size;
    Context ctx(rp.device, co);
    std::vector<StepStats> st;
    try {
      st = train(cfg, ctx, world, os);
    } catch (const NonFiniteError& e) {
      // Every rank raises it after the same collective: no rank is left waiting, so it is not a
      // rank failure (which would abort the world and log from every rank).
      std::lock_guard<std::mutex> lk(mu);
      nonfinite = std::make_exception_ptr(TrainDivergedError(e));
      return;
    }
    if (rp.rank == first) {
      std::lock_guard<std::mutex> lk(mu);
      out.stats = std::move(st);
      out.has_rank0 = rp.rank == 0;
    }
  });
  if (nonfinite) std::rethrow_exception(nonfinite);
  return out;
}

// The comparison table after a finished run (rank 0).
void print_table(std::ostream& os, const TrainCliOptions& o, GradSyncMode mode, const Summary& a,
                 bool compare, const std::vector<StepStats>& ss) {
  auto line = [&](const char* name, const Summary& s) {
    os << std::left << std::setw(22) << name << std::right << std::fixed << std::setprecision(2)
       << std::setw(10) << s.median_ms << std::setw(14) << s.dp_comm << std::setw(14)
       << s.dp_exposed << std::setw(12) << std::setprecision(6) << s.final_loss << "\n";
  };
  os << "\n"
     << std::left << std::setw(22) << "grad sync" << std::right << std::setw(10) << "step ms"
     << std::setw(14) << "dp comm ms" << std::setw(14) << "exposed ms" << std::setw(12)
     << "loss@" + std::to_string(o.steps) << "\n";
  std::string name = grad_sync_name(mode);
  if (mode == GradSyncMode::Async) name += " (K=" + std::to_string(o.staleness) + ")";
  if (mode == GradSyncMode::Local) name += " (H=" + std::to_string(o.sync_every) + ")";
  line(name.c_str(), a);
  if (compare) line("sync", summarize(ss));
  os << "(step ms: median over steps 2..N; comm and exposed: sums over steps 2..N; exposed = time "
        "the compute stream waited for dp communication)\n";
}

int run_train(const TrainCliOptions& o, std::ostream& os) {
  const GradSyncMode mode = parse_grad_sync(o.grad_sync);
  StopSignals signals(bench::launcher_rank() == 0);
  TrainConfig cfg;
  try {
    cfg = train_config(o, mode);
  } catch (const Error& e) {
    throw bench::UniformError(e);
  }
  // Under a process launch, bootstrap() refuses ranks started differently (validate() set the
  // options): the token files' contents too, as the paths may name different files.
  detail::ConfigFields shared = train_shared_options(o);
  auto contents = [](const std::shared_ptr<const TokenFile>& f) {
    return f ? f->format() + ", " + std::to_string(f->size()) + " tokens, " + f->digest()
             : "(none)";
  };
  shared.emplace_back("--data contents", contents(cfg.data));
  shared.emplace_back("--val-data contents", contents(cfg.val_data));
  detail::set_process_config(std::move(shared), "meshrt train");
  RunResult run;
  try {
    run = run_train_once(cfg, o, &os, [&](int world) { check_mesh_flags(o, cfg, world); });
  } catch (const std::exception& e) {
    // A signal before the first step (e.g. during a file-rendezvous wait): nothing to save.
    const int early = StopSignals::received();
    if (early == 0) throw;
    if (bench::launcher_rank() == 0)
      print_line(os, "train: 0 of " + std::to_string(o.steps) + " steps, stopped by " +
                         StopSignals::name(early) + " while starting (" + e.what() + ")\n");
    return 128 + early;
  }
  const std::vector<StepStats>& st = run.stats;
  // The one-line summary: steps done, last loss, why it stopped.
  // Skipped steps of the run (a resumed one continues its checkpoint's count).
  const int skipped = st.empty() ? 0 : st.back().skipped_steps;
  // A resumed run starts past step 0: count by step numbers.
  const int done = st.empty() ? 0 : st.back().step;
  const bool stopped = !st.empty() && st.back().stopped;
  // The signal every rank agreed on (under mpirun it may have reached another rank only).
  const int sig =
      stopped && st.back().stop_signal != 0 ? st.back().stop_signal : StopSignals::received();
  if (st.empty()) {
    if (run.has_rank0)
      print_line(os, "train: no step to run (the checkpoint is at or past --steps)\n");
    return 0;
  }
  if (run.has_rank0) {
    std::ostringstream line;
    line << "train: " << done << " of " << o.steps << " steps";
    if (stopped)
      line << ", stopped by " << StopSignals::name(sig);
    else
      line << ", finished";
    line << "; last loss " << std::fixed << std::setprecision(6) << st.back().loss << "; "
         << skipped << " skipped (non-finite)";
    for (const StepStats& s : st)
      if (s.straggler_rank >= 0)
        line << "; straggler: rank " << s.straggler_rank << " (" << s.straggler_device << ") "
             << std::setprecision(2) << s.straggler_ratio
             << "x the median rank's compute from step " << s.step;
    line << "\n";
    // Standard output closed by its reader: the summary goes to stderr.
    print_line(stopped && sig == SIGPIPE ? std::cerr : os, line.str());
  }
  // Stopped by a signal (here or, under mpirun, at another rank): no comparison run.
  if (stopped) return 128 + (sig != 0 ? sig : SIGTERM);
  const bool compare = mode != GradSyncMode::Sync && o.compare;
  // Every process runs the comparison (it is collective); only rank 0's process prints.
  std::vector<StepStats> ss;
  if (compare) {
    TrainConfig sync_cfg = cfg;
    sync_cfg.grad_sync = GradSyncMode::Sync;
    sync_cfg.metrics.clear();  // the file is the run's, not the comparison's
    ss = run_train_once(sync_cfg, o, nullptr).stats;
  }
  if (!run.has_rank0) return 0;
  std::ostringstream table;
  print_table(table, o, mode, summarize(st), compare, ss);
  print_line(os, table.str());
  return 0;
}

}  // namespace meshrt::cli
