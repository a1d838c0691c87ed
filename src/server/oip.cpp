#include "server/oip.h"

#include <cstring>
#include <limits>

#include "bevformer/error.h"
#include "io/frame_json.h"
#include "server/api_error.h"
#include "server/frame_request.h"

namespace bev::server {
namespace {

using json = nlohmann::json;

[[noreturn]] void invalid(const std::string& message) { throw ApiError(400, "invalid_input", message); }

std::string clip(std::string_view s, size_t n = 100) { return std::string(s.substr(0, n)); }

// A JSON value as a short text for messages (never the whole of a large one).
std::string shown(const json& v) { return clip(v.dump(-1, ' ', false, json::error_handler_t::replace), 80); }

bool get_bool(const json& v, const std::string& what) {
  if (!v.is_boolean()) invalid(what + " is " + shown(v) + "; expected true or false");
  return v.get<bool>();
}

std::vector<int64_t> read_shape(const json& v, const std::string& what) {
  if (!v.is_array() || v.size() > 8) invalid(what + ".shape is " + shown(v) + "; expected a list of at most 8 extents");
  std::vector<int64_t> shape;
  for (const json& e : v) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0) invalid(what + ".shape has " + shown(e) + "; expected non-negative integers");
    shape.push_back(e.get<int64_t>());
  }
  return shape;
}

// The element count a shape declares, or nullopt past kMaxOipElements (no overflow on the way).
std::optional<size_t> element_count(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) {
    if (d == 0) return 0;
    if (static_cast<uint64_t>(d) > kMaxOipElements || n * static_cast<size_t>(d) > kMaxOipElements) return std::nullopt;
    n *= static_cast<size_t>(d);
  }
  return n;
}

// A JSON "data" list of strings, nested as the shape or flat (the protocol allows both).
void flatten_strings(json& v, std::vector<std::string>& out, const std::string& what, int depth) {
  if (v.is_string()) {
    if (out.size() >= kMaxOipElements) invalid(what + ".data has more than " + std::to_string(kMaxOipElements) + " elements");
    out.push_back(std::move(v.get_ref<std::string&>()));
    return;
  }
  if (!v.is_array() || depth > 8) invalid(what + ".data holds " + shown(v) + "; a BYTES tensor's JSON data is strings");
  for (json& e : v) flatten_strings(e, out, what, depth + 1);
}

// BYTES in the binary extension: each element a 4-byte little-endian length and its bytes.
std::vector<std::string_view> split_bytes(std::string_view raw, const std::string& what) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (at < raw.size()) {
    if (raw.size() - at < 4) invalid(what + ": the binary data ends inside an element's 4-byte length (byte " + std::to_string(at) + ")");
    uint32_t n;
    std::memcpy(&n, raw.data() + at, 4);  // little-endian, as the protocol says (x86-64, aarch64)
    at += 4;
    if (n > raw.size() - at) {
      invalid(what + ": an element of " + std::to_string(n) + " bytes at byte " + std::to_string(at) + " but only " +
              std::to_string(raw.size() - at) + " remain");
    }
    if (out.size() >= kMaxOipElements) invalid(what + " has more than " + std::to_string(kMaxOipElements) + " elements");
    out.push_back(raw.substr(at, n));
    at += n;
  }
  return out;
}

void check_tensor_parameters(const json& p, const std::string& what, std::optional<size_t>* binary_size) {
  if (!p.is_object()) invalid(what + ".parameters is " + shown(p) + "; expected an object");
  for (const auto& [k, v] : p.items()) {
    if (k == "binary_data_size") {
      if (!v.is_number_unsigned()) invalid(what + ".parameters.binary_data_size is " + shown(v) + "; expected a byte count");
      *binary_size = v.get<uint64_t>();
    } else if (k.rfind("shared_memory_", 0) == 0) {
      throw ApiError(400, "unsupported", what + ": shared memory inputs are not supported; send the data in the request");
    }
    // Other parameters are the client's business (the protocol lets them pass).
  }
}

}  // namespace

const OipInput* OipRequest::input(std::string_view name) const {
  for (const OipInput& i : inputs) {
    if (i.name == name) return &i;
  }
  return nullptr;
}

const std::vector<OipTensorSpec>& oip_inputs() {
  static const std::vector<OipTensorSpec> v = {{"FRAME", "BYTES", {1}}, {"IMAGES", "BYTES", {-1}}};
  return v;
}

const std::vector<OipTensorSpec>& oip_outputs() {
  static const std::vector<OipTensorSpec> v = {
      {"BOXES", "FP32", {-1, 9}}, {"SCORES", "FP32", {-1}}, {"LABELS", "INT32", {-1}}, {"DETECTIONS", "BYTES", {1}}};
  return v;
}

