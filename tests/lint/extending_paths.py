#!/usr/bin/env python3
"""lint.extending_paths: every file a recipe of docs/extending.md lists exists.

Reads the numbered lists of docs/extending.md (an item and its indented continuation lines;
fenced code blocks are left out) and takes each backticked span that names a path: its first
word contains a "/" or ends in a source or build file extension. A path with a placeholder
(`kernels/host/<family>.cpp`) is skipped. A bare name (`ops.cpp`) or a path relative to a folder
named in the same recipe (`host/isa.h` after `kernels/ops.h`) is looked up under the repository
root and under every folder (and its parents) that a path anywhere in the same section names; a
lone extension (`model/blocks.h` / `.cpp`) means the path before it with that extension. Fails
naming every path that exists nowhere, with its section and line.

Usage: extending_paths.py <source root> [<markdown file>]   (default: docs/extending.md)
Exit status: 0 pass, 1 a missing path or too few paths checked (the parser found no lists).
"""
import os
import re
import sys

EXTENSIONS = ("h", "hpp", "c", "cpp", "cu", "cuh", "py", "sh", "cmake", "txt", "md", "map",
              "json", "in")
BARE = re.compile(r"^[\w.+-]+\.(" + "|".join(EXTENSIONS) + r")$")
PATHISH = re.compile(r"^[\w.+/-]+$")
ITEM = re.compile(r"^\s*\d+\.\s")
MIN_PATHS = 100  # today about 130: a parser that finds none must not pass


def sections(lines):
    """(heading, [(line number, text)]) per '## ' section."""
    out, title, body, fenced = [], "(top)", [], False
    for no, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if line.startswith("## "):
            out.append((title, body))
            title, body = line[3:].strip(), []
        else:
            body.append((no, line))
    out.append((title, body))
    return out


def list_items(body):
    """(line number, joined text) of each numbered item with its indented continuation."""
    items, cur = [], None
    for no, line in body:
        if ITEM.match(line):
            if cur:
                items.append(cur)
            cur = [no, line.strip()]
        elif cur and line.startswith(" ") and line.strip():
            cur[1] += " " + line.strip()
        else:
            if cur:
                items.append(cur)
            cur = None
    if cur:
        items.append(cur)
    return items


def candidates(text):
    """Backticked spans whose first word looks like a path (placeholders included)."""
    for span in re.findall(r"`([^`]+)`", text):
        word = span.strip().split()[0] if span.strip() else ""
        if re.fullmatch(r"\.\w+", word):
            yield word  # a lone extension: the previous path's
        elif PATHISH.match(word.replace("<", "").replace(">", "")) and (
                "/" in word or BARE.match(word.replace("<", "x").replace(">", "x"))):
            yield word


def folders(paths):
    """The folders a section's paths name, with their parents (placeholders cut off)."""
    out = set()
    for p in paths:
        if "<" in p:
            p = p[:p.index("<")]
            p = p[:p.rfind("/") + 1] if "/" in p else ""
        d = p if p.endswith("/") else os.path.dirname(p)
        while d:
            out.add(d.rstrip("/"))
            d = os.path.dirname(d.rstrip("/"))
    return out


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = argv[1]
    doc = argv[2] if len(argv) > 2 else os.path.join(root, "docs", "extending.md")
    with open(doc, encoding="utf-8") as f:
        lines = f.read().splitlines()
    missing, checked = [], 0
    for title, body in sections(lines):
        every = [p for _, text in body for p in candidates(text) if not p.startswith(".")]
        where = [""] + sorted(folders(every))
        for no, text in list_items(body):
            prev = None
            for p in candidates(text):
                if p.startswith("."):
                    if prev is None:
                        missing.append(f"{doc}:{no}: [{title}] '{p}' follows no path")
                        continue
                    p = os.path.splitext(prev)[0] + p
                prev = p
                if "<" in p:
                    continue
                checked += 1
                if not any(os.path.exists(os.path.join(root, d, p)) for d in where):
                    missing.append(f"{doc}:{no}: [{title}] '{p}' does not exist (looked under "
                                   f"the root and {', '.join(d + '/' for d in where[1:]) or '-'})")
    for m in missing:
        print("FAIL: " + m)
    if missing:
        print(f"{len(missing)} path(s) of the recipes do not exist: fix the recipe (or the code)")
        return 1
    if checked < MIN_PATHS:
        print(f"FAIL: only {checked} paths found in the numbered lists of {doc} (expected at least "
              f"{MIN_PATHS}): the parser no longer matches the page")
        return 1
    print(f"{checked} paths of the recipes in {doc} exist")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
