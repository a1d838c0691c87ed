#!/usr/bin/env bash
# Installs everything bevformer.cpp needs to build and test on Debian 12, with apt. Idempotent and
# quiet: when every package is already there it does nothing and says so in one line.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  clang libclang-rt-14-dev lld          # libFuzzer targets and sanitizer runtimes
  zlib1g-dev                            # CRC-32 of checkpoint archive entries
  nlohmann-json3-dev libcli11-dev
  libboost1.81-dev                      # the HTTP server: Boost.Asio sockets, Boost.Beast's HTTP/1.1 parser
  libcpp-httplib-dev wrk                # HTTP client of the tests and bench/load_client; load tools
  libjpeg62-turbo-dev                   # JPEG data checked scan by scan (libjpeg's warnings as errors)
  libdnnl-dev ocl-icd-opencl-dev        # oneDNN 2.6 (its CMake config needs the OpenCL headers)
  libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev  # image decode, resize, drawing
  libopencv-videoio-dev                 # detect --video (OpenCV's writer; its FFmpeg backend writes H.264)
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-torch python3-numpy libopenblas0-openmp  # reference/ (PyTorch reference; OpenBLAS: netlib BLAS is ~7x slower)
)

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
