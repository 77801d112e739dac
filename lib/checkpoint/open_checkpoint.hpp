// Private to the checkpoint library: a step dir of either format (single-file
// version 1, sharded version 2) read into one index of stored tensor pieces, so that
// loading and validation do not care which format or layout wrote it.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/safetensors.hpp"

namespace pptrain::ckpt {

enum Role { kModel = 0, kOptimizer = 1 };

// A tensor file listed in meta.json. Its header is parsed and its size checked when the
// checkpoint is opened; its bytes are read (checksummed) only by verify().
struct StoredFile {
  std::string name;  // in the step dir
  SafetensorsFile file;
  std::string checksum;  // hex, as recorded in meta.json
  bool verified = false;
  // InputError "PATH: checksum mismatch ..." unless the bytes match meta.json.
  void verify();
};

// A flat run of a piece stored in a data-parallel rank's optimizer file (sharded.hpp):
// elements [begin, end) of the piece, flattened.
struct Fragment {
  std::size_t file = 0;
  std::string stored_name;
  std::size_t begin = 0, end = 0;
};

// One stored piece of a global tensor.
struct Piece {
  std::size_t file = 0;  // index into OpenCheckpoint::files (the first fragment's)
  // name: the tensor's name in the file (global name + suffix); shape/numel: as stored;
  // hf_shape: the global shape; split fields: where the piece sits in the global tensor.
  ParamEntry slicing;
  // Empty: the piece is stored whole, as `slicing.name`. Else the runs it is stored in,
  // in order, tiling it.
  std::vector<Fragment> fragments;
};

// The files a piece is read from.
std::vector<std::size_t> piece_files(const Piece& p);

struct OpenCheckpoint {
  std::filesystem::path dir;
  int format_version = 0;
  CheckpointMeta meta;
  std::vector<StoredFile> files;
  // By role, stored tensor name -> its pieces in file order. Every tensor is complete:
  // a whole piece, or one piece for each shard of a split (checked when opened).
  std::map<std::string, std::vector<Piece>> tensors[2];

  // Throws InputError(files[i].path + ": " + why), after verifying the file first so
  // that a corrupt file is reported as corrupt rather than as whatever it now says.
  [[noreturn]] void fail_in(std::size_t i, const std::string& why);
};

// Reads meta.json and every listed tensor file's header (optimizer files only when
// `with_optimizer`), checks file sizes, slicing records and that every tensor is
// complete; `verify_all` also checks every opened file's checksum. Any problem is an
// InputError "PATH: reason".
OpenCheckpoint open_checkpoint(const std::filesystem::path& dir, bool with_optimizer,
                               bool verify_all);

// The stored tensors of `role` must be exactly `whole`'s names + suffixes, of its global
// shapes; InputError naming the file (or dir) and tensor otherwise.
void match_model(OpenCheckpoint& ck, Role role, const ParamLayout& whole,
                 const std::vector<std::string>& suffixes);

// The piece's slicing.numel floats, as its slicing says (files verified first).
void read_piece(const OpenCheckpoint& ck, const Piece& p, float* out);

// `global` (the tensor's hf_numel floats) = the stored tensor assembled from `pieces` (a
// whole piece, or one piece of every shard); the files must be verified first.
void assemble_global(const OpenCheckpoint& ck, const std::vector<const Piece*>& pieces,
                     float* global);

}  // namespace pptrain::ckpt
