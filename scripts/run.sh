#!/usr/bin/env bash
# The main job. Until the model lands, it inspects a checkpoint and validates it against its
# config: by default the bundled golden set's official-format checkpoint, or the checkpoint you
# pass. Usage: scripts/run.sh [CHECKPOINT [CONFIG]]   (CONFIG: tiny|small|base|path.json)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "run: building (release)"
bash scripts/build.sh build -DCMAKE_BUILD_TYPE=Release
shared=$(cd .. && pwd)/shared
ckpt=${1:-$shared/golden/micro/checkpoint.pth}
config=${2:-}
if [ -z "$config" ] && [ $# -eq 0 ]; then config=$shared/golden/micro/config.json; fi
echo "run: inspecting $ckpt${config:+ against $config}"
exec build/bin/bevformer inspect "$ckpt" ${config:+--config "$config"} --no-tensors
