// safetensors writer and reader: round trip, an exact header, and every malformed case.
#include "checkpoint/safetensors.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/error.hpp"
#include "fixture.hpp"

namespace fs = std::filesystem;
using namespace pptrain;
using pptrain::ckpt_test::slurp;
using pptrain::ckpt_test::spit;

namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pptrain_st_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  // A file with the given header text and `data_bytes` zero bytes of data.
  std::string raw(const std::string& header, std::size_t data_bytes, const std::string& name) {
    std::string out(8, '\0');
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
    out += header + std::string(data_bytes, '\0');
    spit(file(name), out);
    return file(name);
  }
  // Expects SafetensorsFile::read to fail with a message naming the file and `reason`.
  static void expect_bad(const std::string& path, const std::string& reason) {
    try {
      SafetensorsFile::read(path);
      FAIL() << "no error for " << path;
    } catch (const InputError& e) {
      std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
      EXPECT_NE(msg.find(reason), std::string::npos) << msg;
    }
  }

  fs::path dir_;
};

TEST_F(SafetensorsTest, RoundTripKeepsNamesShapesBytesAndMetadata) {
  std::vector<float> a(6), b(4), c;
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * float(i) - 1.25f;
  b = {1e-30f, -0.0f, 3.4e38f, 7.0f};
  const std::vector<TensorView> tensors = {
      {"z.weight", {2, 3}, a.data()}, {"a.bias", {4}, b.data()}, {"empty", {0, 5}, c.data()}};
  write_safetensors(file("t.safetensors"), tensors, {{"format", "pt"}, {"note", "héllo"}});

  const auto f = SafetensorsFile::read(file("t.safetensors"));
  EXPECT_EQ(f.names(), (std::vector<std::string>{"z.weight", "a.bias", "empty"}));
  EXPECT_TRUE(f.contains("a.bias"));
  EXPECT_FALSE(f.contains("nope"));
  EXPECT_EQ(f.shape("z.weight"), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.shape("empty"), (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "héllo");
  std::vector<float> a2(6, 9.0f), b2(4, 9.0f);
  f.copy_to("z.weight", {2, 3}, a2.data());
  f.copy_to("a.bias", {4}, b2.data());
  EXPECT_EQ(std::memcmp(a.data(), a2.data(), a.size() * 4), 0);
  EXPECT_EQ(std::memcmp(b.data(), b2.data(), b.size() * 4), 0);

  EXPECT_THROW(f.copy_to("z.weight", {3, 2}, a2.data()), InputError);
  EXPECT_THROW(f.copy_to("nope", {1}, a2.data()), InputError);
  EXPECT_THROW(f.shape("nope"), InputError);
}

TEST_F(SafetensorsTest, HeaderIsExactlyAsSpecified) {
  const float x[2] = {1.0f, -2.0f};
  write_safetensors(file("x.safetensors"), {{"x", {2}, x}}, {{"k", "v"}});
  const std::string bytes = slurp(file("x.safetensors"));
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  const std::string json =
      R"({"__metadata__":{"k":"v"},"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_EQ(json.size(), 79u);  // padded with one space to 80
  EXPECT_EQ(n, 80u);
  EXPECT_EQ(bytes.size(), 8 + 80 + 8u);
  EXPECT_EQ(bytes.substr(8, 80), json + " ");
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["x"]["data_offsets"], nlohmann::json::array({0, 8}));
  EXPECT_EQ(std::memcmp(bytes.data() + 88, x, 8), 0);
}

// Hugging Face models stored in half precision load as floats, exactly.
TEST_F(SafetensorsTest, ReadsF16AndBf16AsFloats) {
  const std::string header = R"({"h":{"dtype":"F16","shape":[5],"data_offsets":[0,10]},)"
                             R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[10,14]}})";
  // F16: 1, -2, 0.5, 2^-24 (the smallest subnormal), inf; BF16: 1, 3.140625.
  const uint16_t bits[] = {0x3C00, 0xC000, 0x3800, 0x0001, 0x7C00, 0x3F80, 0x4049};
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t(header.size()) >> (8 * i));
  out += header + std::string(reinterpret_cast<const char*>(bits), sizeof bits);
  spit(file("half"), out);
  const SafetensorsFile f = SafetensorsFile::read(file("half"));
  EXPECT_EQ(f.dtype("h"), "F16");
  std::vector<float> h(5), b(2);
  f.copy_to("h", {5}, h.data());
  f.copy_to("b", {2}, b.data());
  EXPECT_EQ(h, (std::vector<float>{1.0f, -2.0f, 0.5f, 0x1p-24f, INFINITY}));
  EXPECT_EQ(b, (std::vector<float>{1.0f, 3.140625f}));
  EXPECT_EQ(f.elements("h")[2], 0.5f);
}

TEST_F(SafetensorsTest, WriteFailureThrowsRuntimeError) {
  const float x = 1.0f;
  EXPECT_THROW(write_safetensors(file("no/such/dir/x.safetensors"), {{"x", {1}, &x}}),
               std::runtime_error);
}

TEST_F(SafetensorsTest, RejectsMalformedFiles) {
  auto x = [](const std::string& dtype, const std::string& shape, const std::string& offsets) {
    return "\"x\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
           ",\"data_offsets\":" + offsets + "}";
  };
  expect_bad(file("missing.safetensors"), "cannot open");
  spit(file("short"), "abc");
  expect_bad(file("short"), "too short");
  spit(file("hlen"), std::string("\xe8\x03\0\0\0\0\0\0", 8) + std::string(10, ' '));
  expect_bad(file("hlen"), "header length 1000 exceeds the file size");
  expect_bad(raw("{not json", 0, "notjson"), "not valid JSON");
  expect_bad(raw("[1, 2]", 0, "array"), "not a JSON object");
  expect_bad(raw("{" + x("I64", "[2]", "[0,16]") + "}", 16, "i64"), "dtype I64");
  expect_bad(raw("{" + x("F16", "[2]", "[0,8]") + "}", 8, "f16_size"), "needs 4 bytes");
  expect_bad(raw("{" + x("F32", "[2]", "[0,8]") + "}", 4, "range"), "outside the 4 data bytes");
  expect_bad(raw("{" + x("F32", "[3]", "[0,8]") + "}", 8, "size"), "needs 12 bytes");
  expect_bad(raw("{" + x("F32", "[-2]", "[0,8]") + "}", 8, "neg"), "not a size");
  expect_bad(raw("{" + x("F32", "[2]", "[0,8]") + "}", 12, "trailing"), "4 trailing bytes");
  expect_bad(raw("{" + x("F32", "[2]", "[4,12]") + "}", 12, "gap"), "4 unused bytes");
  expect_bad(raw("{" + x("F32", "[2]", "[0,8]") +
                     R"(,"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 12, "overlap"),
             "overlap");
  expect_bad(raw(R"({"__metadata__":{"a":1}})", 0, "meta"), "not a string");
  // The same layout, well formed, is accepted (so the cases above fail for their reason).
  EXPECT_NO_THROW(SafetensorsFile::read(raw("{" + x("F32", "[2]", "[0,8]") + "}", 8, "ok")));
}

}  // namespace