std::optional<std::string> oip_sequence_id(const json& value) {
  if (value.is_number_unsigned() || (value.is_number_integer() && value.get<int64_t>() >= 0)) {
    const uint64_t id = value.get<uint64_t>();
    if (id == 0) return std::nullopt;
    return std::to_string(id);
  }
  if (value.is_string()) {
    const std::string& id = value.get_ref<const std::string&>();
    if (id.empty()) return std::nullopt;
    if (!valid_stream_id(id)) {
      invalid("sequence_id '" + clip(id, 140) + "' is not a valid id: 1 to 128 characters of A-Z a-z 0-9 . _ : -");
    }
    return id;
  }
  invalid("sequence_id is " + shown(value) + "; expected a non-negative integer (uint64) or a string");
}

OipRequest parse_oip_rest_request(std::string body, const std::string* header_length) {
  OipRequest req;
  req.body_bytes = body.size();
  auto owned_body = std::make_shared<const std::string>(std::move(body));
  const std::string_view all(*owned_body);
  size_t json_size = all.size();
  if (header_length) {
    const std::string& h = *header_length;
    if (h.empty() || h.size() > 12 || h.find_first_not_of("0123456789") != std::string::npos) {
      invalid("Inference-Header-Content-Length is '" + clip(h) + "'; expected the JSON header's byte count");
    }
    json_size = std::stoull(h);
    if (json_size > all.size()) {
      invalid("Inference-Header-Content-Length is " + h + " but the body has " + std::to_string(all.size()) + " bytes");
    }
  }
  json j;
  try {
    j = parse_json_strict(all.substr(0, json_size), "inference request");
  } catch (const Error& e) {
    invalid(e.what());
  }
  if (!j.is_object()) invalid("the inference request is " + shown(j) + "; expected a JSON object");
  for (const auto& [k, v] : j.items()) {
    if (k != "id" && k != "parameters" && k != "inputs" && k != "outputs") {
      invalid("unknown field '" + clip(k) + "' in the inference request (id, parameters, inputs, outputs)");
    }
  }
  if (j.contains("id")) {
    if (!j["id"].is_string() || j["id"].get_ref<const std::string&>().size() > kMaxOipIdBytes) {
      invalid("id is " + shown(j["id"]) + "; expected a string of at most 256 bytes");
    }
    req.id = j["id"].get<std::string>();
  }
  if (j.contains("parameters")) {
    const json& p = j["parameters"];
    if (!p.is_object()) invalid("parameters is " + shown(p) + "; expected an object");
    for (const auto& [k, v] : p.items()) {
      if (k == "sequence_id") {
        req.sequence_id = oip_sequence_id(v);
      } else if (k == "sequence_start") {
        req.sequence_start = get_bool(v, "parameters.sequence_start");
      } else if (k == "sequence_end") {
        req.sequence_end = get_bool(v, "parameters.sequence_end");
      } else if (k == "binary_data_output") {
        req.binary_outputs = get_bool(v, "parameters.binary_data_output");
      }
      // priority, timeout and custom parameters pass (Triton hands them to its backends).
    }
  }
  if (!j.contains("inputs") || !j["inputs"].is_array() || j["inputs"].empty() || j["inputs"].size() > kMaxOipTensors) {
    invalid("inputs must be a list of 1 to " + std::to_string(kMaxOipTensors) + " tensors (FRAME, and IMAGES)");
  }
  std::string_view binary = all.substr(json_size);
  for (size_t i = 0; i < j["inputs"].size(); ++i) {
    json& t = j["inputs"][i];
    const std::string what = "inputs[" + std::to_string(i) + "]";
    if (!t.is_object()) invalid(what + " is " + shown(t) + "; expected an object");
    OipInput in;
    for (const auto& [k, v] : t.items()) {
      if (k != "name" && k != "shape" && k != "datatype" && k != "parameters" && k != "data") {
        invalid("unknown field '" + clip(k) + "' in " + what);
      }
    }
    if (!t.contains("name") || !t["name"].is_string()) invalid(what + " has no \"name\"");
    if (!t.contains("datatype") || !t["datatype"].is_string()) invalid(what + " has no \"datatype\"");
    if (!t.contains("shape")) invalid(what + " has no \"shape\"");
    in.name = clip(t["name"].get_ref<const std::string&>(), 64);
    in.datatype = clip(t["datatype"].get_ref<const std::string&>(), 16);
    in.shape = read_shape(t["shape"], what);
    std::optional<size_t> binary_size;
    if (t.contains("parameters")) check_tensor_parameters(t["parameters"], what, &binary_size);
    if (in.datatype != "BYTES") {
      invalid(what + " (" + in.name + ") is " + in.datatype + "; this model's inputs are BYTES (FRAME, IMAGES)");
    }
    if (binary_size) {
      if (t.contains("data")) invalid(what + " has both binary_data_size and \"data\"");
      if (!header_length) invalid(what + " has binary_data_size but the request has no Inference-Header-Content-Length");
      if (*binary_size > binary.size()) {
        invalid(what + " declares " + std::to_string(*binary_size) + " bytes of binary data but " +
                std::to_string(binary.size()) + " remain");
      }
      in.elements = split_bytes(binary.substr(0, *binary_size), what);
      in.owner = owned_body;
      binary.remove_prefix(*binary_size);
    } else {
      if (!t.contains("data")) invalid(what + " has neither \"data\" nor parameters.binary_data_size");
      flatten_strings(t["data"], in.owned, what, 0);
      for (const std::string& s : in.owned) in.elements.emplace_back(s);  // after the vector is complete
    }
    const std::optional<size_t> declared = element_count(in.shape);
    if (!declared || *declared != in.elements.size()) {
      invalid(what + " (" + in.name + ") has shape " + shown(t["shape"]) + " but " + std::to_string(in.elements.size()) +
              " elements");
    }
    for (const OipInput& earlier : req.inputs) {
      if (earlier.name == in.name) invalid("input " + in.name + " appears twice");
    }
    req.inputs.push_back(std::move(in));
  }
  if (!binary.empty()) {
    invalid(std::to_string(binary.size()) + " bytes after the inputs' binary data (the binary_data_size values do not add up to the body)");
  }
  if (j.contains("outputs")) {
    const json& outs = j["outputs"];
    if (!outs.is_array() || outs.size() > kMaxOipTensors) invalid("outputs must be a list of at most 8 requested outputs");
    for (size_t i = 0; i < outs.size(); ++i) {
      const json& o = outs[i];
      const std::string what = "outputs[" + std::to_string(i) + "]";
      if (!o.is_object() || !o.contains("name") || !o["name"].is_string()) invalid(what + " needs a \"name\"");
      OipRequest::Output out{clip(o["name"].get_ref<const std::string&>(), 64), req.binary_outputs};
      if (o.contains("parameters")) {
        const json& p = o["parameters"];
        if (!p.is_object()) invalid(what + ".parameters is " + shown(p) + "; expected an object");
        for (const auto& [k, v] : p.items()) {
          if (k == "binary_data") {
            out.binary = get_bool(v, what + ".parameters.binary_data");
          } else if (k == "classification") {
            throw ApiError(400, "unsupported", what + ": the classification extension does not apply to 3D boxes");
          } else if (k.rfind("shared_memory_", 0) == 0) {
            throw ApiError(400, "unsupported", what + ": shared memory outputs are not supported");
          }
        }
      }
      for (const OipRequest::Output& earlier : req.outputs) {
        if (earlier.name == out.name) invalid("output " + out.name + " is requested twice");
      }
      req.outputs.push_back(std::move(out));
    }
  }
  return req;
}

