"""BEVFormer, the model object: loaded once, called once per frame of a stream."""

import json as _json
import os

from . import _bevformer


class Knobs:
    """The knobs a model was loaded with (bev::Knobs); ``as_dict()`` gives them all."""

    __slots__ = ("_values",)

    def __init__(self, values):
        object.__setattr__(self, "_values", dict(values))

    def as_dict(self):
        return dict(self._values)

    def __getattr__(self, name):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        raise AttributeError("knobs are fixed when the model is loaded; load another model to change them")

    def __repr__(self):
        return "Knobs(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"


class Result:
    """One frame's detections.

    boxes (K x 9 float32: x, y, z, w, l, h, yaw, vx, vy in the LiDAR frame, z the bottom centre),
    scores (K float32), labels (K int64), query (K int64, the decoder query of each box),
    class_names (K names), used_history, history_reset, frame_index, stream, timestamp, scene,
    sample_token, untrained, seconds (total, prepare, geometry, image, bev, output), batch_size
    (frames that ran together: 1 from model(...), up to max_batch from detect_batch), json (the
    detections JSON document) and nuscenes_json (this frame's results_nusc.json entries).
    """

    __slots__ = ("boxes", "scores", "labels", "query", "class_names", "stream", "timestamp", "scene",
                 "frame_index", "used_history", "history_reset", "untrained", "sample_token", "seconds",
                 "batch_size", "json", "nuscenes_json")

    def __init__(self, fields):
        for k in self.__slots__:
            setattr(self, k, fields[k])

    def __len__(self):
        return len(self.scores)

    def detections(self):
        """The detections JSON document, parsed (docs/FORMATS.md)."""
        return _json.loads(self.json)

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__}

    def __repr__(self):
        history = "history" if self.used_history else "first frame"
        untrained = ", UNTRAINED" if self.untrained else ""
        return (f"<Result stream={self.stream!r} t={self.timestamp} {history}: {len(self)} boxes, "
                f"{self.seconds['total'] * 1e3:.1f} ms{untrained}>")


class Runner:
    """The model's two recorded stages: ``replay`` and ``run_eager`` a variant ("image", "bev" with
    history, "bev_first") on the last frame's inputs, ``describe`` them. Each call has the model to
    itself (frames on other threads wait)."""

    variants = ("image", "bev", "bev_first")

    def __init__(self, handle):
        self._h = handle

    def replay(self, variant):
        """Executes the recorded stage once on the inputs it holds; returns its wall time."""
        return self._h.runner_replay(variant)

    def run_eager(self, variant):
        """Runs the stage eagerly (every op as the model code builds it) on the last frame's inputs."""
        return self._h.runner_run_eager(variant)

    def prepare_eager(self):
        """run_eager's set-up now, so that a profile's eager range holds only the variants."""
        self._h.runner_prepare_eager()

    def describe(self):
        """The recorded stages: ops, shapes, arena offsets and sizes."""
        return self._h.runner_describe()

    def stages(self):
        """The recorded stages as numbers (name, ops, buffers, arena_bytes, no_reuse_bytes)."""
        return self._h.runner_stages()


class BEVFormer:
    """A BEVFormer on this engine. ``BEVFormer.from_pretrained(config, weights, **knobs)``, then
    ``model(**request)`` per frame; a context manager that closes the model."""

    def __init__(self, config="tiny", weights=None, *, backend="cpu", precision="f32", threads=0,
                 pipeline=False, device=0, seed=2026, max_streams=64, stream_ttl_seconds=600.0,
                 max_gap_seconds=10.0, replay=True, max_batch=8, profiling=False, calibration=None):
        knobs = dict(backend=backend, device=device, threads=threads, precision=precision, seed=seed,
                     calibration="" if calibration is None else os.fspath(calibration),
                     max_streams=max_streams, stream_ttl_seconds=stream_ttl_seconds,
                     max_gap_seconds=max_gap_seconds, replay=replay, pipeline=pipeline, max_batch=max_batch,
                     profiling=profiling)
        config = os.fspath(config)
        weights = "" if weights is None else os.fspath(weights)
        self._h = _bevformer._Model(config, weights, knobs)
        self._config = config
        self._weights = weights or None
        self.runner = Runner(self._h)

    @classmethod
    def from_pretrained(cls, config="tiny", weights=None, **knobs):
        """config: "tiny" | "small" | "base" | a config JSON path; weights: a .pth or .safetensors
        checkpoint, or None for seeded random weights (every result then says untrained)."""
        return cls(config, weights, **knobs)

    def __call__(self, request=None, /, **fields):
        """One frame: the frame JSON's fields as keyword arguments (or one mapping); see docs/PYTHON.md."""
        return self.detect(request, **fields)

    def detect(self, request=None, /, **fields):
        if request is not None:
            if fields:
                fields = {**request, **fields}
            else:
                fields = request
        return Result(self._h.detect(dict(fields)))

    def detect_batch(self, requests, max_batch=0, return_exceptions=False):
        """Frames of several streams in one call (Model::detect_batch): frames of distinct streams
        run together through the recorded stages, each exactly as model(**request) would answer
        it alone; each stream's frames in the order given; at most max_batch per batch (0: the
        model's max_batch knob). Returns one Result per request, in order. A frame that fails
        fails alone (its stream keeps its history): with return_exceptions its entry is the
        bevformer.Error; without, the first failure is raised after every frame ran, carrying
        the whole list as its ``outcomes``."""
        out = []
        for entry in self._h.detect_batch([dict(r) for r in requests], max_batch):
            out.append(entry if isinstance(entry, BaseException) else Result(entry))
        if not return_exceptions:
            for entry in out:
                if isinstance(entry, BaseException):
                    entry.outcomes = out
                    raise entry
        return out

    def detect_file(self, path):
        """A frame JSON file (images relative to its folder)."""
        return Result(self._h.detect_file(os.fspath(path)))

    def warmup(self, frames=2, seed=2026):
        """Runs `frames` synthetic frames on a stream of its own (recording the image stage and both
        bev stages), then drops that stream; returns their results."""
        results = []
        for k in range(frames):
            request = _bevformer.synthetic_request(self._config, seed, k)
            request["stream"]["id"] = "__warmup__"
            results.append(self.detect(request))
        self.drop_stream("__warmup__")
        return results

    def streams(self):
        return self._h.streams()

    def drop_stream(self, stream_id):
        """Forgets a stream's history; False when there is no such stream."""
        return self._h.drop_stream(stream_id)

    def stream_totals(self):
        return self._h.stream_totals()

    @property
    def device_info(self):
        return self._h.device_info()

    @property
    def knobs(self):
        return Knobs(self._h.knobs())

    @property
    def class_names(self):
        return self._h.class_names()

    @property
    def untrained(self):
        return self._h.untrained()

    @property
    def config(self):
        return self._config

    @property
    def weights(self):
        return self._weights

    def describe(self):
        """Config, backend, weights and the recorded stages (recorded first on synthetic frames
        when nothing ran yet)."""
        return self._h.describe()

    def config_summary(self):
        return self._h.config_summary()

    @property
    def closed(self):
        return self._h.closed()

    def close(self):
        """Releases the model (waiting for frames in flight); later calls raise InvalidInputError."""
        self._h.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        if self.closed:
            return f"<BEVFormer {self._config} (closed)>"
        info = self.device_info
        weights = self._weights or "random weights (UNTRAINED)"
        return f"<BEVFormer {self._config}, {weights}, {info['backend']} {info['precision']}, {info['threads']} threads>"
