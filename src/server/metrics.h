// The server's counters and latency histograms, written as Prometheus text (exposition format
// 0.0.4): requests by route and status, errors by kind, per-stage latency histograms, and the
// gauges the caller samples at scrape time (queue depth, active streams, evictions).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace bev::server {

class Metrics {
 public:
  // Bucket upper bounds in seconds (1 ms .. 60 s), shared by every stage.
  static constexpr std::array<double, 14> kBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                      0.25,  0.5,    1,     2.5,  5,     10,   60};

  void count_request(const std::string& route, int status);
  void count_error(const std::string& kind);
  // stage: "parse", "queue", "prepare", "geometry", "image", "bev", "output", "total".
  void observe(const std::string& stage, double seconds);

  // A gauge or counter sampled by the caller: name, help, type ("gauge"|"counter"), value.
  struct Sample {
    std::string name, help, type;
    double value = 0;
  };
  std::string prometheus_text(const std::vector<Sample>& sampled) const;

 private:
  struct Histogram {
    std::array<uint64_t, kBuckets.size()> counts{};  // per bucket (not cumulative)
    uint64_t count = 0;
    double sum = 0;
  };
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> errors_;
  std::map<std::string, Histogram> stages_;
};

}  // namespace bev::server
