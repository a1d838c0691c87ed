// A closed-loop load client for `bevformer serve` (docs/API.md): N streams, one connection each,
// each sending its frames back to back (a stream's frames must be sequential anyway) for a fixed
// time; prints throughput and latency percentiles. Frames are frame JSON files whose images are
// sent inline (base64) or as multipart parts, or — with --oip — as Open Inference Protocol
// requests (docs/DEPLOY.md: FRAME and IMAGES in the binary tensor data extension, each stream a
// sequence with X-Sequence-Id, so a balancer that hashes it keeps each on one server); each
// stream gets its own id and clock.
//
//   load_client --port 8080 --streams 4 --seconds 20 [--multipart | --oip [--model NAME]] FRAME.json...
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "io/frame_json.h"
#include "io/image.h"

namespace {

using nlohmann::json;

struct Frame {
  json doc;                                    // images by absolute path
  std::map<std::string, std::string> images;  // path -> bytes
};

Frame load_frame(const std::string& path) {
  Frame f;
  const std::vector<uint8_t> text = bev::read_file_bytes(path);
  f.doc = json::parse(text.begin(), text.end());
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  for (json& c : f.doc["cameras"]) {
    const std::string p = (dir / c["image"].get<std::string>()).string();
    const std::vector<uint8_t> b = bev::read_file_bytes(p);
    f.images[p] = std::string(b.begin(), b.end());
    c["image"] = p;
  }
  return f;
}

// The body and Content-Type of frame `f` on `stream` at `t`.
std::pair<std::string, std::string> body_of(const Frame& f, const std::string& stream, double t, bool multipart) {
  json doc = f.doc;
  doc["stream"] = stream;
  doc["timestamp"] = t;
  doc.erase("token");
  if (!multipart) {
    for (json& c : doc["cameras"]) {
      const std::string& b = f.images.at(c["image"].get<std::string>());
      c["image"] = {{"base64", bev::base64_encode({reinterpret_cast<const uint8_t*>(b.data()), b.size()})}};
    }
    return {doc.dump(), "application/json"};
  }
  const std::string boundary = "load-client-boundary-5c3e9a";
  std::string images;
  for (size_t i = 0; i < doc["cameras"].size(); ++i) {
    json& c = doc["cameras"][i];
    const std::string name = "cam" + std::to_string(i);
    images += "--" + boundary + "\r\nContent-Disposition: form-data; name=\"" + name + "\"; filename=\"" + name +
              "\"\r\n\r\n" + f.images.at(c["image"].get<std::string>()) + "\r\n";
    c["image"] = name;
  }
  std::string body = "--" + boundary +
                     "\r\nContent-Disposition: form-data; name=\"frame\"\r\nContent-Type: application/json\r\n\r\n" +
                     doc.dump() + "\r\n" + images + "--" + boundary + "--\r\n";
  return {body, "multipart/form-data; boundary=" + boundary};
}

// Frame `f` of sequence `stream` at `t` as an Open Inference Protocol infer request: the body and
// its Inference-Header-Content-Length.
std::uint32_t le32(size_t n) { return static_cast<std::uint32_t>(n); }  // x86-64, aarch64: little-endian

std::string element(const std::string& b) {
  const std::uint32_t n = le32(b.size());
  return std::string(reinterpret_cast<const char*>(&n), 4) + b;
}

std::pair<std::string, std::string> oip_body_of(const Frame& f, const std::string& stream, double t, bool start) {
  json doc = f.doc;
  doc["stream"] = stream;
  doc["timestamp"] = t;
  doc.erase("token");
  std::string images;
  for (json& c : doc["cameras"]) {
    images += element(f.images.at(c["image"].get<std::string>()));
    c["image"] = c["name"];
  }
  const std::string frame = element(doc.dump());
  const json head = {
      {"parameters", {{"sequence_id", stream}, {"sequence_start", start}, {"binary_data_output", true}}},
      {"inputs",
       {{{"name", "FRAME"}, {"datatype", "BYTES"}, {"shape", {1}}, {"parameters", {{"binary_data_size", frame.size()}}}},
        {{"name", "IMAGES"},
         {"datatype", "BYTES"},
         {"shape", {doc["cameras"].size()}},
         {"parameters", {{"binary_data_size", images.size()}}}}}},
      {"outputs", {{{"name", "BOXES"}}, {{"name", "SCORES"}}, {{"name", "LABELS"}}}}};
  const std::string h = head.dump();
  return {h + frame + images, std::to_string(h.size())};
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Closed-loop load on bevformer serve: N streams for S seconds"};
  std::string host = "127.0.0.1";
  int port = 8080, streams = 1;
  double seconds = 10, warmup = 2;
  bool multipart = false, oip = false;
  std::string model = "bevformer";
  std::vector<std::string> files;
  app.add_option("--host", host)->capture_default_str();
  app.add_option("--port", port)->required();
  app.add_option("--streams", streams, "Concurrent streams (one connection each)")->capture_default_str();
  app.add_option("--seconds", seconds, "Measured time")->capture_default_str();
  app.add_option("--warmup", warmup, "Seconds before measuring (first frames record the plans; queues fill)")->capture_default_str();
  app.add_flag("--multipart", multipart, "Send images as multipart parts (default: base64 JSON)");
  app.add_flag("--oip", oip, "Open Inference Protocol requests (POST /v2/models/NAME/infer, binary tensor data)")->excludes("--multipart");
  app.add_option("--model", model, "The model's name for --oip")->capture_default_str();
  app.add_option("frames", files, "Frame JSON files, sent in turn")->required();
  CLI11_PARSE(app, argc, argv);

  std::vector<Frame> frames;
  for (const std::string& f : files) frames.push_back(load_frame(f));

  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto measure_from = start + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(warmup));
  const auto end = measure_from + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
  std::mutex mu;
  std::vector<double> latencies;
  std::map<int, int> statuses;
  // /v1 answers: frames after a stream's first that ran without history, how many said why, and
  // how many of those were evictions (the table full or a TTL: scripts/soak.sh checks them).
  int64_t without_history = 0, told = 0, evicted = 0;
  std::vector<std::thread> threads;
  const auto run_id = std::chrono::system_clock::now().time_since_epoch().count() % 1000000;
  for (int s = 0; s < streams; ++s) {
    threads.emplace_back([&, s] {
      httplib::Client cli(host, port);
      cli.set_read_timeout(300, 0);
      cli.set_write_timeout(300, 0);
      const std::string stream = "load-" + std::to_string(run_id) + "-" + std::to_string(s);
      for (int k = 0; clock::now() < end; ++k) {
        const Frame& frame = frames[static_cast<size_t>(k) % frames.size()];
        const double t = 1000.0 + 0.5 * k;
        const auto t0 = clock::now();
        const httplib::Result r = [&] {
          if (oip) {
            const auto [body, header_length] = oip_body_of(frame, stream, t, k == 0);
            const httplib::Headers headers = {{"Inference-Header-Content-Length", header_length}, {"X-Sequence-Id", stream}};
            return cli.Post("/v2/models/" + model + "/infer", headers, body, "application/octet-stream");
          }
          const auto [body, type] = body_of(frame, stream, t, multipart);
          return cli.Post("/v1/streams/" + stream + "/frames", body, type);
        }();
        const auto t1 = clock::now();
        std::lock_guard lock(mu);
        // Counted: answers that arrive inside the measured window (as wrk counts), so the
        // throughput is not biased by latencies that are long against the window.
        if (t1 < measure_from || t1 > end) continue;
        ++statuses[r ? r->status : -1];
        if (r && r->status == 200) latencies.push_back(std::chrono::duration<double>(t1 - t0).count());
        if (r && r->status == 200 && !oip && k > 0) {
          const json answer = json::parse(r->body, nullptr, false);
          if (answer.is_object() && answer.value("used_history", true) == false) {
            ++without_history;
            const std::string why = answer.value("history_reset", std::string());
            told += !why.empty();
            evicted += why.rfind("history evicted", 0) == 0;
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::printf("streams %d  seconds %.1f  %s\n", streams, seconds, oip ? "oip+binary" : multipart ? "multipart" : "json+base64");
  for (const auto& [status, n] : statuses) std::printf("  status %d: %d\n", status, n);
  std::printf("  throughput %.2f frames/s  p50 %.1f ms  p99 %.1f ms  (%zu frames)\n",
              static_cast<double>(latencies.size()) / seconds, 1e3 * percentile(latencies, 0.5),
              1e3 * percentile(latencies, 0.99), latencies.size());
  if (!oip) {
    std::printf("  history: %lld frames without it after their stream's first, %lld told why, %lld of them evicted\n",
                static_cast<long long>(without_history), static_cast<long long>(told), static_cast<long long>(evicted));
  }
  return statuses.size() == 1 && statuses.count(200) ? 0 : 1;
}
