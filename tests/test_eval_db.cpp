// Ground truth from a nuScenes database: a small v1.0-schema database written by the test (every
// table load_gt touches), read as the devkit's load_gt reads it — split selection, table order,
// categories, attributes, num_pts, box_velocity at the ends of a track and across a time gap, the
// LIDAR_TOP key frame's ego pose, bike racks — and `--export-gt` then eval equal to eval from the
// database, through the library and through the CLI.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <string>

#include "bevformer/error.h"
#include "eval/metrics.h"
#include "eval/nuscenes_db.h"
#include "eval_test_util.h"

namespace bev::eval {
namespace {

constexpr int64_t kT0 = 1532402927647951;  // microseconds

ojson rec(std::initializer_list<std::pair<const std::string, ojson>> fields) {
  ojson j = ojson::object();
  for (const auto& [k, v] : fields) j[k] = v;
  return j;
}

// DATAROOT/v1.0-mini/*.json. Scene scene-0103 (mini_val) has samples s1..s4 at 0, 0.5, 2.5 and
// 4.5 s; scene-0916 (mini_val) has s5; scene-0061 (mini_train) has s6.
class Database : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::scratch_dir();
    dir_ = root_ + "/v1.0-mini";
    std::filesystem::create_directories(dir_);
    tables_["category"] = ojson::array();
    for (const char* c : {"vehicle.car", "human.pedestrian.adult", "vehicle.bicycle", "static_object.bicycle_rack",
                          "animal", "movable_object.barrier"}) {
      tables_["category"].push_back(rec({{"token", std::string("cat-") + c}, {"name", c}, {"description", ""}}));
    }
    tables_["attribute"] = ojson::array();
    for (const char* a : {"vehicle.moving", "vehicle.parked", "cycle.without_rider", "pedestrian.standing"}) {
      tables_["attribute"].push_back(rec({{"token", std::string("attr-") + a}, {"name", a}, {"description", ""}}));
    }
    tables_["visibility"] = ojson::array();
    tables_["sensor"] = {rec({{"token", "sensor-lidar"}, {"channel", "LIDAR_TOP"}, {"modality", "lidar"}}),
                         rec({{"token", "sensor-cam"}, {"channel", "CAM_FRONT"}, {"modality", "camera"}})};
    tables_["calibrated_sensor"] = {rec({{"token", "cs-lidar"}, {"sensor_token", "sensor-lidar"}}),
                                    rec({{"token", "cs-cam"}, {"sensor_token", "sensor-cam"}})};
    tables_["log"] = {rec({{"token", "log-1"}, {"location", "singapore-onenorth"}})};
    tables_["map"] = ojson::array();
    tables_["scene"] = {rec({{"token", "scene-a"}, {"name", "scene-0103"}, {"log_token", "log-1"}}),
                        rec({{"token", "scene-b"}, {"name", "scene-0916"}, {"log_token", "log-1"}}),
                        rec({{"token", "scene-c"}, {"name", "scene-0061"}, {"log_token", "log-1"}})};
    const std::pair<const char*, const char*> samples[] = {{"s1", "scene-a"}, {"s2", "scene-a"}, {"s6", "scene-c"},
                                                           {"s3", "scene-a"}, {"s4", "scene-a"}, {"s5", "scene-b"}};
    const std::map<std::string, double> seconds = {{"s1", 0}, {"s2", 0.5}, {"s3", 2.5}, {"s4", 4.5}, {"s5", 0}, {"s6", 9}};
    tables_["sample"] = ojson::array();
    tables_["sample_data"] = ojson::array();
    tables_["ego_pose"] = ojson::array();
    for (const auto& [s, scene] : samples) {
      const std::string tok = s;
      tables_["sample"].push_back(rec({{"token", tok},
                                       {"timestamp", kT0 + static_cast<int64_t>(seconds.at(tok) * 1e6)},
                                       {"scene_token", scene}}));
      // A camera key frame with another pose and a lidar sweep that is no key frame: neither counts.
      add_sample_data(tok, "cs-cam", true, {1e4, 1e4, 0});
      add_sample_data(tok, "cs-lidar", false, {2e4, 2e4, 0});
      add_sample_data(tok, "cs-lidar", true, ego_of(tok));
    }
    tables_["instance"] = ojson::array();
    tables_["sample_annotation"] = ojson::array();
    instance("car1", "vehicle.car");
    instance("ped1", "human.pedestrian.adult");
    instance("bike1", "vehicle.bicycle");
    instance("rack1", "static_object.bicycle_rack");
    instance("dog1", "animal");
    instance("bar1", "movable_object.barrier");
    // Table order decides the order within a sample: in s1 the pedestrian comes first.
    annotate("p1", "s1", "ped1", {5, 3, 1}, {"pedestrian.standing"}, 4, 0, "", "");
    annotate("c1", "s1", "car1", {10, 0, 1}, {"vehicle.moving"}, 3, 2, "", "c2");
    annotate("d1", "s1", "dog1", {2, 2, 0}, {}, 9, 0, "", "");
    annotate("c2", "s2", "car1", {11, 0.5, 1}, {}, 7, 0, "c1", "c3");
    annotate("r2", "s2", "rack1", {20, 5, 0.5}, {}, 0, 0, "", "");
    annotate("b2", "s2", "bike1", {20.5, 5, 0.6}, {"cycle.without_rider"}, 5, 0, "", "");
    annotate("c3", "s3", "car1", {14, 2, 1}, {"vehicle.parked"}, 7, 0, "c2", "c4");
    annotate("c4", "s4", "car1", {15, 4, 1}, {"vehicle.parked"}, 7, 0, "c3", "");
    annotate("x5", "s5", "bar1", {3, 3, 0.5}, {}, 0, 0, "", "");
    annotate("c6", "s6", "car1", {1, 1, 1}, {}, 1, 0, "", "");
    write();
  }

