// The peak table behind MFU. Figures are the vendors' dense bf16 tensor-core TFLOP/s
// (their datasheets print the 2:4-sparsity figure, twice these, with an asterisk).
#include "train/mfu.hpp"

#include <algorithm>
#include <cctype>

namespace pptrain {
namespace {

struct Peak {
  const char* name;  // model words of the device name, upper case
  double tflops;
};

// Names match as whole words; a variant comes before its family ("H100 NVL" before
// "H100").
constexpr Peak kPeaks[] = {
    {"GH200", 989},       // Grace Hopper superchip: the H100/H200 SXM rate
    {"H200 NVL", 835.5},  // PCIe card: 1671 with sparsity
    {"H200", 989},        // SXM: 1979 with sparsity
    {"H100 NVL", 835.5},  // 1671 with sparsity
    {"H100 PCIE", 756.5}, // 1513 with sparsity
    {"H100", 989},        // SXM ("H100 80GB HBM3", "H100 SXM5 ..."): 1979 with sparsity
    {"A100", 312},        // SXM and PCIe: 624 with sparsity
    {"A10G", 70},         // AWS variant of the A10, lower tensor clocks
    {"A10", 125},         // 250 with sparsity
    {"L40S", 362.05},     // 733 with sparsity
    {"L40", 181.05},      // 362 with sparsity
    {"L4", 121},          // 242 with sparsity
    {"RTX 4090", 165.2},  // fp32 accumulate (fp16 accumulate is twice this)
};

bool is_alnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

// `word` occurs in `name` as a whole: "A100" is in "NVIDIA A100-SXM4-80GB" but neither
// "A10" nor "A100" is in "NVIDIA RTX A1000".
bool contains_word(const std::string& name, const std::string& word) {
  for (auto at = name.find(word); at != std::string::npos; at = name.find(word, at + 1)) {
    const auto end = at + word.size();
    if ((at == 0 || !is_alnum(name[at - 1])) && (end == name.size() || !is_alnum(name[end])))
      return true;
  }
  return false;
}

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return char(std::toupper(c)); });
  return s;
}

}  // namespace

double dense_bf16_peak_tflops(const std::string& device_model) {
  const std::string name = upper(device_model);
  if (name.empty()) return 0;
  for (const Peak& p : kPeaks)
    if (contains_word(name, p.name)) return p.tflops;
  return 0;
}

double mfu(double flops_per_second_per_gpu, double peak_tflops) {
  if (!(peak_tflops > 0)) return 0;
  return flops_per_second_per_gpu / (peak_tflops * 1e12);
}

double peak_tflops_for(double configured, const std::string& device_model) {
  return configured > 0 ? configured : dense_bf16_peak_tflops(device_model);
}

}  // namespace pptrain
