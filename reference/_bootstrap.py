"""Finds a Python with Debian's python3-torch: scripts call ensure_torch() before importing it.

Debian installs torch for /usr/bin/python3; a python3 earlier on PATH (pyenv, a venv) may not
see it, so the script re-runs itself under /usr/bin/python3. Without torch anywhere it exits 77
(ctest's SKIP_RETURN_CODE) saying how to install it."""

import os
import sys

sys.dont_write_bytecode = True  # keep reference/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SKIP = 77


def ensure_torch():
    try:
        import torch  # noqa: F401
        import numpy  # noqa: F401
        return
    except ImportError as e:
        err = e
    system = "/usr/bin/python3"
    if os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system) \
            and not os.environ.get("BEVFORMER_REF_REEXEC"):
        os.environ["BEVFORMER_REF_REEXEC"] = "1"
        os.execv(system, [system, "-B"] + sys.argv)
    print(f"reference: {err}; install python3-torch and python3-numpy (scripts/setup.sh)", file=sys.stderr)
    sys.exit(SKIP)
