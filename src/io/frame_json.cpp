#include "io/frame_json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <numbers>
#include <set>
#include <utility>

#include "bevformer/error.h"
#include "io/byte_source.h"
#include "io/image.h"
#include "io/json_checks.h"

namespace bev {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

constexpr int kMaxDepth = 16;           // the schema needs 4 (cameras[i].K[r][c])
constexpr double kRigidTolerance = 1e-4;  // |RᵀR − I| of T_* matrices
constexpr double kExactTolerance = 1e-9;  // structural zeros and ones (bottom rows, K's last row)

// Field paths as a user reads them: "cameras[2].K[1][0]".
using json_checks::item_path;
using json_checks::join_path;
using json_checks::text;

// Every frame error is the caller's input.
[[noreturn]] void fail(const std::string& where, const std::string& path, const std::string& problem,
                       const std::string& expected = {}, const std::string& hint = {}) {
  json_checks::fail(ErrorKind::kInvalidInput, where, path, problem, expected, hint);
}

std::string describe(const json& v) {
  std::string d = v.dump();
  if (d.size() > 40) d = d.substr(0, 37) + "...";
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean (" + d + ")";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return "a number (" + d + ")";
    case json::value_t::string: return "a string (" + d + ")";
    case json::value_t::array: return "a list of " + std::to_string(v.size());
    case json::value_t::object: return "an object";
    default: return "a value of an unexpected kind";
  }
}

// Refuses any field of `obj` not in `allowed`, naming the first one.
void check_fields(const json& obj, const std::string& where, const std::string& path,
                  std::initializer_list<std::string_view> allowed) {
  for (const auto& [key, value] : obj.items()) {
    bool ok = false;
    for (std::string_view a : allowed) ok = ok || key == a;
    if (!ok) {
      std::string list;
      for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      fail(where, join_path(path, key), "unknown field", "one of: " + list);
    }
  }
}

double number(const json& v, const std::string& where, const std::string& path) {
  if (!v.is_number()) fail(where, path, "is " + describe(v), "a number");
  const double x = v.get<double>();
  if (!std::isfinite(x)) fail(where, path, "is not finite (" + text(x) + ")", "a finite number");
  return x;
}

std::string text_field(const json& v, const std::string& where, const std::string& path) {
  if (!v.is_string()) fail(where, path, "is " + describe(v), "a non-empty string");
  std::string s = v.get<std::string>();
  if (s.empty()) fail(where, path, "is empty", "a non-empty string");
  return s;
}

template <size_t R, size_t C>
std::array<double, R * C> matrix(const json& v, const std::string& where, const std::string& path) {
  const std::string shape = std::to_string(R) + "x" + std::to_string(C);
  const std::string want = "a " + shape + " matrix as " + std::to_string(R) + " rows of " + std::to_string(C) +
                           " numbers (row-major nested lists)";
  if (!v.is_array()) fail(where, path, "is " + describe(v), want);
  if (v.size() != R) fail(where, path, "has " + std::to_string(v.size()) + " rows", want);
  std::array<double, R * C> m{};
  for (size_t r = 0; r < R; ++r) {
    const json& row = v[r];
    const std::string rp = item_path(path, r);
    if (!row.is_array()) fail(where, rp, "is " + describe(row), "a row of " + std::to_string(C) + " numbers (" + shape + ")");
    if (row.size() != C) {
      fail(where, rp, "has " + std::to_string(row.size()) + " numbers", std::to_string(C) + " per row (" + shape + ")");
    }
    for (size_t c = 0; c < C; ++c) m[r * C + c] = number(row[c], where, item_path(rp, c));
  }
  return m;
}

std::string row_text(const double* p, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + text(p[i]);
  return s + "]";
}

// A rigid transform: bottom row [0 0 0 1], orthonormal rotation with determinant +1.
void check_rigid(const Mat4& m, const std::string& where, const std::string& path) {
  if (std::abs(m[12]) > kExactTolerance || std::abs(m[13]) > kExactTolerance ||
      std::abs(m[14]) > kExactTolerance || std::abs(m[15] - 1) > kExactTolerance) {
    fail(where, path, "bottom row is " + row_text(&m[12], 4), "[0, 0, 0, 1] (a rigid 4x4 transform)");
  }
  const double err = rotation_orthogonality_error(m);
  if (err > kRigidTolerance) {
    fail(where, path, "is not a rigid transform: its rotation part has |R^T R - I| = " + text(err),
         "an orthonormal rotation (|R^T R - I| <= 1e-4) and a translation",
         "scale, shear or a transposed matrix? Matrices are row-major: p_to = T p_from");
  }
  if (rotation_determinant(m) < 0) {
    fail(where, path, "is not a rigid transform: its rotation part is a reflection (determinant -1)",
         "a proper rotation (determinant +1)", "is one axis flipped (a left-handed frame)?");
  }
}

