// The evaluator's parts on the edge cases the devkit's definitions turn on (numpy.interp on
// plateaus, cummean's NaN rules, the recall grid's exact doubles, floor modulo, yaw under pitch,
// inclusive rack bounds with height, strict thresholds, ties by file order), and the JSON
// helpers and the config.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "bevformer/error.h"
#include "eval/box_geometry.h"
#include "eval/metrics.h"
#include "eval_test_util.h"

namespace bev::eval {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kPi = std::numbers::pi;

TEST(NumpyInterp, SinglePointIsLeftOnOrRight) {
  const std::vector<double> xp = {0.5}, fp = {7};
  EXPECT_EQ(numpy_interp(0.4, xp, fp, -1, -2), -1);
  EXPECT_EQ(numpy_interp(0.5, xp, fp, -1, -2), 7);
  EXPECT_EQ(numpy_interp(0.6, xp, fp, -1, -2), -2);
}

TEST(NumpyInterp, AnExactHitOnARepeatedAbscissaTakesTheLastValue) {
  // Recall repeated by false positives: the lowest (last) precision of the run, no envelope.
  const std::vector<double> rec = {1.0 / 3, 1.0 / 3, 2.0 / 3, 2.0 / 3}, prec = {1, 0.5, 2.0 / 3, 0.5};
  EXPECT_EQ(numpy_interp(1.0 / 3, rec, prec, prec[0], 0), 0.5);
  EXPECT_EQ(numpy_interp(2.0 / 3, rec, prec, prec[0], 0), 0.5);
  EXPECT_EQ(numpy_interp(0.2, rec, prec, prec[0], 0), 1);  // left of the first: the first value
  EXPECT_EQ(numpy_interp(0.7, rec, prec, prec[0], 0), 0);  // right of the last: right
  // Between the runs, from the last of the lower run.
  EXPECT_DOUBLE_EQ(numpy_interp(0.5, rec, prec, prec[0], 0), 0.5 + (0.5 - 1.0 / 3) * (2.0 / 3 - 0.5) / (1.0 / 3));
}

TEST(NumpyInterp, NanFallbacksAsNumpy) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> xp = {0, 1}, fp = {inf, inf};
  EXPECT_EQ(numpy_interp(0.5, xp, fp, 0, 0), inf);  // slope NaN, equal ends: the end value
  EXPECT_TRUE(std::isnan(numpy_interp(kNaN, xp, std::vector<double>{0, 1}, 0, 0)));
}

TEST(Cummean, AllNanIsAllOnes) {
  EXPECT_EQ(cummean(std::vector<double>{kNaN, kNaN}), (std::vector<double>{1, 1}));
}

TEST(Cummean, ZeroBeforeTheFirstNumberThenTheMeanOfTheNumbers) {
  EXPECT_EQ(cummean(std::vector<double>{kNaN, 2, kNaN, 4}), (std::vector<double>{0, 2, 2, 3}));
}

TEST(RecallGrid, IsIntegerTimesAHundredthNotIOver100) {
  const Curve& r = recall_grid();
  EXPECT_EQ(r[70], 70 * 0.01);
  EXPECT_EQ(r[70], 0.7000000000000001);
  EXPECT_NE(r[70], 0.7);
  for (int i : {35, 41, 47, 57, 69, 82, 83, 94, 95}) EXPECT_GT(r[static_cast<size_t>(i)], i / 100.0) << i;
  EXPECT_EQ(r[100], 1.0);
}

TEST(PairwiseSum, MatchesNumpyGrouping) {
  // numpy sums 8 lanes then combines them; a plain loop differs in the last bit here.
  std::vector<double> v;
  for (int i = 0; i < 90; ++i) v.push_back(1.0 / (i + 1));
  double lanes[8] = {};
  for (size_t i = 0; i < 88; ++i) lanes[i % 8] += v[i];
  double expected = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  expected += v[88];
  expected += v[89];
  EXPECT_EQ(numpy_sum(v), expected);
  EXPECT_TRUE(std::isnan(numpy_mean(std::vector<double>{})));
}

