// Shared by the Open Inference Protocol and fleet tests: OIP REST bodies (JSON, or JSON plus the
// binary tensor data extension), their answers read back, and a server on a free port over a
// model of the test's choosing (fleet tests run several servers, each with its own model).
#pragma once

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "bevformer/model.h"
#include "server_test_util.h"

namespace bev::server {

inline std::string bytes_element(std::string_view b) {
  const uint32_t n = static_cast<uint32_t>(b.size());
  std::string out(reinterpret_cast<const char*>(&n), 4);
  out.append(b);
  return out;
}

struct OipCall {
  std::string body;
  httplib::Headers headers;
};

// An infer request for micro frame `f` of sequence `seq`: FRAME and IMAGES in the binary section
// (images: the frame's PNGs in camera order), outputs as `binary_outputs` says.
inline OipCall oip_binary_call(json f, const std::string& seq, bool start, bool end = false, bool binary_outputs = true) {
  std::string images;
  std::vector<std::string> imgs;
  for (json& c : f["cameras"]) {
    imgs.push_back(file_bytes(c["image"].get<std::string>()));
    c["image"] = c["name"];  // any string: IMAGES gives the bytes
  }
  for (const std::string& i : imgs) images += bytes_element(i);
  const std::string frame = bytes_element(f.dump());
  json req = {{"id", "req-" + seq},
              {"parameters", {{"sequence_id", seq}, {"sequence_start", start}, {"sequence_end", end}}},
              {"inputs",
               {{{"name", "FRAME"}, {"datatype", "BYTES"}, {"shape", {1}}, {"parameters", {{"binary_data_size", frame.size()}}}},
                {{"name", "IMAGES"},
                 {"datatype", "BYTES"},
                 {"shape", {imgs.size()}},
                 {"parameters", {{"binary_data_size", images.size()}}}}}}};
  if (!binary_outputs) req["parameters"]["binary_data_output"] = false;
  else req["parameters"]["binary_data_output"] = true;
  OipCall c;
  c.body = req.dump();
  c.headers = {{"Inference-Header-Content-Length", std::to_string(c.body.size())}, {"X-Sequence-Id", seq}};
  c.body += frame + images;
  return c;
}

// The same frame as a plain JSON request: FRAME holds the frame JSON with its images inline.
inline OipCall oip_json_call(json f, const std::string& seq, bool start) {
  const std::string frame = json_body(std::move(f));
  json req = {{"parameters", {{"sequence_id", seq}, {"sequence_start", start}}},
              {"inputs", {{{"name", "FRAME"}, {"datatype", "BYTES"}, {"shape", {1}}, {"data", {frame}}}}}};
  return {req.dump(), {{"X-Sequence-Id", seq}}};
}

// An infer answer: the JSON header and each output's values (binary or JSON).
struct OipAnswer {
  int status = 0;
  json header;
  std::map<std::string, std::string> binary;  // output name -> raw bytes
  std::string error, kind;

  json detections() const {
    for (const json& o : header["outputs"]) {
      if (o["name"] != "DETECTIONS") continue;
      if (o.contains("data")) return json::parse(o["data"][0].get<std::string>());
      const std::string& raw = binary.at("DETECTIONS");
      uint32_t n;
      std::memcpy(&n, raw.data(), 4);
      return json::parse(raw.substr(4, n));
    }
    return nullptr;
  }
  const json& parameters() const { return header["parameters"]; }
};

inline OipAnswer read_oip_answer(const httplib::Result& r) {
  OipAnswer a;
  if (!r) return a;
  a.status = r->status;
  if (r->status != 200) {
    const json e = json::parse(r->body, nullptr, false);
    if (e.is_object() && e.contains("error") && e["error"].is_string()) {
      a.error = e["error"];
      a.kind = e.value("kind", "");
    } else {
      a.error = "not the protocol's error shape: " + r->body;
    }
    return a;
  }
  const size_t n = r->has_header("Inference-Header-Content-Length") ? std::stoul(r->get_header_value("Inference-Header-Content-Length"))
                                                                     : r->body.size();
  a.header = json::parse(r->body.substr(0, n));
  size_t at = n;
  for (const json& o : a.header["outputs"]) {
    if (!o.contains("parameters") || !o["parameters"].contains("binary_data_size")) continue;
    const size_t size = o["parameters"]["binary_data_size"].get<size_t>();
    a.binary[o["name"].get<std::string>()] = r->body.substr(at, size);
    at += size;
  }
  return a;
}

inline OipAnswer post_oip(httplib::Client& cli, const OipCall& c, const std::string& model = "bevformer") {
  return read_oip_answer(cli.Post("/v2/models/" + model + "/infer", c.headers, c.body, "application/octet-stream"));
}

// A server on a free port over `model` (RunningServer always serves the shared served_model()).
class ModelServer {
 public:
  ModelServer(Model& model, ServiceOptions so) {
    service_ = std::make_unique<Service>(model, std::move(so));
    HttpOptions ho;
    ho.port = 0;
    http_ = std::make_unique<HttpServer>(*service_, ho);
    port_ = http_->bind();
    thread_ = std::thread([this] { http_->run(); });
  }
  ~ModelServer() { stop(); }
  void stop() {
    if (!thread_.joinable()) return;
    http_->shutdown();
    thread_.join();
    service_->finish();
  }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_read_timeout(60, 0);
    c->set_write_timeout(60, 0);
    return c;
  }
  Service& service() { return *service_; }

 private:
  std::unique_ptr<Service> service_;
  std::unique_ptr<HttpServer> http_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace bev::server