void check_intrinsics(const Mat3& k, const std::string& where, const std::string& path) {
  if (std::abs(k[3]) > kExactTolerance || std::abs(k[6]) > kExactTolerance || std::abs(k[7]) > kExactTolerance ||
      std::abs(k[8] - 1) > kExactTolerance) {
    fail(where, path, "is not a pinhole intrinsics matrix: " + row_text(k.data(), 9),
         "[[fx, s, cx], [0, fy, cy], [0, 0, 1]]");
  }
  if (!(k[0] > 0) || !(k[4] > 0)) {
    fail(where, path, "has focal lengths fx = " + text(k[0]) + ", fy = " + text(k[4]), "fx > 0 and fy > 0 (pixels)");
  }
}

// `consume`: the tree is the caller's own non-const object (parse_frame_json's), so each inline
// image's base64 text may be freed once decoded: the text and its bytes never coexist in full.
Camera parse_camera(const json& c, const std::string& where, const std::string& path, bool consume) {
  if (!c.is_object()) fail(where, path, "is " + describe(c), "a camera object {name, image, K, T_ego_from_cam | lidar2img}");
  check_fields(c, where, path, {"name", "image", "K", "T_ego_from_cam", "lidar2img"});
  Camera cam;
  if (!c.contains("name")) fail(where, join_path(path, "name"), "is missing", "the camera's name (e.g. \"CAM_FRONT\")");
  cam.name = text_field(c["name"], where, join_path(path, "name"));
  const std::string ip = join_path(path, "image");
  if (!c.contains("image")) {
    fail(where, ip, "is missing", "an image file path (relative to the frame file) or {\"base64\": \"...\"}");
  }
  const json& img = c["image"];
  if (img.is_string()) {
    cam.image_path = text_field(img, where, ip);
  } else if (img.is_object()) {
    check_fields(img, where, ip, {"base64"});
    if (!img.contains("base64")) fail(where, join_path(ip, "base64"), "is missing", "the image file's bytes, base64-encoded");
    const json& b = img["base64"];
    if (!b.is_string()) fail(where, join_path(ip, "base64"), "is " + describe(b), "a base64 string");
    cam.image_bytes = ImageBytes::adopt(base64_decode(b.get_ref<const std::string&>(), where + ": " + join_path(ip, "base64")));
    if (cam.image_bytes.empty()) fail(where, join_path(ip, "base64"), "is empty", "the image file's bytes, base64-encoded");
    if (consume) std::string().swap(const_cast<json&>(b).get_ref<std::string&>());
  } else {
    fail(where, ip, "is " + describe(img), "an image file path (relative to the frame file) or {\"base64\": \"...\"}");
  }
  if (c.contains("K")) {
    cam.K = matrix<3, 3>(c["K"], where, join_path(path, "K"));
    check_intrinsics(*cam.K, where, join_path(path, "K"));
  }
  if (c.contains("T_ego_from_cam")) {
    cam.T_ego_from_cam = matrix<4, 4>(c["T_ego_from_cam"], where, join_path(path, "T_ego_from_cam"));
    check_rigid(*cam.T_ego_from_cam, where, join_path(path, "T_ego_from_cam"));
  }
  if (c.contains("lidar2img")) cam.lidar2img = matrix<4, 4>(c["lidar2img"], where, join_path(path, "lidar2img"));
  const std::string calib = "either K and T_ego_from_cam, or lidar2img";
  if (cam.lidar2img && (cam.K || cam.T_ego_from_cam)) {
    fail(where, path, "gives both lidar2img and " + std::string(cam.K ? "K" : "T_ego_from_cam"), calib,
         "lidar2img already contains the intrinsics and extrinsics; keep one description");
  }
  if (!cam.lidar2img) {
    if (!cam.K && !cam.T_ego_from_cam) fail(where, path, "has no calibration", calib);
    if (!cam.K) fail(where, join_path(path, "K"), "is missing (T_ego_from_cam is given)", "the 3x3 intrinsics at the image's resolution");
    if (!cam.T_ego_from_cam) fail(where, join_path(path, "T_ego_from_cam"), "is missing (K is given)", "the camera's 4x4 pose in the ego frame");
  }
  return cam;
}

