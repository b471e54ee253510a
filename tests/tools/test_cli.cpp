// The `meshrt` binary: bad flags and impossible configurations fail with a message saying what to
// change; tiny benchmark runs write JSON, traces, dumps and sweeps with the promised content.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/backend.h"
#include "runtime/safetensors.h"
#include "tests/common/env.h"
#include "tests/common/files.h"
#include "tools/cli/command.h"

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

using meshrt::test::Run;
using meshrt::test::sh_quote;
using meshrt::test::slurp;

fs::path scratch() {
  static const fs::path d = meshrt::test::scratch_dir("tools");
  return d;
}

// Runs `<bin> <args>` (the path quoted; no shell quoting needed for the arguments used here).
Run run(const std::string& bin, const std::string& args) {
  return meshrt::test::run_program(bin, args, scratch());
}

// Runs `meshrt <args>`.
Run cli(const std::string& args) { return run(MESHRT_CLI_BIN, args); }

// Tiny shapes for runs that must finish in about a second.
const std::string kTiny = "--seq 64 --hidden 128 --heads 4 --steps 3 --warmup 1";

}  // namespace

namespace {

struct RefusedCase {
  std::string args, expect;
};

// Each `meshrt <args>` exits 1 before any output with a message matching `expect`: no crash, no
// internal error, no source location, no dump.
void expect_refused(const std::vector<RefusedCase>& cases) {
  for (const RefusedCase& c : cases) {
    INFO("meshrt " << c.args);
    Run r = cli(c.args);
    INFO("stderr: " << r.err);
    CHECK_FALSE(r.signaled);
    CHECK(r.rc == 1);
    CHECK(std::regex_search(r.err, std::regex(c.expect)));
    CHECK(r.err.find("terminate called") == std::string::npos);
    CHECK(r.err.find("internal error") == std::string::npos);
    CHECK(r.err.size() < 2000);  // a message, not a dump
    // Errors are for users: no source location unless MESHRT_LOG_LEVEL=debug asks for it.
    CHECK_FALSE(std::regex_search(r.err, std::regex("\\[[a-z_]+\\.(cpp|h):[0-9]+\\]")));
    // Nothing was printed before the error (flags are checked before any output).
    CHECK(r.out.empty());
  }
}

}  // namespace

TEST_CASE("bad flags and impossible configurations exit non-zero saying what to change", "[unit]") {
  std::vector<RefusedCase> cases = {
      {"bench block --devices cpu:2 --mesh tp=3", "has 3 ranks but the world has 2"},
      {"bench block --mesh ''",
       "--mesh: an empty value is not accepted: give one, or leave the option out"},
      {"train --mesh ''",
       "--mesh: an empty value is not accepted: give one, or leave the option out"},
      {"train --save ''",
       "--save: an empty value is not accepted: give one, or leave the option out"},
      {"train --seed 99999999999999999999999",
       "--seed: '99999999999999999999999' is not an integer >= 0 of at most 9223372036854775807"},
      {"bench collective --seed 99999999999999999999999", "of at most 9223372036854775807"},
      {"bench collective -i 0",
       "-i 0: the step must be at least 1 byte \\(or leave -i out to multiply the size by -f\\)"},
      {"train --save-every 2", "--save-every requires --save"},
      {"train --keep 2", "--keep requires --save"},
      {"bench block --devices cpu:2 --mesh dp=2,tp=2", "make the sizes multiply to 2"},
      {"bench block --devices cpu:2 --mesh pp=2", "name the dims dp, cp and tp"},
      {"bench block --devices cpu:2 --mesh tp=two", "not an integer >= 1"},
      {"bench block --devices cpu:2 --hidden 250 --heads 4", "does not divide by heads"},
      {"bench block --devices cpu:2 --hidden 384 --heads 3", "heads 3 do not divide by tp=2"},
      {"bench block --devices cpu:2 --hidden 128 --heads 4 --ffn 1", "ffn 1 is smaller than tp=2"},
      {"bench block --devices cpu:2 --seq 127", "change --seq or pass --no-sp"},
      {"bench block --devices cpu:2 --seq 130 --overlap chunked", "divisible by tp\\^2=4"},
      {"bench block --devices cpu:2 --overlap chunked --no-sp", "add --sp or use --overlap async"},
      {"bench block --overlap sometimes", "sometimes not in \\{none,async,chunked\\}"},
      {"bench block --dtype f64", "f64 not in \\{f32,bf16,f16\\}"},
      {"bench block --batch 0", "--batch: '0' is not an integer >= 1"},
      {"bench block --steps 2.5", "--steps: '2.5' is not an integer from 1 to 1000000"},
      {"bench block --steps 300000000", "--steps: '300000000' is not an integer from 1 to"},
      {"bench block --warmup -1", "--warmup: '-1' is not an integer from 0 to 1000000"},
      {"bench block --warmup 2147483647", "--warmup: '2147483647' is not an integer from 0"},
      {"sweep --steps 2147483647", "--steps: '2147483647' is not an integer from 1 to"},
      {"bench block --bucket-mb 0", "--bucket-mb: '0' is not a number > 0"},
      {"bench block --sp --no-sp", "--sp excludes --no-sp"},
      {"bench block --devices gpu:2", "unknown device kind 'gpu'"},
      {"bench block --devices cpu:0", "host rank count 0"},
      {"bench block --devices cpu:3", "does not divide by tp=3"},
      {"bench block --json /nonexistent-dir/x.json", "does not exist"},
      {"bench block --trace /", "is a directory"},
      {"bench block --devices cpu:2 --hidden 262144 --ffn 1048576", "reduce --hidden"},
      {"bench block --frobnicate", "not expected: --frobnicate"},
      {"bench", "subcommand"},
      {"bench mlp --mesh dp=2,tp=x", "not an integer >= 1"},
      {"bench collective -b 12Q", "12Q"},
      {"bench collective -b 3 -e 8", "-b 3: not a whole number of f32 elements \\(4 bytes each\\)"},
      {"bench collective -b 4 -e 16 -d i64", "-b 4: not a whole number of i64 elements"},
      {"bench collective -b 8 -e 1G -i 8", "is more than 1000 sizes"},
      {"bench collective -e 99999999999999G", "too large"},
      {"bench collective --devices cpu:2 -b 1000G -e 1000G", "need .* for their buffers.*lower -e"},
      {"frobnicate",
       "unknown command 'frobnicate': use one of info, train, doctor, report, tune, bench, plan, "
       "sweep"},
      {"bench frobnicate", "meshrt bench: unknown command 'frobnicate': use one of block"},
      {"sweep --batches 1,x", "'x' is not an integer >= 1"},
      {"sweep --mesh tp=2", "--mesh is swept; leave it out"},
      {"sweep --plot /nonexistent-dir/p.png", "does not exist"},
      {"bench block --seed -3", "--seed: '-3' is not an integer >= 0"},
      {"bench collective --seed -1", "--seed: '-1' is not an integer >= 0"},
      {"bench gemm -m -1 -n 4 -k 4", "-m: '-1' is not an integer from 1 to 2147483648"},
      {"train --lr -1", "--lr: '-1' is not a number >= 0"},
      {"train --clip -0.5", "--clip: '-0.5' is not a number >= 0"},
      {"train --seed -1", "--seed: '-1' is not an integer >= 0"},
      {"train --steps 0", "--steps: '0' is not an integer >= 1"},
      {"train --data ''", "--data: an empty value is not accepted"},
      {"train --resume ''", "--resume: an empty value is not accepted"},
      {"bench block --devices ''", "--devices: an empty value is not accepted"},
      {"train --bucket-mb 0", "--bucket-mb: '0' is not a number > 0"},
  };
  if (!meshrt::cuda_available())
    cases.push_back({"bench block --devices cuda:0", "CUDA is unavailable"});
  expect_refused(cases);
}

