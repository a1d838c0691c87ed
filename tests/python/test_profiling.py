"""model.runner and bevformer.profiling: the recorded stages replayed and run eagerly between
signposts, per-op records, and the files of `bevformer profile` written from them."""

import json

import numpy as np
import pytest

import bevformer
from bevformer import profiling
from conftest import assert_same_detections, micro_model, micro_request


def test_runner_replays_and_describes_without_changing_streams():
    with micro_model() as model, micro_model() as reference:
        for k in range(2):
            model(**micro_request(k))
            reference(**micro_request(k))
        for variant in ("image", "bev", "bev_first"):
            run = model.runner.replay(variant)
            assert run["variant"] == variant and run["seconds"] > 0
        text = model.runner.describe()
        assert "bev (with history)" in text and "arena" in text
        names = [s["name"] for s in model.runner.stages()]
        assert names[0] == "image" and "bev (with history)" in names
        assert all(s["arena_bytes"] <= s["no_reuse_bytes"] for s in model.runner.stages())
        # Replays and eager runs change no stream: the next frame is the reference's.
        model.runner.run_eager("image")
        model.runner.run_eager("bev")
        assert_same_detections(model(**micro_request(2)), reference(**micro_request(2)))


def test_profiler_records_ops_between_signposts_and_writes_the_profile_files(tmp_path):
    with micro_model(profiling=True) as model:
        assert model.knobs.profiling
        for k in range(3):
            model(**micro_request(k))
        profiling.signpost("nobody listens")  # no profiler running: nothing happens
        prof = profiling.Profiler(model)
        assert not prof.running and prof.op_count == 0
        model.runner.prepare_eager()
        with prof:
            assert profiling.running_profilers() == [prof]
            profiling.signpost("trace")
            for _ in range(2):
                profiling.signpost("image")
                model.runner.replay("image")
                profiling.signpost("image_end")
                profiling.signpost("bev")
                model.runner.replay("bev")
                profiling.signpost("bev_end")
            profiling.signpost("eager")
            model.runner.run_eager("image")
            model.runner.run_eager("bev")
            profiling.signpost("eager_end")
            profiling.signpost("trace_end")
        assert not prof.running and profiling.running_profilers() == []
        ops = prof.ops
        assert len(ops) == prof.op_count > 100
        first = ops[0]
        assert first.index == 0 and first.name and first.stage.startswith("img.") and first.ms >= 0
        assert first.as_dict()["label"] == first.label and "->" in repr(first)
        names = [n for n, _ in prof.signposts]
        assert names[:2] == ["trace", "image"] and names[-1] == "trace_end"
        # A frame outside the profiler's start/stop records nothing.
        count = prof.op_count
        model(**micro_request(2))
        assert prof.op_count == count

        summary = prof.report(measure_peaks=False)
        assert summary["rounds"] == 2 and summary["ops_per_frame"] * 2 < len(ops)
        assert summary["labels_from_eager"] is True, summary["labels_note"]
        assert summary["forward_ms"] > 0
        assert {s["group"] for s in summary["stages"]} == {"image", "bev"}
        assert all(s["eager_ms"] >= 0 for s in summary["stages"])
        assert len(summary["overhead"]["unprofiled_round_ms"]) == 2
        files = prof.write(tmp_path / "prof")
        assert [f.split("/")[-1] for f in files] == ["trace.json", "summary.json", "summary.md", "memory.json"]
        trace = json.loads((tmp_path / "prof" / "trace.json").read_text())
        assert sum(1 for e in trace["traceEvents"] if e.get("cat") == "op") == len(ops)
        assert "## Stages" in (tmp_path / "prof" / "summary.md").read_text()
        assert json.loads((tmp_path / "prof" / "summary.json").read_text())["rounds"] == 2


def test_a_report_needs_rounds_and_one_profiler_records_at_a_time():
    with micro_model(profiling=True) as model:
        model(**micro_request(0))
        a = profiling.Profiler(model)
        b = profiling.Profiler(model)
        with a:
            with pytest.raises(bevformer.InvalidInputError):
                b.start()
            model.runner.replay("image")
        with pytest.raises(bevformer.InvalidInputError) as info:
            a.report(measure_peaks=False)
        assert "image_end" in info.value.expected
        with pytest.raises(bevformer.InvalidInputError):
            a.signpost("")
    with pytest.raises(bevformer.InvalidInputError):
        a.ops  # the model is closed


def test_eager_runs_repeat_the_same_ops():
    with micro_model(profiling=True) as model:
        for k in range(2):
            model(**micro_request(k))
        prof = profiling.Profiler(model)
        with prof:
            for _ in range(2):
                profiling.signpost("eager")
                model.runner.run_eager("bev")
                profiling.signpost("eager_end")
        ops = prof.ops
        half = len(ops) // 2
        assert len(ops) == 2 * half and all(o.stage[:3] in ("enc", "dec") for o in ops)
        assert [(o.name, o.inputs, o.outputs) for o in ops[:half]] == [(o.name, o.inputs, o.outputs) for o in ops[half:]]