// Streaming JSON parse that refuses duplicate keys and deep nesting, naming the field path. A
// SAX handler of our own rather than json::parse with a callback: that one copies every string
// out of the lexer's buffer, so a frame's base64 images were briefly held three times over.
class StrictSax : public nlohmann::json_sax<json> {
 public:
  explicit StrictSax(const std::string& where) : where_(where) {}
  json take() { return std::move(root_); }

  bool null() override { return value(nullptr); }
  bool boolean(bool v) override { return value(v); }
  bool number_integer(number_integer_t v) override { return value(v); }
  bool number_unsigned(number_unsigned_t v) override { return value(v); }
  bool number_float(number_float_t v, const string_t&) override { return value(v); }
  bool string(string_t& v) override { return value(std::move(v)); }
  bool binary(binary_t& v) override { return value(std::move(v)); }
  bool start_object(std::size_t) override { return open(json::value_t::object, true); }
  bool start_array(std::size_t) override { return open(json::value_t::array, false); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    Level& top = stack_.back();
    top.key = k;
    if (!top.keys.insert(k).second) fail(where_, path_to(stack_.size()), "duplicate field", "each field once");
    slot_ = &(*refs_.back())[k];
    return true;
  }
  // Thrown as the parser made it, so the caller's catch sees its type (parse_error has the byte).
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    if (const auto* pe = dynamic_cast<const json::parse_error*>(&ex)) throw *pe;
    if (const auto* oe = dynamic_cast<const json::out_of_range*>(&ex)) throw *oe;
    throw Error(ErrorKind::kInvalidInput, std::string("not valid JSON: ") + ex.what()).where(where_);
  }

 private:
  struct Level {
    bool object = false;
    std::string key;
    size_t index = 0;
    std::set<std::string> keys;
  };

  std::string path_to(size_t levels) const {
    std::string p;
    for (size_t i = 0; i < levels; ++i) p = stack_[i].object ? join_path(p, stack_[i].key) : item_path(p, stack_[i].index);
    return p;
  }
  template <typename V>
  json* place(V&& v) {
    if (refs_.empty()) {
      root_ = json(std::forward<V>(v));
      return &root_;
    }
    json& parent = *refs_.back();
    if (parent.is_array()) {
      parent.emplace_back(std::forward<V>(v));
      return &parent.back();
    }
    *slot_ = json(std::forward<V>(v));
    return slot_;
  }
  template <typename V>
  bool value(V&& v) {
    place(std::forward<V>(v));
    after_value();
    return true;
  }
  bool open(json::value_t type, bool object) {
    if (stack_.size() >= kMaxDepth) {
      fail(where_, path_to(stack_.size()), "nests deeper than " + std::to_string(kMaxDepth) + " levels",
           "a frame object (matrices nest 2 levels)");
    }
    refs_.push_back(place(type));
    stack_.push_back({object, {}, 0, {}});
    return true;
  }
  bool close() {
    refs_.pop_back();
    stack_.pop_back();
    after_value();
    return true;
  }
  void after_value() {
    if (!stack_.empty() && !stack_.back().object) ++stack_.back().index;
  }

  const std::string& where_;
  json root_;
  std::vector<json*> refs_;  // the open containers, innermost last
  json* slot_ = nullptr;     // the member the last key named
  std::vector<Level> stack_;
};

json parse_strict(std::string_view text, const std::string& where) {
  StrictSax sax(where);
  try {
    json::sax_parse(text.begin(), text.end(), &sax);
    return sax.take();
  } catch (const json::parse_error& e) {
    std::string msg = e.what();
    if (const auto p = msg.find("syntax error"); p != std::string::npos) msg = msg.substr(p);
    throw Error(ErrorKind::kInvalidInput, "not valid JSON: " + msg).where(where).at_offset(e.byte == 0 ? 0 : e.byte - 1);
  } catch (const json::exception& e) {  // e.g. a number too large for a double (1e999)
    std::string msg = e.what();
    if (const auto p = msg.find("] "); p != std::string::npos) msg = msg.substr(p + 2);
    throw Error(ErrorKind::kInvalidInput, "not valid JSON: " + msg).where(where).expected("finite numbers");
  }
}