TEST(AngleDiff, FloorModuloHasTheSignOfThePeriod) {
  EXPECT_EQ(python_mod(-1.0, 3.0), 2.0);
  EXPECT_EQ(python_mod(1.0, -3.0), -2.0);
  EXPECT_EQ(std::signbit(python_mod(-3.0, 3.0)), false);
  EXPECT_NEAR(angle_diff(0.1, -0.1, 2 * kPi), 0.2, 1e-15);
  EXPECT_NEAR(angle_diff(-3.0, 3.0, 2 * kPi), 2 * kPi - 6.0, 1e-12);  // C fmod would give -6 + ...
  // A barrier turned by pi is the same barrier; anything else is not.
  EXPECT_NEAR(angle_diff(kPi + 0.1, 0.0, kPi), 0.1, 1e-12);
  EXPECT_NEAR(std::abs(angle_diff(kPi + 0.1, 0.0, 2 * kPi)), kPi - 0.1, 1e-12);
}

TEST(QuaternionYaw, IsTheHeadingOfTheXAxisEvenUnderPitchAndRoll) {
  // A box turned by 0.5 about z, then the whole tilted by 0.3 about the world's y (a slope): its
  // x axis points at atan2(sin 0.5, cos 0.3 cos 0.5) in the ground plane. 2*atan2(z, w) says 0.5.
  const double c1 = std::cos(0.25), s1 = std::sin(0.25), c2 = std::cos(0.15), s2 = std::sin(0.15);
  const Quat q = {c2 * c1, s2 * s1, s2 * c1, c2 * s1};  // (about y by 0.3) * (about z by 0.5)
  const double heading = std::atan2(std::sin(0.5), std::cos(0.3) * std::cos(0.5));
  EXPECT_NEAR(quaternion_yaw(q), heading, 1e-12);
  EXPECT_GT(std::abs(2 * std::atan2(q[3], q[0]) - heading), 1e-3);
  // Not normalised, or negated: the same rotation.
  EXPECT_NEAR(quaternion_yaw({2 * q[0], 2 * q[1], 2 * q[2], 2 * q[3]}), heading, 1e-12);
  EXPECT_NEAR(quaternion_yaw({-q[0], -q[1], -q[2], -q[3]}), heading, 1e-12);
}

TEST(Normalised, OnlyWhenFurtherThan1e14FromUnit) {
  const Quat almost = {1 + 1e-16, 0, 0, 0};
  EXPECT_EQ(normalised(almost), almost);
  EXPECT_EQ(normalised({2, 0, 0, 0}), (Quat{1, 0, 0, 0}));
  EXPECT_EQ(normalised({0, 0, 0, 0}), (Quat{0, 0, 0, 0}));
}

TEST(PointInBox, InclusiveBoundsAndHeightCounts) {
  const Vec3 c = {10, 20, 1}, wlh = {2, 4, 2};  // |x| <= 2, |y| <= 1, |z| <= 1 around c
  const Quat id = {1, 0, 0, 0};
  EXPECT_TRUE(point_in_box({12, 21, 2}, c, wlh, id));    // a corner
  EXPECT_TRUE(point_in_box({8, 19, 0}, c, wlh, id));     // the opposite corner
  EXPECT_FALSE(point_in_box({12.001, 20, 1}, c, wlh, id));
  EXPECT_FALSE(point_in_box({10, 20, 2.5}, c, wlh, id));  // above the rack
  // Turned by 90 degrees: length along y.
  const Quat turned = {std::cos(kPi / 4), 0, 0, std::sin(kPi / 4)};
  EXPECT_TRUE(point_in_box({10, 21.9, 1}, c, wlh, turned));
  EXPECT_FALSE(point_in_box({11.9, 20, 1}, c, wlh, turned));
}

