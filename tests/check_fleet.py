"""A fleet on loopback with real HAProxy (scripts/fleet.sh, deploy/haproxy.cfg): 3 servers, 12
sequences of 20 micro frames each, sent concurrently through the balancer with sequence ids.

  plain  every frame answered 200, equal to a single server's run
  kill   SIGKILL the server holding the most sequences mid-run: its sequences fail over; their
         next frame is refused as "restart the sequence" (the client restarts it), and no answer
         ever carries a wrong history (every 200 equals the single-server run of the sequence
         from its last start)
  term   SIGTERM that server mid-run: it drains and hands its streams over through HAProxy; no
         frame needs a restart, every answer equals the single-server run with used_history

A client resends a frame after a retryable answer (503 with Retry-After, 502/504 from the
balancer when the server died under it, or no answer) and restarts the sequence on 409
sequence_unknown; it counts both. Prints frames/s and p50/p99 latency per phase.
Usage: python3 tests/check_fleet.py BUILD_DIR [plain kill term]
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet_util import T0, Server, get, post_infer, sequence, wait_until  # noqa: E402

SEQS, FRAMES, SERVERS = 12, 20, 3
HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "scripts", "fleet.sh")


def strip(det):
    return {k: v for k, v in det.items() if k not in ("stream", "timestamp")}


def seq_id(s):
    return f"veh-{s}"


def frames_of(s):
    # Sequence s starts at micro frame s % 3 and has its own clock.
    frames = sequence(seq_id(s), FRAMES + 2, T0 + 100.0 * s)
    return frames[s % 3:s % 3 + FRAMES]


def reference(binary):
    """The single-server run of each distinct sequence (by its first micro frame)."""
    server = Server(binary)
    ref = {}
    try:
        for r in range(3):
            seq = f"ref-{r}"
            frames = sequence(seq, FRAMES + 2, T0)[r:r + FRAMES]
            out = []
            for k, (f, images) in enumerate(frames):
                status, a = post_infer(server.port, seq, f, images, start=k == 0)
                assert status == 200, (status, a)
                out.append(strip(a["detections"]))
            ref[r] = out
    finally:
        assert server.stop() == 0
    return ref


def free_base():
    """A base port whose fleet ports (HAProxy's two, the servers' HTTP and gRPC) are free now,
    below the kernel's ephemeral range (so no client connection takes one meanwhile)."""
    while True:
        base = 12000 + (os.getpid() * 7 + int(time.time() * 1000)) % 18000
        ok = True
        for p in [base + i for i in range(SERVERS + 1)] + [base + 100 + i for i in range(SERVERS + 1)]:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
        if ok:
            return base


class Fleet:
    def __init__(self, build):
        self.dir = tempfile.mkdtemp(prefix="fleet-")
        self.port = free_base()
        env = dict(os.environ, FLEET_DIR=self.dir, PORT=str(self.port),
                   SERVE_ARGS="--threads 1")
        self.proc = subprocess.Popen(["bash", SCRIPT, build, str(SERVERS)], env=env, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("fleet: ready"), line
        self.pids = {i: int(open(f"{self.dir}/s{i}.pid").read()) for i in range(1, SERVERS + 1)}

    def owner(self, key):
        """The server (1..N) HAProxy sends `key` to now."""
        status, body = get(self.port, "/v1/handoff/owner", {"X-Sequence-Id": key})
        assert status == 200, (status, body)
        inst = __import__("json").loads(body)["instance"]
        for i in self.pids:
            s, b = get(self.port + i, "/v1/handoff/owner")
            if __import__("json").loads(b)["instance"] == inst:
                return i
        raise AssertionError(inst)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=180)


