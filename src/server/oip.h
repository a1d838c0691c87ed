// The Open Inference Protocol (KServe v2, as Triton speaks it) without a model or sockets: the
// request and answer of POST /v2/models/{name}/infer as plain data, read from the REST JSON body
// with the binary tensor data extension (Inference-Header-Content-Length) and written back the
// same way; the gRPC side (grpc_convert.h) fills and reads the same structs. The model's inputs
// and outputs are fixed (docs/API.md, "Open Inference Protocol"):
//   FRAME       BYTES [1]      the frame JSON (docs/FORMATS.md)
//   IMAGES      BYTES [N]      optional: one encoded image (JPEG/PNG) per camera, in the frame's order
//   BOXES       FP32  [K, 9]   x, y, z (bottom centre), w, l, h, yaw, vx, vy in the LiDAR frame
//   SCORES      FP32  [K]
//   LABELS      INT32 [K]
//   DETECTIONS  BYTES [1]      the detections JSON
// Every length, count and shape is checked against the bytes that remain before anything is
// read or allocated (fuzz/fuzz_oip_request.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/http_types.h"

namespace bev::server {

// Bounds on what a request may declare.
inline constexpr size_t kMaxOipTensors = 8;          // inputs or requested outputs
inline constexpr size_t kMaxOipElements = 64;        // elements of one BYTES tensor (cameras + 1)
inline constexpr size_t kMaxOipIdBytes = 256;        // "id"

struct OipInput {
  std::string name, datatype;
  std::vector<int64_t> shape;
  // BYTES elements, viewing `owner` (the request body, a gRPC message) or `owned`.
  std::vector<std::string_view> elements;
  std::shared_ptr<const void> owner;
  std::vector<std::string> owned;  // elements that came as JSON strings
};

struct OipRequest {
  std::string id;                          // echoed in the answer
  std::optional<std::string> sequence_id;  // a uint64 in decimal, or the string as sent
  bool sequence_start = false, sequence_end = false;
  std::vector<OipInput> inputs;
  struct Output {
    std::string name;
    bool binary = false;  // REST: answer it in the binary section
  };
  std::vector<Output> outputs;  // empty: every output
  bool binary_outputs = false;  // REST "binary_data_output": the default for outputs not listed
  size_t body_bytes = 0;        // the request's size (memory accounting)

  const OipInput* input(std::string_view name) const;
};

// One output of an answer: typed values, in row-major order.
struct OipOutput {
  std::string name, datatype;
  std::vector<int64_t> shape;
  std::vector<float> fp32;
  std::vector<int32_t> int32;
  std::vector<std::string> bytes;
  bool binary = false;  // REST: in the binary section
  // The values as the binary extension lays them out (BYTES: 4-byte little-endian length + bytes each).
  std::string raw() const;
};

struct OipResponse {
  std::string model_name, model_version, id;
  nlohmann::json parameters = nlohmann::json::object();  // sequence_id, used_history, frame_index, ...
  std::vector<OipOutput> outputs;
};

// The input and output tensors the model declares (metadata and checks).
struct OipTensorSpec {
  const char* name;
  const char* datatype;
  std::vector<int64_t> shape;  // -1: any extent
};
const std::vector<OipTensorSpec>& oip_inputs();
const std::vector<OipTensorSpec>& oip_outputs();

// POST .../infer's body: the JSON inference request, followed by the binary section when
// `header_length` (Inference-Header-Content-Length) is given. Throws ApiError (400 invalid, 413
// over a bound). The body's bytes stay alive through the inputs' `owner`.
OipRequest parse_oip_rest_request(std::string body, const std::string* header_length);

// A sequence_id parameter (a non-negative integer or a non-empty string) as the stream id; 0 and
// "" mean none (Triton's rule). Throws ApiError 400 for other types and invalid ids.
std::optional<std::string> oip_sequence_id(const nlohmann::json& value);

// The answer's body: JSON alone, or JSON then the binary section of the outputs marked binary
// (with the Inference-Header-Content-Length header).
HttpResponse oip_rest_response(const OipResponse& r);

// Errors in the protocol's shape, {"error": message}, with our kind beside it for metrics and
// clients that branch on it: {"error": "...", "kind": "sequence_unknown"}.
HttpResponse oip_error_response(int status, const std::string& kind, const std::string& message);
// A refusal in the /v1 shape ({"error": {"kind", "message"}}) rewritten in the protocol's.
HttpResponse oip_error_from_v1(const HttpResponse& v1);

}  // namespace bev::server