TEST_CASE("numbers past their type, empty outputs and parse errors are refused up front",
          "[unit]") {
  expect_refused({
      // Past the variable's type (int), in digits only, decimal only.
      {"train --steps 99999999999",
       "--steps: '99999999999' is not an integer >= 1 of at most 2147483647"},
      {"train --layers 3000000000", "--layers: '3000000000' is not an integer >= 1 of at most"},
      {"train --steps 1e2", "--steps: '1e2' is not an integer >= 1 written in digits"},
      {"train --grad-sync async --staleness 2147483647",
       "--staleness: '2147483647' is not an integer from 0 to 1024"},
      {"train --lr 0x10", "--lr: '0x10' is not a number >= 0"},
      {"bench block --bucket-mb 0x10", "--bucket-mb: '0x10' is not a number > 0"},
      {"bench collective -c 5", "--check: '5' is not an integer from 0 to 1"},
      {"bench collective -n 0", "--iters: '0' is not an integer >= 1"},
      {"bench collective -w 3000000000", "--warmup_iters: '3000000000' is not an integer >= 0"},
      // A --hidden whose default --ffn (4 x hidden) would overflow, in train as in bench block.
      {"train --hidden 9223372036854775807",
       "^meshrt: error: --hidden 9223372036854775807 is too large: the default --ffn \\(4 x "
       "hidden\\) overflows a 64-bit integer; reduce --hidden or give --ffn\n$"},
      // A step factor that is not a finite number > 1 (1e400 reads as inf).
      {"bench collective -b 0 -e 8 -f inf", "--stepfactor: 'inf' is not a number > 1"},
      {"bench collective -b 0 -e 8 -f nan", "--stepfactor: 'nan' is not a number > 1"},
      {"bench collective -b 0 -e 8 -f 1e400", "--stepfactor: '1e400' is not a number > 1"},
      {"bench collective -f 1", "--stepfactor: '1' is not a number > 1"},
      // CLI11's own conversion, where no validator checks the range first.
      {"bench gemm -m 99999999999999999999 -n 4 -k 4",
       "-m: '99999999999999999999' is not an integer from 1 to 2147483648"},
      {"bench collective -r 99999999999",
       "--root: '99999999999' is not an integer this option can hold \\(INT\\)"},
      // Parse errors read like every other error, status 1.
      {"train --frob", "^meshrt: error: The following argument was not expected: --frob"},
      {"bench block --plan-cluster nonexist.json",
       "^meshrt: error: --plan-cluster nonexist.json: cannot read the file: it does not exist"},
      {"bench block --peak-tflops 1e-300",
       "--peak-tflops: '1e-300' is not a peak in TFLOP/s from 0.001 to 1000000"},
      {"train --peak-tflops 1e300", "--peak-tflops: '1e300' is not a peak in TFLOP/s"},
      {"bench gemm -m 2147483648 -n 2147483648 -k 2",
       "gemm bench: the largest GEMM's operands need .* of memory; lower -m"},
      {"bench collective --json /", "--json / is a directory"},
      {"bench gemm --json /", "--json / is a directory"},
      {"train --metrics ''", "--metrics: an empty value is not accepted"},
      {"sweep --plot ''", "--plot: an empty value is not accepted"},
      {"sweep --overlap chunked --sp-modes off",
       "--overlap chunked runs only with sequence parallelism, which --sp-modes off leaves out"},
      {"train --devices cpu:2 --mesh tp=2 --overlap chunked",
       "--overlap chunked .* needs sequence parallelism: add --sp or use --overlap async"},
  });
}

TEST_CASE("flags a run would ignore are refused, naming the flag as the user gave it", "[unit]") {
  const std::string model = "plan --model hidden=64,heads=2,layers=1,seq=32 --global-batch 4 ";
  expect_refused({
      // --plan-cluster's errors name --plan-cluster (not plan's --cluster).
      {"bench block --plan-cluster nonexist.json", "^meshrt: error: --plan-cluster nonexist.json"},
      {"bench block --plan-cluster h100-sxm:0",
       "^meshrt: error: --plan-cluster h100-sxm:0: give <gpu>:G \\(1-8 GPUs per node\\)"},
      {"bench block --plan-cluster v100", "^meshrt: error: --plan-cluster v100: unknown preset"},
      {"bench block --plan-cluster ''", "--plan-cluster: an empty value is not accepted"},
      {"bench block --plan-cluster cpu --fwd-only",
       "--plan-cluster cpu with --fwd-only: the planner models forward \\+ backward steps only"},
      // --fault where no collective runs.
      {"bench gemm --fault crash@rank=0,step=1",
       "^meshrt: error: --fault crash@rank=0,step=1: the gemm benchmark times kernels in this "
       "process and issues no collectives.*; drop --fault"},
      {model + "--fault hang@rank=0,step=1",
       "--fault hang@rank=0,step=1: meshrt plan issues collectives only with --calibrate"},
      {model + "--devices cpu:2", "--devices cpu:2 chooses the ranks --calibrate measures"},
      {"bench gemm --no-gemm -m 8 -n 8 -k 8",
       "-m would be ignored: --no-gemm skips the GEMM table it shapes; drop -m or --no-gemm"},
      {"bench gemm --no-gemm --trans-b", "--trans-b would be ignored: --no-gemm"},
      {"bench gemm --no-attention --attn-seq 64", "--attn-seq would be ignored: --no-attention"},
      {"bench gemm --no-gemm --no-elementwise --hidden 64",
       "--hidden would be ignored: --no-gemm and --no-elementwise skip the tables it sizes"},
      {"bench gemm --no-gemm --no-elementwise --no-attention", "leave nothing to measure"},
      {"bench collective --op all_gather -r 1",
       "-r 1 would be ignored: only broadcast has a root, and --op is all_gather"},
      {"bench collective --op broadcast -o max",
       "-o max would be ignored: broadcast reduces nothing"},
      {"bench collective -b 8 -e 64 -i 8 -f 4", "-f 4 would be ignored: -i 8 adds a fixed step"},
      {"bench block --devices cpu:2 --mesh dp=2 --zero 2 --fwd-only",
       "--zero 2 would be ignored: it shards the gradients and --fwd-only computes none"},
      {"bench block --devices cpu:2 --mesh tp=2 --zero 3",
       "--zero 3 would be ignored: ZeRO shards over dp and --mesh tp=2 has dp=1"},
  });
  // Where they act, the same flags run: --fault in a benchmark with collectives (a fault for
  // rank 1 at a step past the run), -r with broadcast, -o with a reduction.
  for (const std::string args :
       {"bench collective --devices cpu:2 -b 8 -e 8 -n 1 -w 0 --fault slow@rank=1,step=1000,ms=1",
        "bench collective --devices cpu:2 -b 8 -e 8 -n 1 -w 0 --op broadcast -r 1",
        "bench collective --devices cpu:2 -b 8 -e 8 -n 1 -w 0 --op reduce_scatter -o max"}) {
    INFO(args);
    Run r = cli(args);
    INFO(r.err);
    CHECK(r.rc == 0);
  }
}

