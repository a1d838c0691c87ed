#!/usr/bin/env bash
# The main job: 3D detection on the bundled real nuScenes keyframe (data/nuscenes-demo), written
# as JSON (detections in the LiDAR and world frames, plus nuScenes results_nusc.json) and rendered
# as a picture (the six cameras with projected boxes, a BEV panel, the ground truth dashed).
# Without a checkpoint a seeded UNTRAINED model runs, and every output says so.
# Usage: scripts/run.sh [CHECKPOINT [CONFIG]]   (CONFIG: tiny|small|base|path.json; default tiny)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --main  # what the main job needs: no test frameworks, PyTorch, clang or load tools
echo "run: building (release: the engine and the CLI; scripts/test.sh builds the tests)"
bash scripts/build.sh build -DCMAKE_BUILD_TYPE=Release -DBEV_TESTS=OFF -DBEV_BENCH=OFF
weights=${1:-}
config=${2:-tiny}
out=out/demo
mkdir -p "$out"
echo "run: converting data/nuscenes-demo/info.json to frame JSONs in $out/frames"
build/bin/bevformer -q convert-info data/nuscenes-demo/info.json "$out/frames" --stream demo >/dev/null
echo "run: detecting with config $config${weights:+ and weights $weights}"
build/bin/bevformer detect "$out"/frames/frame_*.json --config "$config" ${weights:+--weights "$weights"} \
  -o "$out/detections.json" --nusc "$out/results_nusc.json" --render "$out/detections.png" \
  --gt data/nuscenes-demo/info.json
echo "run: done: $out/detections.json, $out/results_nusc.json, $out/detections.png"
