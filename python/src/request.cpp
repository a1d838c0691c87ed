// Requests: the keyword arguments of model(**request) become a bev::Frame through the frame JSON's
// own parser (frame_from_json), so they get exactly its checks and its errors ("request:
// cameras[2].K: ..."). The shortcuts (images + camera_names + lidar2img or intrinsics +
// extrinsics, stream as {"id", "T_world_from_ego"}) are spelled out into its fields first; images
// are attached afterwards without copying: arrays as decoded pixels, bytes as encoded images,
// paths as paths.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numbers>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "common.h"

namespace bevpy {
namespace {

using json = nlohmann::json;
using bev::Error;
using bev::ErrorKind;

constexpr const char* kNuScenesCameras[] = {"CAM_FRONT",      "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT",
                                            "CAM_BACK",       "CAM_BACK_LEFT",   "CAM_BACK_RIGHT"};

Error invalid(const std::string& where, const std::string& problem, const std::string& expected) {
  return Error(ErrorKind::kInvalidInput, problem).where("request: " + where).expected(expected);
}

std::string type_name(const py::handle& h) { return py::str(py::type::of(h).attr("__name__")).cast<std::string>(); }

// Numbers, strings, lists and mappings as JSON; the frame parser (bev::parse_frame, the public
// one every frame goes through) judges shapes and values.
json to_json(const py::handle& h, const std::string& path, int depth = 0) {
  if (depth > 16) throw invalid(path, "nested deeper than 16 levels", "matrices of numbers");
  if (h.is_none()) return nullptr;
  if (py::isinstance<py::bool_>(h)) return h.cast<bool>();
  if (py::isinstance<py::int_>(h)) return h.cast<int64_t>();
  if (py::isinstance<py::float_>(h)) {
    // The request becomes frame JSON, which has no NaN or infinity: refuse them here, by name.
    const double v = h.cast<double>();
    if (!std::isfinite(v)) throw invalid(path, "has a non-finite value (" + py::str(h).cast<std::string>() + ")", "finite numbers");
    return v;
  }
  if (py::isinstance<py::str>(h)) return h.cast<std::string>();
  if (py::isinstance<py::array>(h)) {
    const py::array a = py::reinterpret_borrow<py::array>(h);
    const char kind = a.dtype().kind();
    if (kind != 'f' && kind != 'i' && kind != 'u' && kind != 'b') {
      throw invalid(path, "an array of dtype " + py::str(a.dtype()).cast<std::string>(), "numbers");
    }
    return to_json(a.attr("tolist")(), path, depth);  // numpy scalars and arrays alike
  }
  if (py::hasattr(h, "dtype") && py::hasattr(h, "item")) return to_json(h.attr("item")(), path, depth);  // np.float64
  if (py::isinstance<py::list>(h) || py::isinstance<py::tuple>(h)) {
    json out = json::array();
    size_t i = 0;
    for (const py::handle& v : h) out.push_back(to_json(v, path + "[" + std::to_string(i++) + "]", depth + 1));
    return out;
  }
  if (py::isinstance<py::dict>(h)) {
    json out = json::object();
    for (const auto& [k, v] : py::reinterpret_borrow<py::dict>(h)) {
      if (!py::isinstance<py::str>(k)) throw invalid(path, "a key of type " + type_name(k), "string keys");
      const std::string key = k.cast<std::string>();
      out[key] = to_json(v, path + "." + key, depth + 1);
    }
    return out;
  }
  throw invalid(path, "a " + type_name(h), "a number, a string, a list or a mapping");
}

// Python objects stay alive while the engine holds their memory; whoever drops the last
// reference (possibly a thread without the GIL) takes the GIL for it.
std::shared_ptr<const void> keep_alive(py::object o) {
  return std::shared_ptr<const void>(new py::object(std::move(o)), [](const void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<const py::object*>(p);
  });
}

bool is_path(const py::handle& h) {
  return py::isinstance<py::str>(h) || py::hasattr(h, "__fspath__");
}

// One camera's image into `cam` (after parsing). Paths were given to the parser as they are.
void attach_image(bev::Camera& cam, const py::handle& image, const std::string& where, bool rgb) {
  if (is_path(image)) return;
  cam.image_path.clear();
  if (py::isinstance<py::bytes>(image)) {
    const std::string_view v = PyBytes_AsString(image.ptr()) ? std::string_view(PyBytes_AsString(image.ptr()),
                                                                                  static_cast<size_t>(PyBytes_Size(image.ptr())))
                                                              : std::string_view();
    cam.image_bytes.owner = keep_alive(py::reinterpret_borrow<py::object>(image));
    cam.image_bytes.bytes = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size());
    return;
  }
  if (py::isinstance<py::bytearray>(image) || py::isinstance<py::memoryview>(image)) {
    // Mutable memory: copied, so that nothing changes it under a running frame.
    const std::string copy = py::bytes(py::reinterpret_borrow<py::object>(image)).cast<std::string>();
    cam.image_bytes = bev::ImageBytes::copy_of(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(copy.data()), copy.size()));
    return;
  }
  if (!py::isinstance<py::array>(image)) {
    throw invalid(where, "a " + type_name(image),
                  "an HxWx3 uint8 array (BGR), the encoded bytes of a JPEG or PNG, or a path");
  }
  py::array a = py::reinterpret_borrow<py::array>(image);
  if (a.dtype().kind() != 'u' || a.itemsize() != 1) {
    throw invalid(where, "an array of dtype " + py::str(a.dtype()).cast<std::string>(),
                  "uint8 pixels (0..255), as cv2.imread, mmcv.imread or PIL give them; scale and cast floats yourself");
  }
  if (a.ndim() != 3 || a.shape(2) != 3) {
    std::string shape;
    for (py::ssize_t i = 0; i < a.ndim(); ++i) shape += (i ? "x" : "") + std::to_string(a.shape(i));
    throw invalid(where, "an array of shape " + (shape.empty() ? std::string("()") : shape),
                  "HxWx3 (three colour channels; convert grey or RGBA images first)");
  }
  if (rgb) a = a[py::make_tuple(py::ellipsis(), py::slice(py::none(), py::none(), py::int_(-1)))];
  // Contiguous rows as the engine reads them: a view that is not (a crop, the RGB flip) is copied.
  py::array_t<uint8_t, py::array::c_style> c = py::array_t<uint8_t, py::array::c_style>::ensure(a);
  if (!c) throw py::error_already_set();
  cam.pixels.data = c.data();
  cam.pixels.height = c.shape(0);
  cam.pixels.width = c.shape(1);
  cam.pixels.owner = keep_alive(std::move(c));
}

