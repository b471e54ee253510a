#!/bin/sh
# Context parallelism against cp = 1 with `meshrt bench block` (docs/cli.md, "Context
# parallelism"): at each sequence length, the block (hidden 128, 2 heads, 1 layer, batch 1, f32)
# on cp=1 with one thread (the baseline cp divides: MESHRT_HOST_THREADS=1) and with both cores,
# cp=2 with the ring and the all-gather exchange, tp=2, and cp=2,tp=2 (4 thread ranks), each a run
# of 3 timed steps after 1 warm-up. The runs alternate within each repetition so that load changes
# hit all of them; the table gives per run the median over the repetitions of its median step
# time, the cp stream and exposed times, and the peak allocation per rank, with the ratios to
# cp = 1 (and of cp=2,tp=2 to tp=2). Load average before each repetition on stderr.
# With CP_BENCH_FLAGS="--plan-cluster FILE" (a `meshrt plan --calibrate` file) a second table
# puts the planner's prediction of each run (its "plan" JSON) beside the measurement.
# Usage: bench/block/compare_cp.sh MESHRT "SEQS" [repeats] [runs]
#   SEQS: e.g. "4096 8192"; runs: a subset of "t1 t2 ring allgather tp2 cptp" (default all), or
#   t1pair: two one-thread cp=1 runs at the same time (the slower one's step), the speed a rank
#   gets while another runs beside it, as in a cp=2 run.
# CP_BENCH_KEEP=<folder>: keep the runs' JSON files there.
set -eu
bin=$1
seqs=$2
reps=${3:-1}
runs=${4:-t1 t2 ring allgather tp2 cptp}
[ -x "$bin" ] || { echo "no executable $bin" >&2; exit 2; }
if [ -n "${CP_BENCH_KEEP:-}" ]; then
  out=$CP_BENCH_KEEP
  mkdir -p "$out"
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
i=1
while [ "$i" -le "$reps" ]; do
  for seq in $seqs; do
    echo "rep $i seq $seq: $(uptime)" >&2
    c="--seq $seq --hidden 128 --heads 2 --layers 1 --batch 1 --steps 3 --warmup 1 --no-calibrate"
    c="$c ${CP_BENCH_FLAGS:-}"
    for r in $runs; do
      j="$out/$r.$seq.$i.json"
      case $r in
        t1) MESHRT_HOST_THREADS=1 "$bin" bench block --devices cpu:1 --mesh tp=1 $c --json "$j" ;;
        t1pair)  # two one-thread cp=1 runs at once: what each core gives a rank beside another
          MESHRT_HOST_THREADS=1 "$bin" bench block --devices cpu:1 --mesh tp=1 $c --json "$j.b" &
          pair=$!
          MESHRT_HOST_THREADS=1 "$bin" bench block --devices cpu:1 --mesh tp=1 $c --json "$j"
          wait $pair ;;
        t2) "$bin" bench block --devices cpu:1 --mesh tp=1 $c --json "$j" ;;
        ring) "$bin" bench block --devices cpu:2 --mesh cp=2 --cp-comm ring $c --json "$j" ;;
        allgather) "$bin" bench block --devices cpu:2 --mesh cp=2 --cp-comm allgather $c --json "$j" ;;
        tp2) "$bin" bench block --devices cpu:2 --mesh tp=2 $c --json "$j" ;;
        cptp) "$bin" bench block --devices cpu:4 --mesh cp=2,tp=2 --cp-comm ring $c --json "$j" ;;
        *) echo "unknown run $r (t1 t1pair t2 ring allgather tp2 cptp)" >&2; exit 2 ;;
      esac >/dev/null
      echo "  $r: $(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["step_ms"]["median"]), "ms")' "$j")" >&2
    done
  done
  i=$((i + 1))
done
python3 - "$out" "$reps" "$seqs" "$runs" <<'PY'
import json, os, statistics, sys
d, reps, seqs, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
names = {"t1": "tp=1 (cpu:1, MESHRT_HOST_THREADS=1)", "t2": "tp=1 (cpu:1, 2 threads)",
         "t1pair": "tp=1 (cpu:1, MESHRT_HOST_THREADS=1, two runs at once)",
         "ring": "cp=2 ring (cpu:2)", "allgather": "cp=2 allgather (cpu:2)",
         "tp2": "tp=2 (cpu:2)", "cptp": "cp=2,tp=2 ring (cpu:4)"}
