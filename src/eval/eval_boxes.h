// What the evaluation compares: predictions (results_nusc.json, the official submission format)
// and ground truth (format nuseval-gt-1, or built from the nuScenes database by nuscenes_db.h),
// both in the global frame and both in FILE ORDER — samples and the boxes within a sample keep
// the order of their JSON, because the devkit breaks score ties and equal distances by it.
//
// Reading validates as the devkit's loaders do (DetectionBox's asserts, load_prediction's
// max_boxes_per_sample, DetectionEval's sample-set check): each violation is one
// Error(kInvalidInput) that names the file, the sample token and the box index.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "eval/python_json.h"

namespace bev::eval {

struct EvalBox {
  std::array<double, 3> translation{};  // global, metres (box centre)
  std::array<double, 3> size{};         // w, l, h
  std::array<double, 4> rotation{};     // w, x, y, z; not necessarily unit (normalised when used)
  std::array<double, 2> velocity{};     // vx, vy in m/s; NaN when unknown
  int detection = 0;                    // index into detection_names()
  int attribute = -1;                   // index into attribute_names(); -1 for ""
  double score = -1.0;                  // detection_score (-1 for ground truth, as in the devkit)
  int64_t num_pts = -1;                 // lidar + radar points (-1 for a prediction without num_pts)
  uint32_t sample = 0;                  // position of the box's sample in its file
  uint32_t index = 0;                   // position of the box in its sample's list
  // Set by filtering (filter.h): the xy distance to the ego, and for a prediction the GT sample
  // it is matched against (its own sample_token's; -1 when that is not a GT sample).
  double ego_dist = 0;
  int32_t match_sample = -1;
};

struct BikeRack {  // a static_object.bicycle_rack annotation
  std::array<double, 3> translation{};
  std::array<double, 3> size{};
  std::array<double, 4> rotation{};
};

struct GtSample {
  std::string token;
  std::array<double, 3> ego_translation{};  // ego pose of the sample's LIDAR_TOP sample_data
  std::array<double, 4> ego_rotation{1, 0, 0, 0};
  std::vector<BikeRack> bike_racks;
  std::vector<EvalBox> boxes;
};

struct GroundTruth {
  std::string source;       // the file or database it came from (for messages)
  std::string description;  // nuseval-gt-1 "description"
  std::vector<GtSample> samples;
  std::unordered_map<std::string, size_t> index;  // token -> position in samples

  // Appends a sample; a token seen before is Error(kInvalidInput).
  GtSample& add_sample(std::string token);
  const GtSample* find(const std::string& token) const;
};

struct ResultSample {
  std::string token;
  std::vector<EvalBox> boxes;
  // Boxes whose own sample_token differs from the key they are listed under, by box index: the
  // devkit filters them with the key's sample but matches them with their own sample's GT.
  std::vector<std::pair<uint32_t, std::string>> own_tokens;
};

struct Results {
  std::string source;  // file name(s), for messages
  ojson meta = ojson::object();
  std::vector<ResultSample> samples;
  std::unordered_map<std::string, size_t> index;  // token -> position in samples

  size_t num_boxes() const;
};

// results_nusc.json ({"meta": ..., "results": {token: [box, ...]}}), streamed: the boxes are
// converted while the parser reads, so a val-sized file needs no DOM. Checks each box as
// DetectionBox does (known detection_name and attribute_name, 3/3/4/2 numbers, no NaN but in
// velocity, a score that is a number and not NaN) and at most max_boxes_per_sample per sample. A
// sample key repeated in the file replaces the earlier list at its position (Python's dict).
Results read_results(const std::string& path, int64_t max_boxes_per_sample);
// The same from text (`where` names it in errors).
Results parse_results(std::string_view text, const std::string& where, int64_t max_boxes_per_sample);

// nuseval-gt-1 (see docs/EVAL.md): {"format": "nuseval-gt-1", "description", "samples": {token:
// {"ego_pose", "bike_racks"?, "boxes"}}}.
GroundTruth read_ground_truth(const std::string& path);
GroundTruth ground_truth_from_json(const ojson& j, const std::string& where);
ojson ground_truth_to_json(const GroundTruth& gt);
void write_ground_truth(const std::string& path, const GroundTruth& gt);

// DetectionEval's assert: the results hold exactly the GT's samples. The error names the first
// GT sample missing from the results (or the first results sample not in the GT) and the counts.
void check_same_samples(const Results& results, const GroundTruth& gt);

// One box of a results or GT list as JSON (the submission format's fields).
ojson box_to_json(const EvalBox& box, const std::string& sample_token, bool ground_truth);

}  // namespace bev::eval
