// Private helpers of the checkpoint library: a streaming checksum, durable POSIX
// file writes (write + fsync + atomic rename) and read-only file mappings.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace pptrain {
struct TensorView;
}

namespace pptrain::ckpt {

// Checksum of a byte stream ("mix64x4"): the bytes are read as little-endian 64-bit
// words (the last one zero-padded); word i goes to lane i % 4 as lane = mix64(lane ^ word);
// the result is the byte count folded with the four lanes in order through mix64.
// Four independent lanes keep it near memory speed; unlike byte-wise FNV-1a it mixes
// every bit into every later one, so no pair of flipped bits cancels out.
class Checksum {
 public:
  void update(const void* data, std::size_t n);
  uint64_t value() const;  // of everything so far; update() may continue afterwards

 private:
  void block(const unsigned char* p);  // one 32-byte block: a word per lane
  uint64_t lane_[4] = {0x6a09e667f3bcc908ull, 0xbb67ae8584caa73bull, 0x3c6ef372fe94f82bull,
                       0xa54ff53a5f1d36f1ull};
  unsigned char pending_[32] = {};
  std::size_t npending_ = 0;
  uint64_t total_ = 0;
};

std::string to_hex(uint64_t v);                            // 16 lowercase hex digits

// meta.json vouches for every tensor file, so it cannot vouch for itself: meta.sum,
// beside it, holds "mix64x4 <checksum> <bytes>" of meta.json's bytes, and a meta.json
// that was edited or damaged no longer matches it.
inline constexpr const char* kMetaSealName = "meta.sum";
std::string meta_seal(std::string_view meta_text);  // meta.sum's text for meta.json's
std::string shape_str(const std::vector<int64_t>& shape);  // "[768, 2304]"
inline constexpr const char* kChecksumName = "mix64x4";

// A new file written through POSIX calls and hashed on the way out. Errors throw
// std::runtime_error naming the file. finish() fsyncs and closes; the destructor
// only closes (an unfinished file is garbage that the caller removes).
class DurableWriter {
 public:
  explicit DurableWriter(std::string path);
  ~DurableWriter();
  DurableWriter(const DurableWriter&) = delete;
  DurableWriter& operator=(const DurableWriter&) = delete;
  void write(const void* data, std::size_t n);
  void finish();
  uint64_t checksum() const { return sum_.value(); }
  uint64_t bytes() const { return bytes_; }

 private:
  std::string path_;
  int fd_ = -1;
  Checksum sum_;
  uint64_t bytes_ = 0;
};

// fsyncs a directory so that entries created or renamed in it are durable.
void fsync_dir(const std::string& dir);

// Replaces `path` with a file holding `text`: writes `path`.tmp, fsyncs it, renames it
// over `path` and fsyncs the parent directory.
void write_file_atomic(const std::string& path, std::string_view text);

// A whole regular file mapped read-only. Throws InputError "PATH: reason".
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const char* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  const char* data_ = nullptr;
  std::size_t size_ = 0;
};

// write_safetensors, fsynced, returning what was written (for meta.json).
struct WrittenFile {
  uint64_t checksum = 0;
  uint64_t bytes = 0;
};
WrittenFile write_safetensors_durable(const std::string& path,
                                      const std::vector<TensorView>& tensors,
                                      const std::map<std::string, std::string>& metadata);

// A tensor's name and shape, its data streamed later.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};
// The same file, with tensor i's data taken from data_of(i) (called in order, its
// result read before the next call): one tensor in memory at a time.
WrittenFile write_safetensors_streamed(const std::string& path, const std::vector<TensorSpec>& specs,
                                       const std::map<std::string, std::string>& metadata,
                                       const std::function<const float*(std::size_t)>& data_of);

}  // namespace pptrain::ckpt