TEST_CASE("environment switches with unknown values are refused before anything runs", "[unit]") {
  struct Case {
    std::string env, expect;
  };
  for (const Case& c :
       {Case{"MESHRT_STREAM_JITTER=abc", "MESHRT_STREAM_JITTER='abc' is not a switch"},
        Case{"MESHRT_LOG_LEVEL=loud", "MESHRT_LOG_LEVEL='loud' is not a log level: use trace"},
        Case{"MESHRT_COMM_DEBUG=2", "MESHRT_COMM_DEBUG='2' is not a switch: use 1"},
        Case{"MESHRT_FLIGHT_ON_EXIT=yess", "MESHRT_FLIGHT_ON_EXIT='yess' is not a switch"},
        Case{"MESHRT_FLIGHT_ON_EXIT=2", "MESHRT_FLIGHT_ON_EXIT='2' is not a switch"},
        Case{"MESHRT_BLAS_REEXEC=maybe",
             "MESHRT_BLAS_REEXEC='maybe' is not a switch: use 1 (or "
             "true, on, yes) or 0 (or false, off, no), or unset it (on)"},
        Case{"MESHRT_HOST_SPIN=lots",
             "MESHRT_HOST_SPIN='lots' is not a whole number in [0, 1000000000]: use one, or unset "
             "it"},
        Case{"MESHRT_HOST_YIELD_US=-5", "MESHRT_HOST_YIELD_US='-5' is not a whole number in [0"},
        Case{"MESHRT_HOST_POLL_US=2000000",
             "MESHRT_HOST_POLL_US='2000000' is not a whole number in [0, 1000000]"},
        Case{"MESHRT_HOST_BF16_GEMM=bf16",
             "MESHRT_HOST_BF16_GEMM='bf16' is not accepted: use auto or f32, or unset it (auto)"},
        Case{"MESHRT_HOST_BIND=cores",
             "MESHRT_HOST_BIND='cores' is not accepted: use auto or none, or unset it (auto)"},
        Case{"MESHRT_HOST_F32_GEMM=mkl",
             "MESHRT_HOST_F32_GEMM='mkl' is not accepted: use auto, openblas, onednn or bf16, or "
             "unset it (auto)"},
        Case{"MESHRT_FLIGHT_DIR=/nonexistent-dir",
             "MESHRT_FLIGHT_DIR=/nonexistent-dir: No such file or directory; give an existing "
             "directory"},
        Case{"MESHRT_FLIGHT_DIR=/dev/null", "MESHRT_FLIGHT_DIR=/dev/null: not a directory"},
        Case{"RANK=1",
             "RANK=1 is set but WORLD_SIZE is not: a process started as one rank needs "
             "both"},
        Case{"WORLD_SIZE=2", "WORLD_SIZE=2 is set but RANK is not"},
        Case{"MESHRT_SOCKET_IFNAME=nosuchif0",
             "MESHRT_SOCKET_IFNAME='nosuchif0': no interface named by it is up with an IPv4 "
             "address; this host's interfaces: "},
        Case{"MESHRT_HOST_ISA=sse4",
             "MESHRT_HOST_ISA=sse4 is not an instruction set of the host "
             "kernels; use auto, baseline"}}) {
    // Built by append: GCC 12 warns (-Warray-bounds, a false positive that depends on the
    // path's length) on operator+ inside an initializer list.
    std::string cli_bench = sh_quote(MESHRT_CLI_BIN);
    cli_bench.append(" bench collective");
    const std::vector<std::string> bins = {cli_bench, sh_quote(MESHRT_BENCH_COLLECTIVE_BIN)};
    for (const std::string& bin : bins) {
      Run r = meshrt::test::run_shell(c.env + " " + bin + " -b 8 -e 8", scratch());
      INFO(c.env << " " << bin << ": " << r.err);
      CHECK(r.rc == 1);
      CHECK(r.err.find(c.expect) != std::string::npos);
      CHECK(r.err.find("logging at warn") == std::string::npos);  // one message: the refusal
      CHECK(r.out.empty());
    }
  }
  // Accepted spellings still run.
  Run r = meshrt::test::run_shell(
      "MESHRT_STREAM_JITTER=off MESHRT_LOG_LEVEL=warning "
      "MESHRT_COMM_DEBUG=yes MESHRT_FLIGHT_ON_EXIT=0 "
      "MESHRT_HOST_SPIN=0 MESHRT_HOST_BF16_GEMM=f32 " +
          sh_quote(MESHRT_CLI_BIN) + " bench collective --devices cpu:2 -b 8 -e 8 -n 2 -w 0",
      scratch());
  INFO(r.err);
  CHECK(r.rc == 0);
}

TEST_CASE("a benchmark stopped by SIGINT, SIGTERM or SIGHUP prints one summary line",
          "[multirank]") {
  for (const char* sig : {"INT", "TERM", "HUP"}) {
    const fs::path out = scratch() / (std::string("sig-") + sig + ".out");
    const fs::path err = scratch() / (std::string("sig-") + sig + ".err");
    // Signalled once its table header is out (the handlers are in place before the run starts).
    // SIGHUP at its default whatever this test inherited (a CI job under nohup ignores it, and
    // a shell cannot undo that).
    const std::string cmd =
        "env --default-signal=HUP " + sh_quote(MESHRT_CLI_BIN) +
        " bench collective --devices cpu:2 -b 8 -e 8 -n 100000000 -w 0 >" + out.string() + " 2>" +
        err.string() + " & pid=$!; i=0; until grep -q '^#' " + out.string() +
        " 2>/dev/null || [ $i -ge 600 ]; do sleep 0.1; i=$((i+1)); done; kill -" + sig +
        " $pid; wait $pid";
    const int st = std::system(cmd.c_str());
    const std::string e = slurp(err);
    INFO(sig << ": " << e);
    REQUIRE(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == (std::string(sig) == "INT"   ? 130
                              : std::string(sig) == "HUP" ? 129
                                                          : 143));
    CHECK(
        std::regex_search(e, std::regex(std::string("meshrt bench collective: interrupted by SIG") +
                                        sig + " after [0-9]+\\.[0-9] s; its --json")));
  }
}

TEST_CASE("info lists the backends, how this program has them and the plugin file", "[unit]") {
  Run r = cli("info");
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  CHECK(std::regex_search(r.out, std::regex("\nbackends\n  host +built in\n")));
  // The CLI links the MPI and CUDA backends in; libmeshrt.so would load libmeshrt-mpi.so and
  // libmeshrt-cuda.so instead.
  CHECK(std::regex_search(
      r.out,
      std::regex("\n  mpi +linked in \\(plugin libmeshrt-mpi\\.so: (not found in .+|/.+)\\)\n")));
#if defined(MESHRT_WITH_CUDA)
  CHECK(std::regex_search(
      r.out,
      std::regex("\n  cuda +linked in \\(plugin libmeshrt-cuda\\.so: (not found in .+|/.+)\\)\n")));
#else
  CHECK(std::regex_search(r.out, std::regex("\n  cuda +not built\n")));
#endif
}

