// The Open Inference Protocol's gRPC messages (proto/grpc_service.proto) to and from the plain
// structs of oip.h, without a model or a server: what grpc_server.cpp calls, and what
// fuzz/fuzz_grpc_infer.cpp drives with arbitrary message bytes.
#pragma once

#include <memory>

#include <grpcpp/support/status.h>

#include "grpc_service.pb.h"
#include "server/api_error.h"
#include "server/oip.h"

namespace bev::server {

// The request's inputs view `message` (kept alive through their owner). Throws ApiError 400
// (malformed or inconsistent tensors and parameters), as the REST parser does.
OipRequest oip_request_from_grpc(std::shared_ptr<const inference::ModelInferRequest> message);

// Every output as raw_output_contents (as Triton answers), parameters as InferParameters.
void grpc_response_from_oip(const OipResponse& r, inference::ModelInferResponse* out);

// The gRPC status for an error the REST API answers with `e.status()`: 400/413/415/422
// INVALID_ARGUMENT, 404 NOT_FOUND, 409 FAILED_PRECONDITION (restart or reorder the sequence),
// 429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE (retry), 504 DEADLINE_EXCEEDED, else INTERNAL. The
// message starts with the kind in brackets: "[sequence_unknown] sequence 7 has no history ...".
grpc::Status grpc_status_from(const ApiError& e);

}  // namespace bev::server
