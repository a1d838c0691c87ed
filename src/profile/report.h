// From a Profiler's records to what a person reads: per-stage and per-op totals of the replayed
// rounds, the eager frame's stage times, labels carried over, and the three writers (Chrome
// trace JSON, summary JSON, summary Markdown). The numbers land in the public ProfileReport
// (include/bevformer/profile.h), which is plain data.
//
// Rounds are found by signposts: round 1 is "trace" > "image".."image_end", "bev".."bev_end",
// round k >= 2 the same names with k appended ("trace2" > "image2", "bev2"); the "eager" range
// holds the eager frame ("eager_image", "eager_bev" inside, and a signpost per module stage).
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "bevformer/profile.h"
#include "profile/profiler.h"

namespace bev {

// The signpost of round k (0-based) for `base` ("trace", "image", "bev"): base for the first
// round, base + (k + 1) after it ("image2").
std::string round_signpost(const std::string& base, size_t k);

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

// Sets report.overhead from its unprofiled_round_ms and the rounds' frame times: the profiler's
// cost when recording and when detached (medians over the rounds).
void summarize_overhead(ProfileReport& report);

// "f32[2, 3] i64[5]": a recorded op's tensors, as the trace, summaries and ProfiledOp show them.
std::string tensors_text(std::span<const RecordedTensor> tensors);

// Writes `text` to `path`, Error(kIo) naming it when that fails.
void write_text_file(const std::filesystem::path& path, const std::string& text);
// The four files of a profile in `dir` (trace.json, summary.json, summary.md, memory.json),
// their paths appended to report.files first so that summary.json names itself.
void write_profile_files(const std::filesystem::path& dir, const Profiler& profiler, ProfileReport& report,
                         int top_ops);

nlohmann::json memory_json(const ProfileMemory& memory);
nlohmann::json summary_json(const ProfileReport& report);
std::string summary_markdown(const ProfileReport& report, int top_ops);

}  // namespace bev
