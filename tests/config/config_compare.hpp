// Test helper: field-by-field comparison of two Configs (Config has no operator==).
#pragma once
#include <gtest/gtest.h>

#include "config/config.hpp"

namespace pptrain {

inline void expect_same_config(const Config& a, const Config& b) {
#define PPTRAIN_SAME(field) EXPECT_EQ(a.field, b.field) << #field
  PPTRAIN_SAME(model.n_layer);
  PPTRAIN_SAME(model.n_head);
  PPTRAIN_SAME(model.d_model);
  PPTRAIN_SAME(model.seq_len);
  PPTRAIN_SAME(model.vocab_size);
  PPTRAIN_SAME(model.arch);
  // By meaning: a config not parsed holds 0 (the default) where a parsed one is resolved.
  EXPECT_EQ(kv_heads(a.model), kv_heads(b.model)) << "model.n_kv_head";
  EXPECT_EQ(ffn_width(a.model), ffn_width(b.model)) << "model.ffn_hidden";
  PPTRAIN_SAME(model.rope_theta);
  PPTRAIN_SAME(model.norm_eps);
  PPTRAIN_SAME(model.tie_embeddings);
  PPTRAIN_SAME(parallel.tp);
  PPTRAIN_SAME(parallel.pp);
  PPTRAIN_SAME(parallel.dp);
  PPTRAIN_SAME(parallel.micro_batches);
  PPTRAIN_SAME(parallel.micro_batch_size);
  PPTRAIN_SAME(parallel.schedule);
  PPTRAIN_SAME(parallel.virtual_stages);
  PPTRAIN_SAME(parallel.zero);
  PPTRAIN_SAME(parallel.schedule_costs);
  PPTRAIN_SAME(parallel.message_mode);
  PPTRAIN_SAME(train.steps);
  PPTRAIN_SAME(train.lr);
  PPTRAIN_SAME(train.min_lr);
  PPTRAIN_SAME(train.warmup_steps);
  PPTRAIN_SAME(train.lr_schedule);
  PPTRAIN_SAME(train.weight_decay);
  PPTRAIN_SAME(train.grad_clip);
  PPTRAIN_SAME(train.beta1);
  PPTRAIN_SAME(train.beta2);
  PPTRAIN_SAME(train.eps);
  PPTRAIN_SAME(train.seed);
  PPTRAIN_SAME(train.eval_every);
  PPTRAIN_SAME(train.eval_batches);
  PPTRAIN_SAME(train.threads);
  PPTRAIN_SAME(train.on_nonfinite);
  PPTRAIN_SAME(train.max_nonfinite);
  PPTRAIN_SAME(train.precision);
  PPTRAIN_SAME(train.peak_tflops);
  PPTRAIN_SAME(train.attention);
  PPTRAIN_SAME(parallel.sequence_parallel);
  PPTRAIN_SAME(train.recompute);
  PPTRAIN_SAME(train.recompute_layers);
  PPTRAIN_SAME(data.source);
  PPTRAIN_SAME(data.path);
  PPTRAIN_SAME(data.val_path);
  PPTRAIN_SAME(checkpoint.dir);
  PPTRAIN_SAME(checkpoint.every);
  PPTRAIN_SAME(checkpoint.keep);
  PPTRAIN_SAME(checkpoint.resume);
  PPTRAIN_SAME(checkpoint.init_from);
  PPTRAIN_SAME(logging.every);
  PPTRAIN_SAME(logging.metrics);
  PPTRAIN_SAME(logging.trace);
  PPTRAIN_SAME(logging.trace_steps);
  PPTRAIN_SAME(logging.level);
  PPTRAIN_SAME(device);
  PPTRAIN_SAME(source_path);
#undef PPTRAIN_SAME
}

}  // namespace pptrain