// Pretty printer: objects one field per line, lists of numbers on one line, matrices one row per line.
bool all_scalars(const ojson& a) {
  for (const auto& e : a) {
    if (e.is_structured()) return false;
  }
  return true;
}

void emit(const ojson& v, int indent, std::string& out) {
  const std::string pad(static_cast<size_t>(indent) + 2, ' ');
  const std::string close_pad(static_cast<size_t>(indent), ' ');
  if (v.is_object()) {
    if (v.empty()) {
      out += "{}";
      return;
    }
    out += "{\n";
    size_t i = 0;
    for (const auto& [key, value] : v.items()) {
      out += pad + ojson(key).dump() + ": ";
      emit(value, indent + 2, out);
      out += ++i < v.size() ? ",\n" : "\n";
    }
    out += close_pad + "}";
  } else if (v.is_array() && all_scalars(v)) {
    out += "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i].dump();
    out += "]";
  } else if (v.is_array()) {
    out += "[\n";
    for (size_t i = 0; i < v.size(); ++i) {
      out += pad;
      emit(v[i], indent + 2, out);
      out += i + 1 < v.size() ? ",\n" : "\n";
    }
    out += close_pad + "]";
  } else {
    out += v.dump();
  }
}

template <size_t R, size_t C>
ojson matrix_json(const std::array<double, R * C>& m) {
  ojson rows = ojson::array();
  for (size_t r = 0; r < R; ++r) {
    ojson row = ojson::array();
    for (size_t c = 0; c < C; ++c) row.push_back(m[r * C + c]);
    rows.push_back(std::move(row));
  }
  return rows;
}

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int b64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

std::string char_text(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7f) return std::string("'") + c + "'";
  char buf[16];
  std::snprintf(buf, sizeof(buf), "byte 0x%02x", u);
  return buf;
}

}  // namespace

nlohmann::json parse_json_strict(std::string_view text, const std::string& where) { return parse_strict(text, where); }

static Frame frame_from(const json& j, const std::string& where, bool consume) {
  if (!j.is_object()) fail(where, "", "the frame is " + describe(j), "a JSON object (docs/FORMATS.md, Frames)");
  check_fields(j, where, "", {"stream", "timestamp", "scene", "token", "T_world_from_ego", "T_ego_from_lidar", "can_bus", "cameras"});
  Frame f;
  if (!j.contains("stream")) fail(where, "stream", "is missing", "the stream id (history is kept per stream)");
  f.stream = text_field(j["stream"], where, "stream");
  if (!j.contains("timestamp")) fail(where, "timestamp", "is missing", "the frame's time in seconds");
  f.timestamp = number(j["timestamp"], where, "timestamp");
  if (std::abs(f.timestamp) > kMaxTimestampSeconds) {
    // Milliseconds or nanoseconds sent as seconds, or a sentinel such as 1e308: every later frame
    // of the stream would be out of order or a time gap.
    fail(where, "timestamp", "is " + text(f.timestamp), "seconds, at most 1e11 from 0 (Unix time is about 1.7e9)");
  }
  if (j.contains("scene")) f.scene = text_field(j["scene"], where, "scene");
  if (j.contains("token")) f.token = text_field(j["token"], where, "token");
  if (j.contains("T_world_from_ego")) {
    f.T_world_from_ego = matrix<4, 4>(j["T_world_from_ego"], where, "T_world_from_ego");
    check_rigid(*f.T_world_from_ego, where, "T_world_from_ego");
  }
  if (j.contains("T_ego_from_lidar")) {
    f.T_ego_from_lidar = matrix<4, 4>(j["T_ego_from_lidar"], where, "T_ego_from_lidar");
    check_rigid(*f.T_ego_from_lidar, where, "T_ego_from_lidar");
  }
  if (j.contains("can_bus")) {
    const json& c = j["can_bus"];
    if (!c.is_array() || c.size() != 18) {
      fail(where, "can_bus", "is " + describe(c), "18 numbers in nuScenes' layout (docs/bevformer-spec.md §3)");
    }
    std::array<double, 18> cb{};
    for (size_t i = 0; i < 18; ++i) cb[i] = number(c[i], where, item_path("can_bus", i));
    f.can_bus = cb;
  }
  if (!f.T_world_from_ego && !f.can_bus) {
    fail(where, "T_world_from_ego", "is missing (and there is no can_bus)",
         "the ego pose: T_world_from_ego (4x4), or can_bus (18 values with the pose in [0:7], [16], [17])",
         "the model's history (BEV shift and rotation) needs the ego motion between frames");
  }
  if (!f.T_world_from_ego) {
    // The can_bus is the whole pose: its quaternion and its two patch angles must be consistent.
    const auto& cb = *f.can_bus;
    const double qn = std::sqrt(cb[3] * cb[3] + cb[4] * cb[4] + cb[5] * cb[5] + cb[6] * cb[6]);
    if (std::abs(qn - 1) > 1e-3) {
      fail(where, "can_bus[3:7]", "is not a unit quaternion (norm " + text(qn) + ")",
           "the ego rotation as (w, x, y, z) when T_world_from_ego is not given");
    }
    if (std::abs(cb[17] - cb[16] * 180 / std::numbers::pi) > 1e-3) {
      fail(where, "can_bus[17]", "is " + text(cb[17]) + " degrees but can_bus[16] is " + text(cb[16]) + " rad",
           "the same patch angle in degrees and radians");
    }
  }
  if (!j.contains("cameras")) fail(where, "cameras", "is missing", "a list of cameras in the model's slot order");
  const json& cams = j["cameras"];
  if (!cams.is_array() || cams.empty()) fail(where, "cameras", "is " + describe(cams), "a non-empty list of cameras");
  for (size_t i = 0; i < cams.size(); ++i) {
    Camera cam = parse_camera(cams[i], where, item_path("cameras", i), consume);
    for (size_t k = 0; k < f.cameras.size(); ++k) {
      if (f.cameras[k].name == cam.name) {
        fail(where, join_path(item_path("cameras", i), "name"), "\"" + cam.name + "\" is also the name of cameras[" + std::to_string(k) + "]",
             "unique camera names");
      }
    }
    f.cameras.push_back(std::move(cam));
  }
  return f;
}

