#!/usr/bin/env bash
# Installs what bevformer.cpp needs on Debian 12, with apt. Idempotent and quiet: when every
# package is already there it does nothing and says so in one line.
#   setup.sh          everything: build, run and test (scripts/test.sh, CI)
#   setup.sh --main   only what the main job needs: build the engine and the CLI, and run them
#                     (scripts/run.sh): no test frameworks, PyTorch, clang or load tools
set -euo pipefail

MAIN_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  zlib1g-dev                            # CRC-32 of checkpoint archive entries
  nlohmann-json3-dev libcli11-dev
  libboost1.81-dev                      # the HTTP server: Boost.Asio sockets, Boost.Beast's HTTP/1.1 parser
  libjpeg62-turbo-dev                   # JPEG data checked scan by scan (libjpeg's warnings as errors)
  libdnnl-dev ocl-icd-opencl-dev        # oneDNN 2.6 (its CMake config needs the OpenCL headers)
  libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev  # image decode, resize, drawing
  libopencv-videoio-dev                 # detect --video (OpenCV's writer; its FFmpeg backend writes H.264)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler  # serve --grpc-port (the Open Inference Protocol over gRPC)
)
TEST_PACKAGES=(
  clang libclang-rt-14-dev lld          # libFuzzer targets and sanitizer runtimes
  libcpp-httplib-dev wrk                # HTTP client of the tests and bench/load_client; load tools
  libgtest-dev libgmock-dev libbenchmark-dev
  haproxy curl python3-venv             # deploy/haproxy.cfg, scripts/fleet.sh; the tritonclient checks' venv
  curl jq                               # the documentation's commands (tests/check_doc_commands.py)
  python3-torch python3-numpy libopenblas0-openmp  # reference/ (PyTorch reference; OpenBLAS: netlib BLAS is ~7x slower)
  python3-dev pybind11-dev python3-pybind11 python3-pytest python3-distributed python3-venv  # the Python package (docs/PYTHON.md)
)
PACKAGES=("${MAIN_PACKAGES[@]}")
[ "${1:-}" = --main ] || PACKAGES+=("${TEST_PACKAGES[@]}")

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
  command -v sudo >/dev/null || { echo "setup: missing packages (${missing[*]}) and not root; run as root" >&2; exit 1; }
else
  SUDO=
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  echo "setup: apt-get failed installing: ${missing[*]}" >&2
  tail -n 20 "$log" >&2
  echo "setup: check the network to the Debian mirror and that this is Debian 12 (bookworm)" >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
echo "setup: done"
