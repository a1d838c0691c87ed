#!/usr/bin/env python3
"""The micro golden set's three frames as frame JSON files (as tests/micro_frames.h builds them),
images by absolute path: OUT/frame0.json .. frame2.json. For scripts/load_test.sh and soak.sh.

    python3 scripts/micro_frames.py MICRO_DIR OUT_DIR"""
import json
import sys

micro, out = sys.argv[1], sys.argv[2]
for k in range(3):
    m = json.load(open(f"{micro}/frame{k}_meta.json"))
    f = {"stream": "micro", "timestamp": m["timestamp"], "scene": m["scene_token"],
         "T_world_from_ego": m["ego2global"], "T_ego_from_lidar": m["lidar2ego"], "can_bus": m["can_bus"],
         "cameras": [{"name": c["name"], "image": f"{micro}/" + m["img_filenames"][c["index"]],
                      "K": c["cam2img"], "T_ego_from_cam": c["cam2ego"]} for c in m["cameras"]]}
    json.dump(f, open(f"{out}/frame{k}.json", "w"))
