// Writing and validating safetensors files (F32 only).
#include "checkpoint/safetensors.hpp"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "checkpoint/file_io.hpp"
#include "core/error.hpp"

namespace pptrain {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this host is not");

namespace ckpt {

WrittenFile write_safetensors_streamed(const std::string& path, const std::vector<TensorSpec>& tensors,
                                       const std::map<std::string, std::string>& metadata,
                                       const std::function<const float*(std::size_t)>& data_of) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& meta = header["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
  }
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const auto& t : tensors) {
    PPTRAIN_CHECK(t.name != "__metadata__" && !header.contains(t.name),
                  "duplicate or reserved tensor name " + t.name);
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      PPTRAIN_CHECK(d >= 0, "negative dimension in " + t.name);
      numel *= static_cast<uint64_t>(d);
    }
    const uint64_t bytes = numel * sizeof(float);
    header[t.name] = {{"dtype", "F32"},
                      {"shape", t.shape},
                      {"data_offsets", nlohmann::ordered_json::array({offset, offset + bytes})}};
    sizes.push_back(bytes);
    offset += bytes;
  }
  std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');

  try {
    DurableWriter out(path);
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(text.size() >> (8 * i));
    out.write(len, sizeof(len));
    out.write(text.data(), text.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const float* data = sizes[i] > 0 ? data_of(i) : nullptr;
      PPTRAIN_CHECK(sizes[i] == 0 || data != nullptr, "no data for " + tensors[i].name);
      out.write(data, sizes[i]);
    }
    out.finish();
    return {out.checksum(), out.bytes()};
  } catch (...) {
    ::unlink(path.c_str());  // no half-written file is left behind
    throw;
  }
}

WrittenFile write_safetensors_durable(const std::string& path,
                                      const std::vector<TensorView>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  for (const TensorView& t : tensors) specs.push_back({t.name, t.shape});
  return write_safetensors_streamed(path, specs, metadata,
                                    [&](std::size_t i) { return tensors[i].data; });
}

}  // namespace ckpt

