#include "core/error.hpp"

namespace pptrain {

void fail_check(const char* condition, const char* file, int line, const std::string& message) {
  throw std::logic_error(std::string(file) + ":" + std::to_string(line) + ": check failed: " +
                         condition + (message.empty() ? "" : ": " + message));
}

}  // namespace pptrain