// The N matrices of a calibration shortcut (a list, or an N x R x C array) as JSON lists.
std::vector<json> per_camera(const py::handle& value, const std::string& key, size_t cameras) {
  const json all = to_json(value, key);
  if (!all.is_array() || all.size() != cameras) {
    throw invalid(key, all.is_array() ? std::to_string(all.size()) + " matrices for " + std::to_string(cameras) + " images"
                                      : "not a list of matrices",
                  "one matrix per image, in the images' order");
  }
  return std::vector<json>(all.begin(), all.end());
}

const std::set<std::string>& request_keys() {
  static const std::set<std::string> keys = {"images",    "camera_names", "lidar2img",        "intrinsics",
                                             "extrinsics", "cameras",      "stream",           "timestamp",
                                             "scene",     "token",        "T_world_from_ego", "T_ego_from_lidar",
                                             "can_bus",   "color_order"};
  return keys;
}

}  // namespace

bev::Frame frame_from_request(const py::dict& request) {
  json j = json::object();
  for (const auto& [k, v] : request) {
    const std::string key = py::str(k).cast<std::string>();
    if (!request_keys().count(key)) {
      throw invalid(key, "an unknown field",
                    "images, camera_names, lidar2img, intrinsics, extrinsics, cameras, stream, timestamp, scene, token, "
                    "T_world_from_ego, T_ego_from_lidar, can_bus, color_order (docs/PYTHON.md)");
    }
  }
  auto get = [&](const char* key) { return request.contains(key) ? py::object(request[key]) : py::object(); };
  bool rgb = false;
  if (py::object order = get("color_order"); order && !order.is_none()) {
    const std::string o = py::isinstance<py::str>(order) ? order.cast<std::string>() : "";
    if (o != "bgr" && o != "rgb") throw invalid("color_order", "'" + py::str(order).cast<std::string>() + "'", "\"bgr\" or \"rgb\"");
    rgb = o == "rgb";
  }
  for (const char* key : {"timestamp", "scene", "token", "T_world_from_ego", "T_ego_from_lidar", "can_bus"}) {
    if (py::object v = get(key); v && !v.is_none()) j[key] = to_json(v, key);
  }
  if (py::object s = get("stream"); s && !s.is_none()) {
    if (py::isinstance<py::dict>(s)) {
      for (const auto& [k, v] : py::reinterpret_borrow<py::dict>(s)) {
        const std::string key = py::str(k).cast<std::string>();
        if (key == "id") {
          j["stream"] = to_json(v, "stream.id");
        } else if (key == "T_world_from_ego") {
          if (j.contains("T_world_from_ego")) throw invalid("stream.T_world_from_ego", "given twice (also at the top level)", "one ego pose");
          if (!v.is_none()) j["T_world_from_ego"] = to_json(v, "stream.T_world_from_ego");
        } else {
          throw invalid("stream." + key, "an unknown field", "\"id\" and \"T_world_from_ego\"");
        }
      }
      if (!j.contains("stream")) throw invalid("stream.id", "missing", "the stream's id (its history's key)");
    } else {
      j["stream"] = to_json(s, "stream");
    }
  }

  // The cameras' images, by camera index, attached after parsing.
  std::vector<py::object> images;
  py::object cameras = get("cameras"), image_list = get("images");
  if (cameras && !cameras.is_none()) {
    for (const char* key : {"images", "camera_names", "lidar2img", "intrinsics", "extrinsics"}) {
      if (request.contains(key)) throw invalid(key, "given with \"cameras\"", "either cameras (the frame JSON's list) or images and calibration");
    }
    if (!py::isinstance<py::list>(cameras) && !py::isinstance<py::tuple>(cameras)) {
      throw invalid("cameras", "a " + type_name(cameras), "a list of {name, image, K + T_ego_from_cam or lidar2img}");
    }
    json cams = json::array();
    size_t i = 0;
    for (const py::handle& c : cameras) {
      const std::string where = "cameras[" + std::to_string(i++) + "]";
      if (!py::isinstance<py::dict>(c)) throw invalid(where, "a " + type_name(c), "a mapping");
      json cj = json::object();
      py::object image;
      for (const auto& [k, v] : py::reinterpret_borrow<py::dict>(c)) {
        const std::string key = py::str(k).cast<std::string>();
        if (key == "image") {
          image = py::reinterpret_borrow<py::object>(v);
          cj["image"] = is_path(v) ? json(py::str(py::module_::import("os").attr("fspath")(v)).cast<std::string>())
                                   : json("<" + where + ".image>");
        } else {
          cj[key] = to_json(v, where + "." + key);
        }
      }
      images.push_back(image);
      cams.push_back(std::move(cj));
    }
    j["cameras"] = std::move(cams);
  } else if (image_list && !image_list.is_none()) {
    std::vector<std::string> names;
    std::vector<py::object> given;
    if (py::isinstance<py::dict>(image_list)) {
      if (request.contains("camera_names")) throw invalid("camera_names", "given with images as a mapping", "the names as the mapping's keys");
      for (const auto& [k, v] : py::reinterpret_borrow<py::dict>(image_list)) {
        names.push_back(py::str(k).cast<std::string>());
        given.push_back(py::reinterpret_borrow<py::object>(v));
      }
    } else if (py::isinstance<py::list>(image_list) || py::isinstance<py::tuple>(image_list)) {
      for (const py::handle& v : image_list) given.push_back(py::reinterpret_borrow<py::object>(v));
      if (py::object n = get("camera_names"); n && !n.is_none()) {
        const json nj = to_json(n, "camera_names");
        if (!nj.is_array() || nj.size() != given.size()) {
          throw invalid("camera_names", "not one name per image", std::to_string(given.size()) + " names, in the images' order");
        }
        for (const json& x : nj) names.push_back(x.is_string() ? x.get<std::string>() : x.dump());
      } else {
        for (size_t i = 0; i < given.size(); ++i) {
          names.push_back(given.size() == 6 ? kNuScenesCameras[i] : "CAM_" + std::to_string(i));
        }
      }
    } else {
      throw invalid("images", "a " + type_name(image_list), "a list of images in camera slot order, or a mapping name -> image");
    }
    std::vector<json> l2i, K, T;
    if (py::object v = get("lidar2img"); v && !v.is_none()) l2i = per_camera(v, "lidar2img", given.size());
    if (py::object v = get("intrinsics"); v && !v.is_none()) K = per_camera(v, "intrinsics", given.size());
    if (py::object v = get("extrinsics"); v && !v.is_none()) T = per_camera(v, "extrinsics", given.size());
    json cams = json::array();
    for (size_t i = 0; i < given.size(); ++i) {
      json cj = {{"name", names[i]}};
      cj["image"] = is_path(given[i]) ? json(py::str(py::module_::import("os").attr("fspath")(given[i])).cast<std::string>())
                                      : json("<images[" + std::to_string(i) + "]>");
      if (!K.empty()) cj["K"] = K[i];
      if (!T.empty()) cj["T_ego_from_cam"] = T[i];
      if (!l2i.empty()) cj["lidar2img"] = l2i[i];
      cams.push_back(std::move(cj));
    }
    images = std::move(given);
    j["cameras"] = std::move(cams);
  } else {
    for (const char* key : {"camera_names", "lidar2img", "intrinsics", "extrinsics"}) {
      if (request.contains(key)) throw invalid(key, "given without images", "images with their calibration");
    }
  }

  bev::Frame frame = bev::parse_frame(j.dump(), "request");
  for (size_t i = 0; i < images.size() && i < frame.cameras.size(); ++i) {
    const std::string where = cameras && !cameras.is_none() ? "cameras[" + std::to_string(i) + "].image"
                                                            : "images[" + std::to_string(i) + "]";
    if (images[i]) attach_image(frame.cameras[i], images[i], where, rgb);
  }
  return frame;
}