  static std::array<double, 3> ego_of(const std::string& s) { return {1.0 * (s[1] - '0'), -1.0, 0.0}; }

  void add_sample_data(const std::string& sample, const char* cs, bool key, std::array<double, 3> pose) {
    const std::string tok = "sd-" + sample + "-" + cs + (key ? "-key" : "-sweep");
    tables_["ego_pose"].push_back(rec({{"token", "ep-" + tok}, {"translation", pose}, {"rotation", {1.0, 0.0, 0.0, 0.0}},
                                       {"timestamp", kT0}}));
    tables_["sample_data"].push_back(rec({{"token", tok}, {"sample_token", sample}, {"ego_pose_token", "ep-" + tok},
                                          {"calibrated_sensor_token", cs}, {"is_key_frame", key},
                                          {"filename", "samples/x.bin"}}));
  }
  void instance(const std::string& tok, const std::string& category) {
    tables_["instance"].push_back(rec({{"token", tok}, {"category_token", "cat-" + category}}));
  }
  void annotate(const std::string& tok, const std::string& sample, const std::string& inst, std::array<double, 3> t,
                std::vector<std::string> attrs, int lidar, int radar, const std::string& prev, const std::string& next) {
    ojson a = ojson::array();
    for (const std::string& x : attrs) a.push_back("attr-" + x);
    tables_["sample_annotation"].push_back(rec({{"token", tok}, {"sample_token", sample}, {"instance_token", inst},
                                                {"attribute_tokens", a}, {"visibility_token", "4"}, {"translation", t},
                                                {"size", {1.9, 4.5, 1.6}}, {"rotation", {1.0, 0.0, 0.0, 0.0}},
                                                {"num_lidar_pts", lidar}, {"num_radar_pts", radar}, {"prev", prev},
                                                {"next", next}}));
  }
  void write() {
    for (const auto& [name, table] : tables_.items()) write_file_atomically(dir_ + "/" + name + ".json", table.dump(1));
  }
  GroundTruth load(const std::string& split = "mini_val") { return load_nuscenes_gt({root_, "v1.0-mini", split}); }

  std::string root_, dir_;
  ojson tables_ = ojson::object();
};


TEST_F(Database, TheSplitsSamplesInSampleTableOrder) {
  const GroundTruth gt = load();
  ASSERT_EQ(gt.samples.size(), 5u);
  const char* order[] = {"s1", "s2", "s3", "s4", "s5"};  // s6 is mini_train
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(gt.samples[i].token, order[i]);
  EXPECT_EQ(load("mini_train").samples.size(), 1u);
  EXPECT_EQ(default_split("v1.0-mini"), "mini_val");
}

TEST_F(Database, EgoPoseOfTheLidarKeyFrame) {
  const GroundTruth gt = load();
  for (const GtSample& s : gt.samples) EXPECT_EQ(s.ego_translation, ego_of(s.token)) << s.token;
}

