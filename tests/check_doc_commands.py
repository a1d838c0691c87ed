#!/usr/bin/env python3
"""ctest doc_commands: every command README.md, docs/API.md and docs/PROFILING.md print runs from
the repository root as printed, after the main job. Standard library only (plus curl and jq,
which the API examples use).

    check_doc_commands.py REPO BUILD_DIR SHARED_DIR TMP

A workspace TMP/repo stands in for the repository root: `build` is BUILD_DIR, `data` the
repository's, `../shared` SHARED_DIR, and `out/demo/frames` what the main job (scripts/run.sh)
converts. Commands are the lines of ```sh blocks (comments and continuations joined) and the
`$ ` lines of ```text blocks. Each runs with bash from the workspace and must exit as the doc
says (0 unless listed below); a server the docs start runs in the background until the blocks
after it are done. Commands that cannot run here are listed with the reason, never dropped
silently: the printed list of skips is part of the output."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

repo, build, shared, tmp = (os.path.abspath(p) for p in sys.argv[1:5])
DOCS = ["README.md", "docs/API.md", "docs/PROFILING.md"]

# Commands not run, by a substring of theirs, and why.
SKIP = {
    "bash scripts/run.sh": "the main job itself (setup, build, run); its steps run here as the fixture",
    "bash scripts/test.sh": "the test suite that runs this test",
    "bash scripts/setup.sh": "installs packages (setup.sh, as CI runs it)",
    "cmake -S . -B build": "configures a build (what scripts/build.sh does; CI builds)",
    "cmake --build build": "builds (CI builds)",
    "ctest --test-dir build": "the test suite that runs this test",
    "-F 'frame=@frame.json": "a template: frame.json and the six JPEGs are the reader's own",
}
# Exit codes the docs show for commands that fail on purpose.
EXPECT = {
    "--backend cuda": 2,                                    # no CUDA device / build: one error, exit 2
    "inspect ../shared/golden/micro/weights.safetensors --config tiny": 1,  # does not fit: exit 1
    "bevformer inspect /tmp/trunc.pth": 2,                  # a truncated checkpoint: exit 2
}


def commands(path):
    """(line number, command) of every command in the markdown file, in order."""
    out, block, pending, start = [], None, "", 0
    for n, line in enumerate(open(os.path.join(repo, path), encoding="utf-8"), 1):
        line = line.rstrip("\n")
        fence = re.match(r"^```(\w*)", line)
        if fence:
            block = None if block is not None else fence.group(1)
            pending = ""
            continue
        if block == "sh":
            text = line
        elif block == "text" and (line.startswith("$ ") or pending):
            text = line[2:] if line.startswith("$ ") and not pending else line
        else:
            continue
        if not pending and (not text.strip() or text.lstrip().startswith("#")):
            continue
        if not pending:
            start = n
        pending += ("\n" if pending else "") + text
        # A command goes on while a line ends with a backslash or a single quote is open.
        if pending.endswith("\\") or pending.count("'") % 2 == 1:
            continue
        out.append((start, pending))
        pending = ""
    return out


def workspace():
    ws = os.path.join(tmp, "repo")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(ws)
    os.symlink(build, os.path.join(ws, "build"))
    os.symlink(os.path.join(repo, "data"), os.path.join(ws, "data"))
    os.symlink(shared, os.path.join(tmp, "shared"))
    # The main job's frames (scripts/run.sh's convert step).
    subprocess.run([os.path.join(build, "bin", "bevformer"), "-q", "convert-info", "data/nuscenes-demo/info.json",
                    "out/demo/frames", "--stream", "demo"], cwd=ws, check=True, stdout=subprocess.DEVNULL)
    return ws


def main():
    ws = workspace()
    env = dict(os.environ, BEV_LOG_LEVEL="error")
    ran, skipped, failed = 0, [], []
    for doc in DOCS:
        server = None
        for line, cmd in commands(doc):
            where = f"{doc}:{line}"
            reason = next((r for k, r in SKIP.items() if k in cmd), None)
            if reason:
                skipped.append(f"{where}: {cmd.splitlines()[0]}  ({reason})")
                continue
            if "bevformer serve" in cmd:
                server = subprocess.Popen(["bash", "-c", "exec " + cmd], cwd=ws, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True, start_new_session=True)
                first = server.stdout.readline()
                if "listening on" not in first:
                    failed.append(f"{where}: {cmd}\n    the server did not start: {first!r}")
                    server.kill()
                    server = None
                else:
                    ran += 1
                continue
            want = next((c for k, c in EXPECT.items() if k in cmd), 0)
            t0 = time.time()
            r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=ws, env=env, capture_output=True, text=True,
                               timeout=900)
            ran += 1
            print(f"{where}: exit {r.returncode} in {time.time() - t0:.1f} s: {cmd.splitlines()[0][:110]}", flush=True)
            if r.returncode != want:
                failed.append(f"{where}: {cmd}\n    exit {r.returncode}, expected {want}\n    "
                              + (r.stderr or r.stdout)[-1500:].replace("\n", "\n    "))
            elif "curl" in cmd and '"error"' in r.stdout:
                failed.append(f"{where}: {cmd}\n    answered an error: {r.stdout[:500]}")
        if server:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
    print(f"\n{ran} commands ran; {len(skipped)} not run here:")
    for s in skipped:
        print("  skipped " + s)
    if failed:
        print(f"\n{len(failed)} FAILED:")
        for f in failed:
            print("  " + f)
        sys.exit(1)


main()