void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  ckpt::write_safetensors_durable(path, tensors, metadata);
}

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  auto mapped = std::make_shared<ckpt::MappedFile>(path);
  auto fail = [&](const std::string& why) { return InputError(path + ": " + why); };
  SafetensorsFile f;
  f.path_ = path;
  f.base_ = mapped->data();
  f.size_ = mapped->size();
  f.file_ = mapped;

  if (f.size_ < 8)
    throw fail("file is too short (" + std::to_string(f.size_) +
               " bytes) for a safetensors header");
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<unsigned char>(f.base_[i]);
  if (hlen > f.size_ - 8)
    throw fail("header length " + std::to_string(hlen) + " exceeds the file size (" +
               std::to_string(f.size_) + " bytes); the file may be truncated");
  f.data_start_ = 8 + hlen;
  const uint64_t data_size = f.size_ - f.data_start_;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(f.base_ + 8, f.base_ + 8 + hlen);
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) throw fail("header is not a JSON object");

  for (const auto& [key, val] : header.items()) {
    if (key == "__metadata__") {
      if (!val.is_object()) throw fail("__metadata__ is not a JSON object");
      for (const auto& [k, v] : val.items()) {
        if (!v.is_string()) throw fail("__metadata__ value of " + k + " is not a string");
        f.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string what = "tensor " + key;
    if (!val.is_object()) throw fail(what + ": entry is not a JSON object");
    auto dtype = val.find("dtype");
    if (dtype == val.end() || !dtype->is_string()) throw fail(what + " has no dtype");
    Tensor t;
    t.name = key;
    const std::string type = dtype->get<std::string>();
    t.elem = type == "F32" ? 0 : type == "F16" ? 1 : type == "BF16" ? 2 : -1;
    if (t.elem < 0)
      throw fail(what + " has dtype " + type + "; F32, F16 and BF16 tensors are supported");
    const uint64_t elem_bytes = t.elem == 0 ? 4 : 2;
    auto shape = val.find("shape");
    if (shape == val.end() || !shape->is_array()) throw fail(what + " has no shape array");
    uint64_t numel = 1;
    for (const auto& d : *shape) {
      if (!d.is_number_unsigned()) throw fail(what + " has a shape entry that is not a size");
      const uint64_t n = d.get<uint64_t>();
      // (A zero elsewhere in the shape does not excuse a dimension int64_t cannot hold.)
      if (n > uint64_t(std::numeric_limits<int64_t>::max()) ||
          (n != 0 && numel > (std::numeric_limits<uint64_t>::max() / 8) / n))
        throw fail(what + " has an impossibly large shape");
      numel *= n;
      t.shape.push_back(static_cast<int64_t>(n));
    }
    auto offs = val.find("data_offsets");
    if (offs == val.end() || !offs->is_array() || offs->size() != 2 ||
        !(*offs)[0].is_number_unsigned() || !(*offs)[1].is_number_unsigned())
      throw fail(what + " has no data_offsets [begin, end]");
    t.begin = (*offs)[0].get<uint64_t>();
    t.end = (*offs)[1].get<uint64_t>();
    std::string range = "[";  // (built step by step: GCC 12 misfires -Wrestrict on "x" + str)
    range += std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
    if (t.begin > t.end || t.end > data_size)
      throw fail(what + " has data_offsets " + range + " outside the " + std::to_string(data_size) +
                 " data bytes; the file may be truncated");
    if (t.end - t.begin != numel * elem_bytes)
      throw fail(what + " has data_offsets " + range + " (" + std::to_string(t.end - t.begin) +
                 " bytes) but shape " + ckpt::shape_str(t.shape) + " needs " +
                 std::to_string(numel * elem_bytes) + " bytes");
    f.tensors_.push_back(std::move(t));
  }

  std::sort(f.tensors_.begin(), f.tensors_.end(), [](const Tensor& a, const Tensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (std::size_t i = 0; i < f.tensors_.size(); ++i) {
    const Tensor& t = f.tensors_[i];
    if (t.begin < covered)
      throw fail("tensors " + f.tensors_[i - 1].name + " and " + t.name + " overlap");
    if (t.begin > covered)
      throw fail(std::to_string(t.begin - covered) + " unused bytes before tensor " + t.name);
    covered = t.end;
    f.index_[t.name] = i;
  }
  if (covered < data_size)
    throw fail(std::to_string(data_size - covered) + " trailing bytes after the last tensor");
  return f;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& t : tensors_) out.push_back(t.name);
  return out;
}

bool SafetensorsFile::contains(const std::string& name) const { return index_.count(name) > 0; }

const SafetensorsFile::Tensor& SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw InputError(path_ + ": no tensor named " + name);
  return tensors_[it->second];
}

std::vector<int64_t> SafetensorsFile::shape(const std::string& name) const {
  return find(name).shape;
}

void SafetensorsFile::copy_to(const std::string& name, const std::vector<int64_t>& expected_shape,
                              float* dst) const {
  const Tensor& t = find(name);
  if (t.shape != expected_shape)
    throw InputError(path_ + ": tensor " + name + " has shape " + ckpt::shape_str(t.shape) +
                     ", expected " + ckpt::shape_str(expected_shape));
  if (t.elem == 0) {
    if (t.end > t.begin) std::memcpy(dst, base_ + data_start_ + t.begin, t.end - t.begin);
    return;
  }
  const Elements e = elements(name);
  for (uint64_t i = 0; i < e.size(); ++i) dst[i] = e[i];
}

std::string SafetensorsFile::dtype(const std::string& name) const {
  static const char* const kNames[] = {"F32", "F16", "BF16"};
  return kNames[find(name).elem];
}

SafetensorsFile::Elements SafetensorsFile::elements(const std::string& name) const {
  const Tensor& t = find(name);
  Elements e;
  e.data_ = base_ + data_start_ + t.begin;
  e.elem_ = t.elem;
  e.size_ = (t.end - t.begin) / (t.elem == 0 ? 4 : 2);
  return e;
}

namespace {
float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf, nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;  // zero
  } else {  // subnormal: mant * 2^-24, exact in float
    const float v = float(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(bits);
}
}  // namespace

float SafetensorsFile::Elements::operator[](uint64_t i) const {
  if (elem_ == 0) {
    float v;
    std::memcpy(&v, data_ + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, data_ + 2 * i, 2);
  return elem_ == 1 ? half_to_float(h) : std::bit_cast<float>(uint32_t(h) << 16);
}

std::string_view SafetensorsFile::bytes() const { return {base_, size_}; }

}  // namespace pptrain