TEST_F(Database, BoxesAsLoadGtBuildsThem) {
  const GroundTruth gt = load();
  const GtSample& s1 = gt.samples[0];
  ASSERT_EQ(s1.boxes.size(), 2u);  // the dog is no detection class
  EXPECT_EQ(s1.boxes[0].detection, *detection_index("pedestrian"));
  EXPECT_EQ(s1.boxes[0].attribute, *attribute_index("pedestrian.standing"));
  EXPECT_EQ(s1.boxes[1].detection, *detection_index("car"));
  EXPECT_EQ(s1.boxes[1].num_pts, 5);  // lidar 3 + radar 2
  EXPECT_EQ(gt.samples[1].boxes[0].attribute, -1);  // no attribute: ""
  // The rack is a bike rack of s2, not a box; the barrier without points stays (filtering drops it).
  ASSERT_EQ(gt.samples[1].bike_racks.size(), 1u);
  EXPECT_EQ(gt.samples[1].bike_racks[0].translation, (std::array<double, 3>{20, 5, 0.5}));
  EXPECT_EQ(gt.samples[1].boxes.size(), 2u);
  EXPECT_EQ(gt.samples[4].boxes.at(0).num_pts, 0);
}

TEST_F(Database, BoxVelocityFromTheNeighbours) {
  const GroundTruth gt = load();
  auto v = [&](size_t sample, size_t box) { return gt.samples[sample].boxes[box].velocity; };
  auto t = [](double s) { return 1e-6 * static_cast<double>(kT0 + static_cast<int64_t>(s * 1e6)); };
  // c1, first of its track: one-sided to c2.
  EXPECT_EQ(v(0, 1)[0], (11.0 - 10.0) / (t(0.5) - t(0)));
  EXPECT_EQ(v(0, 1)[1], (0.5 - 0.0) / (t(0.5) - t(0)));
  // c2: centred over 2.5 s (up to 3 s allowed for a centred difference).
  EXPECT_EQ(v(1, 0)[0], (14.0 - 10.0) / (t(2.5) - t(0)));
  EXPECT_EQ(v(1, 0)[1], (2.0 - 0.0) / (t(2.5) - t(0)));
  // c3: centred over 4 s > 3 s; c4, last: one-sided over 2 s > 1.5 s. Both unknown.
  EXPECT_TRUE(std::isnan(v(2, 0)[0]) && std::isnan(v(2, 0)[1]));
  EXPECT_TRUE(std::isnan(v(3, 0)[0]));
  // p1 has no neighbour at all.
  EXPECT_TRUE(std::isnan(v(0, 0)[0]));
}

TEST_F(Database, BoxVelocityEdgesDirectly) {
  const AnnotationTrack a{{0, 0, 0}, 0, "", ""}, b{{1, 2, 0}, 1500000, "", ""}, c{{2, 4, 0}, 3000001, "", ""};
  EXPECT_EQ(box_velocity(a, nullptr, &b)[1], 2.0 / 1.5);        // exactly 1.5 s: still allowed
  EXPECT_TRUE(std::isnan(box_velocity(a, nullptr, &c)[0]));     // 3.000001 s one-sided
  EXPECT_TRUE(std::isnan(box_velocity(b, &a, &c)[0]));          // 3.000001 s centred
  EXPECT_TRUE(std::isnan(box_velocity(a, nullptr, nullptr)[0]));
}

TEST_F(Database, ExportedGtReadsBackAndEvaluatesTheSame) {
  const GroundTruth db = load();
  const std::string path = root_ + "/gt.json";
  write_ground_truth(path, db);
  const GroundTruth file = read_ground_truth(path);
  ASSERT_EQ(file.samples.size(), db.samples.size());
  // Predictions: every GT box a little off, plus a bicycle in the rack (dropped) and a FP.
  Results r;
  r.source = "results";
  r.meta = {{"use_camera", true}};
  for (const GtSample& s : db.samples) {
    r.index[s.token] = r.samples.size();
    ResultSample rs{s.token, {}, {}};
    for (EvalBox b : s.boxes) {
      b.translation[0] += 0.3;
      b.score = 0.5 + 0.01 * static_cast<double>(rs.boxes.size());
      b.num_pts = -1;
      b.velocity = {1, 0};
      rs.boxes.push_back(b);
    }
    r.samples.push_back(rs);
  }
  EvalBox bike = db.samples[1].boxes[1];
  bike.score = 0.99;
  bike.num_pts = -1;
  r.samples[1].boxes.push_back(bike);
  const Evaluation a = evaluate(db, r, detection_cvpr_2019());
  const Evaluation b = evaluate(file, r, detection_cvpr_2019());
  EXPECT_EQ(a.pred_counts.after_bike_racks, a.pred_counts.after_points - 2);  // both bicycles sat in the rack
  auto text = [](const Evaluation& e) {
    DetectionMetrics m = e.metrics;
    m.eval_time = 0;
    return dump_python(metrics_summary_json(m, ojson::object()));
  };
  EXPECT_EQ(text(a), text(b));
  EXPECT_GT(a.metrics.mean_ap(), 0.0);
}

