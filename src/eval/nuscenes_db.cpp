#include "eval/nuscenes_db.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "bevformer/error.h"
#include "core/log.h"
#include "io/byte_source.h"
#include "eval/detection_config.h"
#include "eval/nuscenes_splits.h"

namespace bev::eval {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr std::string_view kBikeRack = "static_object.bicycle_rack";

// One record of a table, with accessors whose errors name the table, record and field.
struct Record {
  const ojson& j;
  const std::string& path;
  size_t index;

  [[noreturn]] void fail(const std::string& problem, const std::string& expected = {}) const {
    Error e(ErrorKind::kInvalidInput, problem);
    e.where(path + ": record " + std::to_string(index));
    if (!expected.empty()) e.expected(expected);
    throw e;
  }
  const ojson& at(const char* key) const {
    const auto it = j.find(key);
    if (it == j.end()) fail(std::string("has no field '") + key + "'", "the nuScenes v1.0 schema");
    return *it;
  }
  const std::string& str(const char* key) const {
    const ojson& v = at(key);
    if (!v.is_string()) fail(std::string(key) + " " + v.dump() + " is not a string");
    return v.get_ref<const std::string&>();
  }
  int64_t integer(const char* key) const {
    const ojson& v = at(key);
    if (!v.is_number_integer()) fail(std::string(key) + " " + v.dump() + " is not an integer");
    return v.get<int64_t>();
  }
  bool boolean(const char* key) const {
    const ojson& v = at(key);
    if (!v.is_boolean()) fail(std::string(key) + " " + v.dump() + " is not a boolean");
    return v.get<bool>();
  }
  template <size_t N>
  std::array<double, N> numbers(const char* key) const {
    const ojson& v = at(key);
    if (!v.is_array() || v.size() != N) fail(std::string(key) + " is not a list of " + std::to_string(N) + " numbers");
    std::array<double, N> out{};
    for (size_t i = 0; i < N; ++i) {
      if (!v[i].is_number()) fail(std::string(key) + " " + v.dump() + " holds a non-number");
      out[i] = v[i].get<double>();
    }
    return out;
  }
  std::vector<std::string> strings(const char* key) const {
    const ojson& v = at(key);
    if (!v.is_array()) fail(std::string(key) + " is not a list");
    std::vector<std::string> out;
    for (const ojson& s : v) {
      if (!s.is_string()) fail(std::string(key) + " holds a non-string");
      out.push_back(s.get<std::string>());
    }
    return out;
  }
};

// Streams DIR/TABLE.json, a list of records, calling visit(Record) on each; nothing of the
// table stays in memory but what visit keeps.
template <typename Visit>
void stream_table(const std::string& dir, const char* table, Visit&& visit) {
  const std::string path = dir + "/" + table + ".json";
  // Mapped, not read: the parse below streams over the pages. A regular file of bounded size (a
  // FIFO, a device or a directory is refused, as by every other reader).
  std::shared_ptr<const ByteSource> src;
  try {
    src = ByteSource::map_file(path, kMaxEvalFileBytes);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kNotFound) throw;
    throw Error(ErrorKind::kNotFound, "cannot open the table")
        .where(path)
        .hint("--dataroot is the folder that holds the version folder (e.g. DATAROOT/v1.0-trainval/sample.json)");
  }
  const char* text = reinterpret_cast<const char*>(src->data());
  size_t index = 0;
  using Event = ojson::parse_event_t;
  const ojson::parser_callback_t on_event = [&](int depth, Event event, ojson& parsed) -> bool {
    if (depth == 0 && event == Event::object_start) {
      throw Error(ErrorKind::kInvalidInput, "is an object").where(path).expected("a list of records");
    }
    if (depth != 1) return true;
    if (event == Event::object_end) {
      visit(Record{parsed, path, index++});
      return false;
    }
    if (event != Event::object_start) {
      throw Error(ErrorKind::kInvalidInput, "is not an object").where(path + ": record " + std::to_string(index));
    }
    return true;
  };
  try {
    [[maybe_unused]] const ojson rest = ojson::parse(text, text + src->size(), on_event);  // the records went to visit: an empty list
  } catch (const ojson::parse_error& e) {
    std::string msg = e.what();
    if (const auto p = msg.find("syntax error"); p != std::string::npos) msg = msg.substr(p);
    throw Error(ErrorKind::kInvalidInput, "not valid JSON: " + msg).where(path);
  } catch (const ojson::exception& e) {  // a number too large for a double (1e999)
    std::string msg = e.what();
    if (const auto p = msg.find("] "); p != std::string::npos) msg = msg.substr(p + 2);
    throw Error(ErrorKind::kInvalidInput, "not valid JSON: " + msg).where(path).expected("finite numbers");
  }
}

