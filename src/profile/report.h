// From a Profiler's records to what a person reads: per-stage and per-op totals of the replayed
// rounds, the eager frame's stage times, labels carried over, and the three writers (Chrome
// trace JSON, summary JSON, summary Markdown). The numbers land in the public ProfileReport
// (include/bevformer/profile.h), which is plain data.
//
// Rounds are found by signposts: the k-th "image".."image_end" and "bev".."bev_end" ranges are
// round k's frame; the "eager".."eager_end" range holds the eager frame.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "bevformer/profile.h"
#include "profile/profiler.h"

namespace bev {

// Fills frame_ms, image_ms, bev_ms, stage_sum_ms, ops_per_frame, gflop/gbyte_per_frame, stages,
// ops and op_kinds (means over the rounds). peak_gflops and peak_gbps must be set first.
// Throws Error(kInternal) when there is no round or the rounds ran different ops.
void summarize_rounds(const Profiler& profiler, ProfileReport& report);

// Sets eager_ms of every stage from the eager range (stages the replay lacks are appended).
void summarize_eager(const Profiler& profiler, ProfileReport& report);

// When the eager frame's ops equal round 0's (kind, input and output shapes and dtypes, in
// order), copies the eager labels onto the ops of every round and returns true; otherwise says
// where they differ in *note and returns false.
bool carry_labels_from_eager(Profiler& profiler, std::string* note);

// Chrome trace events: signposts as B/E pairs, each op an X (complete) event with its stage,
// label, shapes, FLOPs and bytes in args, and stage ranges (consecutive ops of one stage) and, in
// the eager frame, image/bev ranges as X events around them. ts and dur in microseconds.
std::string chrome_trace_json(const Profiler& profiler, const nlohmann::json& metadata);

nlohmann::json memory_json(const ProfileMemory& memory);
nlohmann::json summary_json(const ProfileReport& report);
std::string summary_markdown(const ProfileReport& report, int top_ops);

}  // namespace bev
