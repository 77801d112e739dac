// Console logging setup (spdlog). Every module logs through spdlog's default logger.
#pragma once
#include <string>

namespace pptrain {

// Sets the default logger's pattern and level ("debug", "info", "warn", "error").
void setup_logging(const std::string& level);

}  // namespace pptrain
