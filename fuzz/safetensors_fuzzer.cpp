// Fuzz target for the safetensors reader. The input is the whole file. Reading must
// succeed or throw InputError; a file it accepts must describe itself consistently:
// every tensor is found by name, has a non-negative shape, and copies out in full.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/safetensors.hpp"
#include "fuzz_common.hpp"

namespace {

using pptrain::fuzz::expect;

void check_accepted(const pptrain::SafetensorsFile& file, std::size_t file_size) {
  expect(file.bytes().size() == file_size, "bytes() is not the whole file");
  const std::vector<std::string> names = file.names();
  std::size_t data_bytes = 0;
  for (const std::string& name : names) {
    expect(file.contains(name), "names() lists " + name + " but contains() denies it");
    const std::vector<int64_t> shape = file.shape(name);
    uint64_t numel = 1;
    for (int64_t d : shape) {
      expect(d >= 0, "tensor " + name + " has a negative dimension");
      numel *= uint64_t(d);
    }
    expect(numel <= file_size / sizeof(float), "tensor " + name + " is larger than the file");
    // Canaries around the destination catch a copy of the wrong length.
    std::vector<float> buf(numel + 2, -1.5f);
    file.copy_to(name, shape, buf.data() + 1);
    expect(buf.front() == -1.5f && buf.back() == -1.5f, "copy_to wrote outside " + name);
    data_bytes += numel * sizeof(float);
  }
  expect(data_bytes <= file_size, "tensors hold more bytes than the file");
  expect(!file.contains("__metadata__"), "__metadata__ was read as a tensor");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static const pptrain::fuzz::ScratchFile scratch("safetensors");
  const std::string& path = scratch.write(data, size);
  pptrain::fuzz::only_input_errors([&] {
    const pptrain::SafetensorsFile file = pptrain::SafetensorsFile::read(path);
    check_accepted(file, size);
  });
  return 0;
}
