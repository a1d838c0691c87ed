// The graph report of one recorded stage (`bevformer profile --graph-report DIR`): what a
// variant (`image`, `bev`) runs and where its memory goes, for a person and for scripts.
//
//   DIR/<variant>/graph.json   every op in run order (kind, stage, label, its input and output
//                              tensors with shape and dtype, which buffer each lives in, the
//                              weight's shape), every arena buffer (offset, size, first and last
//                              op), the tensors outside the arena (stage inputs, kept outputs,
//                              constants) and the weights
//   DIR/<variant>/index.html   the same as one self-contained page (no script, no network): the
//                              arena's occupancy over the ops as an SVG plot (a rectangle per
//                              buffer: ops across, offsets down; live bytes per op as a line),
//                              then the op sequence as a table
//
// Nothing here knows BEVFormer: a RecordedStage's nodes and arena are all it reads.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/recorded_stage.h"

namespace bev {

// The stage as JSON (the layout above). `precision` sizes the weights (the backend's).
nlohmann::json graph_report_json(const RecordedStage& stage, const std::string& variant, Precision precision);

// The HTML page of a graph_report_json document.
std::string graph_report_html(const nlohmann::json& graph);

// Bytes the report of `stage` takes in memory while it is built (JSON tree and texts), an upper
// estimate: what the --max-rss-gb guard checks before building it.
size_t graph_report_estimated_bytes(const RecordedStage& stage);

}  // namespace bev
