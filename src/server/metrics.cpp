#include "server/metrics.h"

#include <cstdio>

namespace bev::server {
namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void header(std::string& out, const std::string& name, const std::string& help, const std::string& type) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

void Metrics::count_request(const std::string& route, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{route, status}];
}

void Metrics::count_error(const std::string& kind) {
  std::lock_guard lock(mu_);
  ++errors_[kind];
}

void Metrics::observe(const std::string& stage, double seconds) {
  std::lock_guard lock(mu_);
  Histogram& h = stages_[stage];
  size_t b = 0;
  while (b < kBuckets.size() && seconds > kBuckets[b]) ++b;
  if (b < kBuckets.size()) ++h.counts[b];
  ++h.count;
  h.sum += seconds;
}

std::string Metrics::prometheus_text(const std::vector<Sample>& sampled) const {
  std::string out;
  std::lock_guard lock(mu_);
  header(out, "bevformer_http_requests_total", "HTTP requests by route and status code.", "counter");
  for (const auto& [key, n] : requests_) {
    out += "bevformer_http_requests_total{route=\"" + key.first + "\",code=\"" + std::to_string(key.second) + "\"} " +
           std::to_string(n) + "\n";
  }
  header(out, "bevformer_http_errors_total", "Requests answered with an error, by error kind.", "counter");
  for (const auto& [kind, n] : errors_) {
    out += "bevformer_http_errors_total{kind=\"" + kind + "\"} " + std::to_string(n) + "\n";
  }
  header(out, "bevformer_stage_seconds",
         "Latency of frame requests per stage: parse (HTTP body to frame), queue (waiting for a worker), the "
         "library's prepare/geometry/image/bev/output, and total (request received to response).",
         "histogram");
  for (const auto& [stage, h] : stages_) {
    uint64_t cumulative = 0;
    for (size_t b = 0; b < kBuckets.size(); ++b) {
      cumulative += h.counts[b];
      out += "bevformer_stage_seconds_bucket{stage=\"" + stage + "\",le=\"" + number(kBuckets[b]) + "\"} " +
             std::to_string(cumulative) + "\n";
    }
    out += "bevformer_stage_seconds_bucket{stage=\"" + stage + "\",le=\"+Inf\"} " + std::to_string(h.count) + "\n";
    out += "bevformer_stage_seconds_sum{stage=\"" + stage + "\"} " + number(h.sum) + "\n";
    out += "bevformer_stage_seconds_count{stage=\"" + stage + "\"} " + std::to_string(h.count) + "\n";
  }
  for (const Sample& s : sampled) {
    header(out, s.name, s.help, s.type);
    out += s.name + " " + number(s.value) + "\n";
  }
  return out;
}

}  // namespace bev::server