EvalBox box(double x, double y, int cls, double score = -1, int64_t pts = 5) {
  EvalBox b;
  b.translation = {x, y, 1};
  b.size = {2, 4, 1.5};
  b.rotation = {1, 0, 0, 0};
  b.detection = cls;
  b.score = score;
  b.num_pts = pts;
  return b;
}

struct Case {
  GroundTruth gt;
  Results results;
};

// One sample at the origin ego pose (ego at (100, 200)); gt and pred offsets from the ego.
Case one_sample(std::vector<EvalBox> gt_boxes, std::vector<EvalBox> preds) {
  Case c;
  c.gt.source = "gt";
  GtSample& s = c.gt.add_sample("s0");
  s.ego_translation = {100, 200, 0};
  for (EvalBox& b : gt_boxes) {
    b.translation[0] += 100;
    b.translation[1] += 200;
    b.index = static_cast<uint32_t>(s.boxes.size());
    s.boxes.push_back(b);
  }
  c.results.source = "results";
  c.results.index["s0"] = 0;
  c.results.samples.push_back(ResultSample{"s0", {}, {}});
  for (EvalBox& b : preds) {
    b.translation[0] += 100;
    b.translation[1] += 200;
    b.index = static_cast<uint32_t>(c.results.samples[0].boxes.size());
    c.results.samples[0].boxes.push_back(b);
  }
  return c;
}

const int kCar = 0, kBicycle = 7, kBarrier = 9;

TEST(Evaluate, MatchDistanceIsStrict) {
  // Exactly 0.5 m off: no match at 0.5, a match at 1.0.
  Case c = one_sample({box(10, 0, kCar)}, {box(10.5, 0, kCar, 0.9)});
  const Evaluation e = evaluate(c.gt, c.results, detection_cvpr_2019());
  EXPECT_EQ(e.metrics.label_aps[kCar][0], 0.0);
  EXPECT_DOUBLE_EQ(e.metrics.label_aps[kCar][1], 1.0);
}

TEST(Evaluate, RangeIsStrictAndMeasuredInGlobalXy) {
  // A car exactly 50 m away is out; the ego's rotation and z do not enter.
  Case c = one_sample({box(50, 0, kCar), box(0, 49.5, kCar)}, {box(0, 49.5, kCar, 0.5)});
  c.gt.samples[0].ego_rotation = {std::cos(0.2), std::sin(0.2), 0, 0};  // a tilted ego
  c.gt.samples[0].ego_translation[2] = 30;
  const Evaluation e = evaluate(c.gt, c.results, detection_cvpr_2019());
  EXPECT_EQ(e.gt_counts.after_distance, 1u);
  EXPECT_DOUBLE_EQ(e.metrics.label_aps[kCar][0], 1.0);
}

TEST(Evaluate, GroundTruthWithoutPointsIsDroppedAndItsPredictionIsAFalsePositive) {
  Case c = one_sample({box(10, 0, kCar, -1, 0), box(20, 0, kCar)}, {box(10, 0, kCar, 0.9), box(20, 0, kCar, 0.8)});
  const Evaluation e = evaluate(c.gt, c.results, detection_cvpr_2019());
  EXPECT_EQ(e.gt_counts.after_points, 1u);
  EXPECT_EQ(e.pred_counts.after_points, 2u);
  // FP then TP: precision 1/2 at recall 1.
  EXPECT_EQ(e.data(0, 0).precision[100], 0.5);
}

TEST(Evaluate, BikesInARackAreDroppedPedestriansAreNot) {
  Case c = one_sample({box(10, 5, kBicycle), box(10, 5, 5), box(10, 5, kBicycle)}, {});
  c.gt.samples[0].boxes[2].translation[2] = 3;  // above the rack: kept
  c.gt.samples[0].bike_racks.push_back(BikeRack{{110, 205, 1}, {2, 4, 1}, {1, 0, 0, 0}});
  const Evaluation e = evaluate(c.gt, c.results, detection_cvpr_2019());
  EXPECT_EQ(e.gt_counts.per_class[kBicycle], 1u);
  EXPECT_EQ(e.gt_counts.per_class[5], 1u);
}

