"""Compares the `step N loss X` lines of two `meshrt train` outputs.
Usage: same_losses.py <reference output> <output> <steps> <relative tolerance>
Prints both curves; exits non-zero unless each has <steps> losses, each within the tolerance
(relative, at least of 1.0 in magnitude) of the reference's."""
import re
import sys


def losses(path):
    text = open(path).read()
    return [float(m.group(1)) for m in re.finditer(r"^step \d+ loss ([0-9.]+)", text, re.M)]


ref, got = losses(sys.argv[1]), losses(sys.argv[2])
steps, tol = int(sys.argv[3]), float(sys.argv[4])
print("reference:", ref, "\nrun:      ", got)
assert len(ref) == steps and len(got) == steps, (ref, got)
assert all(abs(a - b) <= tol * max(1.0, abs(a)) for a, b in zip(ref, got)), (ref, got)
