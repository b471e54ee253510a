#!/usr/bin/env python3
"""lint.from_blob_owner: library code wraps no memory of its own in a Tensor::from_blob without a
deleter.

Such a tensor owns nothing, so the host tasks queued on it cannot keep its memory alive: a local
buffer freed by an exception unwinding past it while a copy from it is still queued is read after
it was freed (the --dump failure of `meshrt bench block`, a heap-use-after-free under ASan).
Library code hands data over with Tensor::from_host_data (a copy the queued work owns) or passes
a deleter that owns the memory. A deleter-less from_blob is for memory the caller owns and keeps
(the C API's borrowed DLTensor): those files are listed in ALLOWED.

Usage: from_blob_owner.py <source root> <folder>...
Exit status: 0 pass, 1 a call without a deleter (each named with file and line), or no call found
at all (the scan would pass on nothing).
"""
import os
import re
import sys

# Files whose deleter-less from_blob wraps memory its caller owns by contract.
ALLOWED = {"capi/tensor.cpp", "runtime/tensor.cpp"}
CALL = re.compile(r"\bTensor::from_blob\s*\(")


def arguments(text, start):
    """The top-level arguments of the call whose '(' is at text[start - 1]."""
    depth, args, cur = 0, [], []
    for ch in text[start:]:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                args.append("".join(cur).strip())
                return args
            depth -= 1
        elif ch == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    return args


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    root, folders = argv[1], argv[2:]
    bad, calls = [], 0
    for folder in folders:
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in files:
                if not name.endswith((".cpp", ".h", ".cu")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for m in CALL.finditer(text):
                    calls += 1
                    args = arguments(text, m.end())
                    deleter = args[4] if len(args) > 4 else ""
                    if deleter in ("", "nullptr", "{}") and rel not in ALLOWED:
                        line = text.count("\n", 0, m.start()) + 1
                        bad.append(f"{rel}:{line}: Tensor::from_blob without a deleter: queued "
                                   "work cannot keep that memory alive; use "
                                   "Tensor::from_host_data or pass a deleter that owns it")
    for b in bad:
        print(b)
    if calls == 0:
        print("no Tensor::from_blob call found under " + " ".join(folders) + ": wrong root?")
        return 1
    print(f"{calls} Tensor::from_blob calls, {len(bad)} without a deleter outside "
          f"{sorted(ALLOWED)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