TEST(Evaluate, EqualScoresGoLaterInTheFileFirst) {
  // Two predictions of one GT with equal scores: the later one in the file takes it, so its
  // (wrong) attribute is the one that counts.
  EvalBox first = box(10, 0, kCar, 0.5), second = box(10.1, 0, kCar, 0.5);
  Case c = one_sample({box(10, 0, kCar)}, {first, second});
  c.gt.samples[0].boxes[0].attribute = 5;
  c.results.samples[0].boxes[0].attribute = 5;
  c.results.samples[0].boxes[1].attribute = 6;
  const Evaluation e = evaluate(c.gt, c.results, detection_cvpr_2019());
  EXPECT_NEAR(e.metrics.label_tp_errors[kCar][static_cast<size_t>(TpMetric::kTrans)], 0.1, 1e-12);
  EXPECT_EQ(e.metrics.label_tp_errors[kCar][static_cast<size_t>(TpMetric::kAttr)], 1.0);
}

TEST(Evaluate, MaxRecallExactlyPointSevenGivesZeroAtBinSeventy) {
  // 7 of 10 found: rec 0.7 < the grid's 0.7000000000000001, so bin 70 is beyond the curve.
  std::vector<EvalBox> gt, pred;
  for (int i = 0; i < 10; ++i) gt.push_back(box(3.0 * i + 1, 0, kCar));
  for (int i = 0; i < 7; ++i) pred.push_back(box(3.0 * i + 1, 0, kCar, 0.9 - 0.01 * i));
  Case c = one_sample(gt, pred);
  const Evaluation e = evaluate(c.gt, c.results, detection_cvpr_2019());
  EXPECT_EQ(e.data(0, 0).precision[69], 1.0);
  EXPECT_EQ(e.data(0, 0).precision[70], 0.0);
  EXPECT_EQ(e.data(0, 0).max_recall_ind(), 69u);
}

TEST(Evaluate, ClassesWithoutGroundTruthScoreApZeroAndErrorsOne) {
  Case c = one_sample({box(10, 0, kCar)}, {box(10, 0, kCar, 0.9), box(5, 5, 3, 0.8)});
  const Evaluation e = evaluate(c.gt, c.results, detection_cvpr_2019());
  for (int cls = 1; cls < kNumDetectionClasses; ++cls) {
    EXPECT_EQ(e.metrics.mean_dist_aps()[static_cast<size_t>(cls)], 0.0);
    EXPECT_EQ(e.metrics.label_tp_errors[static_cast<size_t>(cls)][0], 1.0);
  }
  EXPECT_TRUE(std::isnan(e.metrics.label_tp_errors[8][static_cast<size_t>(TpMetric::kOrient)]));
  EXPECT_TRUE(std::isnan(e.metrics.label_tp_errors[kBarrier][static_cast<size_t>(TpMetric::kVel)]));
  EXPECT_EQ(e.metrics.label_tp_errors[kBarrier][static_cast<size_t>(TpMetric::kOrient)], 1.0);
  EXPECT_NEAR(e.metrics.mean_ap(), 0.1, 1e-15);
}

TEST(Evaluate, ATruePositiveWithScoreZeroShortensTheTpRange) {
  // Recall 1 is reached only by a score-0 match: the confidence there is 0, so max_recall_ind
  // (the last non-zero confidence) stops one bin short; with score 0.1 it does not.
  for (const double score : {0.0, 0.1}) {
    Case c = one_sample({box(10, 0, kCar), box(20, 0, kCar)}, {box(10, 0, kCar, 0.9), box(21.5, 0, kCar, score)});
    const Evaluation e = evaluate(c.gt, c.results, detection_cvpr_2019());
    EXPECT_EQ(e.data(0, detection_cvpr_2019().dist_th_tp_index).max_recall_ind(), score == 0 ? 99u : 100u);
  }
}

