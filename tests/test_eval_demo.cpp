// The end-to-end check on the real nuScenes frame (data/nuscenes-demo): its ground-truth boxes,
// turned into score-1 detections, go through the engine's own output path — Box9 in the LiDAR
// frame, NuscResults / to_nusc_box (lidar -> ego, class range, ego -> global), results_nusc.json
// text — and are evaluated against ground truth built independently from the same info file in
// the global frame (eval/info_gt.h: one 4x4 product and a rotation-matrix quaternion, no Box9,
// no float32). Every class with ground truth must score AP 1 at every threshold, with TP errors
// at float32 rounding; the classes without ground truth in range score what the devkit gives
// them (AP 0, errors 1), which is why mAP and NDS are not 1 on one frame.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "eval/info_gt.h"
#include "eval/metrics.h"
#include "io/detections_json.h"
#include "io/nuscenes_info.h"

namespace bev::eval {
namespace {

const std::string kInfo = std::string(BEV_SOURCE_DIR) + "/data/nuscenes-demo/info.json";

// The info's ground truth as the engine would have detected it: score 1, the detection path.
Results ground_truth_as_detections() {
  const NuScenesInfo info = read_nuscenes_info(kInfo);
  const InfoSample& s = info.samples.at(0);
  std::vector<Detection> detections;
  for (const GtBox& g : read_info_ground_truth(kInfo, 0)) {
    if (!g.valid) continue;  // no lidar or radar point: the devkit drops such GT, a detection would be a FP
    Detection d;
    d.box = box_from_mmdet3d_info(g.box, g.velocity[0], g.velocity[1]);
    d.score = 1.0f;
    d.label = static_cast<int>(std::find(info.categories.begin(), info.categories.end(), g.class_name) -
                               info.categories.begin());
    detections.push_back(d);
  }
  NuscResults nusc;
  nusc.add_sample(s.token, detections, info.categories, FramePoses{s.ego2global, s.lidar2ego});
  return parse_results(nusc.to_json().dump(), "demo results_nusc.json", 500);
}

TEST(DemoFrame, GroundTruthThroughTheDetectionPathScoresApOne) {
  const GroundTruth gt = ground_truth_from_info(kInfo, InfoAttributes::kFromSpeed);
  const Results results = ground_truth_as_detections();
  const Evaluation e = evaluate(gt, results, detection_cvpr_2019());
  const DetectionMetrics& m = e.metrics;
  size_t present = 0;
  double present_errors[kNumTpMetrics] = {};
  double present_counts[kNumTpMetrics] = {};
  for (int c : m.cfg.classes) {
    const std::string name(detection_names()[static_cast<size_t>(c)]);
    if (e.gt_counts.per_class[static_cast<size_t>(c)] == 0) {
      EXPECT_EQ(m.mean_dist_aps()[static_cast<size_t>(c)], 0.0) << name;
      continue;
    }
    ++present;
    for (double ap : m.label_aps[static_cast<size_t>(c)]) EXPECT_NEAR(ap, 1.0, 1e-12) << name;
    for (size_t k = 0; k < kNumTpMetrics; ++k) {
      const double err = m.label_tp_errors[static_cast<size_t>(c)][k];
      if (std::isnan(err)) continue;
      // float32 positions at ~60 m: micrometres; sizes and yaw: 1e-7.
      EXPECT_LT(err, 1e-5) << name << " " << tp_metric_names()[k];
      present_errors[k] += err;
      present_counts[k] += 1;
    }
  }
  // pedestrian, car, barrier, traffic_cone and truck are within range on this frame.
  EXPECT_EQ(present, 5u);
  EXPECT_EQ(e.pred_counts.after_bike_racks, e.gt_counts.after_bike_racks);  // nothing lost on the way
  EXPECT_NEAR(m.mean_ap(), 0.5, 1e-12);
  // The NDS the devkit's definition gives, and the one over the classes present.
  double present_score = 0;
  for (size_t k = 0; k < kNumTpMetrics; ++k) present_score += 1 - present_errors[k] / present_counts[k];
  const double nds_present = (5 * 1.0 + present_score) / 10;
  std::printf("[ demo ] mAP %.12f NDS %.12f (classes with GT: %zu; over them: mAP 1, NDS %.12f)\n", m.mean_ap(),
              m.nd_score(), present, nds_present);
  EXPECT_GT(nds_present, 1 - 1e-5);
  // 5 classes absent: mATE = mASE = 0.5 + eps, mAOE over 9 = 5/9, mAVE = mAAE over 8 = 5/8.
  EXPECT_NEAR(m.nd_score(), (5 * 0.5 + (0.5 + 0.5 + 4.0 / 9 + 3.0 / 8 + 3.0 / 8)) / 10, 1e-5);
}

TEST(DemoFrame, InfoGroundTruthKeepsNumPtsAndUnknownVelocities) {
  const GroundTruth gt = ground_truth_from_info(kInfo, InfoAttributes::kUnknown);
  ASSERT_EQ(gt.samples.size(), 1u);
  const GtSample& s = gt.samples[0];
  EXPECT_EQ(s.token, "ca9a282c9e77460f8360f564131a8af5");
  EXPECT_EQ(s.boxes.size(), 68u);  // 69 instances, one with label -1
  size_t zero_pts = 0, nan_velocity = 0;
  for (const EvalBox& b : s.boxes) {
    zero_pts += b.num_pts == 0;
    nan_velocity += std::isnan(b.velocity[0]);
    EXPECT_EQ(b.attribute, -1);
  }
  EXPECT_EQ(zero_pts, 3u);      // the three bbox_3d_isvalid == false pedestrians
  EXPECT_EQ(nan_velocity, 2u);  // the info's NaN velocities stay unknown
  // The ego pose is ego2global's translation; the first box is the LiDAR-frame centre moved there.
  EXPECT_NEAR(s.ego_translation[0], 411.3039245605469, 1e-9);
}

}  // namespace
}  // namespace bev::eval
