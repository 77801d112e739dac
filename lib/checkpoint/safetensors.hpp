// The safetensors file format (as used by Hugging Face): an 8-byte little-endian
// header length, a JSON header naming each tensor's dtype, shape and byte range,
// then the raw tensor bytes. pptrain writes F32 tensors; it reads F32, F16 and BF16 ones
// (the last two converted to float, for Hugging Face models stored in half precision).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pptrain {

// A contiguous F32 tensor to be written.
struct TensorView {
  std::string name;
  std::vector<int64_t> shape;
  const float* data;
};

// Writes `tensors` in the given order, with an optional "__metadata__" string map;
// the header is padded with spaces to a multiple of 8 bytes. The file is fsynced.
// Throws std::runtime_error naming the file on I/O failure.
void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// A whole file, mapped read-only and validated. Cheap to copy (the mapping is shared).
class SafetensorsFile {
 public:
  // Throws InputError "PATH: reason" if the file is unreadable or not a valid
  // safetensors file of F32, F16 and BF16 tensors (bad header, bad offsets, trailing
  // bytes, another dtype...).
  static SafetensorsFile read(const std::string& path);

  std::vector<std::string> names() const;  // in file (data offset) order
  bool contains(const std::string& name) const;
  std::vector<int64_t> shape(const std::string& name) const;  // InputError if absent
  std::string dtype(const std::string& name) const;  // "F32", "F16" or "BF16"
  // Copies tensor `name`, which must have exactly `expected_shape`, to dst as floats;
  // InputError otherwise.
  void copy_to(const std::string& name, const std::vector<int64_t>& expected_shape,
               float* dst) const;
  // Tensor `name`'s elements in row-major order, read from the mapping as floats on
  // access (only the pages touched are read). Valid while this file object lives.
  class Elements {
   public:
    float operator[](uint64_t i) const;
    uint64_t size() const { return size_; }
   private:
    friend class SafetensorsFile;
    const char* data_ = nullptr;
    int elem_ = 0;  // 0 F32, 1 F16, 2 BF16
    uint64_t size_ = 0;
  };
  Elements elements(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  std::string_view bytes() const;  // the whole file as stored

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // byte range in the data section
    uint64_t end = 0;
    int elem = 0;        // 0 F32, 1 F16, 2 BF16
  };
  const Tensor& find(const std::string& name) const;

  std::string path_;
  std::shared_ptr<const void> file_;  // the mapping (a ckpt::MappedFile)
  const char* base_ = nullptr;        // file start
  std::size_t size_ = 0;              // file size
  uint64_t data_start_ = 0;           // 8 + header length
  std::vector<Tensor> tensors_;       // sorted by data offset
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace pptrain