TEST_CASE("info shows the collective algorithm table, and MESHRT_ALGO's choices", "[unit]") {
  Run r = cli("info");
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  CHECK(std::regex_search(r.out, std::regex("\ncollective algorithms \\(the table's choice; "
                                            "MESHRT_ALGO forces others\\)\n  host \\([0-9]+ "
                                            "ranks, 1 node\\)\n    op \\\\ bytes +8 B +4 KiB "
                                            "+256 KiB +64 MiB\n    all_reduce +eager +eager "
                                            "+flat +flat\n")));
  CHECK(std::regex_search(r.out, std::regex("\n  shm \\([0-9]+ ranks, 1 node\\)\n")));
  CHECK(std::regex_search(r.out, std::regex("\n    all_gather +staged +staged +zero_copy "
                                            "+zero_copy\n")));
  CHECK(std::regex_search(
      r.out, std::regex("\n  mpi \\([0-9]+ ranks, 1 node\\): native for every op and size\n")));
  CHECK(std::regex_search(r.out, std::regex("\n  tcp \\([0-9]+ ranks, 1 node\\)\n.*\n    "
                                            "all_reduce +socket_ring +socket_ring +socket_ring "
                                            "+socket_ring\n")));
  CHECK(std::regex_search(r.out, std::regex("\n  hier \\([0-9]+ ranks, 2 nodes\\)\n")));
  {
    test::ScopedEnv env("MESHRT_ALGO", "all_reduce:flat,all_gather:ring");
    Run f = cli("info");
    INFO(f.out << f.err);
    REQUIRE(f.rc == 0);
    CHECK(std::regex_search(
        f.out, std::regex("\ncollective algorithms \\(MESHRT_ALGO=all_reduce:flat,all_gather:"
                          "ring\\)\n  host \\([0-9]+ ranks, 1 node\\)\n.*\n    all_reduce +flat "
                          "+flat +flat +flat\n    all_gather +ring +ring +ring +ring\n")));
  }
  test::ScopedEnv bad("MESHRT_ALGO", "all_reduce:rign");
  Run b = cli("info");
  CHECK(b.rc == 1);
  CHECK_THAT(b.err,
             Catch::Contains("meshrt: error: MESHRT_ALGO='all_reduce:rign': 'rign' is not "
                             "an algorithm of all_reduce; use eager, fixed_order, flat, native, "
                             "one_step, socket_ring, staged, two_level or zero_copy"));
}

TEST_CASE("info names the devices, why CUDA is unavailable, and every library's version",
          "[unit]") {
  Run r = cli("info");
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  CHECK(std::regex_search(r.out, std::regex("cpu +[0-9]+ hardware threads")));
  if (!meshrt::cuda_available())
    CHECK(std::regex_search(r.out, std::regex("cuda +unavailable: .+")));
  CHECK(std::regex_search(r.out, std::regex("blas +OpenBLAS \\(OpenBLAS [0-9.]+.*threading")));
  CHECK(std::regex_search(r.out, std::regex("mpi +Open MPI v[0-9.]+")));
  CHECK(std::regex_search(r.out, std::regex("type +[A-Za-z]+, ")));
#if defined(MESHRT_WITH_CUDA)
  // Library versions come from library calls that need no GPU.
  CHECK(std::regex_search(r.out, std::regex("cuda +CUDA runtime [0-9]+\\.[0-9]+")));
  CHECK(std::regex_search(r.out, std::regex("gemm +cuBLASLt [0-9]+\\.[0-9]+\\.[0-9]+")));
  CHECK(std::regex_search(r.out, std::regex("nccl +NCCL 2\\.[0-9]+\\.[0-9]+")));
  CHECK(std::regex_search(r.out, std::regex("cuda +ON \\(arch [0-9]+")));
#else
  CHECK(std::regex_search(r.out, std::regex("cuda +OFF")));
#endif
}

TEST_CASE("help works for every command", "[unit]") {
  for (const char* cmd :
       {"--help", "bench --help", "bench block --help", "bench mlp --help", "bench attn --help",
        "bench collective --help", "bench gemm --help", "sweep --help", "info"}) {
    INFO(cmd);
    Run r = cli(cmd);
    CHECK(r.rc == 0);
    CHECK(!r.out.empty());
  }
  Run r = cli("bench block --help");
  for (const char* flag : {"--devices", "--mesh", "--sp", "--batch", "--seq", "--hidden", "--ffn",
                           "--heads", "--layers", "--dtype", "--steps", "--warmup", "--fwd-only",
                           "--overlap", "--bucket-mb", "--json", "--trace", "--dump"})
    CHECK(r.out.find(flag) != std::string::npos);
}

TEST_CASE("bench gemm reports attention against the fastest GEMM of the same run", "[unit]") {
  const fs::path js = scratch() / "gemm_attn.json";
  Run r =
      cli("bench gemm --devices cpu:2 --dtype f32 --no-elementwise --tokens 64 --hidden 32 "
          "--attn-heads 2 --attn-seq 64 --attn-head-dim 16 --warmup 0 --repeats 1 --json " +
          js.string());
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("vs best GEMM above") != std::string::npos);
  json j = json::parse(slurp(js));
  double best = 0;
  for (const json& g : j["gemm"]) best = std::max(best, g["meshrt_gflops"].get<double>() / 2);
  REQUIRE(best > 0);
  CHECK(j["attention"]["best_gemm_rate_per_rank"].get<double>() == Approx(best));
  const json& d = j["attention"]["default"];
  CHECK(d["fwd_vs_best_gemm"].get<double>() == Approx(d["fwd_rate"].get<double>() / best));
  CHECK(d["bwd_vs_best_gemm"].get<double>() == Approx(d["bwd_rate"].get<double>() / best));
  // Without the GEMM table there is nothing to compare with: no column, a null rate.
  Run n =
      cli("bench gemm --no-gemm --no-elementwise --attn-heads 2 --attn-seq 64 "
          "--attn-head-dim 16 --warmup 0 --repeats 1 --json " +
          js.string());
  INFO(n.out << n.err);
  REQUIRE(n.rc == 0);
  CHECK(n.out.find("vs best GEMM") == std::string::npos);
  CHECK(json::parse(slurp(js))["attention"]["best_gemm_rate_per_rank"].is_null());
}

TEST_CASE("bench block's MFU label says whether f32 GEMMs took bf16 products", "[multirank]") {
  // MESHRT_HOST_F32_GEMM=bf16 takes bf16 products only where oneDNN has the kernel (3.2: AMX);
  // capped at AVX2 no CPU has it, so the label must say the products stayed f32.
  for (const char* isa : {"AVX2", static_cast<const char*>(nullptr)}) {
    test::ScopedEnv env({{"MESHRT_HOST_F32_GEMM", "bf16"}, {"ONEDNN_MAX_CPU_ISA", isa}});
    Run info = cli("info");
    if (info.rc != 0) {  // a build without oneDNN refuses the mode
      CHECK(info.err.find("this build has no oneDNN") != std::string::npos);
      return;
    }
    const bool products = info.out.find("products in bf16 where") != std::string::npos;
    INFO("ONEDNN_MAX_CPU_ISA=" << (isa ? isa : "(unset)") << "\n" << info.out);
    if (isa) CHECK_FALSE(products);
    const fs::path js = scratch() / "bf16_label.json";
    Run r = cli("bench block --devices cpu:2 " + kTiny + " --json " + js.string());
    INFO(r.out << r.err);
    REQUIRE(r.rc == 0);
    const std::string label = json::parse(slurp(js))["peak"]["label"];
    CHECK(label.find(products ? "f32 with bf16 products (MESHRT_HOST_F32_GEMM=bf16)"
                              : "f32 on oneDNN in f32 arithmetic (MESHRT_HOST_F32_GEMM=bf16, "
                                "but oneDNN has no bf16-product f32 matmul for this CPU)") !=
          std::string::npos);
  }
}

