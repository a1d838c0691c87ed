"""scripts/compare_reference.py as documented, on the micro config: both sides run, in f32 and in
bf16 (the reference under torch.autocast), and --json prints one parseable object whose numbers
are consistent; bf16 with --rounds 2, whose medians and per-round ratios agree (exit 77, a skip,
without python3-torch).
Usage: python3 tests/check_compare_reference.py BEVFORMER_BINARY CONFIG_JSON"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    binary, config = sys.argv[1], sys.argv[2]
    for precision, rounds in (("f32", 1), ("bf16", 2)):
        cmd = [sys.executable, os.path.join(ROOT, "scripts", "compare_reference.py"), "--config", config, "--threads", "2",
               "--frames", "2", "--rounds", str(rounds), "--precision", precision, "--bevformer", binary, "--json"]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sys.stderr.write(p.stderr)
        if p.returncode == 77:
            print("compare_reference: torch not installed: skipped")
            return 77
        if precision != "f32" and p.returncode == 2 and "does not run on this CPU" in p.stderr:
            print(f"{precision}: not run: the engine refused it on this CPU (exit 2, above)")
            continue
        assert p.returncode == 0, (precision, p.returncode)
        out = json.loads(p.stdout)  # nothing else on stdout
        ours, ref = out["bevformer"], out["pytorch"]
        # Each side's precision as the side itself reported it (bench's and time_reference's JSON).
        assert ours["precision"] == precision and ref["precision"] == precision, out
        for side in (ours, ref):
            assert 0 < side["median_ms"] <= side["p90_ms"], out
            assert side["backbone_ms"] > 0, out
        assert out["rounds"] == rounds and len(out["ratio_frame_rounds"]) == rounds, out
        assert abs(out["ratio_frame"] - ref["median_ms"] / ours["median_ms"]) < 1e-9, out
        if rounds == 1:
            assert out["ratio_frame_rounds"] == [out["ratio_frame"]], out
        print(f"{precision}: bevformer {ours['median_ms']:.1f} ms, pytorch {ref['median_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
