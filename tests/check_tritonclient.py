"""`bevformer serve` against the official Triton client (tritonclient[http,grpc] from PyPI, which no
one here wrote), over HTTP and gRPC: server and model health, model metadata, inference of a
sequence with Triton's sequence parameters and binary tensor data, answers equal across the two
protocols and to /v1, and the protocol's errors as the client raises them.

Usage: VENV/bin/python tests/check_tritonclient.py BEVFORMER_BINARY
(the venv: python3 -m venv V && V/bin/pip install "tritonclient[http,grpc]" numpy; docs/DEPLOY.md)
"""
import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
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


def run_sequence(client, mod, seq, frames, seq_id):
    out = []
    for k, (f, images) in enumerate(frames):
        r = client.infer("bevformer", inputs_for(mod, f, images), outputs=outputs_for(mod), sequence_id=seq_id,
                         sequence_start=k == 0, sequence_end=k == len(frames) - 1)
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


if __name__ == "__main__":
    main()
