#include "plexus/common/logging.h"

#include <cstdlib>

#include "spdlog/sinks/stdout_color_sinks.h"

namespace plexus {

void InitLogging(const std::string& role, const std::string& level) {
  auto logger = spdlog::stderr_color_mt(role);
  const char* env = std::getenv("PLEXUS_LOG_LEVEL");
  logger->set_level(spdlog::level::from_str(env ? env : level));
  logger->set_pattern("%H:%M:%S.%e [%n] %^%l%$ %v");
  spdlog::set_default_logger(logger);
}

}  // namespace plexus
