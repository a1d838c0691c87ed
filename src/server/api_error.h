// Errors as the HTTP API reports them: a status, a machine-readable kind and the message, sent
// as {"error": {"kind": ..., "message": ...}}. Library errors (bev::Error) map by ErrorKind and
// by where they were raised: a malformed request is 400, a well-formed frame the model refuses
// (wrong image size for the rig, ...) is 422.
#pragma once

#include <stdexcept>
#include <string>

#include "bevformer/error.h"
#include "server/http_types.h"

namespace bev::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string kind, const std::string& message, int retry_after_seconds = 0)
      : std::runtime_error(message), status_(status), kind_(std::move(kind)), retry_after_(retry_after_seconds) {}
  int status() const { return status_; }
  const std::string& kind() const { return kind_; }
  int retry_after_seconds() const { return retry_after_; }  // > 0: the answer carries Retry-After

 private:
  int status_;
  std::string kind_;
  int retry_after_;
};

// Where a bev::Error came from: parsing the request, or running the frame through the model.
enum class ErrorStage { kRequest, kModel };

// The status and kind for a library error: invalid input 400 (request) / 422 (model), not
// found 404, unsupported 415 (request) / 422 (model), busy 503 with Retry-After (a resource
// such as the stream slots is exhausted for now), i/o and internal 500.
ApiError api_error_from(const Error& e, ErrorStage stage);

HttpResponse error_response(int status, const std::string& kind, const std::string& message);
HttpResponse error_response(const ApiError& e);

// The "kind" of an error body this module wrote ("" when the body is not one).
std::string error_kind_of(const HttpResponse& r);

}  // namespace bev::server