TEST_CASE("a tiny block bench writes JSON with every figure and a valid trace", "[multirank]") {
  const fs::path js = scratch() / "tiny.json", tr = scratch() / "tiny.trace.json";
  Run r = cli("bench block --devices cpu:2 " + kTiny + " --json " + js.string() + " --trace " +
              tr.string());
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  for (const char* row : {"step time", "tokens/s", "model FLOPs", "TFLOP/s", "MFU", "compute",
                          "comm tp", "comm dp", "memory", "skew", "overhead"})
    CHECK(r.out.find(row) != std::string::npos);

  json j = json::parse(slurp(js));
  CHECK(j["config"]["mesh"] == "tp=2");
  CHECK(j["config"]["sp"] == true);  // on by default when tp > 1
  CHECK(j["config"]["world_size"] == 2);
  CHECK(j["config"]["steps"] == 3);
  CHECK(j["step_ms"]["all"].size() == 3);
  const double med = j["step_ms"]["median"];
  CHECK(med > 0);
  CHECK(j["step_ms"]["p10"].get<double>() <= med);
  CHECK(j["step_ms"]["p90"].get<double>() >= med);
  // FLOPs by hand: B=1, s=64, h=128, ffn=512: QKV 6*64*128^2 = 6291456, attention (halved)
  // 2*64^2*128 = 1048576, out-proj 2097152, MLP 4*64*128*512 = 16777216; x3 for fwd + bwd.
  CHECK(j["flops"]["per_layer_forward"]["total"] == 26214400.0);
  CHECK(j["flops"]["per_step"] == 78643200.0);
  CHECK(j["tokens_per_step"] == 64.0);
  CHECK(j["tokens_per_s"].get<double>() == Approx(64.0 / (med * 1e-3)));
  CHECK(j["tflops_model"].get<double>() == Approx(78643200.0 / (med * 1e-3) / 1e12));
  CHECK(j["peak"]["source"] == "calibration_gemm");
  CHECK(j["peak"]["tflops_per_rank"].get<double>() > 0);
  CHECK(j["mfu"].get<double>() > 0);
  CHECK(j["comm"]["tp"]["size"] == 2);
  CHECK(j["comm"]["tp"]["collectives_per_step_per_rank"].get<double>() > 0);
  CHECK(j["comm"]["tp"]["bytes_per_step_per_rank"].get<double>() > 0);
  CHECK(j["comm"]["tp"]["comm_ms_median"].get<double>() > 0);
  CHECK(j["comm"]["tp"]["exposed_ms_median"].get<double>() >= 0);
  CHECK(j["comm"]["dp"]["size"] == 1);
  CHECK(j["comm"]["dp"]["collectives_per_step_per_rank"] == 0);
  CHECK(j["memory"]["peak_allocated_bytes_max"].get<double>() > 0);
  CHECK(j["ranks"].size() == 2);
  CHECK(j["skew"]["step_ms_slowest"].get<double>() >= j["skew"]["step_ms_fastest"].get<double>());
  CHECK(j["overhead"]["fraction_of_step"].get<double>() >= 0);
  CHECK(j["overhead"]["trace_markers_per_step"].get<double>() > 0);
  CHECK(j["versions"].contains("blas"));
  CHECK(j["versions"].contains("mpi"));
  CHECK(j["versions"].contains("meshrt"));
  CHECK(j["command_line"].get<std::string>().find("bench block") != std::string::npos);

  // The trace: Chrome JSON, one process per rank, compute and tp-comm tracks, steps that
  // contain their ops, communication slices carrying bytes and compute slices carrying FLOPs.
  json t = json::parse(slurp(tr));
  REQUIRE(t["traceEvents"].is_array());
  std::map<std::pair<int, int>, std::string> tracks;
  std::map<int, std::vector<std::pair<double, double>>> steps;  // rank -> [ts, end]
  int comm = 0, compute = 0;
  for (auto& e : t["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name")
      tracks[{e["pid"].get<int>(), e["tid"].get<int>()}] = e["args"]["name"];
    if (e["ph"] != "X") continue;
    CHECK(e["dur"].get<double>() >= 0);
    const std::string name = e["name"];
    if (name.rfind("step ", 0) == 0)
      steps[e["pid"]].push_back({e["ts"], e["ts"].get<double>() + e["dur"].get<double>()});
    if (e["tid"] == 1) {
      ++comm;
      CHECK(e["args"]["bytes"].get<double>() > 0);
      CHECK((name == "all_gather" || name == "reduce_scatter" || name == "all_reduce" ||
             name == "all_to_all"));
    }
    if (name.find(".fwd") != std::string::npos || name.find(".bwd") != std::string::npos) {
      ++compute;
      CHECK(e["tid"] == 0);
      CHECK(e["args"]["flops"].get<double>() > 0);
    }
  }
  CHECK(tracks[{0, 0}] == "compute");
  CHECK(tracks[{1, 0}] == "compute");
  CHECK(tracks[{0, 1}] == "comm.tp");
  CHECK(tracks[{1, 1}] == "comm.tp");
  CHECK(steps[0].size() == 3);
  CHECK(steps[1].size() == 3);
  CHECK(comm >= 2 * 3 * 10);    // per rank and step: a dozen or so sequence collectives
  CHECK(compute == 2 * 3 * 4);  // attn / mlp x fwd / bwd per rank and step
}

TEST_CASE("dp > 1 all-reduces gradients over dp and reports it", "[multirank]") {
  const fs::path js = scratch() / "dp.json";
  Run r = cli("bench mlp --devices cpu:2 --mesh dp=2,tp=1 --no-calibrate " + kTiny + " --json " +
              js.string());
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  json j = json::parse(slurp(js));
  CHECK(j["config"]["dp"] == 2);
  CHECK(j["config"]["global_batch"] == 2);
  CHECK(j["comm"]["dp"]["collectives_per_step_per_rank"].get<double>() >= 1);
  // MLP parameters: norm 2x128, fc1 128x512 + 512, fc2 512x128 + 128, f32.
  CHECK(j["comm"]["dp"]["bytes_per_step_per_rank"] == 4.0 * (256 + 65536 + 512 + 65536 + 128));
  CHECK(j["comm"]["tp"]["collectives_per_step_per_rank"] == 0);
  CHECK(j["mfu"].is_null());  // --no-calibrate on CPU: no peak to compare with
  CHECK(j["flops"]["per_step"] == 3.0 * 4 * 2 * 64 * 128 * 512);  // global batch 2
}

TEST_CASE("dp gradient buckets launch during backward in every step, not at its end",
          "[multirank]") {
  // Two layers, small buckets: layer 1's buckets are complete before layer 0's backward runs, so
  // their all-reduce is launched before that backward. MESHRT_LAUNCH_BLOCKING=1 runs every
  // stream's work in program order on the issuing thread, so the trace shows launch order and
  // not when the OS scheduled the dp stream's thread (on 2 cores that can be after the backward).
  // If buckets were only launched by finish(), every all-reduce would follow L0.attn.bwd.
  const fs::path tr = scratch() / "dp.trace.json";
  std::string cmd = "MESHRT_LAUNCH_BLOCKING=1 ";
  cmd.append(sh_quote(MESHRT_CLI_BIN));
  cmd.append(
      " bench block --devices cpu:2 --mesh dp=2,tp=1 --layers 2 --bucket-mb 0.05 --seq 128 "
      "--hidden 128 --heads 4 --steps 3 --warmup 1 --no-calibrate --trace ");
  cmd.append(tr.string());
  Run r = meshrt::test::run_shell(cmd, scratch());
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  json t = json::parse(slurp(tr));
  for (int pid = 0; pid < 2; ++pid) {
    for (int step = 0; step < 3; ++step) {
      double first_ar = 1e300, l1_end = 0, l0_end = 0;
      for (auto& e : t["traceEvents"]) {
        if (e["ph"] != "X" || e["pid"] != pid || e["args"]["step"] != step) continue;
        const double ts = e["ts"].get<double>();
        if (e["name"] == "all_reduce" && e["tid"] == 2) first_ar = std::min(first_ar, ts);
        if (e["name"] == "L1.mlp.bwd") l1_end = ts + e["dur"].get<double>();
        if (e["name"] == "L0.attn.bwd") l0_end = ts + e["dur"].get<double>();
      }
      INFO("rank " << pid << " step " << step << ": L1.mlp.bwd ends " << l1_end
                   << ", first all-reduce " << first_ar << ", L0.attn.bwd ends " << l0_end);
      REQUIRE(l0_end > 0);
      CHECK(first_ar >= l1_end);  // launched once layer 1's MLP gradients exist
      CHECK(first_ar < l0_end);   // and before layer 0's backward ended
    }
  }
}

