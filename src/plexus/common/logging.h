// Logging for Plexus processes: spdlog, one line per event, with the
// process role in every line ("[server]", "[worker 1]").
#pragma once

#include <string>

#include "spdlog/spdlog.h"

namespace plexus {

// Sets the process-wide logger's name and level ("info", "debug", ...).
// PLEXUS_LOG_LEVEL overrides `level` when set.
void InitLogging(const std::string& role, const std::string& level = "info");

}  // namespace plexus

#define PLEXUS_LOG(level, ...) SPDLOG_##level(__VA_ARGS__)
