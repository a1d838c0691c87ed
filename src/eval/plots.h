// The devkit's render_curves as PNG (OpenCV): per class the precision/recall curves at each
// distance threshold (<class>_pr.png) and the TP error curves at dist_th_tp (<class>_tp.png), and
// per threshold the precision/recall curves of every class (dist_pr_<th>.png) — the same curves,
// ranges, reference lines and legends as nuscenes/eval/detection/render.py.
#pragma once

#include <string>
#include <vector>

#include "eval/metrics.h"

namespace bev::eval {

// Writes the PNGs into `dir` (created if missing) and returns their paths. Error(kIo) when a
// file cannot be written.
std::vector<std::string> render_curves(const Evaluation& evaluation, const std::string& dir);

}  // namespace bev::eval
