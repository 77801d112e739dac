// MFU arithmetic: the dense bf16 peak table matched by CUDA device names as the driver
// reports them, the utilisation fraction, and the train.peak_tflops override.
#include <gtest/gtest.h>

#include "train/mfu.hpp"

namespace pptrain {
namespace {

TEST(PeakTable, DeviceNamesAsTheDriverReportsThem) {
  struct Case {
    const char* name;
    double tflops;
  };
  const Case cases[] = {
      {"NVIDIA H200", 989},
      {"NVIDIA H200 NVL", 835.5},
      {"NVIDIA GH200 480GB", 989},
      {"NVIDIA H100 80GB HBM3", 989},
      {"NVIDIA H100 SXM5 94GB", 989},
      {"NVIDIA H100 PCIe", 756.5},
      {"NVIDIA H100 NVL", 835.5},
      {"NVIDIA A100-SXM4-80GB", 312},
      {"NVIDIA A100 80GB PCIe", 312},
      {"NVIDIA A100-PCIE-40GB", 312},
      {"NVIDIA A10G", 70},
      {"NVIDIA A10", 125},
      {"NVIDIA L40S", 362.05},
      {"NVIDIA L40", 181.05},
      {"NVIDIA L4", 121},
      {"NVIDIA GeForce RTX 4090", 165.2},
  };
  for (const Case& c : cases) EXPECT_EQ(dense_bf16_peak_tflops(c.name), c.tflops) << c.name;
}

TEST(PeakTable, LetterCaseDoesNotMatter) {
  EXPECT_EQ(dense_bf16_peak_tflops("nvidia h100 pcie"), 756.5);
  EXPECT_EQ(dense_bf16_peak_tflops("NVIDIA H100 PCIE"), 756.5);
}

TEST(PeakTable, UnknownOrPartialNamesGiveZero) {
  for (const char* name : {"", "cpu", "NVIDIA RTX A1000", "NVIDIA RTX A6000",
                           "Tesla V100-SXM2-16GB", "NVIDIA H800", "NVIDIA L20",
                           "AMD Instinct MI300X"})
    EXPECT_EQ(dense_bf16_peak_tflops(name), 0.0) << name;
}

TEST(Mfu, FractionOfThePeak) {
  EXPECT_DOUBLE_EQ(mfu(494.5e12, 989), 0.5);
  EXPECT_DOUBLE_EQ(mfu(312e12, 312), 1.0);
  EXPECT_DOUBLE_EQ(mfu(0, 989), 0.0);
}

TEST(Mfu, NoPeakMeansZero) {
  EXPECT_EQ(mfu(1e15, 0), 0.0);
  EXPECT_EQ(mfu(1e15, -5), 0.0);
}

TEST(Mfu, ConfiguredPeakOverridesTheTable) {
  EXPECT_EQ(peak_tflops_for(0, "NVIDIA H200"), 989);
  EXPECT_EQ(peak_tflops_for(790, "NVIDIA H200"), 790);
  EXPECT_EQ(peak_tflops_for(100, ""), 100);
  EXPECT_EQ(peak_tflops_for(0, ""), 0);
}

}  // namespace
}  // namespace pptrain
