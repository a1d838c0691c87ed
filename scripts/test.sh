#!/usr/bin/env bash
# Every test: installs what is missing, builds, then runs
#   1. the release build's tests (unit, golden, CLI; CUDA tests skip without a device),
#   2. the same tests built with AddressSanitizer + UndefinedBehaviorSanitizer (clang, CPU-only),
#   3. each libFuzzer target of that same tree for FUZZ_SECONDS (default 30) on a seed corpus.
# Environment: FUZZ_SECONDS, SKIP_ASAN=1, SKIP_FUZZ=1, SKIP_DOC_COMMANDS=1 (leaves out the tests
# labelled `docs`: every command the README, docs/API.md and docs/PROFILING.md print, run as
# printed; under a minute).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# Each step says when it began, so a CI log shows where its minutes go.
step() { printf '\n== %s (at %d s)\n' "$*" "$(( $(date +%s) - start ))"; }

step "setup"
bash scripts/setup.sh
step "build (release)"
bash scripts/build.sh build -DCMAKE_BUILD_TYPE=Release -DBEV_TESTS=ON -DBEV_BENCH=ON  # scripts/run.sh builds without them
step "tests (release)"
# The official Triton client, for ctest tritonclient: from PyPI, once; offline, that test skips.
if [ ! -x build/venv-triton/bin/python ] || ! build/venv-triton/bin/python -c "import tritonclient.grpc" 2>/dev/null; then
  rm -rf build/venv-triton
  if python3 -m venv build/venv-triton && timeout 300 build/venv-triton/bin/pip install -q "tritonclient[http,grpc]" numpy; then
    echo "tritonclient: installed into build/venv-triton"
  else
    echo "tritonclient: could not be installed from PyPI; ctest tritonclient will skip"
  fi
fi
docs=()
[ "${SKIP_DOC_COMMANDS:-0}" = 1 ] && docs=(-LE docs)
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 600 "${docs[@]}" | tee build/ctest-output.log
python3 scripts/skipped_tests.py build  # ctest says only "Skipped"; each test's reason

# The cap makes oneDNN and every kernel of ours take a Zen 3's path (core/cpu_features.h), so a
# machine with AVX-512 also checks what AVX2 machines depend on: batches bit-identical to each
# stream alone (RowGemm), results independent of the thread count, each dispatch level against
# its reference, bf16 refused clearly. On a CPU without AVX-512 the run above already was this.
if ! grep -qw avx512f /proc/cpuinfo; then
  echo "tests (release, capped to AVX2): skipped, this CPU has no AVX-512 and the run above took its AVX2 path"
else
step "tests (release, as an AVX2-only CPU runs them: ONEDNN_MAX_CPU_ISA=AVX2)"
ONEDNN_MAX_CPU_ISA=AVX2 ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 600 \
  -R 'BatchGolden|Linear|RowGemm|CpuIsa|Conv2dBatch|DeformConv2d|CpuAttention|cli_detect_batch|ForeignBackend.GoldenMicro|BevFormerPipeline|PlanAllocations|Server.BatchedFramesEqualTheLibrary|OipServer.BatchedSequencesEqualTheLibrary|ModelApi.DetectBatch|compare_reference_micro|cli_threads_invariant|backend_ops_threads' \
  | tee build/ctest-avx2-output.log
fi

# One clang tree serves the sanitizer tests and the fuzz targets: every library built once with
# ASan+UBSan and libFuzzer's coverage instrumentation, at -O1 with line tables (the test files' own
# code at -O0, the heavy ones at -O1: tests/CMakeLists.txt). Until 2026-12-04
# there were two trees, GCC -O0 for the tests and clang -O2 for the fuzzers: on the AMX Xeon
# 495 + 223 s of build and 426 s of tests, against about 470 s of build and 185 s of tests here.
# Our OpenMP code links LLVM's libomp in this tree (GCC's libgomp in the release build, whose
# tests cover it); scripts/lsan.supp holds libomp's leak at exit (test_core only).
if [ "${SKIP_ASAN:-0}" != 1 ] || [ "${SKIP_FUZZ:-0}" != 1 ]; then
  step "build (ASan+UBSan and libFuzzer, clang -O1, CPU only)"
  # A build-asan of GCC's (before 2026-12-04) cannot switch compilers in place.
  if [ -f build-asan/CMakeCache.txt ] && ! grep -q '^CMAKE_CXX_COMPILER:.*clang++' build-asan/CMakeCache.txt; then
    rm -rf build-asan
  fi
  target=""
  [ "${SKIP_ASAN:-0}" = 1 ] && target=fuzz_all  # the fuzz targets alone
  TARGET=$target bash scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=Debug \
    "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -gline-tables-only" "-DCMAKE_C_FLAGS_DEBUG=-O1 -gline-tables-only" \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DBEV_SANITIZE=ON -DBEV_FUZZ=ON -DBEV_CUDA=OFF -DBEV_BENCH=OFF
fi

if [ "${SKIP_ASAN:-0}" != 1 ]; then
  step "tests (ASan+UBSan)"
  echo "python: the package is not built under ASan (an ASan extension needs libasan preloaded into python3); the release tests ran it"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$(nproc)" --timeout 900 -LE slow | tee build-asan/ctest-output.log
  python3 scripts/skipped_tests.py build-asan
fi

if [ "${SKIP_FUZZ:-0}" != 1 ]; then
  step "fuzz (libFuzzer, ${FUZZ_SECONDS:-30} s per target)"
  bash scripts/fuzz.sh build-asan "${FUZZ_SECONDS:-30}"
fi

step "all tests passed in $(( $(date +%s) - start )) s"
