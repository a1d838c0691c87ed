#include "eval/eval_boxes.h"

#include <cmath>
#include <limits>

#include "bevformer/error.h"
#include "core/log.h"
#include "eval/detection_config.h"

namespace bev::eval {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

// Where a box is, as a user finds it in the file: BEFORE + token + AFTER [+ "[index]"], e.g.
// "results['tok'][3]" or "samples['tok'].boxes[3]". Built only for a message.
struct BoxPlace {
  const std::string& where;
  std::string_view before;
  const std::string& token;
  std::string_view after;
  int64_t index = -1;

  std::string path() const {
    std::string p = std::string(before) + token + std::string(after);
    if (index >= 0) p += "[" + std::to_string(index) + "]";
    return p;
  }
  [[noreturn]] void fail(const std::string& problem, const std::string& expected = {}) const {
    Error e(ErrorKind::kInvalidInput, problem);
    e.where(where + ": " + path());
    if (!expected.empty()) e.expected(expected);
    throw e;
  }
};

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

std::string text_field(const ojson& obj, const char* key, const BoxPlace& at) {
  const ojson& v = member(obj, key, at);
  if (!v.is_string()) at.fail(std::string(key) + " " + v.dump() + " is not a string");
  return v.get<std::string>();
}

int64_t integer_field(const ojson& v, const char* key, const BoxPlace& at) {
  if (v.is_number_integer()) return v.get<int64_t>();
  // Python's int() of a float truncates.
  if (v.is_number_float() && std::isfinite(v.get<double>())) return static_cast<int64_t>(v.get<double>());
  at.fail(std::string(key) + " " + v.dump() + " is not an integer");
}

// DetectionBox.deserialize and its asserts, for one box.
EvalBox parse_box(const ojson& b, bool ground_truth, const BoxPlace& at) {
  if (!b.is_object()) at.fail("is a " + std::string(b.type_name()) + ", not a box object");
  EvalBox box;
  box.translation = numbers<3>(b, "translation", at, false);
  box.size = numbers<3>(b, "size", at, false);
  box.rotation = numbers<4>(b, "rotation", at, false);
  box.velocity = numbers<2>(b, "velocity", at, true);
  const std::string name = text_field(b, "detection_name", at);
  const std::optional<int> cls = detection_index(name);
  if (!cls) at.fail("unknown detection_name " + in_quotes(name), detection_names_text());
  box.detection = *cls;
  const std::string attr = ground_truth && !b.contains("attribute_name") ? "" : text_field(b, "attribute_name", at);
  const std::optional<int> a = attribute_index(attr);
  if (!a) {
    std::string names;
    for (std::string_view n : attribute_names()) names += std::string(n) + ", ";
    at.fail("unknown attribute_name " + in_quotes(attr), names + "or \"\"");
  }
  box.attribute = *a;
  if (ground_truth) {
    box.num_pts = integer_field(member(b, "num_pts", at), "num_pts", at);
  } else {
    if (const auto it = b.find("num_pts"); it != b.end()) box.num_pts = integer_field(*it, "num_pts", at);
    if (const auto it = b.find("detection_score"); it != b.end()) {
      if (it->is_null()) at.fail("detection_score may not be NaN");
      if (!it->is_number()) at.fail("detection_score " + it->dump() + " is not a number");
      box.score = it->get<double>();
      if (std::isnan(box.score)) at.fail("detection_score may not be NaN");
    }
  }
  return box;
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

Results parse_results(std::string_view text, const std::string& where, int64_t max_boxes_per_sample) {
  Results r;
  r.source = where;
  std::string top_key;
  size_t current = 0;
  using Event = ojson::parse_event_t;
  // Depth 0 is the root object, 1 its keys and `results` itself, 2 the sample keys and lists,
  // 3 the boxes: each box is converted at its object_end and dropped from the DOM.
  const ojson::parser_callback_t on_event = [&](int depth, Event event, ojson& parsed) -> bool {
    if (depth == 1 && event == Event::key) {
      top_key = parsed.get<std::string>();
      return true;
    }
    if (top_key != "results" || depth < 1) return true;
    if (depth == 1 && event != Event::object_start && event != Event::object_end) {
      throw Error(ErrorKind::kInvalidInput, "'results' is not an object")
          .where(where)
          .expected("{sample_token: [box, ...], ...}");
    }
    if (depth == 2 && event == Event::key) {
      std::string token = parsed.get<std::string>();
      const auto it = r.index.find(token);
      if (it != r.index.end()) {
        log_warn(where, ": sample '", token, "' appears twice in results; the later list replaces the earlier one");
        current = it->second;
        r.samples[current].boxes.clear();
        r.samples[current].own_tokens.clear();
      } else {
        current = r.samples.size();
        r.index.emplace(token, current);
        r.samples.push_back(ResultSample{std::move(token), {}, {}});
      }
    } else if (depth == 2 && event != Event::array_start && event != Event::array_end) {
      throw Error(ErrorKind::kInvalidInput, "is not a list of boxes")
          .where(where + ": results['" + r.samples[current].token + "']");
    } else if (depth == 3 && event != Event::object_start) {
      ResultSample& s = r.samples[current];
      const size_t i = s.boxes.size();
      const BoxPlace at{where, "results['", s.token, "']", static_cast<int64_t>(i)};
      if (event != Event::object_end) at.fail("is not a box object");
      EvalBox box = parse_box(parsed, false, at);
      const ojson* token = nullptr;
      if (const auto it = parsed.find("sample_token"); it != parsed.end()) token = &*it;
      if (token == nullptr) at.fail("has no field 'sample_token'", "each box's sample_token (the devkit requires it)");
      if (!token->is_string()) at.fail("sample_token " + token->dump() + " is not a string");
      if (token->get_ref<const std::string&>() != s.token) {
        s.own_tokens.emplace_back(static_cast<uint32_t>(i), token->get<std::string>());
      }
      box.sample = static_cast<uint32_t>(current);
      box.index = static_cast<uint32_t>(i);
      s.boxes.push_back(box);
      return false;
    }
    return true;
  };
  ojson root;
  const std::optional<std::string> fixed = replace_nan_tokens(text);
  const std::string_view input = fixed ? std::string_view(*fixed) : text;
  try {
    root = ojson::parse(input.begin(), input.end(), on_event);
  } catch (const ojson::parse_error& e) {
    std::string msg = e.what();
    if (const auto p = msg.find("syntax error"); p != std::string::npos) msg = msg.substr(p);
    throw Error(ErrorKind::kInvalidInput, "not valid JSON: " + msg).where(where);
  }
  if (!root.is_object() || !root.contains("results")) {
    throw Error(ErrorKind::kInvalidInput, "no field 'results'")
        .where(where)
        .expected("the nuScenes submission format {\"meta\": {...}, \"results\": {sample_token: [box, ...]}}");
  }
  if (!root.contains("meta")) {
    throw Error(ErrorKind::kInvalidInput, "no field 'meta'")
        .where(where)
        .expected("\"meta\": {\"use_camera\": ..., \"use_lidar\": ..., ...} beside \"results\"");
  }
  r.meta = root.at("meta");
  for (const ResultSample& s : r.samples) {
    if (static_cast<int64_t>(s.boxes.size()) > max_boxes_per_sample) {
      throw Error(ErrorKind::kInvalidInput,
                  "sample '" + s.token + "' has " + std::to_string(s.boxes.size()) + " boxes")
          .where(where + ": results['" + s.token + "']")
          .expected("at most " + std::to_string(max_boxes_per_sample) + " boxes per sample (max_boxes_per_sample)")
          .hint("keep each sample's highest-scoring boxes");
    }
  }
  return r;
}

Results read_results(const std::string& path, int64_t max_boxes_per_sample) {
  return parse_results(read_text_file(path), path, max_boxes_per_sample);
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
      EvalBox b = parse_box((*boxes)[i], true, BoxPlace{where, "samples['", token, "'].boxes", static_cast<int64_t>(i)});
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
  write_text_file(path, out);
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
