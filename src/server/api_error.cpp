#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace bev::server {

ApiError api_error_from(const Error& e, ErrorStage stage) {
  const bool request = stage == ErrorStage::kRequest;
  switch (e.kind()) {
    case ErrorKind::kInvalidInput: return {request ? 400 : 422, "invalid_input", e.what()};
    case ErrorKind::kNotFound: return {404, "not_found", e.what()};
    case ErrorKind::kUnsupported: return {request ? 415 : 422, "unsupported", e.what()};
    case ErrorKind::kIo: return {500, "io", e.what()};
    case ErrorKind::kBusy: return {503, "busy", e.what(), 1};
    case ErrorKind::kInternal: break;
  }
  return {500, "internal", e.what()};
}

HttpResponse error_response(int status, const std::string& kind, const std::string& message) {
  HttpResponse r;
  r.status = status;
  // Invalid UTF-8 in a message (it may quote request bytes) is replaced, never thrown.
  r.body = nlohmann::json{{"error", {{"kind", kind}, {"message", message}}}}.dump(
               -1, ' ', false, nlohmann::json::error_handler_t::replace) +
           "\n";
  return r;
}

HttpResponse error_response(const ApiError& e) {
  HttpResponse r = error_response(e.status(), e.kind(), e.what());
  if (e.retry_after_seconds() > 0) r.headers.emplace_back("Retry-After", std::to_string(e.retry_after_seconds()));
  return r;
}

std::string error_kind_of(const HttpResponse& r) {
  const nlohmann::json body = nlohmann::json::parse(r.body, nullptr, false);
  if (!body.is_object() || !body.contains("error")) return "";
  // The Open Inference Protocol's shape: {"error": message, "kind": kind} (server/oip.h).
  if (body["error"].is_string() && body.contains("kind") && body["kind"].is_string()) return body["kind"];
  if (!body["error"].is_object()) return "";
  return body["error"].value("kind", "");
}

}  // namespace bev::server