TEST_CASE("dumps of a tp=2 sequence-parallel run equal the unsharded run", "[multirank]") {
  const fs::path a = scratch() / "tp2.safetensors", b = scratch() / "tp1.safetensors";
  const std::string shape = "--seq 32 --hidden 64 --heads 4 --steps 1 --warmup 0 --no-calibrate";
  Run r2 = cli("bench block --devices cpu:2 --sp " + shape + " --dump " + a.string());
  INFO(r2.out << r2.err);
  REQUIRE(r2.rc == 0);
  Run r1 = cli("bench block --devices cpu:1 " + shape + " --dump " + b.string());
  INFO(r1.out << r1.err);
  REQUIRE(r1.rc == 0);
  auto host = meshrt::make_host_plain_allocator();
  meshrt::SafetensorsFile fa = meshrt::load_safetensors(a.string(), host);
  meshrt::SafetensorsFile fb = meshrt::load_safetensors(b.string(), host);
  REQUIRE(fa.tensors.size() == fb.tensors.size());
  CHECK(fa.tensors.size() >= 4 + 2 * 12);  // input, output and their grads; params and grads
  for (auto& [name, t] : fb.tensors) {
    INFO(name);
    const meshrt::Tensor& u = fa.at(name);
    REQUIRE(u.shape() == t.shape());
    std::vector<double> x = u.to_vector(), y = t.to_vector();
    double md = 0, mr = 1e-30;
    for (size_t i = 0; i < y.size(); ++i) {
      md = std::max(md, std::abs(x[i] - y[i]));
      mr = std::max(mr, std::abs(y[i]));
    }
    CHECK(md / mr < 1e-4);
  }
  CHECK(fa.metadata.at("meshrt.mesh") == "tp=2");
}

TEST_CASE("outputs refuse device nodes and shared files, follow links, and fail on write errors",
          "[multirank]") {
  const std::string shape =
      "--devices cpu:2 --seq 32 --hidden 64 --heads 4 --steps 1 --warmup 0 --no-calibrate";
  // A device node is refused before the run (as root, the rename would have replaced it).
  for (const char* flag : {"--dump", "--json", "--trace"}) {
    Run r = cli("bench block " + shape + " " + flag + " /dev/null");
    INFO(r.err);
    CHECK(r.rc == 1);
    CHECK(r.err.find(std::string(flag) + " /dev/null is a character device") != std::string::npos);
  }
  CHECK(fs::is_character_file("/dev/null"));
  const fs::path same = scratch() / "same.json";
  Run r = cli("bench block " + shape + " --json " + same.string() + " --trace " + same.string());
  CHECK(r.rc == 1);
  CHECK(r.err.find("name the same file") != std::string::npos);
  CHECK(!fs::exists(same));
  // A symlink is followed: the file it names gets the JSON, the link stays.
  const fs::path real = scratch() / "real.json", link = scratch() / "link.json";
  fs::remove(link);
  fs::create_symlink(real, link);
  r = cli("bench block " + shape + " --json " + link.string());
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(fs::is_symlink(link));
  CHECK(json::parse(slurp(real))["config"].is_object());
  // A write error (file size limit: EFBIG, as a full disk gives ENOSPC) fails naming it, says
  // nothing was written, and leaves no file and no temporary behind.
  const fs::path dir = scratch() / "efbig";
  fs::create_directories(dir);
  const fs::path err = scratch() / "efbig.err";
  for (const char* flag : {"--json", "--trace"}) {
    const std::string cmd = "ulimit -f 1; trap '' XFSZ; " + sh_quote(MESHRT_CLI_BIN) +
                            " bench block " + shape + " " + flag + " " + (dir / "x").string() +
                            " >/dev/null 2>" + err.string();
    const int st = std::system(cmd.c_str());
    const std::string e = slurp(err);
    INFO(flag << ": " << e);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 1);
    // /bin/sh counts ulimit -f in blocks of 512 (dash) or 1024 (bash) bytes.
    CHECK(e.find("File too large (the file size limit, ulimit -f, is ") != std::string::npos);
    CHECK(e.find(" bytes; raise it or write less); nothing was written to " +
                 (dir / "x").string()) != std::string::npos);
    CHECK(fs::is_empty(dir));
  }
}

namespace {

// `meshrt <args>` under `ulimit -f 1` (1024 bytes) with the default SIGXFSZ action, stdout
// discarded (it would hit the limit too).
Run cli_file_limit(const std::string& args) {
  const fs::path err = scratch() / "limit.err";
  // The program's path reaches bash as $0, so it needs no quoting inside the command string.
  const std::string cmd = "bash -c 'ulimit -f 1; exec \"$0\" " + args + "' " +
                          sh_quote(MESHRT_CLI_BIN) + " >/dev/null 2>" + err.string();
  const int st = std::system(cmd.c_str());
  Run r;
  r.signaled = WIFSIGNALED(st);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = slurp(err);
  return r;
}

const std::string kPlanArgs =
    "plan --model hidden=256,heads=4,ffn=1024,layers=2,seq=128 --global-batch 16 --cluster "
    "h100-sxm:8";

}  // namespace

TEST_CASE("a file size limit fails every output like a full disk, leaving the old file",
          "[multirank]") {
  const std::string shape =
      "--devices cpu:2 --seq 32 --hidden 64 --heads 4 --steps 1 --warmup 0 --no-calibrate";
  const fs::path dir = scratch() / "fsize";
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"bench block " + shape, "--json"},
      {"bench block " + shape, "--trace"},
      {"bench block " + shape, "--dump"},
      {"sweep --devices cpu:2 --seq 32 --hidden 64 --heads 4 --batches 1,2 --steps 1 --warmup 0",
       "--json"},
      {kPlanArgs, "--json"}};
  for (const auto& [args, flag] : runs) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    const fs::path out = dir / "out";
    std::ofstream(out) << "previous";
    Run r = cli_file_limit(args + " " + flag + " " + out.string());
    INFO(args << " " << flag << ": " << r.err);
    CHECK_FALSE(r.signaled);
    CHECK(r.rc == 1);  // not 128 + SIGXFSZ (153)
    CHECK(r.err.find(flag + " " + out.string() + ": writing") != std::string::npos);
    CHECK(r.err.find("File too large (the file size limit, ulimit -f, is 1024 bytes") !=
          std::string::npos);
    CHECK(slurp(out) == "previous");
    size_t n = 0;
    for (auto& e : fs::directory_iterator(dir)) n += e.path() != out;
    CHECK(n == 0);  // no temporary left
  }
  // train --metrics appends a record per step: the limit stops it mid-record, which is cut back
  // to the last whole line, and the error names the limit.
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path m = dir / "m.jsonl";
  Run r = cli_file_limit(
      "train --hidden 32 --heads 2 --layers 1 --seq 16 --batch 4 --vocab 64 "
      "--steps 40 --metrics " +
      m.string());
  INFO(r.err);
  CHECK_FALSE(r.signaled);
  CHECK(r.rc == 1);
  CHECK(r.err.find("--metrics " + m.string() + ": write failed after ") != std::string::npos);
  CHECK(r.err.find("File too large (the file size limit, ulimit -f, is 1024 bytes") !=
        std::string::npos);
  const std::string kept = slurp(m);
  CHECK(!kept.empty());
  CHECK(kept.back() == '\n');
  fs::remove_all(dir);
}

