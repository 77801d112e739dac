#include "core/error.hpp"

namespace pptrain {

void fail_check(const char* condition, const char* file, int line, const std::string& message) {
  throw std::logic_error(std::string(file) + ":" + std::to_string(line) + ": check failed: " +
                         condition + (message.empty() ? "" : ": " + message));
}

std::string abbreviated(std::string_view text, std::size_t max) {
  if (text.size() <= max) return std::string(text);
  return std::string(text.substr(0, max)) + "...(" + std::to_string(text.size()) + " bytes)";
}

}  // namespace pptrain
