// Golden-set comparison, the public face of `bevformer golden`: runs every frame of a golden set
// (../shared/golden/<set>/: config.json, checkpoint.pth, frame<k>.safetensors, frame<k>_meta.json)
// in order through one model, with the history carried from frame to frame, and compares every
// stage the model taps and the detections against the set (DESIGN §4: relative L2 <= 1e-4 in f32,
// detections as a set keyed by (query, label)).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bevformer/engine_knobs.h"

namespace bev {

// EngineKnobs::calibration, in int8: "" calibrates on the set's own frames first (run_golden logs it).
struct GoldenOptions : EngineKnobs {
  double tolerance = 1e-4;  // bound on the relative L2 error of every float tensor
  int max_frames = -1;      // run only the first max_frames frames; < 0: all of them
  std::string dump_dir;     // when set: write every tap and the detections as <dir>/frame<k>.safetensors
  bool eager = false;       // run every frame eagerly instead of recording the stages and replaying them
};

// One golden tensor against the model's tap of the same name.
struct GoldenTensorResult {
  enum class Status : uint8_t {
    kOk,             // within tolerance (or equal, for exact tensors)
    kOverTolerance,  // relative L2 above tolerance, or an exact tensor that differs
    kMismatch,       // the tap has another shape: not comparable
    kNotProduced,    // the model does not tap this name (shown, not a failure)
  };
  std::string name;
  std::string dtype;                  // the golden dtype: "f32", "f64", "i64", "u8"
  std::vector<int64_t> shape;         // the golden shape
  std::vector<int64_t> tapped_shape;  // the model's shape (equal to `shape` unless kMismatch)
  bool exact = false;                 // integer tensor: values must be equal
  double relative_l2 = 0;             // ||ours - golden|| / ||golden||
  double max_abs = 0;                 // max |ours - golden|
  Status status = Status::kNotProduced;
  std::string note;                   // why it is not comparable, where it came from

  bool failed() const { return status == Status::kOverTolerance || status == Status::kMismatch; }
};

const char* golden_status_name(GoldenTensorResult::Status s);  // "OK", "FAIL", "SHAPE", "not produced"

// The detections compared as a set keyed by (query, label): every golden detection whose score
// differs by more than score_tie from both neighbours in the golden ranking must be among ours
// with its box and score within the bounds; near ties may swap, also across the top-k cut.
struct DetectionTolerance {
  double score_tie = 1e-5;  // scores closer than this may swap ranks
  double box_m = 1e-3;      // x, y, z, w, l, h, vx, vy (metres, m/s)
  double yaw_rad = 1e-3;    // yaw, difference wrapped to [-pi, pi]
  double score = 1e-4;
};

// The detection bounds that go with a tensor tolerance (GoldenOptions::tolerance): the defaults
// above at the default 1e-4, every bound scaled by tolerance / 1e-4 otherwise. A looser tolerance
// (bf16: its rounding reorders near scores and moves boxes by centimetres) loosens the matching
// with it, instead of detections failing at any --tolerance.
DetectionTolerance detection_tolerance(double tensor_tolerance);

struct GoldenDetectionResult {
  size_t golden = 0;      // golden detections
  size_t ours = 0;        // our detections
  size_t compared = 0;    // golden detections that must be matched (not near-tied)
  size_t matched = 0;     // of those, found among ours by (query, label)
  size_t ambiguous = 0;   // golden detections near-tied with a neighbour (need not be matched)
  size_t extra = 0;       // ours not in the golden set and not explained by a tie at the cut
  size_t out_of_tolerance = 0;  // matched pairs whose box or score differs beyond the bounds
  double max_box_diff = 0;      // over matched pairs: max over x, y, z, w, l, h, vx, vy
  double max_yaw_diff = 0;      // radians, wrapped
  double max_score_diff = 0;
  std::vector<std::string> problems;  // the first few failures, readable
  bool ok = true;
};

struct GoldenFrameResult {
  int frame = 0;
  std::string scene_token;
  bool used_history = false;
  double seconds = 0;  // forward() wall time
  std::vector<GoldenTensorResult> tensors;  // in pipeline order
  bool has_detections = false;              // the set has det.* for this frame
  GoldenDetectionResult detections;
  std::string dump_path;                    // the file written with --dump, else ""
  bool ok = true;
};

struct GoldenReport {
  std::string dir;
  std::string config_path;
  std::string checkpoint_path;
  double tolerance = 0;
  std::string precision = "f32";
  std::string backend;  // where it ran: "cpu: <CPU model>, <ISA>, <threads> threads"
  size_t frames_in_set = 0;
  std::vector<GoldenFrameResult> frames;
  bool ok = true;

  size_t compared() const;       // tensors compared over all frames
  size_t failures() const;       // tensors over tolerance or mismatched, plus failed detection sets
  size_t not_produced() const;
};

// Throws bev::Error on a missing or malformed set (kNotFound / kInvalidInput), on a checkpoint or
// config that does not fit, and on i/o errors. Being over tolerance is not an error: see `ok`.
// Progress goes to the log (stderr, level info).
GoldenReport run_golden(const std::string& dir, const GoldenOptions& options = {});

// The report as text: a table per frame (tensor, shape, rel L2, max abs, OK/FAIL), the detection
// comparison, and a one-line verdict at the end.
std::string format_golden_report(const GoldenReport& report);
std::string golden_verdict(const GoldenReport& report);  // the last line of the above

}  // namespace bev
