#include "server/grpc_convert.h"

#include <cstring>

namespace bev::server {
namespace {

using json = nlohmann::json;

[[noreturn]] void invalid(const std::string& message) { throw ApiError(400, "invalid_input", message); }

json to_json(const inference::InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kBoolParam: return p.bool_param();
    case inference::InferParameter::kInt64Param: return p.int64_param();
    case inference::InferParameter::kStringParam: return p.string_param();
    case inference::InferParameter::kDoubleParam: return p.double_param();
    case inference::InferParameter::kUint64Param: return p.uint64_param();
    case inference::InferParameter::PARAMETER_CHOICE_NOT_SET: break;
  }
  return nullptr;
}

bool get_bool(const inference::InferParameter& p, const std::string& what) {
  if (p.parameter_choice_case() != inference::InferParameter::kBoolParam) invalid(what + " must be a bool_param");
  return p.bool_param();
}

// BYTES packed as the binary extension packs them: a 4-byte little-endian length, then the bytes.
std::vector<std::string_view> split_raw(std::string_view raw, const std::string& what) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (at < raw.size()) {
    if (raw.size() - at < 4) invalid(what + ": raw contents end inside an element's 4-byte length");
    uint32_t n;
    std::memcpy(&n, raw.data() + at, 4);
    at += 4;
    if (n > raw.size() - at) invalid(what + ": an element of " + std::to_string(n) + " bytes but " + std::to_string(raw.size() - at) + " remain");
    if (out.size() >= kMaxOipElements) invalid(what + " has more than " + std::to_string(kMaxOipElements) + " elements");
    out.push_back(raw.substr(at, n));
    at += n;
  }
  return out;
}

void set(inference::InferParameter* p, const json& v) {
  if (v.is_boolean()) {
    p->set_bool_param(v.get<bool>());
  } else if (v.is_number_integer()) {
    p->set_int64_param(v.get<int64_t>());
  } else if (v.is_number_float()) {
    p->set_double_param(v.get<double>());
  } else if (v.is_string()) {
    p->set_string_param(v.get<std::string>());
  }
}

}  // namespace