TEST_F(Database, TheCliExportsAndEvaluatesTheSameAsFromTheDatabase) {
  const std::string bin = std::string(BEV_BINARY_DIR) + "/bin/bevformer";
  const std::string gt = root_ + "/cli_gt.json", res = root_ + "/cli_results.json";
  // Results: the exported GT's boxes as predictions.
  ASSERT_EQ(std::system((bin + " -q eval --dataroot " + root_ + " --version v1.0-mini --export-gt " + gt).c_str()), 0);
  const GroundTruth g = read_ground_truth(gt);
  ojson results = ojson::object();
  for (const GtSample& s : g.samples) {
    ojson list = ojson::array();
    for (const EvalBox& b : s.boxes) {
      EvalBox p = b;
      p.score = 0.7;
      p.num_pts = -1;
      list.push_back(box_to_json(p, s.token, false));
    }
    results[s.token] = list;
  }
  write_file_atomically(res, ojson{{"meta", {{"use_camera", true}}}, {"results", results}}.dump());
  const std::string a = root_ + "/a.json", b = root_ + "/b.json";
  ASSERT_EQ(std::system((bin + " -q eval --results " + res + " --dataroot " + root_ + " --version v1.0-mini --json > " + a).c_str()), 0);
  ASSERT_EQ(std::system((bin + " -q eval --results " + res + " --gt " + gt + " --json > " + b).c_str()), 0);
  ojson ja = parse_python_json(read_text_file(a), a), jb = parse_python_json(read_text_file(b), b);
  ja.erase("eval_time");
  jb.erase("eval_time");
  EXPECT_EQ(ja, jb);
  EXPECT_GT(ja.at("mean_ap").get<double>(), 0.0);
}

TEST_F(Database, ASplitOfAnotherVersionIsRefused) {
  try {
    load("val");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("v1.0-trainval"), std::string::npos) << e.what();
  }
}

TEST_F(Database, ACustomSplitFromSplitsJson) {
  EXPECT_THROW(load("mine"), Error);
  write_file_atomically(dir_ + "/splits.json", R"({"mine": ["scene-0061", "scene-0916"]})");
  const GroundTruth gt = load("mine");
  ASSERT_EQ(gt.samples.size(), 2u);
  EXPECT_EQ(gt.samples[0].token, "s6");
  EXPECT_EQ(gt.samples[1].token, "s5");
}

TEST_F(Database, MoreThanOneAttributeIsRefused) {
  tables_["sample_annotation"][1]["attribute_tokens"] = {"attr-vehicle.moving", "attr-vehicle.parked"};
  write();
  try {
    load();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("c1"), std::string::npos) << e.what();
  }
}

TEST_F(Database, ABrokenReferenceNamesTableAndRecord) {
  tables_["instance"][0]["category_token"] = "cat-nothing";
  write();
  try {
    load();
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("instance.json: record 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cat-nothing"), std::string::npos) << msg;
  }
}

TEST_F(Database, ANumberTooLargeForADoubleNamesTheTable) {
  write();
  write_file_atomically(dir_ + "/ego_pose.json", R"([{"token": "e", "translation": [1e999, 0, 0]}])");
  try {
    load();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("ego_pose.json"), std::string::npos) << e.what();
  }
}

TEST_F(Database, AMissingTableIsNotFound) {
  std::filesystem::remove(dir_ + "/ego_pose.json");
  try {
    load();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
    EXPECT_NE(std::string(e.what()).find("ego_pose.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace bev::eval
