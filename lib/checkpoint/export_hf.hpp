// `pptrain export`: a Hugging Face directory (GPT2LMHeadModel or LlamaForCausalLM, by
// model.arch: model.safetensors in Hugging Face's names and shapes, the real vocabulary
// rows only, and config.json) from a checkpoint of any layout, one-rank or sharded, on
// one process without MPI.
#pragma once
#include <cstdint>
#include <string>

namespace pptrain {

struct ExportSummary {
  std::string step_dir;  // the checkpoint exported
  int64_t step = 0;
  std::size_t tensors = 0;
  uint64_t bytes = 0;    // of model.safetensors
};

// `checkpoint` is a step dir or a checkpoint root (its `latest` is followed); it is
// validated (every checksum) first. Tensors are assembled one at a time from their
// stored pieces and streamed to the file, so no more than the largest tensor is held.
// The directory is written as a temporary sibling of `out_dir`, fsynced and renamed into
// place. InputError for a bad checkpoint or an `out_dir` that exists and is not an empty
// directory; std::runtime_error for a write failure (nothing is left behind).
ExportSummary export_hf(const std::string& checkpoint, const std::string& out_dir);

}  // namespace pptrain