OipRequest oip_request_from_grpc(std::shared_ptr<const inference::ModelInferRequest> message) {
  const inference::ModelInferRequest& m = *message;
  OipRequest req;
  req.body_bytes = m.ByteSizeLong();
  if (m.id().size() > kMaxOipIdBytes) invalid("id is longer than 256 bytes");
  req.id = m.id();
  for (const auto& [k, v] : m.parameters()) {
    if (k == "sequence_id") {
      req.sequence_id = oip_sequence_id(to_json(v));
    } else if (k == "sequence_start") {
      req.sequence_start = get_bool(v, "parameters.sequence_start");
    } else if (k == "sequence_end") {
      req.sequence_end = get_bool(v, "parameters.sequence_end");
    }
  }
  if (m.inputs_size() == 0 || m.inputs_size() > static_cast<int>(kMaxOipTensors)) {
    invalid("inputs must hold 1 to " + std::to_string(kMaxOipTensors) + " tensors (FRAME, and IMAGES)");
  }
  const bool raw = m.raw_input_contents_size() > 0;
  if (raw && m.raw_input_contents_size() != m.inputs_size()) {
    invalid("raw_input_contents has " + std::to_string(m.raw_input_contents_size()) + " entries for " +
            std::to_string(m.inputs_size()) + " inputs (one per input, or none)");
  }
  for (int i = 0; i < m.inputs_size(); ++i) {
    const auto& t = m.inputs(i);
    const std::string what = "inputs[" + std::to_string(i) + "]";
    OipInput in;
    in.name = t.name().substr(0, 64);
    in.datatype = t.datatype().substr(0, 16);
    if (t.shape_size() > 8) invalid(what + " has more than 8 dimensions");
    size_t declared = 1;
    for (const int64_t d : t.shape()) {
      if (d < 0) invalid(what + " has a negative extent");
      if (declared != 0 && static_cast<uint64_t>(d) > kMaxOipElements) invalid(what + " declares more than 64 elements");
      declared *= static_cast<size_t>(d);
      if (declared > kMaxOipElements) invalid(what + " declares more than 64 elements");
    }
    for (const auto& [k, v] : t.parameters()) {
      if (k.rfind("shared_memory_", 0) == 0) {
        throw ApiError(400, "unsupported", what + ": shared memory inputs are not supported; send the data in the request");
      }
    }
    if (in.datatype != "BYTES") invalid(what + " (" + in.name + ") is " + in.datatype + "; this model's inputs are BYTES (FRAME, IMAGES)");
    const auto& c = t.contents();
    if (raw) {
      if (c.bytes_contents_size() > 0) invalid(what + " has contents and raw_input_contents");
      in.elements = split_raw(m.raw_input_contents(i), what);
    } else {
      if (c.bytes_contents_size() > static_cast<int>(kMaxOipElements)) invalid(what + " has more than 64 elements");
      for (const std::string& b : c.bytes_contents()) in.elements.emplace_back(b);
    }
    if (c.bool_contents_size() || c.int_contents_size() || c.int64_contents_size() || c.uint_contents_size() ||
        c.uint64_contents_size() || c.fp32_contents_size() || c.fp64_contents_size()) {
      invalid(what + " has non-BYTES contents");
    }
    if (in.elements.size() != declared) {
      invalid(what + " (" + in.name + ") declares " + std::to_string(declared) + " elements but has " + std::to_string(in.elements.size()));
    }
    in.owner = message;
    for (const OipInput& earlier : req.inputs) {
      if (earlier.name == in.name) invalid("input " + in.name + " appears twice");
    }
    req.inputs.push_back(std::move(in));
  }
  if (m.outputs_size() > static_cast<int>(kMaxOipTensors)) invalid("more than 8 requested outputs");
  for (const auto& o : m.outputs()) {
    for (const auto& [k, v] : o.parameters()) {
      if (k == "classification") throw ApiError(400, "unsupported", "the classification extension does not apply to 3D boxes");
      if (k.rfind("shared_memory_", 0) == 0) throw ApiError(400, "unsupported", "shared memory outputs are not supported");
    }
    for (const OipRequest::Output& earlier : req.outputs) {
      if (earlier.name == o.name()) invalid("output " + o.name().substr(0, 64) + " is requested twice");
    }
    req.outputs.push_back({o.name().substr(0, 64), true});
  }
  return req;
}

void grpc_response_from_oip(const OipResponse& r, inference::ModelInferResponse* out) {
  out->set_model_name(r.model_name);
  out->set_model_version(r.model_version);
  out->set_id(r.id);
  for (const auto& [k, v] : r.parameters.items()) set(&(*out->mutable_parameters())[k], v);
  for (const OipOutput& o : r.outputs) {
    auto* t = out->add_outputs();
    t->set_name(o.name);
    t->set_datatype(o.datatype);
    for (const int64_t d : o.shape) t->add_shape(d);
    out->add_raw_output_contents(o.raw());
  }
}

grpc::Status grpc_status_from(const ApiError& e) {
  grpc::StatusCode code = grpc::StatusCode::INTERNAL;
  switch (e.status()) {
    case 400:
    case 413:
    case 415:
    case 422: code = grpc::StatusCode::INVALID_ARGUMENT; break;
    case 404: code = grpc::StatusCode::NOT_FOUND; break;
    case 409: code = grpc::StatusCode::FAILED_PRECONDITION; break;
    case 429: code = grpc::StatusCode::RESOURCE_EXHAUSTED; break;
    case 503: code = grpc::StatusCode::UNAVAILABLE; break;
    case 504: code = grpc::StatusCode::DEADLINE_EXCEEDED; break;
    default: break;
  }
  return grpc::Status(code, "[" + e.kind() + "] " + e.what());
}

}  // namespace bev::server
