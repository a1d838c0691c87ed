// The profile's device-profile flow on the micro golden config: signposts named and ordered
// exactly as docs/PROFILING.md lists them (replay windows per round, the eager run's windows and
// one signpost per module stage it enters), the run's metadata (--json), the graph report of each
// recorded variant (ops, tensors, arena buffers with their lives, weights, a self-contained HTML
// page), the host memory guard, and a given frame as the warm-up's input (--input), all on one
// profile run (about 7 s).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bevformer/error.h"
#include "bevformer/profile.h"
#include "io_test_util.h"
#include "micro_frames.h"
#include "model/config.h"

namespace bev {
namespace {

const std::string kMicro = std::string(BEV_SHARED_DIR) + "/golden/micro";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The signposts of a profile with `rounds` rounds and an eager frame, in order, as
// docs/PROFILING.md names them (`pixels`: input from a frame file, preprocessed in the image stage).
std::vector<std::string> expected_signposts(const ModelConfig& cfg, int rounds, bool pixels) {
  std::vector<std::string> s;
  for (int k = 1; k <= rounds; ++k) {
    const std::string n = k == 1 ? "" : std::to_string(k);
    s.insert(s.end(), {"trace" + n, "image" + n, "image" + n + "_end", "bev" + n, "bev" + n + "_end", "trace" + n + "_end"});
  }
  s.insert(s.end(), {"eager", "eager_image"});
  if (pixels) s.push_back("img.preprocess");
  s.push_back("img.stem");
  const int last = *std::max_element(cfg.backbone.out_indices.begin(), cfg.backbone.out_indices.end());
  for (int i = 0; i <= last; ++i) s.push_back("img.layer" + std::to_string(i + 1));
  s.insert(s.end(), {"img.neck", "img.values", "eager_image_end", "eager_bev", "enc.queries"});
  for (int i = 0; i < cfg.transformer.encoder_layers; ++i) {
    for (const char* part : {".tsa", ".sca", ".ffn"}) s.push_back("enc" + std::to_string(i) + part);
  }
  s.insert(s.end(), {"enc.out", "dec.value_proj"});
  for (int i = 0; i < cfg.transformer.decoder_layers; ++i) {
    for (const char* part : {".self", ".cross", ".ffn", ".reg"}) s.push_back("dec" + std::to_string(i) + part);
  }
  s.insert(s.end(), {"dec.heads", "dec.pack", "eager_bev_end", "eager_end"});
  return s;
}

// The micro golden set's frame 0 as a frame JSON in `tmp`, its images by absolute path.
std::string micro_frame_file(const testing::TempDir& tmp, bool drop_a_camera = false) {
  nlohmann::json frame = testing::micro_frame_json(0);
  for (nlohmann::json& c : frame["cameras"]) c["image"] = kMicro + "/" + c["image"].get<std::string>();
  if (drop_a_camera) frame["cameras"].erase(frame["cameras"].begin());
  const std::string path = tmp.file(drop_a_camera ? "frame_5cams.json" : "frame.json");
  std::ofstream(path) << frame.dump();
  return path;
}

ProfileOptions micro_options(const std::string& dir) {
  ProfileOptions o;
  o.config = kMicro + "/config.json";
  o.weights = kMicro + "/checkpoint.pth";
  o.rounds = 2;
  o.threads = 2;
  o.out_dir = dir + "/prof";
  return o;
}

// One profile of the micro model (each costs seconds), on the golden set's frame 0 given as
// --input (its PNGs and calibration as every warm-up frame: the history in use from the second).
TEST(ProfileFlow, SignpostsMetadataGraphReportAndGivenInputOfTheMicroModel) {
  const testing::TempDir tmp;
  const ModelConfig cfg = load_config(kMicro + "/config.json");
  ProfileOptions o = micro_options(tmp.str());
  o.input = micro_frame_file(tmp);
  o.eager = true;
  o.json_path = tmp.file("run.json");
  o.graph_report = tmp.file("graph");
  const ProfileReport r = run_profile(o);

  // Signposts: names and order, exactly.
  EXPECT_EQ(r.signposts, expected_signposts(cfg, 2, /*pixels=*/true));

  // The run's metadata.
  const nlohmann::json run = nlohmann::json::parse(read_text(o.json_path));
  EXPECT_EQ(r.input, o.input);
  EXPECT_EQ(run["input"], o.input);
  EXPECT_GT(run["load_seconds"].get<double>(), 0);
  EXPECT_EQ(run["detections"].get<size_t>(), r.detections);
  EXPECT_GT(r.detections, 0u);
  EXPECT_EQ(run["signposts"].get<std::vector<std::string>>(), r.signposts);
  EXPECT_EQ(run["device"]["backend"], "cpu");
  EXPECT_EQ(run["device"]["threads"], 2);
  EXPECT_EQ(run["knobs"]["rounds"], 2);
  EXPECT_EQ(run["knobs"]["precision"], "f32");
  ASSERT_GE(run["stages"].size(), 3u);  // image, bev (first frame), bev (with history)
  for (const nlohmann::json& s : run["stages"]) {
    const std::string d = s["description"];
    EXPECT_NE(d.find(s["name"].get<std::string>() + ": " + std::to_string(s["ops"].get<size_t>()) + " ops"),
              std::string::npos)
        << d.substr(0, 200);
  }

  // The graph report: per variant, the op graph and its arena, consistent with itself.
  for (const std::string variant : {"image", "bev"}) {
    SCOPED_TRACE(variant);
    const std::string dir = o.graph_report + "/" + variant;
    const nlohmann::json g = nlohmann::json::parse(read_text(dir + "/graph.json"));
    const nlohmann::json& ops = g["ops"];
    const nlohmann::json& buffers = g["buffers"];
    ASSERT_GT(ops.size(), 0u);
    ASSERT_GT(buffers.size(), 0u);
    EXPECT_EQ(g["ops_count"].get<size_t>(), ops.size());
    const auto arena = g["arena_bytes"].get<size_t>();
    size_t sum = 0;
    for (const nlohmann::json& b : buffers) {
      EXPECT_LE(b["offset"].get<size_t>() + b["bytes"].get<size_t>(), arena) << b.dump();
      EXPECT_LE(b["first_op"].get<size_t>(), b["last_op"].get<size_t>()) << b.dump();
      sum += b["bytes"].get<size_t>();
    }
    EXPECT_EQ(sum, g["no_reuse_bytes"].get<size_t>());
    // Every tensor an op touches in the arena is alive then, and buffers alive at once never
    // share a byte.
    std::map<std::string, const nlohmann::json*> by_id;
    for (const nlohmann::json& b : buffers) by_id[b["id"]] = &b;
    for (const nlohmann::json& op : ops) {
      const auto i = op["index"].get<size_t>();
      for (const char* side : {"inputs", "outputs"}) {
        for (const nlohmann::json& t : op[side]) {
          ASSERT_TRUE(t.contains("shape") && t.contains("dtype") && t.contains("buffer")) << t.dump();
          const auto it = by_id.find(t["buffer"]);
          if (it == by_id.end()) continue;  // outside the arena
          EXPECT_LE((*it->second)["first_op"].get<size_t>(), i);
          EXPECT_GE((*it->second)["last_op"].get<size_t>(), i);
        }
      }
      std::vector<std::pair<size_t, size_t>> live;
      for (const nlohmann::json& b : buffers) {
        if (b["first_op"].get<size_t>() <= i && i <= b["last_op"].get<size_t>()) {
          live.emplace_back(b["offset"].get<size_t>(), b["offset"].get<size_t>() + b["bytes"].get<size_t>());
        }
      }
      std::sort(live.begin(), live.end());
      for (size_t k = 1; k < live.size(); ++k) EXPECT_LE(live[k - 1].second, live[k].first) << "op " << i;
    }
    EXPECT_GT(g["weights"].size(), 0u);
    EXPECT_GT(g["weight_bytes"].get<size_t>(), 0u);
    // The page: the plot and the op table, nothing fetched from anywhere.
    const std::string html = read_text(dir + "/index.html");
    EXPECT_NE(html.find("<svg"), std::string::npos);
    EXPECT_NE(html.find("<table>"), std::string::npos);
    for (const char* fetch : {"<script", "<link", "src=", "url(", "@import"}) {
      EXPECT_EQ(html.find(fetch), std::string::npos) << fetch;
    }
  }
  EXPECT_EQ(run["files"].size(), r.files.size());
}

// The host memory guard stops a run that would pass it, with the CLI's usage error (exit 2).
TEST(ProfileFlow, MemoryGuardStopsTheRun) {
  const testing::TempDir tmp;
  ProfileOptions o = micro_options(tmp.str());
  o.max_rss_gb = 0.001;  // 1 MB: less than any process
  try {
    run_profile(o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("--max-rss-gb"), std::string::npos) << e.what();
  }
}

// --input that does not fit the config fails before the model loads (in well under a second).
TEST(ProfileFlow, GivenFrameThatDoesNotFitFailsBeforeLoading) {
  const testing::TempDir tmp;
  ProfileOptions o = micro_options(tmp.str());
  o.input = micro_frame_file(tmp, /*drop_a_camera=*/true);
  try {
    run_profile(o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(o.out_dir + "/summary.json"));
}

}  // namespace
}  // namespace bev
