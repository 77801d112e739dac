// The parameter layout table: every tensor's Hugging Face GPT-2 name, shape and
// offset in one flat fp32 arena. Parameters, gradients and the optimizer's moment
// buffers all use the same table, so the optimizer, the checkpoint and (later) the
// data-parallel gradient buckets agree on where each tensor lives.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace pptrain {

struct ParamEntry {
  std::string name;               // e.g. "transformer.h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;     // shape stored in the arena (wte: padded vocab rows)
  std::vector<int64_t> hf_shape;  // shape in a GPT-2 checkpoint: the leading rows of `shape`
  std::size_t offset = 0;         // in floats from the arena start; 256-byte aligned
  std::size_t numel = 0;          // product of `shape`
  bool decay = false;             // AdamW weight decay applies (2-D weights, embeddings)
  std::size_t hf_numel() const;   // product of `hf_shape`
};

class ParamLayout {
 public:
  // Appends a tensor; `hf_shape` empty means the same as `shape`.
  void add(const std::string& name, std::vector<int64_t> shape, bool decay,
           std::vector<int64_t> hf_shape = {});
  const std::vector<ParamEntry>& entries() const { return entries_; }
  const ParamEntry& at(const std::string& name) const;  // throws std::out_of_range
  std::size_t total_floats() const { return total_; }   // arena size including alignment gaps
  int64_t hf_param_count() const;                       // real parameters (GPT-2 shapes)

 private:
  std::vector<ParamEntry> entries_;
  std::size_t total_ = 0;
};

// GPT-2's tensors in Hugging Face order and names, with Conv1D weights stored as
// (in, out) exactly as GPT-2 checkpoints do. The LM head is tied to wte.
ParamLayout gpt_param_layout(const ModelConfig& model);

}  // namespace pptrain