def run_phase(build, ref, phase):
    fleet = Fleet(build)
    owners = {s: fleet.owner(seq_id(s)) for s in range(SEQS)}
    counts = {i: sum(1 for o in owners.values() if o == i) for i in fleet.pids}
    victim = max(counts, key=counts.get)
    answered = [0]
    lock = threading.Lock()
    stats = {"retries": 0, "restarts": 0, "wrong": [], "latency": [], "failed": [], "moved_with_history": 0,
             "moved_without_history": 0}
    signalled = [False]

    def client(s):
        frames = frames_of(s)
        start_at = 0  # the frame of the sequence's last start
        k = 0
        attempts = 0
        while k < FRAMES:
            f, images = frames[k]
            t = time.monotonic()
            status, a = post_infer(fleet.port, seq_id(s), f, images, start=k == start_at)
            lat = time.monotonic() - t
            if status == 200:
                want = ref[(s + start_at) % 3][k - start_at]
                got = strip(a["detections"])
                with lock:
                    stats["latency"].append(lat)
                    answered[0] += 1
                    if got != want:
                        stats["wrong"].append((s, k, start_at, a["parameters"]))
                    if owners[s] == victim and signalled[0] and k > start_at:
                        # A frame of the signalled server's sequences, sent after the signal.
                        key = "moved_with_history" if a["parameters"].get("used_history") else "moved_without_history"
                        stats[key] += 1
                k += 1
                attempts = 0
                continue
            attempts += 1
            if attempts > 50:
                with lock:
                    stats["failed"].append((s, k, status, a))
                return
            kind = a.get("kind") or (a.get("error") or {}).get("kind") if isinstance(a.get("error"), dict) else a.get("kind")
            if status == 409 and kind == "sequence_unknown":
                with lock:
                    stats["restarts"] += 1
                start_at = k
                continue
            if status in (0, 502, 503, 504):
                with lock:
                    stats["retries"] += 1
                time.sleep(float(a.get("retry_after", 0.2)))
                continue
            with lock:
                stats["failed"].append((s, k, status, a))
            return

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(s,)) for s in range(SEQS)]
    for t in threads:
        t.start()
    if phase in ("kill", "term"):
        wait_until(lambda: answered[0] >= SEQS * FRAMES * 2 // 5, 600, "the run's first frames")
        with lock:
            signalled[0] = True
        os.kill(fleet.pids[victim], signal.SIGKILL if phase == "kill" else signal.SIGTERM)
    for t in threads:
        t.join()
    seconds = time.monotonic() - t0
    handed = 0
    if phase == "term":
        wait_until(lambda: not os.path.exists(f"/proc/{fleet.pids[victim]}") or
                   open(f"/proc/{fleet.pids[victim]}/stat").read().split()[2] == "Z", 120, "the drained server to exit")
        log = open(f"{fleet.dir}/s{victim}.log").read()
        m = re.search(r"drain done: (\d+) streams handed over, (\d+) lost", log)
        assert m, log[-2000:]
        handed, lost = int(m.group(1)), int(m.group(2))
        assert handed >= 1 and lost == 0, m.group(0)
    fleet.stop()
    lat = sorted(stats["latency"])
    p50, p99 = lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(f"fleet {phase}: {len(lat)} frames in {seconds:.1f} s ({len(lat) / seconds:.1f} frames/s, p50 {p50 * 1000:.0f} ms, "
          f"p99 {p99 * 1000:.0f} ms); server s{victim} held {counts[victim]} of {SEQS} sequences; "
          f"{stats['retries']} retried, {stats['restarts']} restarted; after the signal its sequences' frames ran "
          f"{stats['moved_with_history']} with history, {stats['moved_without_history']} restarted without"
          + (f"; {handed} histories handed over" if phase == "term" else ""))
    assert not stats["failed"], stats["failed"][:3]
    assert not stats["wrong"], stats["wrong"][:3]
    assert len(lat) == SEQS * FRAMES
    if phase == "plain":
        assert stats["restarts"] == 0 and stats["retries"] == 0
    if phase == "kill":
        assert stats["restarts"] >= 1, "the killed server's sequences were never refused"
    if phase == "term":
        assert stats["restarts"] == 0, "a drained sequence lost its history"
        assert stats["moved_without_history"] == 0 and stats["moved_with_history"] >= 1, stats


def main():
    build = os.path.realpath(sys.argv[1])
    missing = [t for t in ("haproxy", "curl") if not shutil.which(t)]
    if missing:
        print(f"check_fleet: {' and '.join(missing)} not installed (bash scripts/setup.sh installs them): skipped")
        sys.exit(77)
    phases = sys.argv[2:] or ["plain", "kill", "term"]
    binary = os.path.join(build, "bin", "bevformer")
    ref = reference(binary)
    for phase in phases:
        run_phase(build, ref, phase)


if __name__ == "__main__":
    main()