std::string OipOutput::raw() const {
  std::string out;
  if (datatype == "FP32") {
    out.assign(reinterpret_cast<const char*>(fp32.data()), fp32.size() * sizeof(float));
  } else if (datatype == "INT32") {
    out.assign(reinterpret_cast<const char*>(int32.data()), int32.size() * sizeof(int32_t));
  } else {
    for (const std::string& b : bytes) {
      const uint32_t n = static_cast<uint32_t>(b.size());
      out.append(reinterpret_cast<const char*>(&n), 4);
      out += b;
    }
  }
  return out;
}

HttpResponse oip_rest_response(const OipResponse& r) {
  json j;
  j["model_name"] = r.model_name;
  j["model_version"] = r.model_version;
  if (!r.id.empty()) j["id"] = r.id;
  if (!r.parameters.empty()) j["parameters"] = r.parameters;
  j["outputs"] = json::array();
  std::string binary;
  for (const OipOutput& o : r.outputs) {
    json t = {{"name", o.name}, {"datatype", o.datatype}, {"shape", o.shape}};
    if (o.binary) {
      const std::string raw = o.raw();
      t["parameters"] = {{"binary_data_size", raw.size()}};
      binary += raw;
    } else if (o.datatype == "FP32") {
      t["data"] = o.fp32;
    } else if (o.datatype == "INT32") {
      t["data"] = o.int32;
    } else {
      t["data"] = o.bytes;
    }
    j["outputs"].push_back(std::move(t));
  }
  HttpResponse out;
  out.body = j.dump(-1, ' ', false, json::error_handler_t::replace);
  bool any_binary = false;
  for (const OipOutput& o : r.outputs) any_binary = any_binary || o.binary;
  if (any_binary) {
    out.headers.emplace_back("Inference-Header-Content-Length", std::to_string(out.body.size()));
    out.content_type = "application/octet-stream";
    out.body += binary;
  }
  return out;
}

HttpResponse oip_error_response(int status, const std::string& kind, const std::string& message) {
  HttpResponse r;
  r.status = status;
  r.body = json{{"error", message}, {"kind", kind}}.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  return r;
}

HttpResponse oip_error_from_v1(const HttpResponse& v1) {
  const json body = json::parse(v1.body, nullptr, false);
  if (!body.is_object() || !body.contains("error") || !body["error"].is_object()) return v1;
  HttpResponse r = oip_error_response(v1.status, body["error"].value("kind", "unknown"), body["error"].value("message", ""));
  r.headers = v1.headers;
  return r;
}

}  // namespace bev::server
