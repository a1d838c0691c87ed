#!/usr/bin/env python3
"""ctest cli_threads_invariant: the engine's results do not depend on --threads.
Standard library only.

    check_threads_invariant.py BEVFORMER MICRO_DIR TMP

`golden MICRO_DIR --dump` with 1, 2 and 3 threads, each its own process (a kernel's work split
is fixed when its primitive is made, once per process: two thread counts in one process would
share it), in f32, replayed and eager: every dumped tensor of every frame byte for byte the same.
scripts/test.sh also runs it under ONEDNN_MAX_CPU_ISA=AVX2, where oneDNN's gemm:jit splits a
product's K over the team (the decoder's attention did, until its products were made for one
thread)."""

import os
import subprocess
import sys

binary, micro, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
failures = []
for mode in ([], ["--eager"]):
    dumps = {}
    for threads in (1, 2, 3):
        out = os.path.join(tmp, f"t{threads}{mode[0] if mode else ''}")
        r = subprocess.run([binary, "-q", "golden", micro, "--threads", str(threads), "--dump", out, *mode],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"golden --threads {threads} {' '.join(mode)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
        dumps[threads] = {f: open(os.path.join(out, f), "rb").read() for f in sorted(os.listdir(out))}
    if not dumps[1]:
        sys.exit("golden --dump wrote no files")
    for threads in (2, 3):
        if sorted(dumps[threads]) != sorted(dumps[1]):
            failures.append(f"--threads {threads}: files {sorted(dumps[threads])}, want {sorted(dumps[1])}")
            continue
        for f, data in dumps[1].items():
            if dumps[threads][f] != data:
                failures.append(f"{' '.join(mode) or 'replay'}: {f} differs between --threads 1 and --threads {threads}")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print(f"golden --dump: {len(dumps[1])} frame files byte-identical with 1, 2 and 3 threads, replayed and eager")
