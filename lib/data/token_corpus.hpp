// Token files opened as one corpus, in the order given: llm.c shards, nanoGPT dumps or
// text files, each kept open and read on demand rather than loaded whole (pread, not a
// mapping, so that a file truncated under the run is an error naming it, not a SIGBUS). data.path
// and data.val_path entries are files or globs (llm.c's fineweb_train_*.bin layout).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace pptrain {

// The files of data.path / data.val_path (`key`, for messages): each entry a file, or a
// glob (* ? [) expanded in sorted order. InputError "ENTRY: key: the glob matches no file".
std::vector<std::string> expand_data_paths(const std::vector<std::string>& entries,
                                           const std::string& key);

class TokenCorpus {
 public:
  // Opens every file and checks it: the llm.c header, the size, and every token
  // < vocab_size (one pass over the file). InputError "PATH: reason" otherwise.
  static TokenCorpus open(DataSource source, const std::vector<std::string>& paths,
                          int vocab_size);

  std::size_t size() const { return size_; }  // tokens in all files
  std::size_t num_files() const { return shards_.size(); }
  // out[0..n) = tokens [start, start + n) of the files' concatenation. DataChanged
  // "PATH: changed during the run: ..." when a file no longer holds what was checked at
  // open (truncated, or a token >= vocab_size).
  void copy(std::size_t start, std::size_t n, int32_t* out) const;

 private:
  struct Shard;
  std::vector<std::shared_ptr<const Shard>> shards_;
  std::vector<std::size_t> first_;  // index of each shard's first token
  std::size_t size_ = 0;
  int vocab_size_ = 0;
};

}  // namespace pptrain
