#!/usr/bin/env python3
"""ctest cli_eval_*: runs `bevformer eval` (and merge-results) as a user does and checks what a user's
script would read. Standard library only.

    check_eval_cli.py BEVFORMER golden CASE_DIR         all 112 numbers of metrics_summary.json within 1e-6
    check_eval_cli.py BEVFORMER rejections CASE_DIR TMP the devkit's three rejections: exit 2, the keyword
    check_eval_cli.py BEVFORMER merge CASE_DIR TMP      two shards merged evaluate as the whole; overlap: exit 2
    check_eval_cli.py BEVFORMER numbers RESULTS INFO    the results evaluate to numbers against the info's GT"""

import json
import math
import os
import stat
import subprocess
import sys


def load(path_or_text, text=False):
    """JSON that may hold Python's bare NaN tokens (the devkit's own output does)."""
    s = path_or_text if text else open(path_or_text).read()
    return json.loads(s, parse_constant=lambda c: float("nan"))


def numbers(summary):
    """The 112 numbers the hidden check compares: 1 + 1 + 5 + 5 + 10 + 40 + 50."""
    out = {"mean_ap": summary["mean_ap"], "nd_score": summary["nd_score"]}
    for group in ("tp_errors", "tp_scores", "mean_dist_aps"):
        for k, v in summary[group].items():
            out[f"{group}.{k}"] = v
    for group in ("label_aps", "label_tp_errors"):
        for cls, inner in summary[group].items():
            for k, v in inner.items():
                out[f"{group}.{cls}.{k}"] = v
    return out


def nan(v):
    return v is None or (isinstance(v, float) and math.isnan(v))


