// Shared by the server test files: frames and request bodies built from the golden micro set,
// raw-socket exchanges, the served and reference models, and a server on a free port.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "bevformer/model.h"
#include "io/frame_json.h"
#include "io/image.h"
#include "micro_frames.h"
#include "server/http_server.h"
#include "server/service.h"

namespace bev::server {

using nlohmann::json;
using bev::testing::kMicroDir;

// ---------------------------------------------------------------------------------------------
// Frames and bodies

struct Part {
  std::string name, content_type, body;
};

inline std::string multipart_body(const std::string& boundary, const std::vector<Part>& parts, bool close = true) {
  std::string out;
  for (const Part& p : parts) {
    out += "--" + boundary + "\r\nContent-Disposition: form-data; name=\"" + p.name + "\"";
    if (p.name != "frame") out += "; filename=\"" + p.name + ".png\"";
    out += "\r\n";
    if (!p.content_type.empty()) out += "Content-Type: " + p.content_type + "\r\n";
    out += "\r\n" + p.body + "\r\n";
  }
  if (close) out += "--" + boundary + "--\r\n";
  return out;
}

inline const std::string& file_bytes(const std::string& relative) {
  static std::map<std::string, std::string> cache;
  static std::mutex mu;
  std::lock_guard lock(mu);
  auto it = cache.find(relative);
  if (it == cache.end()) {
    const std::vector<uint8_t> b = read_file_bytes(kMicroDir + "/" + relative);
    it = cache.emplace(relative, std::string(b.begin(), b.end())).first;
  }
  return it->second;
}

// Micro frame `k` on `stream` at `timestamp`; images still by path (relative to kMicroDir).
inline json micro_frame(int k, const std::string& stream, double timestamp) {
  json f = bev::testing::micro_frame_json(k);
  f["stream"] = stream;
  f["timestamp"] = timestamp;
  return f;
}

// The frame with inline base64 images: the application/json body, and what the library takes.
inline std::string json_body(json f) {
  for (json& c : f["cameras"]) {
    const std::string& b = file_bytes(c["image"].get<std::string>());
    c["image"] = {{"base64", base64_encode({reinterpret_cast<const uint8_t*>(b.data()), b.size()})}};
  }
  return f.dump();
}

inline const std::string kBoundary = "bev-test-boundary-7d1f";
inline const std::string kMultipartType = "multipart/form-data; boundary=" + kBoundary;

// The frame as multipart: a "frame" part, one part per camera named cam<i>.
inline std::string multipart_frame(json f) {
  std::vector<Part> parts;
  parts.push_back({"frame", "application/json", ""});
  for (size_t i = 0; i < f["cameras"].size(); ++i) {
    json& c = f["cameras"][i];
    const std::string name = "cam" + std::to_string(i);
    parts.push_back({name, "image/png", file_bytes(c["image"].get<std::string>())});
    c["image"] = name;
  }
  parts[0].body = f.dump();
  return multipart_body(kBoundary, parts);
}

inline json parse(const std::string& body) { return json::parse(body); }

// Sends `request` as raw bytes on a fresh connection and returns the server's answer (headers and
// Content-Length body; 10 s at most each way). For requests the server refuses before reading
// them whole, which a client library may not finish sending.
inline std::string raw_exchange(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    // The whole request, in as many sends as it takes; a server that answered early may cut it
    // short, and its answer is read all the same.
    for (size_t sent = 0; sent < request.size();) {
      const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
      answer.append(buf, static_cast<size_t>(n));
      // Done once the headers and the Content-Length bytes of body are in.
      const size_t end = answer.find("\r\n\r\n");
      const size_t cl = answer.find("Content-Length: ");
      if (end != std::string::npos && cl != std::string::npos && cl < end &&
          answer.size() >= end + 4 + std::stoul(answer.substr(cl + 16))) {
        break;
      }
    }
  }
  ::close(fd);
  return answer;
}

// ---------------------------------------------------------------------------------------------
// The server on a port, over one shared micro model (and a second one as the reference library).

inline std::unique_ptr<Model> load_micro_model(bool pipeline) {
  Knobs k;
  k.threads = 2;
  k.pipeline = pipeline;
  return Model::load(kMicroDir + "/config.json", kMicroDir + "/checkpoint.pth", k);
}

// Two separate models: the server's, and an independent library run alone to compare with. The
// server's is pipelined (Knobs::pipeline: one frame's image stage beside another's bev stage),
// so every comparison below also checks that its workers' overlapping frames change nothing.
inline Model& served_model() {
  static const std::unique_ptr<Model> m = load_micro_model(/*pipeline=*/true);
  return *m;
}