TEST(Evaluate, RecallNeverPastTheMinimumGivesTpErrorOne) {
  std::vector<EvalBox> gt;
  for (int i = 0; i < 20; ++i) gt.push_back(box(2.0 * i + 1, 0, kCar));
  Case c = one_sample(gt, {box(1, 0, kCar, 0.9)});  // recall 0.05
  const Evaluation e = evaluate(c.gt, c.results, detection_cvpr_2019());
  EXPECT_EQ(e.metrics.label_tp_errors[kCar][static_cast<size_t>(TpMetric::kTrans)], 1.0);
}

TEST(Evaluate, AMatchedBoxWithAZeroSizeIsRefused) {
  EvalBox p = box(10, 0, kCar, 0.9);
  p.size[2] = 0;
  Case c = one_sample({box(10, 0, kCar)}, {p});
  try {
    evaluate(c.gt, c.results, detection_cvpr_2019());
    FAIL() << "no error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("sample 's0'"), std::string::npos) << err.what();
  }
}

// results_nusc.json is read from parser events; shapes the devkit refuses are refused with the
// place named, fields it ignores are skipped however deep, and meta comes back as it was.
TEST(ResultsReader, ShapesAndPlaces) {
  const std::string box = R"({"sample_token": "a", "translation": [1, 2, 3], "size": [1, 2, 3],
      "rotation": [1, 0, 0, 0], "velocity": [null, 0.5], "detection_name": "car", "detection_score": 0.5,
      "attribute_name": "")";
  auto read = [](const std::string& text) { return parse_results(text, "r.json", 500); };
  auto message = [&](const std::string& text) {
    try {
      read(text);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // A float num_pts past int64 (undefined to cast; fuzz_eval_results found it) saturates, keeping
  // its sign and non-zeroness as Python's int() does.
  for (const auto& [pts, want] : {std::pair{"3.3e35", std::numeric_limits<int64_t>::max()},
                                  std::pair{"-3.3e35", std::numeric_limits<int64_t>::min()},
                                  std::pair{"-2.9", int64_t{-2}}}) {
    const Results big = read(R"({"meta": {}, "results": {"a": [)" + box + R"(, "num_pts": )" + pts + "}]}}");
    EXPECT_EQ(big.samples.at(0).boxes.at(0).num_pts, want) << pts;
  }
  const Results r = read(R"({"results": {"a": [)" + box + R"(, "extra": {"x": [1, [2, {"y": 3}]]},
      "detection_name": "truck"}], "b": []}, "meta": {"m": [1, {"n": null}], "s": "t"}})");
  ASSERT_EQ(r.samples.size(), 2u);
  EXPECT_EQ(r.samples[0].boxes[0].detection, *detection_index("truck"));  // a repeated key: the last
  EXPECT_TRUE(std::isnan(r.samples[0].boxes[0].velocity[0]));
  EXPECT_EQ(r.meta, ojson::parse(R"({"m": [1, {"n": null}], "s": "t"})"));
  EXPECT_EQ(read(R"({"meta": 5, "results": {}})").meta, ojson(5));
  EXPECT_NE(message(R"({"meta": {}, "results": []})").find("'results' is not an object"), std::string::npos);
  EXPECT_NE(message(R"({"meta": {}, "results": {"a": {}}})").find("results['a']: is not a list"), std::string::npos);
  EXPECT_NE(message(R"({"meta": {}, "results": {"a": [5]}})").find("results['a'][0]: is not a box"), std::string::npos);
  EXPECT_NE(message(R"({"meta": {}, "results": {"a": [)" + box + R"(, "translation": [1, [2], 3]}]}})").find(
                "translation holds"), std::string::npos);
  EXPECT_NE(message(R"({"meta": {}, "results": {"a": [)" + box + R"(, "size": {"w": 1}}]}})").find(
                "size is an object"), std::string::npos);
  EXPECT_NE(message(R"({"meta": {}, "results": {"a": [)" + box + R"(, "detection_score": "high"}]}})").find(
                "detection_score is the string 'high'"), std::string::npos);
  EXPECT_NE(message(R"({"meta": {}, "results": {"a": [)").find("not valid JSON"), std::string::npos);
  EXPECT_NE(message(R"([1, 2])").find("is a list"), std::string::npos);
  EXPECT_NE(message(R"({"results": {}})").find("'meta'"), std::string::npos);
  // A box listed under another sample's key keeps its own token for matching.
  const Results moved = read(R"({"meta": {}, "results": {"b": [)" + box + R"(}]}})");
  ASSERT_EQ(moved.samples[0].own_tokens.size(), 1u);
  EXPECT_EQ(moved.samples[0].own_tokens[0].second, "a");
}