Frame frame_from_json(const json& j, const std::string& where) { return frame_from(j, where, false); }

ImageBytes ImageBytes::copy_of(std::span<const uint8_t> data) { return adopt(std::vector<uint8_t>(data.begin(), data.end())); }

ImageBytes ImageBytes::adopt(std::vector<uint8_t> data) {
  auto owned = std::make_shared<const std::vector<uint8_t>>(std::move(data));
  ImageBytes b;
  b.bytes = std::span<const uint8_t>(owned->data(), owned->size());
  b.owner = std::move(owned);
  return b;
}

bool ImageBytes::operator==(const ImageBytes& other) const {
  return bytes.size() == other.bytes.size() && std::equal(bytes.begin(), bytes.end(), other.bytes.begin());
}

bool ImagePixels::operator==(const ImagePixels& other) const {
  if (height != other.height || width != other.width || empty() != other.empty()) return false;
  return empty() || data == other.data || std::memcmp(data, other.data, static_cast<size_t>(height * width * 3)) == 0;
}

Frame parse_frame(std::string_view json_text, const std::string& where) { return parse_frame_json(json_text, where); }
Frame read_frame(const std::string& path) { return read_frame_json(path); }
std::string frame_json(const Frame& frame) { return frame_json_text(frame); }

Frame parse_frame_json(std::string_view text, const std::string& where) {
  json tree = parse_strict(text, where);
  return frame_from(tree, where, true);
}

Frame parse_frame_json_owned(std::string text, const std::string& where) {
  json tree = parse_strict(text, where);
  std::string().swap(text);  // the tree holds what the text held (the base64 images)
  return frame_from(tree, where, true);
}

Frame read_frame_json(const std::string& path) {
  return parse_frame_json_owned(read_regular_file(path, kMaxFrameFileBytes, "frame file"), path);
}

