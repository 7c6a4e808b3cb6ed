#include "common/logging.h"

#include <string>

#include "spdlog/sinks/stdout_color_sinks.h"

namespace dsv4 {

void InitLogging(std::string_view role, int rank, std::string_view level) {
  auto logger = spdlog::stderr_color_mt("dsv4");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ " + std::string(role) + "[" +
                      std::to_string(rank) + "] %v");
  spdlog::set_level(spdlog::level::from_str(std::string(level)));
}

}  // namespace dsv4
