"""Shared by the fleet and tritonclient checks: the golden micro frames, `bevformer serve`
processes on loopback, and Open Inference Protocol REST calls with the binary tensor data
extension (standard library only: the fleet check needs no venv)."""
import http.client
import json
import os
import signal
import struct
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MICRO = os.path.realpath(os.path.join(os.environ.get("BEV_SHARED_DIR", os.path.join(HERE, "..", "..", "shared")),
                                      "golden", "micro"))
T0 = 1533151603.54759


def micro_frames():
    """The micro set's three frames as frame dicts (images by name) and their PNG bytes."""
    out = []
    for k in range(3):
        m = json.load(open(f"{MICRO}/frame{k}_meta.json"))
        f = {"stream": "micro", "timestamp": m["timestamp"], "scene": m["scene_token"],
             "T_world_from_ego": m["ego2global"], "T_ego_from_lidar": m["lidar2ego"], "can_bus": m["can_bus"],
             "cameras": [{"name": c["name"], "image": c["name"], "K": c["cam2img"], "T_ego_from_cam": c["cam2ego"]}
                         for c in m["cameras"]]}
        images = [open(f"{MICRO}/" + m["img_filenames"][c["index"]], "rb").read() for c in m["cameras"]]
        out.append((f, images))
    return out


def sequence(seq, n, t0):
    """n frames of sequence `seq`: the micro frames in turn, 0.5 s apart from t0."""
    frames = micro_frames()
    out = []
    for k in range(n):
        f, images = frames[k % 3]
        f = dict(f, stream=seq, timestamp=t0 + 0.5 * k)
        out.append((f, images))
    return out


def element(b):
    return struct.pack("<I", len(b)) + b


def infer_body(seq, frame, images, start, end=False):
    """An infer request with FRAME and IMAGES in the binary section; every output binary."""
    fb = element(json.dumps(frame).encode())
    ib = b"".join(element(i) for i in images)
    head = json.dumps({
        "parameters": {"sequence_id": seq, "sequence_start": start, "sequence_end": end, "binary_data_output": True},
        "inputs": [{"name": "FRAME", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(fb)}},
                   {"name": "IMAGES", "datatype": "BYTES", "shape": [len(images)],
                    "parameters": {"binary_data_size": len(ib)}}]}).encode()
    return head + fb + ib, {"Inference-Header-Content-Length": str(len(head)), "X-Sequence-Id": seq,
                            "Content-Type": "application/octet-stream"}


def post_infer(port, seq, frame, images, start, end=False, model="bevformer", timeout=120):
    """(status, answer): answer is {"parameters", "detections"} on 200, the error JSON otherwise,
    or {"error": ...} with status 0 when the connection failed."""
    body, headers = infer_body(seq, frame, images, start, end)
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("POST", f"/v2/models/{model}/infer", body, headers)
        r = c.getresponse()
        data = r.read()
        status = r.status
        hlen = r.getheader("Inference-Header-Content-Length")
        retry_after = r.getheader("Retry-After")
        c.close()
    except (OSError, http.client.HTTPException) as e:
        return 0, {"error": f"connection: {e!r}"}
    if status != 200:
        try:
            a = json.loads(data)
        except ValueError:
            a = {"error": data[:200].decode(errors="replace")}
        if retry_after:
            a["retry_after"] = retry_after
        return status, a
    n = int(hlen) if hlen else len(data)
    head = json.loads(data[:n])
    at = n
    det = None
    for o in head["outputs"]:
        size = o.get("parameters", {}).get("binary_data_size")
        if size is None:
            continue
        if o["name"] == "DETECTIONS":
            (ln,) = struct.unpack("<I", data[at:at + 4])
            det = json.loads(data[at + 4:at + 4 + ln])
        at += size
    return 200, {"parameters": head.get("parameters", {}), "detections": det}


def get(port, path, headers=None, timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("GET", path, headers=headers or {})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, body


class Server:
    """`bevformer serve` over the micro set on a free port (and a gRPC port when asked)."""

    def __init__(self, binary, port=0, grpc=False, extra=(), log=None):
        args = [binary, "serve", "--config", f"{MICRO}/config.json", "--weights", f"{MICRO}/checkpoint.pth",
                "--port", str(port), "--threads", "1", "--workers", "2"]
        if grpc:
            args += ["--grpc-port", "0"]
        args += list(extra)
        self.log = open(log, "w") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.port = self.grpc_port = None
        while self.port is None or (grpc and self.grpc_port is None):
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"serve exited: {self.proc.wait()}")
            if line.startswith("listening on http://"):
                self.port = int(line.rsplit(":", 1)[1])
            elif line.startswith("grpc listening on "):
                self.grpc_port = int(line.rsplit(":", 1)[1])

    def stop(self, sig=signal.SIGTERM, timeout=120):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)


def strip(det):
    """Detections without what names the request (the stream id)."""
    return {k: v for k, v in det.items() if k not in ("stream",)}


def wait_until(pred, seconds, what):
    t = time.monotonic() + seconds
    while time.monotonic() < t:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
