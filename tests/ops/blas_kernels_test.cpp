// Which OpenBLAS kernels pptrain runs (ops/cpu/blas_kernels.hpp): the choice as a
// table, and the pptrain binary, started without OPENBLAS_CORETYPE, on kernels no older
// than this CPU's instruction sets allow.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>

#include "ops/cpu/blas_kernels.hpp"

namespace pptrain::ops {
namespace {

TEST(BlasKernels, NewestFamilyTheInstructionSetsRunWhenOpenBlasChoseAnOlderOne) {
  const CpuIsa sse{}, avx{true, false, false}, avx2{true, true, false}, avx512{true, true, true};
  struct Row {
    const char* chosen;
    CpuIsa isa;
    const char* want;
  };
  const Row rows[] = {
      {"Prescott", avx512, "SkylakeX"},
      {"Prescott", avx2, "Haswell"},
      {"Prescott", avx, "Sandybridge"},
      {"Prescott", sse, ""},
      {"Nehalem", avx512, "SkylakeX"},
      {"Core2", avx2, "Haswell"},
      {"Sandybridge", avx512, "SkylakeX"},
      {"Sandybridge", avx, ""},
      {"Haswell", avx512, "SkylakeX"},
      {"Haswell", avx2, ""},
      {"SkylakeX", avx512, ""},
      {"Cooperlake", avx512, ""},
      {"SapphireRapids", avx512, ""},
      {"Zen", avx2, ""},
      {"", avx512, ""},
  };
  for (const Row& r : rows) EXPECT_EQ(better_blas_coretype(r.chosen, r.isa), r.want) << r.chosen;
}

TEST(BlasKernels, PptrainRunsKernelsAsNewAsThisCpuAllows) {
  char dir[] = "/tmp/pptrain_blas_kernels_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string command = std::string("env -u OPENBLAS_CORETYPE ") + PPTRAIN_BINARY +
                              " --config " + PPTRAIN_SOURCE_DIR +
                              "/configs/tiny.yaml --set train.steps=1 --set logging.metrics= "
                              "--set checkpoint.dir=" +
                              dir + "/ckpt 2>&1";
  FILE* out = popen(command.c_str(), "r");
  ASSERT_NE(out, nullptr);
  std::string log;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, out)) log += buf;
  const int status = pclose(out);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(status, 0) << log;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("OpenBLAS ([A-Za-z0-9]*),"))) << log;
  EXPECT_EQ(better_blas_coretype(m[1], this_cpu_isa()), "") << "pptrain runs " << m[1];
  std::printf("pptrain runs OpenBLAS's %s kernels\n", m[1].str().c_str());
}

}  // namespace
}  // namespace pptrain::ops