TEST_CASE("plan --json and --calibrate refuse non-regular targets before running", "[unit]") {
  const fs::path fifo = scratch() / "plan.fifo";
  fs::remove(fifo);
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const std::string& flag : {std::string("--json"), std::string("--calibrate")}) {
    Run r = cli(kPlanArgs + " " + flag + " /dev/null");
    INFO(r.err);
    CHECK(r.rc == 1);
    CHECK(r.err.find(flag + " /dev/null is a character device, not a regular file") !=
          std::string::npos);
    CHECK(r.out.find("wrote") == std::string::npos);
    r = cli(kPlanArgs + " " + flag + " " + fifo.string());  // no hang
    CHECK(r.rc == 1);
    CHECK(r.err.find(flag + " " + fifo.string() + " is a FIFO") != std::string::npos);
  }
  const fs::path js = scratch() / "plan.json";
  Run r = cli(kPlanArgs + " --json " + js.string());
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("wrote " + js.string()) != std::string::npos);
  CHECK(json::parse(slurp(js)).is_object());
  r = cli(kPlanArgs + " --calibrate " + js.string() + " --json " + js.string());
  CHECK(r.rc == 1);
  CHECK(r.err.find("name the same file") != std::string::npos);
  fs::remove(fifo);
  fs::remove(js);
}

TEST_CASE("doctor refuses FIFOs, devices and a --trace over its own input", "[unit]") {
  const fs::path rec = scratch() / "doctor-rank0.json", link = scratch() / "doctor-link.json";
  const std::string text =
      "{\"meshrt_flight\": 1, \"rank\": 0, \"world_size\": 1, \"backend\": \"host\", "
      "\"fault\": \"\", \"reason\": \"test\", \"dumped_ns\": 0, \"entries\": []}\n";
  std::ofstream(rec) << text;
  fs::remove(link);
  fs::create_symlink(rec, link);
  for (const fs::path& out : {rec, link}) {
    Run r = cli("doctor " + rec.string() + " --trace " + out.string());
    INFO(r.err);
    CHECK(r.rc == 1);
    CHECK(r.err.find("--trace " + out.string() + " is the input " + rec.string()) !=
          std::string::npos);
    CHECK(slurp(rec) == text);
  }
  const fs::path fifo = scratch() / "doctor.fifo";
  fs::remove(fifo);
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const std::string& in : {fifo.string(), std::string("/dev/zero")}) {
    Run r = cli("doctor " + in);  // neither hangs nor reads without end
    INFO(r.err);
    CHECK(r.rc == 1);
    CHECK(r.err.find("meshrt doctor: flight record " + in + ": is ") != std::string::npos);
    CHECK(r.err.find(", not a regular file") != std::string::npos);
  }
  Run r = cli("doctor " + rec.string() + " --trace /dev/null");
  CHECK(r.rc == 1);
  CHECK(r.err.find("--trace /dev/null is a character device") != std::string::npos);
  const fs::path tr = scratch() / "doctor-trace.json";
  r = cli("doctor " + rec.string() + " --trace " + tr.string());
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(json::parse(slurp(tr)).is_object());
  fs::remove(fifo);
}

TEST_CASE("a tiny sweep covers every factorisation and writes JSON and a PNG", "[multirank]") {
  const fs::path js = scratch() / "sweep.json", png = scratch() / "sweep.png";
  Run r =
      cli("sweep --devices cpu:2 --seq 32 --hidden 64 --heads 4 --batches 1,2 --steps 2 --warmup 0 "
          "--json " +
          js.string() + " --plot " + png.string());
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("best") != std::string::npos);
  CHECK(r.err.find("ETA") != std::string::npos);  // the progress line
  json j = json::parse(slurp(js));
  // dp=2,tp=1 (sp n/a) and dp=1,tp=2 with sp off and on, each with batches 1 and 2.
  REQUIRE(j["results"].size() == 6);
  int best = 0;
  double prev = 1e300;
  std::set<std::string> seen;
  for (auto& res : j["results"]) {
    const double tps = res["tokens_per_s"];
    CHECK(tps <= prev);  // sorted by throughput
    prev = tps;
    best += res["best"].get<bool>() ? 1 : 0;
    seen.insert(res["config"]["mesh"].get<std::string>() +
                (res["config"]["sp"].get<bool>() ? "+sp" : "") + "/" +
                std::to_string(res["config"]["batch_per_replica"].get<int>()));
  }
  CHECK(best == 1);
  CHECK(j["results"][0]["best"] == true);
  CHECK(seen == std::set<std::string>{"dp=2,tp=1/1", "dp=2,tp=1/2", "dp=1,tp=2/1", "dp=1,tp=2/2",
                                      "dp=1,tp=2+sp/1", "dp=1,tp=2+sp/2"});
  std::ifstream p(png, std::ios::binary);
  char sig[8] = {};
  p.read(sig, 8);
  CHECK(std::string(sig + 1, 3) == "PNG");
}

namespace {

// The part of a --help text after "Options:" (the usage line names the program).
std::string options_part(const std::string& help) {
  const size_t at = help.find("Options:");
  return at == std::string::npos ? std::string() : help.substr(at);
}

struct Program {
  const char* name;  // `meshrt bench <name>`
  const char* bin;   // its standalone program
};
const Program kPrograms[] = {{"collective", MESHRT_BENCH_COLLECTIVE_BIN},
                             {"gemm", MESHRT_BENCH_GEMM_BIN}};

}  // namespace

TEST_CASE("the registry lists every benchmark and the CLI offers each with its flags", "[unit]") {
  std::set<std::string> names;
  for (const meshrt::bench::Entry& e : meshrt::bench::registry()) {
    INFO(e.name);
    CHECK(names.insert(e.name).second);  // no name twice
    CHECK(!e.description.empty());
    // `meshrt bench --help` / `meshrt --help` list it with its description, and its own --help
    // shows every flag its command adds.
    Run list = cli(e.top_level ? "--help" : "bench --help");
    CHECK(list.out.find(e.name) != std::string::npos);
    CHECK(list.out.find(e.description.substr(0, 40)) != std::string::npos);
    Run help = cli(std::string(e.top_level ? "" : "bench ") + e.name + " --help");
    CHECK(help.rc == 0);
    CLI::App app;
    std::unique_ptr<meshrt::bench::Command> cmd = e.make();
    meshrt::bench::bind_flags(app, *cmd);
    int flags = 0;
    for (const CLI::Option* o : app.get_options()) {
      if (o->get_group().empty()) continue;  // hidden (the sweep's --mesh)
      for (const std::string& l : o->get_lnames()) {
        ++flags;
        CHECK(help.out.find("--" + l) != std::string::npos);
      }
    }
    CHECK(flags >= 5);
  }
  for (const char* n : {"block", "mlp", "attn", "collective", "gemm", "sweep", "plan"})
    CHECK(names.count(n) == 1);
}

