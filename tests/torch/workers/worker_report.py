"""The workers' one output function (each worker imports it: torchrun and the fault test run
the workers with this folder on sys.path)."""
import os


def report(line):
    """Prints line and appends it to <MESHRT_TORCH_TEST_OUT>/rank<r>.txt (the tests read those
    files: the ranks' output through torchrun may interleave)."""
    print(line, flush=True)
    out = os.environ.get("MESHRT_TORCH_TEST_OUT")
    if out:
        with open(os.path.join(out, f"rank{os.environ.get('RANK', '0')}.txt"), "a") as f:
            f.write(line + "\n")
