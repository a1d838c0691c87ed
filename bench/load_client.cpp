// A closed-loop load client for `bevformer serve` (docs/API.md): N streams, one connection each,
// each sending its frames back to back (a stream's frames must be sequential anyway) for a fixed
// time; prints throughput and latency percentiles. Frames are frame JSON files whose images are
// sent inline (base64) or as multipart parts; each stream gets its own id and clock.
//
//   load_client --port 8080 --streams 4 --seconds 20 [--multipart] FRAME.json...
#include <algorithm>
#include <atomic>
#include <chrono>
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
  bool multipart = false;
  std::vector<std::string> files;
  app.add_option("--host", host)->capture_default_str();
  app.add_option("--port", port)->required();
  app.add_option("--streams", streams, "Concurrent streams (one connection each)")->capture_default_str();
  app.add_option("--seconds", seconds, "Measured time")->capture_default_str();
  app.add_option("--warmup", warmup, "Seconds before measuring (first frames record the plans; queues fill)")->capture_default_str();
  app.add_flag("--multipart", multipart, "Send images as multipart parts (default: base64 JSON)");
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
  std::vector<std::thread> threads;
  const auto run_id = std::chrono::system_clock::now().time_since_epoch().count() % 1000000;
  for (int s = 0; s < streams; ++s) {
    threads.emplace_back([&, s] {
      httplib::Client cli(host, port);
      cli.set_read_timeout(300, 0);
      cli.set_write_timeout(300, 0);
      const std::string stream = "load-" + std::to_string(run_id) + "-" + std::to_string(s);
      for (int k = 0; clock::now() < end; ++k) {
        const auto [body, type] = body_of(frames[static_cast<size_t>(k) % frames.size()], stream, 1000.0 + 0.5 * k, multipart);
        const auto t0 = clock::now();
        const auto r = cli.Post("/v1/streams/" + stream + "/frames", body, type);
        const auto t1 = clock::now();
        std::lock_guard lock(mu);
        // Counted: answers that arrive inside the measured window (as wrk counts), so the
        // throughput is not biased by latencies that are long against the window.
        if (t1 < measure_from || t1 > end) continue;
        ++statuses[r ? r->status : -1];
        if (r && r->status == 200) latencies.push_back(std::chrono::duration<double>(t1 - t0).count());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::printf("streams %d  seconds %.1f  %s\n", streams, seconds, multipart ? "multipart" : "json+base64");
  for (const auto& [status, n] : statuses) std::printf("  status %d: %d\n", status, n);
  std::printf("  throughput %.2f frames/s  p50 %.1f ms  p99 %.1f ms  (%zu frames)\n",
              static_cast<double>(latencies.size()) / seconds, 1e3 * percentile(latencies, 0.5),
              1e3 * percentile(latencies, 0.99), latencies.size());
  return statuses.size() == 1 && statuses.count(200) ? 0 : 1;
}
