#include "eval/eval_boxes.h"

#include <cmath>
#include <limits>

#include "bevformer/error.h"
#include "eval/box_fields.h"
#include "eval/detection_config.h"

namespace bev::eval {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

const ojson& member(const ojson& obj, const char* key, const BoxPlace& at) {
  const auto it = obj.find(key);
  if (it == obj.end()) at.fail(std::string("has no field '") + key + "'");
  return *it;
}

// N numbers; null (a NaN in the file) reads as NaN and is refused unless allow_nan.
template <size_t N>
std::array<double, N> numbers(const ojson& obj, const char* key, const BoxPlace& at, bool allow_nan) {
  const ojson& v = member(obj, key, at);
  auto what = [&] { return std::string(key) + " " + v.dump(); };  // only for a message: dump is slow
  if (!v.is_array() || v.size() != N) at.fail(what() + " is not a list of " + std::to_string(N) + " numbers");
  std::array<double, N> out{};
  for (size_t i = 0; i < N; ++i) {
    if (v[i].is_null()) {
      out[i] = kNaN;
    } else if (v[i].is_number()) {
      out[i] = v[i].get<double>();
    } else {
      at.fail(what() + " holds a " + std::string(v[i].type_name()), "numbers");
    }
    if (std::isnan(out[i]) && !allow_nan) at.fail(std::string(key) + " may not be NaN");
  }
  return out;
}

}  // namespace

GtSample& GroundTruth::add_sample(std::string token) {
  if (index.count(token)) {
    throw Error(ErrorKind::kInvalidInput, "sample " + in_quotes(token) + " appears twice").where(source);
  }
  index.emplace(token, samples.size());
  samples.push_back(GtSample{});
  samples.back().token = std::move(token);
  return samples.back();
}

const GtSample* GroundTruth::find(const std::string& token) const {
  const auto it = index.find(token);
  return it == index.end() ? nullptr : &samples[it->second];
}

size_t Results::num_boxes() const {
  size_t n = 0;
  for (const ResultSample& s : samples) n += s.boxes.size();
  return n;
}

GroundTruth ground_truth_from_json(const ojson& j, const std::string& where) {
  auto fail = [&](const std::string& path, const std::string& problem, const std::string& expected) {
    throw Error(ErrorKind::kInvalidInput, problem).where(where + (path.empty() ? "" : ": " + path)).expected(expected);
  };
  if (!j.is_object() || !j.contains("format") || j.at("format") != "nuseval-gt-1") {
    fail("format", "is not nuseval-gt-1", "{\"format\": \"nuseval-gt-1\", \"samples\": {...}} (docs/EVAL.md)");
  }
  GroundTruth gt;
  gt.source = where;
  if (const auto it = j.find("description"); it != j.end() && it->is_string()) gt.description = it->get<std::string>();
  const auto samples = j.find("samples");
  if (samples == j.end() || !samples->is_object()) fail("samples", "is missing or not an object", "{token: sample}");
  for (const auto& [token, s] : samples->items()) {
    const std::string path = "samples['" + token + "']";
    if (!s.is_object()) fail(path, "is not an object", "{\"ego_pose\", \"boxes\", \"bike_racks\"?}");
    GtSample& out = gt.add_sample(token);
    const auto pose = s.find("ego_pose");
    if (pose == s.end() || !pose->is_object()) fail(path + ".ego_pose", "is missing", "{\"translation\", \"rotation\"}");
    const BoxPlace pose_at{where, "samples['", token, "'].ego_pose"};
    out.ego_translation = numbers<3>(*pose, "translation", pose_at, false);
    if (pose->contains("rotation")) out.ego_rotation = numbers<4>(*pose, "rotation", pose_at, false);
    if (const auto racks = s.find("bike_racks"); racks != s.end()) {
      if (!racks->is_array()) fail(path + ".bike_racks", "is not a list", "[{translation, size, rotation}, ...]");
      for (size_t i = 0; i < racks->size(); ++i) {
        const BoxPlace rack_at{where, "samples['", token, "'].bike_racks", static_cast<int64_t>(i)};
        const ojson& rj = (*racks)[i];
        if (!rj.is_object()) rack_at.fail("is not an object");
        out.bike_racks.push_back(BikeRack{numbers<3>(rj, "translation", rack_at, false),
                                          numbers<3>(rj, "size", rack_at, false),
                                          numbers<4>(rj, "rotation", rack_at, false)});
      }
    }
    const auto boxes = s.find("boxes");
    if (boxes == s.end() || !boxes->is_array()) fail(path + ".boxes", "is missing or not a list", "[box, ...]");
    for (size_t i = 0; i < boxes->size(); ++i) {
      const BoxPlace at{where, "samples['", token, "'].boxes", static_cast<int64_t>(i)};
      if (!(*boxes)[i].is_object()) at.fail("is not a box object");
      EvalBox b = box_from_fields(fields_from_json((*boxes)[i]), true, at);
      b.sample = static_cast<uint32_t>(gt.samples.size() - 1);
      b.index = static_cast<uint32_t>(i);
      out.boxes.push_back(b);
    }
  }
  return gt;
}