TEST(PythonJson, FloatReprAsPython) {
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(-0.0), "-0.0");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(1e-05), "1e-05");
  EXPECT_EQ(python_float_repr(1.5e-07), "1.5e-07");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1234567890123456.0), "1234567890123456.0");
  EXPECT_EQ(python_float_repr(0.7000000000000001), "0.7000000000000001");
  EXPECT_EQ(python_float_repr(kNaN), "NaN");
}

TEST(PythonJson, DumpsLikeJsonDumpIndent2) {
  const ojson j = ojson::parse(R"({"a": [1, 2.5, {}], "b": {"c": null, "d": []}, "é": "x\ny"})");
  EXPECT_EQ(dump_python(j), "{\n  \"a\": [\n    1,\n    2.5,\n    {}\n  ],\n  \"b\": {\n    \"c\": null,\n"
                            "    \"d\": []\n  },\n  \"\\u00e9\": \"x\\ny\"\n}");
  EXPECT_EQ(dump_python(ojson(kNaN)), "null");
  EXPECT_EQ(dump_python(ojson(kNaN), 2, "NaN"), "NaN");
}

TEST(PythonJson, ReadsNanTokensOutsideStrings) {
  const ojson j = parse_python_json(R"({"v": [NaN, 1], "s": "NaN"})", "t");
  EXPECT_TRUE(j["v"][0].is_null());
  EXPECT_EQ(j["s"], "NaN");
  EXPECT_THROW(parse_python_json("{", "t"), Error);
}

// Found by fuzz_eval_results: nlohmann reports a number too large for a double as out_of_range, not
// parse_error, and it escaped as a foreign exception.
TEST(PythonJson, ANumberTooLargeForADoubleIsAnInputError) {
  try {
    parse_python_json(R"({"v": [1, 9e9998]})", "gt.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("gt.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("9e9998"), std::string::npos) << msg;
  }
}

TEST(DetectionConfig, BuiltInAndFromJson) {
  const DetectionConfig a = detection_cvpr_2019();
  EXPECT_EQ(a.dist_th_keys, (std::vector<std::string>{"0.5", "1.0", "2.0", "4.0"}));
  EXPECT_EQ(a.dist_th_tp(), 2.0);
  EXPECT_NE(dump_python(a.serialized).find("\"car\": 50,"), std::string::npos);  // ints stay ints
  ojson j = a.serialized;
  j["dist_ths"] = {1, 2};
  j["dist_th_tp"] = 2;
  const DetectionConfig b = detection_config_from_json(j, "cfg.json");
  EXPECT_EQ(b.dist_th_keys, (std::vector<std::string>{"1", "2"}));  // json.dump of int keys
  j = a.serialized;
  j["class_range"].erase("car");
  EXPECT_THROW(detection_config_from_json(j, "cfg.json"), Error);
  j = a.serialized;
  j["dist_th_tp"] = 3.0;
  EXPECT_THROW(detection_config_from_json(j, "cfg.json"), Error);
  j = a.serialized;
  j["dist_fcn"] = "iou";
  try {
    detection_config_from_json(j, "cfg.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  }
}

}  // namespace
}  // namespace bev::eval