def load(r, seq):
    out = []
    for i in range(1, reps + 1):
        p = f"{d}/{r}.{seq}.{i}.json"
        if os.path.exists(p):  # t1pair: the slower of the two runs
            out.append(max([json.load(open(q)) for q in (p, p + ".b") if os.path.exists(q)],
                           key=lambda j: j["step_ms"]["median"]))
    return out
def med(js, f):
    return statistics.median(f(j) for j in js)
print(f"median over {reps} alternating repetition(s) of each run's median step")
print()
print("| seq | mesh (devices) | step ms | vs cp=1, 1 thread / cp | vs cp=1, 2 threads "
      "| cp stream ms | cp exposed ms (% of cp stream) | peak MiB per rank (vs cp=1) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for seq in seqs:
    fig = {}
    for r in runs:
        js = load(r, seq)
        if js:
            fig[r] = dict(step=med(js, lambda j: j["step_ms"]["median"]),
                          mem=js[0]["memory"]["peak_allocated_bytes_max"] / 2**20,
                          cp=med(js, lambda j: j["comm"]["cp"]["comm_ms_median"]),
                          exp=med(js, lambda j: j["comm"]["cp"]["exposed_ms_median"]))
    base_mem = fig.get("t2", fig.get("t1", {})).get("mem")
    for r, f in fig.items():
        cells = [str(seq), names[r], f"{f['step']:.0f}", "-", "-", "-", "-", f"{f['mem']:.1f}"]
        if r in ("ring", "allgather"):
            if "t1" in fig:
                cells[3] = f"{f['step'] / (fig['t1']['step'] / 2):.2f}x"
            if "t2" in fig:
                cells[4] = f"{f['step'] / fig['t2']['step']:.2f}x"
        if r == "cptp" and "tp2" in fig:
            cells[4] = f"{f['step'] / fig['tp2']['step']:.2f}x of tp=2"
        if r in ("ring", "allgather", "cptp"):
            cells[5] = f"{f['cp']:.0f}"
            cells[6] = f"{f['exp']:.0f} ({100 * f['exp'] / f['cp']:.0f}%)"
            if r == "cptp" and "tp2" in fig:
                cells[7] += f" ({f['mem'] / fig['tp2']['mem']:.2f}x of tp=2)"
            elif r != "cptp" and base_mem:
                cells[7] += f" ({f['mem'] / base_mem:.2f}x)"
        if r in ("ring", "allgather") and "t1pair" in fig:
            cells[3] += f" ({f['step'] / (fig['t1pair']['step'] / 2):.2f}x of two at once / cp)"
        if r in ("t1", "t1pair"):
            cells[7] = "-"
        print("| " + " | ".join(cells) + " |")
rows = []
for seq in seqs:
    for r in runs:
        js = [j for j in load(r, seq) if "predicted" in j["plan"]]
        if not js:
            continue
        pr = lambda k: med(js, lambda j: j["plan"]["predicted"][k])
        ms = med(js, lambda j: j["step_ms"]["median"])
        cp = r in ("ring", "allgather", "cptp")
        mem = js[0]["memory"]["peak_allocated_bytes_max"] / 2**20
        rows.append(f"| {seq} | {names[r]} | {ms:.0f} | {pr('step_ms'):.0f} "
                    f"| {pr('step_ms') / ms:.2f}x | "
                    + (f"{med(js, lambda j: j['comm']['cp']['exposed_ms_median']):.0f} | "
                       f"{pr('cp_exposed_ms'):.1f} | " if cp else "- | - | ")
                    + f"{mem:.1f} | {pr('memory_bytes') / 2**20:.1f} |")
if rows:
    print()
    print(f"planner ({js[0]['plan']['cluster']}) vs measured, medians as above")
    print()
    print("| seq | mesh (devices) | step ms | predicted | predicted / measured "
          "| cp exposed ms | predicted | peak MiB | predicted |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
PY
