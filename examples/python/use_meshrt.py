"""The examples' one way to the meshrt Python package: the installed one (pip install .), else
this repository's python/meshrt; either loads the libmeshrt.so named on the command line
(MESHRT_LIBRARY), so the examples run against a build tree or an installed library alike."""
import os
import sys


def meshrt_for(lib_path):
    os.environ["MESHRT_LIBRARY"] = os.path.abspath(lib_path)
    try:
        import meshrt
    except ImportError:
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.join(here, "..", "..", "python"))
        import meshrt
    return meshrt