template <typename Map>
const auto& lookup(const Map& map, const std::string& token, const char* table, const Record& from) {
  const auto it = map.find(token);
  if (it == map.end()) from.fail("refers to " + std::string(table) + " '" + token + "', which does not exist");
  return it->second;
}

struct Sample {
  std::string token;
  std::string scene_token;
  int64_t timestamp = 0;
  std::string lidar_ego_pose;  // ego_pose token of the LIDAR_TOP key frame ("" until seen)
};

struct Annotation {
  std::string token;
  size_t sample = 0;
  std::string category;
  std::vector<std::string> attributes;
  std::array<double, 3> translation{};
  std::array<double, 3> size{};
  std::array<double, 4> rotation{};
  int64_t num_pts = 0;
  std::string prev, next;
};

std::vector<std::string> custom_split(const std::string& dir, const std::string& split) {
  const std::string path = dir + "/splits.json";
  if (!std::filesystem::exists(path)) {
    throw Error(ErrorKind::kInvalidInput, "unknown split '" + split + "'")
        .expected("train, val, test, mini_train, mini_val, train_detect, train_track, or a split of " + path);
  }
  const ojson j = parse_python_json(read_text_file(path), path);
  if (!j.is_object() || !j.contains(split)) {
    throw Error(ErrorKind::kInvalidInput, "has no split '" + split + "'").where(path);
  }
  std::vector<std::string> scenes;
  for (const ojson& s : j.at(split)) {
    if (!s.is_string()) throw Error(ErrorKind::kInvalidInput, "split '" + split + "' holds a non-string").where(path);
    scenes.push_back(s.get<std::string>());
  }
  return scenes;
}

// load_gt's check that the split belongs to the version.
void check_split_version(const std::string& split, const std::string& version) {
  auto ends = [&](std::string_view s) { return version.ends_with(s); };
  bool ok = true;
  if (split == "train" || split == "val" || split == "train_detect" || split == "train_track") ok = ends("trainval");
  if (split == "mini_train" || split == "mini_val") ok = ends("mini");
  if (split == "test") ok = ends("test");
  if (!ok) {
    throw Error(ErrorKind::kInvalidInput, "split '" + split + "' is not part of nuScenes version '" + version + "'")
        .hint("val and train are in v1.0-trainval, mini_val and mini_train in v1.0-mini, test in v1.0-test");
  }
}

}  // namespace

std::optional<std::string_view> category_to_detection_name(std::string_view c) {
  static const std::unordered_map<std::string_view, std::string_view> kMap = {
      {"movable_object.barrier", "barrier"},
      {"vehicle.bicycle", "bicycle"},
      {"vehicle.bus.bendy", "bus"},
      {"vehicle.bus.rigid", "bus"},
      {"vehicle.car", "car"},
      {"vehicle.construction", "construction_vehicle"},
      {"vehicle.motorcycle", "motorcycle"},
      {"human.pedestrian.adult", "pedestrian"},
      {"human.pedestrian.child", "pedestrian"},
      {"human.pedestrian.construction_worker", "pedestrian"},
      {"human.pedestrian.police_officer", "pedestrian"},
      {"movable_object.trafficcone", "traffic_cone"},
      {"vehicle.trailer", "trailer"},
      {"vehicle.truck", "truck"}};
  const auto it = kMap.find(c);
  if (it == kMap.end()) return std::nullopt;
  return it->second;
}

std::string default_split(std::string_view version) {
  if (version.ends_with("trainval")) return "val";
  if (version.ends_with("mini")) return "mini_val";
  if (version.ends_with("test")) return "test";
  return "";
}

std::array<double, 2> box_velocity(const AnnotationTrack& current, const AnnotationTrack* prev,
                                   const AnnotationTrack* next, double max_time_diff) {
  if (prev == nullptr && next == nullptr) return {kNaN, kNaN};
  const AnnotationTrack& first = prev ? *prev : current;
  const AnnotationTrack& last = next ? *next : current;
  const double pos_diff[2] = {last.translation[0] - first.translation[0], last.translation[1] - first.translation[1]};
  // 1e-6 * timestamp in seconds first, then the difference, as the devkit does.
  const double time_diff = 1e-6 * static_cast<double>(last.timestamp) - 1e-6 * static_cast<double>(first.timestamp);
  if (prev && next) max_time_diff *= 2;
  if (time_diff > max_time_diff) return {kNaN, kNaN};
  return {pos_diff[0] / time_diff, pos_diff[1] / time_diff};
}

