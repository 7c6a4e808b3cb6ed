// Logging for every process: spdlog with level and timestamp on each line.
// Use DSV4_LOG_INFO("loaded {} tensors", n); request lines carry "req=<id>".
#pragma once

#include <string_view>

#include "spdlog/spdlog.h"

namespace dsv4 {

// Sets the process-wide pattern "<time> <level> <role>[<rank>] message" and the level
// ("trace", "debug", "info", "warn", "error"). Call once at start-up.
void InitLogging(std::string_view role, int rank, std::string_view level = "info");

}  // namespace dsv4

#define DSV4_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define DSV4_LOG_INFO(...) SPDLOG_INFO(__VA_ARGS__)
#define DSV4_LOG_WARN(...) SPDLOG_WARN(__VA_ARGS__)
#define DSV4_LOG_ERROR(...) SPDLOG_ERROR(__VA_ARGS__)
