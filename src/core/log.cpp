#include "core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace bev {
namespace {

LogLevel level_from_env() {
  const char* v = std::getenv("BEV_LOG_LEVEL");
  if (!v) return LogLevel::kInfo;
  if (!std::strcmp(v, "error")) return LogLevel::kError;
  if (!std::strcmp(v, "warn")) return LogLevel::kWarn;
  if (!std::strcmp(v, "debug")) return LogLevel::kDebug;
  return LogLevel::kInfo;
}

std::atomic<int>& threshold() {
  static std::atomic<int> t{static_cast<int>(level_from_env())};
  return t;
}

const char* tag(LogLevel l) {
  switch (l) {
    case LogLevel::kError: return "error";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kInfo: return "info";
    case LogLevel::kDebug: return "debug";
  }
  return "?";
}

}  // namespace

void set_log_level(LogLevel level) { threshold().store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(threshold().load()); }
bool log_enabled(LogLevel level) { return static_cast<int>(level) <= threshold().load(); }

void log_write(LogLevel level, const std::string& message) {
  static std::mutex mu;
  static const auto start = std::chrono::steady_clock::now();
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[%8.3f %s] %s\n", t, tag(level), message.c_str());
}

}  // namespace bev
