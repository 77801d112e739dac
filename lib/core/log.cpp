#include "core/log.hpp"

#include <spdlog/spdlog.h>

namespace pptrain {

void setup_logging(const std::string& level) {
  spdlog::set_pattern("[%H:%M:%S] %^%l%$ %v");
  spdlog::set_level(spdlog::level::from_str(level));
}

}  // namespace pptrain