// Decoded pixels as a new HxWx3 uint8 array (BGR).
py::array pixels_array(const bev::ImagePixels& px) {
  py::array_t<uint8_t> out({px.height, px.width, int64_t{3}});
  std::memcpy(out.mutable_data(), px.data, static_cast<size_t>(px.height * px.width * 3));
  return out;
}

py::array read_image(const py::object& source) {
  bev::ImagePixels px;
  if (is_path(source)) {
    const std::string path = py::str(py::module_::import("os").attr("fspath")(source)).cast<std::string>();
    py::gil_scoped_release nogil;
    px = bev::read_image_pixels(path);
  } else if (py::isinstance<py::bytes>(source) || py::isinstance<py::bytearray>(source) || py::isinstance<py::memoryview>(source)) {
    const std::string bytes = py::bytes(source).cast<std::string>();
    py::gil_scoped_release nogil;
    px = bev::decode_image_pixels(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), "image");
  } else {
    throw Error(ErrorKind::kInvalidInput, "a " + type_name(source)).where("read_image").expected("a path or encoded bytes");
  }
  return pixels_array(px);
}

py::dict request_from_frame(const bev::Frame& f, const std::string& base_dir, bool decode) {
  namespace fs = std::filesystem;
  auto mat = [](const double* m, py::ssize_t r, py::ssize_t c) {
    py::array_t<double> a({r, c});
    std::memcpy(a.mutable_data(), m, sizeof(double) * static_cast<size_t>(r * c));
    return a;
  };
  py::dict out;
  py::dict stream;
  stream["id"] = f.stream;
  if (f.T_world_from_ego) stream["T_world_from_ego"] = mat(f.T_world_from_ego->data(), 4, 4);
  out["stream"] = stream;
  out["timestamp"] = f.timestamp;
  if (f.scene) out["scene"] = *f.scene;
  if (f.token) out["token"] = *f.token;
  if (f.T_ego_from_lidar) out["T_ego_from_lidar"] = mat(f.T_ego_from_lidar->data(), 4, 4);
  if (f.can_bus) out["can_bus"] = mat(f.can_bus->data(), 1, 18).attr("reshape")(18);
  py::list images, names;
  bool all_k = true, all_l2i = true;
  for (const bev::Camera& c : f.cameras) {
    names.append(c.name);
    all_k = all_k && c.K && c.T_ego_from_cam;
    all_l2i = all_l2i && c.lidar2img;
    py::object image;
    if (!c.pixels.empty()) {
      image = pixels_array(c.pixels);
    } else if (!c.image_path.empty()) {
      const fs::path p = fs::path(c.image_path).is_absolute() ? fs::path(c.image_path) : fs::path(base_dir) / c.image_path;
      const std::string abs = fs::absolute(p).lexically_normal().string();
      image = decode ? py::object(read_image(py::str(abs))) : py::object(py::str(abs));
    } else {
      py::bytes b(reinterpret_cast<const char*>(c.image_bytes.bytes.data()), c.image_bytes.size());
      image = decode ? py::object(read_image(b)) : py::object(b);
    }
    images.append(image);
  }
  auto stack = [&](auto field, py::ssize_t r, py::ssize_t c) {
    py::array_t<double> a({static_cast<py::ssize_t>(f.cameras.size()), r, c});
    for (size_t i = 0; i < f.cameras.size(); ++i) {
      std::memcpy(a.mutable_data() + i * static_cast<size_t>(r * c), field(f.cameras[i]).data(), sizeof(double) * static_cast<size_t>(r * c));
    }
    return a;
  };
  if (all_k && !f.cameras.empty()) {
    out["images"] = images;
    out["camera_names"] = names;
    out["intrinsics"] = stack([](const bev::Camera& c) { return *c.K; }, 3, 3);
    out["extrinsics"] = stack([](const bev::Camera& c) { return *c.T_ego_from_cam; }, 4, 4);
  } else if (all_l2i && !f.cameras.empty()) {
    out["images"] = images;
    out["camera_names"] = names;
    out["lidar2img"] = stack([](const bev::Camera& c) { return *c.lidar2img; }, 4, 4);
  } else {
    py::list cams;
    for (size_t i = 0; i < f.cameras.size(); ++i) {
      const bev::Camera& c = f.cameras[i];
      py::dict cd;
      cd["name"] = c.name;
      cd["image"] = images[i];
      if (c.K) cd["K"] = mat(c.K->data(), 3, 3);
      if (c.T_ego_from_cam) cd["T_ego_from_cam"] = mat(c.T_ego_from_cam->data(), 4, 4);
      if (c.lidar2img) cd["lidar2img"] = mat(c.lidar2img->data(), 4, 4);
      cams.append(cd);
    }
    out["cameras"] = cams;
  }
  return out;
}

py::dict synthetic_request(const std::string& config, uint64_t seed, int index) {
  return request_from_frame(bev::synthetic_camera_frame(config, seed, index), "", /*decode=*/true);
}

std::string request_frame_json(const py::dict& request) { return bev::frame_json(frame_from_request(request)); }

}  // namespace bevpy
