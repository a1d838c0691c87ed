"""Profiling from Python: a profiler started and stopped around any calls on a model loaded with
``profiling=True``, ``signpost(name)`` ranges ("x" opens, "x_end" closes), every op as an
``OpRecord``, and the files of ``bevformer profile`` (trace.json, summary.json, summary.md,
memory.json) from the ``image``/``bev`` rounds and the ``eager`` range you marked.

    with profiling.Profiler(model) as prof:
        profiling.signpost("image"); model.runner.replay("image"); profiling.signpost("image_end")
        profiling.signpost("bev"); model.runner.replay("bev"); profiling.signpost("bev_end")
    prof.write("out/prof")
"""

import json as _json
import os
import threading

from . import _bevformer

OpRecord = _bevformer.OpRecord

_lock = threading.Lock()
_running = []  # profilers started and not stopped, oldest first


def signpost(name):
    """Marks `name` in every running profiler; with none running it does nothing, so signposts can
    stay in code that runs unprofiled."""
    with _lock:
        running = list(_running)
    for p in running:
        p.signpost(name)


def running_profilers():
    with _lock:
        return list(_running)


class Profiler:
    """A profiler of one model (loaded with profiling=True; else UnsupportedError). Frames on that
    model run one at a time while it exists, since the profiler records from one thread."""

    def __init__(self, model):
        self._model = model
        self._s = _bevformer._ProfileSession(model._h)
        self._report = None

    def start(self):
        self._s.start()
        with _lock:
            if self not in _running:
                _running.append(self)
        return self

    def stop(self):
        self._s.stop()
        with _lock:
            if self in _running:
                _running.remove(self)

    @property
    def running(self):
        return self._s.running()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def signpost(self, name):
        self._s.signpost(name)

    @property
    def ops(self):
        """Every op recorded so far, in order (OpRecord: index, name, stage, label, inputs,
        outputs, start_ms, ms, gflop, gbyte)."""
        return self._s.ops()

    @property
    def op_count(self):
        return self._s.op_count()

    @property
    def signposts(self):
        """[(name, ms since the profiler began)]"""
        return self._s.signposts()

    def report(self, measure_peaks=True, measure_unprofiled=True):
        """The summary of the recording as summary.json holds it (a dict): round k is the k-th
        image..image_end and bev..bev_end ranges, the eager frame the eager..eager_end range.
        measure_peaks: time this machine's matmul and copy peaks (for % of peak);
        measure_unprofiled: replay the stages detached as many times as there are rounds (for
        the profiler's measured cost)."""
        self._report = _json.loads(self._s.report(measure_peaks, measure_unprofiled))
        return self._report

    def write(self, out_dir, top_ops=15, **report_options):
        """Writes trace.json, summary.json, summary.md and memory.json (a report first if none
        was made); returns their paths."""
        if self._report is None or report_options:
            self.report(**report_options)
        return self._s.write(os.fspath(out_dir), top_ops)