GroundTruth load_nuscenes_gt(const NuscenesDbOptions& options) {
  const std::string dir = options.dataroot + "/" + options.version;
  const std::string split = options.split.empty() ? default_split(options.version) : options.split;
  if (!std::filesystem::is_directory(dir)) {
    throw Error(ErrorKind::kNotFound, "no such nuScenes version folder")
        .where(dir)
        .hint("--dataroot DIR --version v1.0-trainval reads DIR/v1.0-trainval/*.json");
  }
  if (split.empty()) {
    throw Error(ErrorKind::kInvalidInput, "no --split given and none implied by version '" + options.version + "'");
  }
  std::unordered_set<std::string> scenes_of_split;
  if (const auto* official = official_split(split)) {
    check_split_version(split, options.version);
    for (std::string_view name : *official) scenes_of_split.emplace(name);
  } else {
    const auto custom = custom_split(dir, split);
    scenes_of_split.insert(custom.begin(), custom.end());
  }

  std::unordered_map<std::string, std::string> category, attribute, instance_category, sensor_channel, cs_channel,
      scene_name;
  stream_table(dir, "category", [&](const Record& r) { category[r.str("token")] = r.str("name"); });
  stream_table(dir, "attribute", [&](const Record& r) { attribute[r.str("token")] = r.str("name"); });
  stream_table(dir, "instance", [&](const Record& r) {
    instance_category[r.str("token")] = lookup(category, r.str("category_token"), "category", r);
  });
  stream_table(dir, "sensor", [&](const Record& r) { sensor_channel[r.str("token")] = r.str("channel"); });
  stream_table(dir, "calibrated_sensor", [&](const Record& r) {
    cs_channel[r.str("token")] = lookup(sensor_channel, r.str("sensor_token"), "sensor", r);
  });
  stream_table(dir, "scene", [&](const Record& r) { scene_name[r.str("token")] = r.str("name"); });

  std::vector<Sample> samples;
  std::unordered_map<std::string, size_t> sample_index;
  stream_table(dir, "sample", [&](const Record& r) {
    sample_index[r.str("token")] = samples.size();
    samples.push_back(Sample{r.str("token"), r.str("scene_token"), r.integer("timestamp"), ""});
  });
  if (samples.empty()) throw Error(ErrorKind::kInvalidInput, "the database has no samples").where(dir);
  std::vector<char> in_split(samples.size(), 0);
  size_t num_in_split = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const auto it = scene_name.find(samples[i].scene_token);
    if (it == scene_name.end()) {
      throw Error(ErrorKind::kInvalidInput, "sample '" + samples[i].token + "' refers to scene '" +
                                                samples[i].scene_token + "', which does not exist")
          .where(dir + "/sample.json");
    }
    if (scenes_of_split.count(it->second)) {
      in_split[i] = 1;
      ++num_in_split;
    }
  }

  // The ego pose of each split sample's LIDAR_TOP key frame (the last such record wins, as the
  // devkit's reverse index overwrites).
  stream_table(dir, "sample_data", [&](const Record& r) {
    if (!r.boolean("is_key_frame")) return;
    const size_t s = lookup(sample_index, r.str("sample_token"), "sample", r);
    if (in_split[s] && lookup(cs_channel, r.str("calibrated_sensor_token"), "calibrated_sensor", r) == "LIDAR_TOP") {
      samples[s].lidar_ego_pose = r.str("ego_pose_token");
    }
  });
  using Pose = std::pair<std::array<double, 3>, std::array<double, 4>>;
  std::unordered_map<std::string, std::optional<Pose>> poses;
  for (size_t s = 0; s < samples.size(); ++s) {
    if (in_split[s]) poses.emplace(samples[s].lidar_ego_pose, std::nullopt);
  }
  stream_table(dir, "ego_pose", [&](const Record& r) {
    const auto it = poses.find(r.str("token"));
    if (it != poses.end()) it->second = Pose{r.numbers<3>("translation"), r.numbers<4>("rotation")};
  });

  std::vector<Annotation> anns;
  std::unordered_map<std::string, size_t> ann_index;
  size_t num_annotations = 0;
  stream_table(dir, "sample_annotation", [&](const Record& r) {
    ++num_annotations;
    const size_t s = lookup(sample_index, r.str("sample_token"), "sample", r);
    if (!in_split[s]) return;
    Annotation a{r.str("token"), s, lookup(instance_category, r.str("instance_token"), "instance", r),
                 r.strings("attribute_tokens"), r.numbers<3>("translation"), r.numbers<3>("size"),
                 r.numbers<4>("rotation"), r.integer("num_lidar_pts") + r.integer("num_radar_pts"), r.str("prev"),
                 r.str("next")};
    ann_index[a.token] = anns.size();
    anns.push_back(std::move(a));
  });
  if (split == "test" && num_annotations == 0) {
    throw Error(ErrorKind::kInvalidInput, "the test split has no annotations in this database").where(dir);
  }
  // Neighbours outside the split's samples (a database whose tracks cross scenes): one more pass.
  std::unordered_map<std::string, std::optional<AnnotationTrack>> outside;
  for (const Annotation& a : anns) {
    for (const std::string* t : {&a.prev, &a.next}) {
      if (!t->empty() && !ann_index.count(*t)) outside.emplace(*t, std::nullopt);
    }
  }
  if (!outside.empty()) {
    stream_table(dir, "sample_annotation", [&](const Record& r) {
      const auto it = outside.find(r.str("token"));
      if (it == outside.end()) return;
      const size_t s = lookup(sample_index, r.str("sample_token"), "sample", r);
      it->second = AnnotationTrack{r.numbers<3>("translation"), samples[s].timestamp, "", ""};
    });
  }
  auto track_of = [&](const std::string& token, const Annotation& from) -> AnnotationTrack {
    if (const auto it = ann_index.find(token); it != ann_index.end()) {
      const Annotation& a = anns[it->second];
      return AnnotationTrack{a.translation, samples[a.sample].timestamp, a.prev, a.next};
    }
    const auto it = outside.find(token);
    if (it == outside.end() || !it->second) {
      throw Error(ErrorKind::kInvalidInput, "sample_annotation '" + from.token + "' refers to neighbour '" + token +
                                                "', which does not exist")
          .where(dir + "/sample_annotation.json");
    }
    return *it->second;
  };

  GroundTruth gt;
  gt.source = dir + " (" + split + ")";
  gt.description = "nuScenes " + options.version + ", split " + split + ", from " + dir;
  std::vector<std::vector<size_t>> anns_of_sample(samples.size());
  for (size_t i = 0; i < anns.size(); ++i) anns_of_sample[anns[i].sample].push_back(i);
  for (size_t s = 0; s < samples.size(); ++s) {
    if (!in_split[s]) continue;
    GtSample& out = gt.add_sample(samples[s].token);
    if (samples[s].lidar_ego_pose.empty()) {
      throw Error(ErrorKind::kInvalidInput, "sample '" + samples[s].token + "' has no LIDAR_TOP key frame")
          .where(dir + "/sample_data.json");
    }
    const auto pose = poses.find(samples[s].lidar_ego_pose);
    if (!pose->second) {
      throw Error(ErrorKind::kInvalidInput, "the LIDAR_TOP key frame of sample '" + samples[s].token +
                                                "' refers to ego_pose '" + pose->first + "', which does not exist")
          .where(dir + "/ego_pose.json");
    }
    out.ego_translation = pose->second->first;
    out.ego_rotation = pose->second->second;
    for (size_t i : anns_of_sample[s]) {
      const Annotation& a = anns[i];
      if (a.category == kBikeRack) out.bike_racks.push_back(BikeRack{a.translation, a.size, a.rotation});
      const auto name = category_to_detection_name(a.category);
      if (!name) continue;
      EvalBox b;
      b.translation = a.translation;
      b.size = a.size;
      b.rotation = a.rotation;
      b.detection = *detection_index(*name);
      if (a.attributes.size() > 1) {
        throw Error(ErrorKind::kInvalidInput, "sample_annotation '" + a.token + "' has " +
                                                  std::to_string(a.attributes.size()) + " attributes")
            .where(dir + "/sample_annotation.json")
            .expected("at most one attribute per annotation (load_gt refuses more)");
      }
      if (a.attributes.empty()) {
        b.attribute = -1;
      } else {
        const auto it = attribute.find(a.attributes[0]);
        if (it == attribute.end()) {
          throw Error(ErrorKind::kInvalidInput, "sample_annotation '" + a.token + "' refers to attribute '" +
                                                    a.attributes[0] + "', which does not exist")
              .where(dir + "/sample_annotation.json");
        }
        const std::optional<int> k = attribute_index(it->second);
        if (!k) {
          throw Error(ErrorKind::kInvalidInput, "attribute '" + it->second + "' is not a detection attribute")
              .where(dir + "/attribute.json");
        }
        b.attribute = *k;
      }
      const AnnotationTrack cur{a.translation, samples[s].timestamp, a.prev, a.next};
      std::optional<AnnotationTrack> prev, next;
      if (!a.prev.empty()) prev = track_of(a.prev, a);
      if (!a.next.empty()) next = track_of(a.next, a);
      b.velocity = box_velocity(cur, prev ? &*prev : nullptr, next ? &*next : nullptr);
      b.num_pts = a.num_pts;
      b.sample = static_cast<uint32_t>(gt.samples.size() - 1);
      b.index = static_cast<uint32_t>(out.boxes.size());
      out.boxes.push_back(b);
    }
  }
  log_info("nuScenes ", options.version, " ", split, ": ", num_in_split, " of ", samples.size(), " samples, ",
           anns.size(), " annotations");
  return gt;
}

}  // namespace bev::eval
