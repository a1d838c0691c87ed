"""`bevformer serve` against the official Triton client (tritonclient[http,grpc] from PyPI, which no
one here wrote), over HTTP and gRPC: server and model health, model metadata, inference of a
sequence with Triton's sequence parameters and binary tensor data, answers equal across the two
protocols and to /v1, and the protocol's errors as the client raises them.

With a BUILD_DIR as second argument it also runs through scripts/fleet.sh's HAProxy (3 servers):
sequences over gRPC (HTTP/2 frontend, hashed on x-sequence-id) and over HTTP (X-Sequence-Id)
keep their history, and each sequence's gRPC frames ran on the server that owns its key for HTTP.

Usage: VENV/bin/python tests/check_tritonclient.py BEVFORMER_BINARY [BUILD_DIR]
(the venv: python3 -m venv V && V/bin/pip install "tritonclient[http,grpc]" numpy; docs/DEPLOY.md)
"""
import json
import os
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet_util import T0, Server, sequence, strip  # noqa: E402


def inputs_for(mod, frame, images):
    f = mod.InferInput("FRAME", [1], "BYTES")
    f.set_data_from_numpy(np.array([json.dumps(frame).encode()], dtype=np.object_), **({"binary_data": True} if mod is httpclient else {}))
    i = mod.InferInput("IMAGES", [len(images)], "BYTES")
    i.set_data_from_numpy(np.array(images, dtype=np.object_), **({"binary_data": True} if mod is httpclient else {}))
    return [f, i]


def outputs_for(mod):
    kw = {"binary_data": True} if mod is httpclient else {}
    return [mod.InferRequestedOutput(n, **kw) for n in ("BOXES", "SCORES", "LABELS", "DETECTIONS")]


def run_sequence(client, mod, seq, frames, seq_id, end=True, headers=None):
    out = []
    for k, (f, images) in enumerate(frames):
        r = client.infer("bevformer", inputs_for(mod, f, images), outputs=outputs_for(mod), sequence_id=seq_id,
                         sequence_start=k == 0, sequence_end=end and k == len(frames) - 1, headers=headers)
        det = json.loads(r.as_numpy("DETECTIONS")[0])
        boxes, scores, labels = r.as_numpy("BOXES"), r.as_numpy("SCORES"), r.as_numpy("LABELS")
        assert boxes.dtype == np.float32 and boxes.shape == (det["num_detections"], 9), boxes.shape
        assert scores.dtype == np.float32 and labels.dtype == np.int32
        for b, s, l, d in zip(boxes, scores, labels, det["detections"]):
            assert s == np.float32(d["score"]) and l == d["label"], (s, d["score"], l, d["label"])
            assert list(b[3:6]) == [np.float32(v) for v in d["size"]]
        if mod is httpclient:
            params = r.get_response()["parameters"]
            used = params["used_history"]
        else:
            params = r.get_response().parameters
            used = params["used_history"].bool_param
        assert used == (k > 0), (seq, k, params)
        out.append(strip(det))
    return out


def main():
    binary = sys.argv[1]
    server = Server(binary, grpc=True)
    try:
        h = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        g = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        for c in (h, g):
            assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("bevformer")
        hm = h.get_model_metadata("bevformer")
        gm = g.get_model_metadata("bevformer", as_json=True)
        assert [t["name"] for t in hm["inputs"]] == ["FRAME", "IMAGES"], hm
        assert [t["name"] for t in hm["outputs"]] == ["BOXES", "SCORES", "LABELS", "DETECTIONS"], hm
        assert [t["name"] for t in gm["outputs"]] == ["BOXES", "SCORES", "LABELS", "DETECTIONS"], gm
        assert hm["outputs"][0]["shape"] == [-1, 9] and gm["outputs"][0]["shape"] == ["-1", "9"], (hm, gm)
        assert "sequence" in h.get_server_metadata()["extensions"]

        # A uint64 sequence id over HTTP, a string one over gRPC: the same frames, the same answers.
        a = run_sequence(h, httpclient, "http", sequence("1234567", 4, T0), 1234567)
        b = run_sequence(g, grpcclient, "grpc", sequence("car-9", 4, T0), "car-9")
        assert a == b, "HTTP and gRPC answers differ"
        print(f"tritonclient: {len(a)} frames over HTTP and gRPC, equal, history used from frame 1")

        # Errors the client raises: the sequence ended, so its next frame must restart it.
        f, images = sequence("car-9", 5, T0)[4]
        for c, mod in ((h, httpclient), (g, grpcclient)):
            try:
                c.infer("bevformer", inputs_for(mod, f, images), sequence_id="car-9")
                raise AssertionError("a frame of an ended sequence was answered")
            except InferenceServerException as e:
                assert "restart the sequence" in str(e), str(e)
            try:
                c.get_model_metadata("resnet")
                raise AssertionError("an unknown model was answered")
            except InferenceServerException as e:
                assert "resnet" in str(e), str(e)
        print("tritonclient: errors (ended sequence, unknown model) raised with their message over both")
    finally:
        assert server.stop() == 0


def through_fleet(build):
    """3 servers behind HAProxy: gRPC and HTTP sequences keep their history, one owner per key."""
    import json as js
    import signal
    import subprocess
    import tempfile
    from fleet_util import get
    port = 18000 + os.getpid() % 1000
    d = tempfile.mkdtemp(prefix="fleet-triton-")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "fleet.sh")
    proc = subprocess.Popen(["bash", script, build, "3"], env=dict(os.environ, PORT=str(port), FLEET_DIR=d),
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("fleet: ready"), line
        g = grpcclient.InferenceServerClient(f"127.0.0.1:{port + 100}")
        h = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        instances = {js.loads(get(port + i, "/v1/handoff/owner")[1])["instance"]: i for i in (1, 2, 3)}
        owners = set()
        for s in range(6):
            seq = f"grpc-fleet-{s}"
            run_sequence(g, grpcclient, seq, sequence(seq, 3, T0 + 50 * s), seq, end=False, headers={"x-sequence-id": seq})
            owner = instances[js.loads(get(port, "/v1/handoff/owner", {"X-Sequence-Id": seq})[1])["instance"]]
            ran_on = [i for i in (1, 2, 3) if any(x["id"] == seq for x in js.loads(get(port + i, "/v1/streams")[1])["streams"])]
            assert ran_on == [owner], (seq, ran_on, owner)
            owners.add(owner)
            hseq = f"http-fleet-{s}"
            run_sequence(h, httpclient, hseq, sequence(hseq, 3, T0 + 50 * s), hseq, headers={"X-Sequence-Id": hseq})
        print(f"tritonclient: 6 sequences over gRPC and 6 over HTTP through HAProxy kept their history; "
              f"each gRPC sequence ran on its key's owner ({len(owners)} of 3 servers used)")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=180)


if __name__ == "__main__":
    main()
    if len(sys.argv) > 2:
        through_fleet(os.path.realpath(sys.argv[2]))
