#!/usr/bin/env python3
"""lint.function_length: no function over 120 lines outside kernels/ (docs/extending.md).

Runs lizard (https://github.com/terryyin/lizard; tools/install-deps.sh puts it in .venv-ci)
over the source folders given and fails naming every function longer than the limit, with its
file, line and length. Refuses to pass vacuously: lizard must have analysed at least MIN_FILES
files with functions, every folder given must have contributed some, and the total must reach
MIN_FUNCTIONS.

Usage: function_length.py <source root> <max lines> <min files> <min functions> <folder>...
Exit status: 0 pass, 1 a function too long (or too little analysed), 77 (ctest skip) only when
no lizard can be found or installed.
"""
import csv
import os
import shutil
import subprocess
import sys


def find_lizard(src):
    venv = os.path.join(src, ".venv-ci", "bin", "lizard")
    if os.access(venv, os.X_OK):
        return venv
    on_path = shutil.which("lizard")
    if on_path:
        return on_path
    # As the checkpoint test does for safetensors: make the venv, then look again.
    deps = os.path.join(src, "tools", "install-deps.sh")
    if subprocess.call([deps, "--python-venv"], stdout=sys.stderr) == 0 and os.access(venv, os.X_OK):
        return venv
    return None


def main(argv):
    if len(argv) < 6:
        print(__doc__, file=sys.stderr)
        return 2
    src, limit, min_files, min_functions = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    folders = argv[5:]
    lizard = find_lizard(src)
    if lizard is None:
        print("SKIP: lizard is not installed (tools/install-deps.sh --python-venv puts it in "
              f"{src}/.venv-ci; pip could not reach PyPI?)")
        return 77
    missing = [f for f in folders if not os.path.isdir(os.path.join(src, f))]
    if missing:
        print(f"FAIL: no folder {', '.join(missing)} under {src}: update the list in "
              "tests/lint/CMakeLists.txt")
        return 1
    # --csv: one row per function: NLOC, CCN, tokens, parameters, length, location, file,
    # name, long name, first line, last line. -C/-L only set warning marks; the CSV has all.
    run = subprocess.run([lizard, "--csv", *folders], cwd=src, capture_output=True, text=True)
    if run.returncode != 0:
        print(f"FAIL: {lizard} --csv {' '.join(folders)} exited {run.returncode}:\n{run.stderr}")
        return 1
    files, per_folder, too_long, functions = set(), {f: 0 for f in folders}, [], 0
    for row in csv.reader(run.stdout.splitlines()):
        if len(row) < 11 or not row[0].isdigit():
            continue  # a header line (lizard versions differ)
        length, path, name, first = int(row[4]), row[6], row[7], row[9]
        functions += 1
        files.add(path)
        top = os.path.normpath(path).split(os.sep)[0]
        if top in per_folder:
            per_folder[top] += 1
        if length > limit:
            too_long.append(f"{path}:{first}: {name} is {length} lines")
    print(f"lizard ({lizard}) analysed {functions} functions in {len(files)} files of "
          f"{', '.join(folders)}; limit {limit} lines")
    bad = False
    if len(files) < min_files or functions < min_functions:
        print(f"FAIL: only {len(files)} files / {functions} functions analysed (expected at "
              f"least {min_files} / {min_functions}): lizard found nothing to check; is "
              f"{src} the source root?")
        bad = True
    empty = [f for f, n in per_folder.items() if n == 0]
    if empty:
        print(f"FAIL: lizard found no function in {', '.join(empty)}")
        bad = True
    if too_long:
        print(f"FAIL: {len(too_long)} function(s) over {limit} lines outside kernels/; split "
              "each into named helpers:")
        for t in too_long:
            print("  " + t)
        bad = True
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