TEST_CASE("standalone programs and the CLI have the same flags, checks and messages", "[unit]") {
  for (const Program& p : kPrograms) {
    INFO(p.bin);
    Run a = cli(std::string("bench ") + p.name + " --help"), b = run(p.bin, "--help");
    CHECK(a.rc == 0);
    CHECK(b.rc == 0);
    CHECK(!options_part(a.out).empty());
    CHECK(options_part(a.out) == options_part(b.out));
  }
  struct Case {
    const char* name;
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      {"collective", "--seed -1", "--seed: '-1' is not an integer >= 0"},
      {"collective", "-b 12Q", "size '12Q' is not a byte count"},
      {"collective", "-i 1X", "size '1X' is not a byte count"},
      {"collective", "--op all_gatherv", "use one of all_reduce"},
      {"collective", "-b 1K -e 512", "-b 1024 must be >= 0 and <= -e 512"},
      {"collective", "-n 0", "--iters: '0' is not an integer >= 1"},
      {"collective", "-a 7", "-a 7: use 0 \\(rank 0\\)"},
      {"collective", "-f 1", "--stepfactor: '1' is not a number > 1"},
      {"collective", "--frobnicate", "not expected: --frobnicate"},
      {"gemm", "-m -1 -n 4 -k 4", "-m: '-1' is not an integer from 1 to 2147483648"},
      {"gemm", "--dtype i32", "--dtype i32 must be f32, bf16 or f16"},
      {"gemm", "--repeats 0", "--repeats: '0' is not an integer from 1 to 1000000"},
      {"gemm", "--tokens -4", "--tokens: '-4' is not an integer from 0 to 2147483648"},
      {"gemm", "--devices gpu:1", "unknown device kind 'gpu'"},
      {"gemm", "--frobnicate", "not expected: --frobnicate"},
      {"gemm", "--fault crash@rank=0,step=1", "--fault crash@rank=0,step=1: the gemm benchmark"},
      {"collective", "--op all_to_all -o min", "-o min would be ignored"},
  };
  for (const Case& c : cases) {
    const std::string bin =
        c.name == std::string("collective") ? MESHRT_BENCH_COLLECTIVE_BIN : MESHRT_BENCH_GEMM_BIN;
    const std::string prog = fs::path(bin).filename().string();
    INFO("meshrt bench " << c.name << " " << c.args << " vs " << prog << " " << c.args);
    Run a = cli(std::string("bench ") + c.name + " " + c.args), b = run(bin, c.args);
    INFO("meshrt: " << a.err << prog << ": " << b.err);
    CHECK(a.rc > 0);
    CHECK(a.rc < 128);
    CHECK(a.rc == b.rc);
    CHECK(std::regex_search(a.err, std::regex(c.expect)));
    CHECK(a.out.empty());
    CHECK(b.out.empty());
    // The same text, but for the program's name in front of a checked option's error.
    std::string b_err = b.err;
    if (b_err.rfind(prog + ":", 0) == 0) b_err = "meshrt" + b_err.substr(prog.size());
    CHECK(a.err == b_err);
  }
}

TEST_CASE("standalone programs and the CLI take the last of a repeated flag", "[multirank]") {
  Run a = cli("bench collective --devices cpu:2 --backend host -b 1K -e 4K -f 4 -w 0 -n 1 -n 2");
  Run b = run(MESHRT_BENCH_COLLECTIVE_BIN,
              "--devices cpu:2 --backend host -b 1K -e 4K -f 4 -w 0 -n 1 -n 2");
  for (const Run* r : {&a, &b}) {
    INFO(r->out << r->err);
    CHECK(r->rc == 0);
    CHECK(r->out.find("# minBytes 1024 maxBytes 4096 step: 4.000000(factor) warmup iters: 0 "
                      "iters: 2 validation: 1") != std::string::npos);
    CHECK(r->out.find("# Out of bounds values : 0 OK") != std::string::npos);
  }
  const std::string g =
      "-m 16 -n 8 -k 4 --no-elementwise --no-attention --warmup 0 --repeats 3 "
      "--repeats 1";
  Run c = cli("bench gemm " + g), d = run(MESHRT_BENCH_GEMM_BIN, g);
  for (const Run* r : {&c, &d}) {
    INFO(r->out << r->err);
    CHECK(r->rc == 0);
    CHECK(r->out.find("median of 1 runs") != std::string::npos);
    CHECK(std::regex_search(r->out, std::regex("custom +16 +8 +4 ")));
  }
}

namespace {

// `meshrt <args>` under `ulimit -v kib`, killed (exit 137) if it has not ended after 240 s.
Run cli_address_limit(uint64_t kib, const std::string& args) {
  return meshrt::test::run_shell("timeout -s KILL 240 bash -c 'ulimit -v " + std::to_string(kib) +
                                     "; exec \"$0\" " + args + "' " + sh_quote(MESHRT_CLI_BIN),
                                 scratch());
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kCliSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kCliSanitized = true;
#else
constexpr bool kCliSanitized = false;
#endif
#else
constexpr bool kCliSanitized = false;
#endif

}  // namespace

TEST_CASE("an address-space limit (ulimit -v) is a clear error or a clean run, never a hang",
          "[unit]") {
  if (kCliSanitized) {
    WARN("skipped: a sanitizer's shadow memory needs far more address space than any ulimit -v");
    return;
  }
  // Before, OpenBLAS's worker thread spun on its 128 MiB buffer and the exit waited for it;
  // a train spun in its first GEMM. Now: 1 OpenBLAS thread, and a limit below the need refused.
  const Run t = cli_address_limit(1200000, "train --devices cpu:2 --steps 2");
  INFO(t.err);
  CHECK(t.rc == 1);
  const std::regex need(
      "meshrt: error: the address-space limit \\(ulimit -v\\) is 1200000 KiB, "
      "but meshrt needs at least ([0-9]+) KiB here: ([0-9]+) KiB of libraries "
      "mapped at start, .*; raise it \\(ulimit -v \\1\\) or remove it \\(ulimit "
      "-v unlimited\\)\n");
  std::smatch m;
  REQUIRE(std::regex_search(t.err, m, need));
  // `meshrt info` runs no kernel: it works with less than an OpenBLAS buffer to spare.
  const uint64_t mapped_kib = std::stoull(m[2].str());
  const Run i = cli_address_limit(mapped_kib + 100000, "info");
  INFO(i.err);
  CHECK(i.rc == 0);
  CHECK_THAT(i.out, Catch::Contains("meshrt "));
}

TEST_CASE("the model flags accept and refuse the same values in every command", "[unit]") {
  // bench block|mlp|attn, sweep and train register them with one function (cli::add_model_flags),
  // plan its --dtype: the same rule and the same message everywhere (docs/cli.md, "Model flags").
  // Before, train took --ffn 0 and any --dtype the runtime knew (i32 failed only in the run).
  const std::vector<std::string> cmds = {"bench block", "bench mlp", "bench attn", "sweep",
                                         "train"};
  const std::vector<RefusedCase> refused = {
      {"--ffn 0", "--ffn: '0' is not an integer >= 1"},
      {"--hidden -4", "--hidden: '-4' is not an integer >= 1"},
      {"--dtype i32", "--dtype: i32 not in {f32,bf16,f16}"},
  };
  for (const RefusedCase& c : refused) {
    std::vector<std::string> with = cmds;
    if (c.args.rfind("--dtype", 0) == 0) with.push_back("plan");
    for (const std::string& cmd : with) {
      INFO("meshrt " << cmd << " " << c.args);
      Run r = cli(cmd + " " + c.args);
      CHECK(r.rc == 1);
      CHECK(r.out.empty());
      CHECK(r.err == "meshrt: error: " + c.expect + "\nRun with --help for more information.\n");
    }
  }
  // Accepted alike: the parser gets past them to the unknown flag after.
  for (const std::string& cmd : cmds) {
    INFO(cmd);
    Run r = cli(cmd + " --ffn 64 --hidden 32 --dtype f16 --frob");
    CHECK(r.rc == 1);
    CHECK(r.err.rfind("meshrt: error: The following argument was not expected: --frob\n", 0) == 0);
  }
  Run p = cli("plan --dtype f16 --frob");
  CHECK(p.err.rfind("meshrt: error: The following argument was not expected: --frob\n", 0) == 0);
}
