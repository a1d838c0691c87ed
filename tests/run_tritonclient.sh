#!/usr/bin/env bash
# ctest tritonclient: the official Triton client (PyPI's tritonclient, which no one here wrote)
# against `bevformer serve`, alone and through HAProxy (tests/check_tritonclient.py). It needs a
# virtual environment with tritonclient, which scripts/test.sh makes from PyPI when it can; without
# one the test is skipped, saying so.
# Usage: run_tritonclient.sh VENV BEVFORMER_BINARY BUILD_DIR
venv=$1
shift
if ! "$venv/bin/python" -c "import tritonclient.http, tritonclient.grpc, numpy" 2>/dev/null; then
  echo "no virtual environment with tritonclient at $venv (scripts/test.sh makes it from PyPI; docs/DEPLOY.md says how)"
  exit 77
fi
exec "$venv/bin/python" "$(dirname "$0")/check_tritonclient.py" "$@"