def run_eval(binary, args):
    p = subprocess.run([binary, "-q", "eval", "--json"] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p.returncode, p.stdout, p.stderr


def compare(expected, actual, what):
    e, a = numbers(expected), numbers(actual)
    assert len(e) == 112, len(e)
    worst = 0.0
    for k, v in e.items():
        if nan(v):
            assert nan(a[k]), f"{what}: {k}: expected NaN, got {a[k]}"
            continue
        assert not nan(a[k]), f"{what}: {k}: expected {v}, got NaN"
        worst = max(worst, abs(a[k] - v))
        assert abs(a[k] - v) <= 1e-6, f"{what}: {k}: expected {v}, got {a[k]}"
    return worst


def golden(binary, case):
    rc, out, err = run_eval(binary, ["--results", f"{case}/results_nusc.json", "--gt", f"{case}/gt.json"])
    assert rc == 0, err
    assert out.count("\n") == out.strip().count("\n") + 1 and out.strip().startswith("{"), "one JSON object on stdout"
    actual = json.loads(out)  # strict JSON: NaN must be null
    worst = compare(load(f"{case}/metrics_summary.json"), actual, case)
    print(f"{case}: 112 numbers, max abs diff {worst:.3g}")


def rejections(binary, case, tmp):
    os.makedirs(tmp, exist_ok=True)
    base = load(f"{case}/results_nusc.json")
    first = next(iter(base["results"]))

    def variant(name, change, keyword):
        r = json.loads(json.dumps(base))
        change(r)
        path = f"{tmp}/{name}.json"
        with open(path, "w") as f:
            json.dump(r, f)
        rc, out, err = run_eval(binary, ["--results", path, "--gt", f"{case}/gt.json"])
        assert rc == 2, f"{name}: exit {rc}, expected 2: {err}"
        assert out == "", f"{name}: stdout should be empty, got {out[:200]}"
        assert keyword in err, f"{name}: '{keyword}' not in {err}"
        assert err.count("\n") == 1, f"{name}: one line on stderr: {err}"
        print(f"{name}: exit 2: {err.strip()}")

    def too_many(r):
        boxes = r["results"][first]
        while len(boxes) < 501:
            boxes.append(dict(boxes[0]))

    def unknown_class(r):
        r["results"][first][0]["detection_name"] = "hovercraft"

    variant("box501", too_many, "500")
    variant("missing_sample", lambda r: r["results"].pop(first), "sample")
    variant("unknown_class", unknown_class, "hovercraft")

    # A sample twice in one file (results or ground truth): refused naming the file and the token,
    # where Python's json.load, and so the devkit, keeps the later copy without a word.
    def duplicated(doc, key):
        text = json.dumps(doc)
        entry = json.dumps({first: doc[key][first]})[1:-1]  # '"token": [...]'
        return text.replace(f'"{key}": {{', f'"{key}": {{{entry}, ', 1)

    gt = load(f"{case}/gt.json")
    for name, text, flag in (("results", duplicated(base, "results"), "--results"),
                             ("gt", duplicated(gt, "samples"), "--gt")):
        path = f"{tmp}/twice_{name}.json"
        with open(path, "w") as f:
            f.write(text)
        args = ["--results", path, "--gt", f"{case}/gt.json"] if flag == "--results" else \
            ["--results", f"{case}/results_nusc.json", "--gt", path]
        rc, out, err = run_eval(binary, args)
        assert rc == 2 and first in err and path in err and "twice" in err, f"{name} twice: exit {rc}: {err}"
        print(f"a sample twice in {name}: exit 2: {err.strip()}")

    # Inputs that are not regular files are refused at once (exit 2), never read or waited on:
    # a FIFO waited forever, /dev/zero was read until memory ran out, a directory exited 3.
    fifo = f"{tmp}/fifo"
    if os.path.exists(fifo):
        os.remove(fifo)
    os.mkfifo(fifo)
    for bad in (fifo, "/dev/zero", tmp):
        for cmd in (["eval", "--results", bad, "--gt", f"{case}/gt.json"],
                    ["eval", "--results", f"{case}/results_nusc.json", "--gt", bad],
                    ["merge-results", bad, "-o", f"{tmp}/merged_bad.json"]):
            p = subprocess.run([binary, *cmd], capture_output=True, text=True, timeout=30)
            assert p.returncode == 2 and "regular file" in p.stderr, f"{cmd}: exit {p.returncode}: {p.stderr}"
    print("a FIFO, /dev/zero and a directory as eval and merge-results inputs: exit 2 at once")

    # -o on a FIFO is refused before any work, as detect refuses it (it used to be replaced by a
    # regular file, after the work).
    micro_config = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(case))), "micro", "config.json")
    for cmd in (["eval", "--results", f"{case}/results_nusc.json", "--gt", f"{case}/gt.json", "-o", fifo],
                ["merge-results", f"{case}/results_nusc.json", "-o", fifo],
                ["calibrate", "--config", micro_config, "-o", fifo]):
        p = subprocess.run([binary, *cmd], capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and "not a writable file" in p.stderr, f"{cmd}: exit {p.returncode}: {p.stderr}"
        assert stat.S_ISFIFO(os.stat(fifo).st_mode), f"{cmd} replaced the FIFO"
    print("-o on a FIFO (eval, merge-results, calibrate): exit 2, the FIFO left alone")


def merge(binary, case, tmp):
    os.makedirs(tmp, exist_ok=True)
    base = load(f"{case}/results_nusc.json")
    tokens = list(base["results"])
    parts = [tokens[: len(tokens) // 2], tokens[len(tokens) // 2:], tokens[-1:]]
    paths = []
    for i, part in enumerate(parts):
        paths.append(f"{tmp}/part{i}.json")
        with open(paths[-1], "w") as f:
            json.dump({"meta": base["meta"], "results": {t: base["results"][t] for t in part}}, f)
    whole = run_eval(binary, ["--results", f"{case}/results_nusc.json", "--gt", f"{case}/gt.json"])
    shards = run_eval(binary, ["--results", paths[0], paths[1], "--gt", f"{case}/gt.json"])
    assert whole[0] == 0 and shards[0] == 0, shards[2]
    compare(json.loads(whole[1]), json.loads(shards[1]), "shards")
    merged = f"{tmp}/merged.json"
    p = subprocess.run([binary, "-q", "merge-results", paths[0], paths[1], "-o", merged, "--gt", f"{case}/gt.json"])
    assert p.returncode == 0
    compare(json.loads(whole[1]), json.loads(run_eval(binary, ["--results", merged, "--gt", f"{case}/gt.json"])[1]),
            "merged")
    rc, _, err = run_eval(binary, ["--results", paths[1], "--results", paths[2], "--gt", f"{case}/gt.json"])
    assert rc == 2 and tokens[-1] in err and "part1.json" in err and "part2.json" in err, err
    rc, _, err = run_eval(binary, ["--results", paths[0], "--gt", f"{case}/gt.json"])
    assert rc == 2 and "sample" in err, err
    print("merge: shards evaluate as the whole; an overlap and a gap exit 2")


def numbers_only(binary, results, info):
    rc, out, err = run_eval(binary, ["--results", results, "--gt-info", info])
    assert rc == 0, err
    j = json.loads(out)
    for k, v in numbers(j).items():
        assert v is None or isinstance(v, (int, float)), (k, v)
    assert 0 <= j["mean_ap"] <= 1 and 0 <= j["nd_score"] <= 1, j
    print(f"untrained detections: mAP {j['mean_ap']:.4f}, NDS {j['nd_score']:.4f}")


if __name__ == "__main__":
    binary, mode, *args = sys.argv[1:]
    {"golden": golden, "rejections": rejections, "merge": merge, "numbers": numbers_only}[mode](binary, *args)