GroundTruth read_ground_truth(const std::string& path) {
  return ground_truth_from_json(parse_python_json(read_text_file(path), path), path);
}

ojson box_to_json(const EvalBox& b, const std::string& sample_token, bool ground_truth) {
  ojson j = ojson::object();
  if (!ground_truth) j["sample_token"] = sample_token;
  j["translation"] = b.translation;
  j["size"] = b.size;
  j["rotation"] = b.rotation;
  j["velocity"] = b.velocity;  // NaN is written as null, which reads back as NaN
  j["detection_name"] = detection_names()[static_cast<size_t>(b.detection)];
  if (!ground_truth) j["detection_score"] = b.score;
  j["attribute_name"] = b.attribute < 0 ? std::string_view() : attribute_names()[static_cast<size_t>(b.attribute)];
  if (ground_truth || b.num_pts >= 0) j["num_pts"] = b.num_pts;
  return j;
}

ojson ground_truth_to_json(const GroundTruth& gt) {
  ojson samples = ojson::object();
  for (const GtSample& s : gt.samples) {
    ojson js = ojson::object();
    js["ego_pose"] = {{"translation", s.ego_translation}, {"rotation", s.ego_rotation}};
    if (!s.bike_racks.empty()) {
      ojson racks = ojson::array();
      for (const BikeRack& r : s.bike_racks) {
        racks.push_back({{"translation", r.translation}, {"size", r.size}, {"rotation", r.rotation}});
      }
      js["bike_racks"] = std::move(racks);
    }
    ojson boxes = ojson::array();
    for (const EvalBox& b : s.boxes) boxes.push_back(box_to_json(b, s.token, true));
    js["boxes"] = std::move(boxes);
    samples[s.token] = std::move(js);
  }
  return {{"format", "nuseval-gt-1"}, {"description", gt.description}, {"samples", std::move(samples)}};
}

void write_ground_truth(const std::string& path, const GroundTruth& gt) {
  // One box per line: diffable, and a val-sized file stays a few tens of MB.
  const ojson j = ground_truth_to_json(gt);
  std::string out = "{\"format\": \"nuseval-gt-1\",\n\"description\": " + j.at("description").dump() + ",\n\"samples\": {";
  bool first = true;
  for (const auto& [token, s] : j.at("samples").items()) {
    out += first ? "\n" : ",\n";
    first = false;
    out += ojson(token).dump() + ": {\"ego_pose\": " + s.at("ego_pose").dump();
    if (s.contains("bike_racks")) out += ", \"bike_racks\": " + s.at("bike_racks").dump();
    out += ", \"boxes\": [";
    bool first_box = true;
    for (const ojson& b : s.at("boxes")) {
      out += (first_box ? "\n  " : ",\n  ") + b.dump();
      first_box = false;
    }
    out += "]}";
  }
  out += "\n}}\n";
  write_file_atomically(path, out);
}

void check_same_samples(const Results& results, const GroundTruth& gt) {
  size_t missing = 0;
  const GtSample* first_missing = nullptr;
  for (const GtSample& s : gt.samples) {
    if (!results.index.count(s.token)) {
      ++missing;
      if (!first_missing) first_missing = &s;
    }
  }
  if (first_missing) {
    throw Error(ErrorKind::kInvalidInput, "the results lack sample '" + first_missing->token + "' of the ground truth (" +
                                              std::to_string(missing) + " of " + std::to_string(gt.samples.size()) +
                                              " GT samples missing)")
        .where(results.source)
        .expected("exactly the ground truth's samples, with an empty list where nothing was detected")
        .hint("evaluate against the split the detections were run on (" + gt.source + ")");
  }
  size_t extra = 0;
  const ResultSample* first_extra = nullptr;
  for (const ResultSample& s : results.samples) {
    if (!gt.index.count(s.token)) {
      ++extra;
      if (!first_extra) first_extra = &s;
    }
  }
  if (first_extra) {
    throw Error(ErrorKind::kInvalidInput, "the results have sample '" + first_extra->token +
                                              "' that is not in the ground truth (" + std::to_string(extra) +
                                              " such samples)")
        .where(results.source)
        .expected("exactly the ground truth's samples (" + gt.source + ")")
        .hint("evaluate against the split the detections were run on");
  }
}

}  // namespace bev::eval
