// The pieces of a dataset-scale run that do not need the engine: results_nusc.json written one
// sample at a time and resumed after a crash, frames split into shards by scene, and the shards'
// results merged back (overlaps and gaps refused).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "bevformer/error.h"
#include "eval/results_merge.h"
#include "eval/results_writer.h"
#include "eval/shard.h"
#include "eval_test_util.h"

namespace bev::eval {
namespace {

const ojson kMeta = {{"use_camera", true}, {"use_lidar", false}};

ojson boxes(int n, double score = 0.5) {
  ojson list = ojson::array();
  for (int i = 0; i < n; ++i) {
    list.push_back({{"translation", {1.0 * i, 2.0, 0.5}}, {"size", {1.9, 4.5, 1.6}}, {"rotation", {1.0, 0.0, 0.0, 0.0}},
                    {"velocity", {0.0, 0.0}}, {"detection_name", "car"}, {"detection_score", score},
                    {"attribute_name", "vehicle.parked"}});
  }
  return list;
}

TEST(ResultsWriter, WritesAFileTheEvaluatorReads) {
  const std::string path = testing::scratch_dir() + "/results_nusc.json";
  {
    ResultsWriter w(path, kMeta, false);
    w.add_sample("a", boxes(2));
    w.add_sample("b", ojson::array());
    NuscBox nb;
    nb.translation = {1, 2, 3};
    nb.size = {1, 2, 3};
    nb.rotation = {1, 0, 0, 0};
    nb.detection_name = "pedestrian";
    nb.detection_score = 0.25;
    nb.attribute_name = "pedestrian.moving";
    w.add_sample("c", std::vector<NuscBox>{nb});
    EXPECT_THROW(w.add_sample("a", boxes(1)), Error);
  }  // the destructor finishes the JSON
  const Results r = read_results(path, 500);
  ASSERT_EQ(r.samples.size(), 3u);
  EXPECT_EQ(r.samples[0].token, "a");
  EXPECT_EQ(r.samples[0].boxes.size(), 2u);
  EXPECT_EQ(r.samples[1].boxes.size(), 0u);
  EXPECT_EQ(r.samples[2].boxes.at(0).score, 0.25);
  EXPECT_TRUE(r.samples[2].own_tokens.empty());  // every box carries its sample_token
  EXPECT_EQ(r.meta, kMeta);
}

TEST(ResultsWriter, ResumesAfterACrashDroppingTheTruncatedLastSample) {
  const std::string path = testing::scratch_dir() + "/results_nusc.json";
  {
    ResultsWriter w(path, kMeta, false);
    w.add_sample("a", boxes(3));
    w.add_sample("b", boxes(1));
    w.add_sample("c", boxes(4));
    // A crash: no finish(), and the last line cut in the middle.
    const size_t size = std::filesystem::file_size(path);
    std::filesystem::resize_file(path, size - 40);
    w.finish();  // appends the footer after the cut line; resume must cope with that too
  }
  std::string text = read_text_file(path);
  text = text.substr(0, text.rfind("\n}}"));  // the crash left no footer
  write_file_atomically(path, text);
  {
    ResultsWriter w(path, kMeta, true);
    EXPECT_EQ(w.samples(), (std::vector<std::string>{"a", "b"}));
    EXPECT_TRUE(w.has_sample("b"));
    EXPECT_FALSE(w.has_sample("c"));
    w.add_sample("c", boxes(4));
    w.add_sample("d", boxes(0));
    w.finish();
  }
  const Results r = read_results(path, 500);
  ASSERT_EQ(r.samples.size(), 4u);
  EXPECT_EQ(r.samples[2].token, "c");
  EXPECT_EQ(r.samples[2].boxes.size(), 4u);
  // A finished file resumes too, and without resume it is replaced.
  {
    ResultsWriter w(path, kMeta, true);
    EXPECT_EQ(w.samples().size(), 4u);
    w.add_sample("e", boxes(1));
  }
  EXPECT_EQ(read_results(path, 500).samples.size(), 5u);
  {
    ResultsWriter w(path, kMeta, false);
    EXPECT_TRUE(w.samples().empty());
  }
  EXPECT_EQ(read_results(path, 500).samples.size(), 0u);
}

TEST(ResultsWriter, TheEnginesOwnSampleTextIsWrittenAsItIsAndResumes) {
  const std::string path = testing::scratch_dir() + "/results_nusc.json";
  ojson a = boxes(2);
  for (ojson& b : a) b["sample_token"] = "a";
  {
    ResultsWriter w(path, kMeta, false);
    w.add_sample_text("a", a.dump());
    w.add_sample_text("b", "[]");
    EXPECT_THROW(w.add_sample_text("a", "[]"), Error);
    EXPECT_THROW(w.add_sample_text("c", "[\n]"), Error);  // two lines: resume could not read it back
    EXPECT_THROW(w.add_sample_text("c", "{}"), Error);
  }
  {
    ResultsWriter w(path, kMeta, true);
    EXPECT_EQ(w.samples(), (std::vector<std::string>{"a", "b"}));
  }
  const Results r = read_results(path, 500);
  ASSERT_EQ(r.samples.size(), 2u);
  EXPECT_EQ(r.samples[0].boxes.size(), 2u);
  EXPECT_TRUE(r.samples[0].own_tokens.empty());
}

TEST(ResultsWriter, ResumeRefusesAFileItDidNotWrite) {
  const std::string path = testing::scratch_dir() + "/other.json";
  write_file_atomically(path, "{\"results\": {\"a\": []}, \"meta\": {}}");
  EXPECT_THROW(ResultsWriter(path, kMeta, true), Error);
  EXPECT_EQ(read_text_file(path), "{\"results\": {\"a\": []}, \"meta\": {}}");  // untouched
}

TEST(Shard, ParsesKOfN) {
  EXPECT_EQ(parse_shard("1/4").index, 0u);
  EXPECT_EQ(parse_shard("4/4").index, 3u);
  EXPECT_EQ(parse_shard("4/4").count, 4u);
  for (const char* bad : {"0/4", "5/4", "1/0", "1", "a/b", "1/2x", ""}) EXPECT_THROW(parse_shard(bad), Error) << bad;
}

TEST(Shard, WholeScenesInOrderCoveringEveryFrameOnce) {
  // Scenes of 40, 40, 10, 10, 10, 39 frames, two interleaved at the end.
  std::vector<std::string> scenes;
  for (const auto& [name, n] : std::vector<std::pair<std::string, int>>{{"A", 40}, {"B", 40}, {"C", 10}, {"D", 10}, {"E", 10}}) {
    for (int i = 0; i < n; ++i) scenes.push_back(name);
  }
  for (int i = 0; i < 39; ++i) scenes.push_back(i % 2 ? "F" : "G");
  scenes.push_back("");  // no scene: a scene of its own
  std::set<size_t> seen;
  std::vector<size_t> sizes;
  for (size_t k = 0; k < 3; ++k) {
    const std::vector<size_t> frames = shard_by_scene(scenes, k, 3);
    EXPECT_TRUE(std::is_sorted(frames.begin(), frames.end()));
    std::set<std::string> mine;
    for (size_t f : frames) {
      EXPECT_TRUE(seen.insert(f).second);
      mine.insert(scenes[f]);
    }
    // A scene is on this shard whole or not at all.
    for (size_t f = 0; f < scenes.size(); ++f) {
      if (!scenes[f].empty() && mine.count(scenes[f])) {
        EXPECT_TRUE(std::count(frames.begin(), frames.end(), f)) << f;
      }
    }
    sizes.push_back(frames.size());
  }
  EXPECT_EQ(seen.size(), scenes.size());
  EXPECT_LE(*std::max_element(sizes.begin(), sizes.end()) - *std::min_element(sizes.begin(), sizes.end()), 40u);
  EXPECT_EQ(shard_by_scene(scenes, 1, 3), shard_by_scene(scenes, 1, 3));  // deterministic
  EXPECT_THROW(shard_by_scene(scenes, 3, 3), Error);
}

TEST(MergeResults, ConcatenatesInFileOrderAndRefusesOverlaps) {
  const std::string dir = testing::scratch_dir();
  auto write_part = [&](const std::string& name, const std::vector<std::string>& tokens) {
    ResultsWriter w(dir + "/" + name, kMeta, false);
    for (const std::string& t : tokens) w.add_sample(t, boxes(1));
    return dir + "/" + name;
  };
  const std::string a = write_part("a.json", {"s1", "s2"}), b = write_part("b.json", {"s3"}),
                    c = write_part("c.json", {"s4", "s2"});
  const Results ab = read_results_files({a, b}, 500);
  ASSERT_EQ(ab.samples.size(), 3u);
  EXPECT_EQ(ab.samples[2].token, "s3");
  EXPECT_EQ(ab.samples[2].boxes[0].sample, 2u);
  try {
    read_results_files({a, b, c}, 500);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'s2'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(a), std::string::npos) << msg;
    EXPECT_NE(msg.find(c), std::string::npos) << msg;
  }
  // Written and read back: the same samples and boxes.
  write_results(dir + "/merged.json", ab);
  const Results back = read_results(dir + "/merged.json", 500);
  ASSERT_EQ(back.samples.size(), 3u);
  EXPECT_EQ(back.samples[1].boxes[0].translation, ab.samples[1].boxes[0].translation);
  // A sample of the GT in none of the parts: refused by name.
  GroundTruth gt;
  gt.source = "gt";
  for (const char* t : {"s1", "s2", "s3", "s5"}) gt.add_sample(t);
  try {
    check_same_samples(ab, gt);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'s5'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace bev::eval
