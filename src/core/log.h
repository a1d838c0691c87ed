// Logging to stderr with a level threshold. The threshold starts from BEV_LOG_LEVEL
// (error|warn|info|debug, default info) and the CLI's --quiet/--verbose change it.
#pragma once

#include <sstream>
#include <string>

namespace bev {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
bool log_enabled(LogLevel level);
void log_write(LogLevel level, const std::string& message);

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

template <typename... Args>
void log(LogLevel level, const Args&... args) {
  if (log_enabled(level)) log_write(level, detail::concat(args...));
}
template <typename... Args> void log_error(const Args&... a) { log(LogLevel::kError, a...); }
template <typename... Args> void log_warn(const Args&... a) { log(LogLevel::kWarn, a...); }
template <typename... Args> void log_info(const Args&... a) { log(LogLevel::kInfo, a...); }
template <typename... Args> void log_debug(const Args&... a) { log(LogLevel::kDebug, a...); }

}  // namespace bev