ojson to_json(const Frame& spec) {
  ojson j;
  j["stream"] = spec.stream;
  j["timestamp"] = spec.timestamp;
  if (spec.scene) j["scene"] = *spec.scene;
  if (spec.token) j["token"] = *spec.token;
  if (spec.T_world_from_ego) j["T_world_from_ego"] = matrix_json<4, 4>(*spec.T_world_from_ego);
  if (spec.T_ego_from_lidar) j["T_ego_from_lidar"] = matrix_json<4, 4>(*spec.T_ego_from_lidar);
  if (spec.can_bus) j["can_bus"] = *spec.can_bus;
  ojson cams = ojson::array();
  for (const Camera& c : spec.cameras) {
    ojson cj;
    cj["name"] = c.name;
    if (!c.pixels.empty()) {
      // Lossless: the PNG decodes to the same pixels, so the frame detects the same.
      const Shape shape{c.pixels.height, c.pixels.width, 3};
      const Tensor bgr = Tensor::view_of(
          Storage::borrow(const_cast<uint8_t*>(c.pixels.data), static_cast<size_t>(shape_numel(shape)), c.pixels.owner),
          DType::kU8, shape, contiguous_strides(shape), 0);
      cj["image"] = {{"base64", base64_encode(encode_image(bgr, ".png"))}};
    } else if (c.image_path.empty()) {
      cj["image"] = {{"base64", base64_encode(c.image_bytes.bytes)}};
    } else {
      cj["image"] = c.image_path;
    }
    if (c.K) cj["K"] = matrix_json<3, 3>(*c.K);
    if (c.T_ego_from_cam) cj["T_ego_from_cam"] = matrix_json<4, 4>(*c.T_ego_from_cam);
    if (c.lidar2img) cj["lidar2img"] = matrix_json<4, 4>(*c.lidar2img);
    cams.push_back(std::move(cj));
  }
  j["cameras"] = std::move(cams);
  return j;
}

std::string frame_json_text(const Frame& spec) {
  std::string out;
  emit(to_json(spec), 0, out);
  out += "\n";
  return out;
}

void write_frame_json(const std::string& path, const Frame& spec) {
  // Through a temporary file and a rename: a failure leaves no half-written frame behind.
  write_file_atomically(path, frame_json_text(spec));
}

std::string base64_encode(std::span<const uint8_t> bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (uint32_t{bytes[i]} << 16) | (uint32_t{bytes[i + 1]} << 8) | bytes[i + 2];
    for (int s = 18; s >= 0; s -= 6) out += kB64[(v >> s) & 63];
  }
  if (const size_t rest = bytes.size() - i; rest > 0) {
    const uint32_t v = (uint32_t{bytes[i]} << 16) | (rest == 2 ? uint32_t{bytes[i + 1]} << 8 : 0);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += rest == 2 ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::vector<uint8_t> base64_decode(std::string_view text, const std::string& where) {
  auto bad = [&](size_t offset, const std::string& problem) -> Error {
    Error e(ErrorKind::kInvalidInput, "not valid base64: " + problem + " at character " + std::to_string(offset));
    e.where(where).expected("RFC 4648 base64 (A-Z a-z 0-9 + /, '=' padding)");
    return e;
  };
  std::vector<uint8_t> out;
  out.reserve(text.size() / 4 * 3);
  uint32_t acc = 0;
  int n = 0;    // characters of the current 4-character group
  int pad = 0;  // '=' seen
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') continue;
    if (c == '=') {
      if (n < 2 || n + pad >= 4) throw bad(i, "misplaced '='");
      ++pad;
      continue;
    }
    if (pad > 0) throw bad(i, char_text(c) + " after '=' padding");
    const int v = b64_value(c);
    if (v < 0) {
      throw bad(i, char_text(c) + " is not in the alphabet")
          .hint(c == ':' || c == ',' ? "give the bare base64 text, without a data: URI prefix" : "");
    }
    acc = (acc << 6) | static_cast<uint32_t>(v);
    if (++n == 4) {
      out.push_back(static_cast<uint8_t>(acc >> 16));
      out.push_back(static_cast<uint8_t>(acc >> 8));
      out.push_back(static_cast<uint8_t>(acc));
      acc = 0;
      n = 0;
    }
  }
  if (pad > 0) {
    if (n + pad != 4) throw bad(text.size(), "incomplete '=' padding");
    if (n == 2) out.push_back(static_cast<uint8_t>(acc >> 4));
    if (n == 3) {
      out.push_back(static_cast<uint8_t>(acc >> 10));
      out.push_back(static_cast<uint8_t>(acc >> 2));
    }
  } else if (n != 0) {
    throw bad(text.size(), "the length is not a multiple of 4 (missing '=' padding?)");
  }
  return out;
}

Mat3 mat3_from_json(const json& v, const std::string& where, const std::string& path) {
  return matrix<3, 3>(v, where, path);
}
Mat4 mat4_from_json(const json& v, const std::string& where, const std::string& path) {
  return matrix<4, 4>(v, where, path);
}

}  // namespace bev
