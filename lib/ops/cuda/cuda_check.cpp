// The out-of-line failure handler of PPTRAIN_CUDA_CHECK.
#include "ops/cuda/cuda_check.hpp"

#include <unistd.h>

#include <stdexcept>
#include <string>

namespace pptrain::cuda_check {

void cuda_failure(const char* what, const char* error, const char* file, int line) {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + " on " +
                           (host[0] ? host : "?") + ": " + what +
                           " failed: " + (error ? error : "unknown error"));
}

}  // namespace pptrain::cuda_check
