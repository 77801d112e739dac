// Shared test fixture: a temp checkpoint root, a small GPT layout and filled arenas.
#pragma once
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/file_io.hpp"
#include "core/aligned_buffer.hpp"
#include "core/error.hpp"
#include "core/random.hpp"
#include "model/param_layout.hpp"

namespace pptrain::ckpt_test {

namespace fs = std::filesystem;

// A whole file's bytes, and a file replaced by `bytes`.
inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
inline void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

inline ModelConfig small_model(int d_model = 16, int n_layer = 2) {
  ModelConfig m;
  m.n_layer = n_layer;
  m.n_head = 2;
  m.d_model = d_model;
  m.seq_len = 8;
  m.vocab_size = 100;  // padded to 128: 28 padded rows
  return m;
}

// Parameters and both AdamW moments of one layout.
struct Arenas {
  explicit Arenas(const ParamLayout& layout)
      : p(layout.total_floats()), m(layout.total_floats()), v(layout.total_floats()) {}
  // Distinct, reproducible values everywhere (padded rows included).
  void fill(uint64_t seed) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] = float(standard_normal(hash_words(seed, 1, i)));
      m[i] = float(standard_normal(hash_words(seed, 2, i))) * 1e-3f;
      v[i] = float(uniform01(hash_words(seed, 3, i))) * 1e-6f;
    }
  }
  void set_all(float x) {
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = m[i] = v[i] = x;
  }
  AlignedBuffer<float> p, m, v;
};

// Lowers the process's file size limit so that writes fail as on a full disk.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &old_);
    rlimit lim = old_;
    lim.rlim_cur = bytes;
    EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit old_{};
  sighandler_t old_handler_;
};

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("pptrain_ckpt_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(std::random_device{}()));
    dir_ = (root_ / "ckpt").string();
  }
  void TearDown() override { fs::remove_all(root_); }

  static CheckpointMeta meta_at(int64_t step) {
    CheckpointMeta meta;
    meta.step = step;
    meta.config_yaml = "model:\n  d_model: 16\n";
    meta.train_state = {{"cursor", step * 7}, {"loss", 2.5}};
    return meta;
  }
  std::string save(const ParamLayout& layout, const Arenas& a, int64_t step, int keep = 0) {
    return save_checkpoint(dir_, keep, layout, a.p.data(), a.m.data(), a.v.data(), meta_at(step));
  }
  std::string step_path(int64_t step) const {
    char name[32];
    std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
    return (fs::path(dir_) / name).string();
  }

  static void flip_byte(const std::string& path, std::size_t pos) {
    std::string bytes = slurp(path);
    ASSERT_LT(pos, bytes.size());
    bytes[pos] = static_cast<char>(bytes[pos] ^ 0x10);
    spit(path, bytes);
  }
  // Replaces a step dir's meta.json with `text`, sealed as a save would (meta.sum
  // updated): an edit only meta.json's own checks can catch.
  static void write_meta(const std::string& step, const std::string& text) {
    spit(step + "/meta.json", text);
    spit(step + "/" + ckpt::kMetaSealName, ckpt::meta_seal(text));
  }
  // Runs `f`, expecting an InputError whose message holds `path` and `reason`.
  template <typename F>
  static void expect_input_error(F&& f, const std::string& path, const std::string& reason) {
    try {
      f();
      ADD_FAILURE() << "no InputError (expected: " << reason << ")";
    } catch (const InputError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find(reason), std::string::npos) << msg;
    }
  }

  fs::path root_;
  std::string dir_;
  ParamLayout layout_ = param_layout(small_model());
};

}  // namespace pptrain::ckpt_test