inline Model& reference_model() {
  static const std::unique_ptr<Model> m = load_micro_model(/*pipeline=*/false);
  return *m;
}

class RunningServer {
 public:
  explicit RunningServer(ServiceOptions so = {}, HttpOptions ho = {}, Model* model = nullptr) {
    ho.port = 0;
    service_ = std::make_unique<Service>(model ? *model : served_model(), std::move(so));
    http_ = std::make_unique<HttpServer>(*service_, ho);
    port_ = http_->bind();
    thread_ = std::thread([this] { http_->run(); });
  }
  ~RunningServer() { stop(); }
  // What SIGTERM does in `bevformer serve`; returns once every connection was answered and closed.
  void stop() {
    if (!thread_.joinable()) return;
    http_->shutdown();
    thread_.join();
    service_->finish();
  }
  int port() const { return port_; }
  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_read_timeout(60, 0);
    c->set_write_timeout(60, 0);
    return c;
  }
  Service& service() { return *service_; }
  HttpServer& http() { return *http_; }

 private:
  std::unique_ptr<Service> service_;
  std::unique_ptr<HttpServer> http_;
  int port_ = 0;
  std::thread thread_;
};

// A counter or gauge of the server's /metrics (-1 when the request fails or the name is absent).
inline double metric(httplib::Client& cli, const std::string& name) {
  const auto m = cli.Get("/metrics");
  if (!m) return -1;
  const size_t at = m->body.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stod(m->body.substr(at + name.size() + 2));
}

inline std::string frames_path(const std::string& stream) { return "/v1/streams/" + stream + "/frames"; }

// The library's detections for a sequence of frames on its own (one stream alone).
inline std::vector<json> library_run(const std::vector<json>& frames) {
  std::vector<json> out;
  for (const json& f : frames) out.push_back(parse(reference_model().detect(json_body(f), "").json));
  return out;
}

// One client thread per stream, each posting its stream's frames in order (multipart where
// multipart(stream, k) says, else JSON); the answers per stream, or the first failure's body.
struct StreamAnswers {
  std::vector<std::vector<json>> got;
  std::vector<std::string> failures;  // "" where every frame was answered 200
};
inline StreamAnswers post_streams_concurrently(const RunningServer& server, const std::vector<std::vector<json>>& frames,
                                               const std::function<bool(size_t, size_t)>& multipart = {}) {
  StreamAnswers a;
  a.got.resize(frames.size());
  a.failures.resize(frames.size());
  std::vector<std::thread> clients;
  for (size_t s = 0; s < frames.size(); ++s) {
    clients.emplace_back([&, s] {
      auto cli = server.client();
      for (size_t k = 0; k < frames[s].size(); ++k) {
        const std::string path = frames_path(frames[s][k]["stream"].get<std::string>());
        const auto r = multipart && multipart(s, k) ? cli->Post(path, multipart_frame(frames[s][k]), kMultipartType)
                                                    : cli->Post(path, json_body(frames[s][k]), "application/json");
        if (!r || r->status != 200) {
          a.failures[s] = r ? r->body : httplib::to_string(r.error());
          return;
        }
        a.got[s].push_back(parse(r->body));
      }
    });
  }
  for (std::thread& t : clients) t.join();
  return a;
}

inline void expect_error(const httplib::Result& r, int status, const std::string& kind, const std::string& message_part = "") {
  ASSERT_TRUE(r) << "no response: " << httplib::to_string(r.error());
  EXPECT_EQ(r->status, status) << r->body;
  const json body = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(body.is_object() && body.contains("error")) << r->body;
  EXPECT_EQ(body["error"]["kind"], kind) << r->body;
  const std::string message = body["error"].value("message", "");
  EXPECT_FALSE(message.empty());
  if (!message_part.empty()) {
    EXPECT_NE(message.find(message_part), std::string::npos) << message;
  }
}

// The same checks on an answer read by raw_exchange (status line, headers, JSON body).
inline void expect_raw_error(const std::string& answer, int status, const std::string& kind) {
  ASSERT_EQ(answer.rfind("HTTP/1.1 " + std::to_string(status), 0), 0u) << answer;
  const size_t body_at = answer.find("\r\n\r\n");
  ASSERT_NE(body_at, std::string::npos) << answer;
  const json body = json::parse(answer.substr(body_at + 4), nullptr, false);
  ASSERT_TRUE(body.is_object() && body.contains("error")) << answer;
  EXPECT_EQ(body["error"]["kind"], kind) << answer;
  EXPECT_FALSE(body["error"].value("message", "").empty()) << answer;
}

}  // namespace bev::server
