// Reading a step dir: meta.json (either format), the listed tensor files' headers and
// sizes, and each stored tensor's slicing, indexed by tensor name.
#include "checkpoint/open_checkpoint.hpp"

#include <algorithm>
#include <set>
#include <tuple>

#include "checkpoint/file_io.hpp"
#include "checkpoint/sharded.hpp"
#include "checkpoint/step_dirs.hpp"
#include "core/error.hpp"

namespace pptrain::ckpt {

namespace fs = std::filesystem;

namespace {

// meta.json of `dir`, once meta.sum vouches for its bytes.
nlohmann::json read_meta(const fs::path& dir) {
  const std::string path = (dir / "meta.json").string();
  const MappedFile file(path);
  const std::string_view text(file.data(), file.size());
  const MappedFile seal((dir / kMetaSealName).string());
  if (std::string_view(seal.data(), seal.size()) != meta_seal(text))
    throw InputError(path + ": does not match its checksum in " + kMetaSealName +
                     " (edited or damaged)");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": not valid JSON (" + e.what() + ")");
  }
}

// Opens `name` in `dir` and checks its size against meta.json's record.
StoredFile open_file(const fs::path& dir, const std::string& name, const nlohmann::json& files,
                     const std::string& meta_path) {
  auto entry = files.find(name);
  if (entry == files.end() || !entry->is_object() || !entry->contains("bytes") ||
      !(*entry)["bytes"].is_number_unsigned() || !entry->contains("checksum") ||
      !(*entry)["checksum"].is_string())
    throw InputError(meta_path + ": no size and checksum recorded for " + name);
  StoredFile f{name, SafetensorsFile::read((dir / name).string()),
               (*entry)["checksum"].get<std::string>()};
  const uint64_t want_bytes = (*entry)["bytes"].get<uint64_t>();
  if (f.file.bytes().size() != want_bytes)
    throw InputError(f.file.path() + ": file has " + std::to_string(f.file.bytes().size()) +
                     " bytes but meta.json records " + std::to_string(want_bytes));
  return f;
}

std::size_t product(const std::vector<int64_t>& shape) {
  std::size_t n = 1;
  for (int64_t d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

// "" when `s` (a piece's slicing, shape = as stored) can be cut from its global shape;
// otherwise why not.
std::string slicing_problem(const ParamEntry& s) {
  const std::size_t rank = s.shape.size();
  if (s.hf_shape.size() != rank) return "has a global shape of another rank";
  if (s.split_dim < 0) return s.shape == s.hf_shape ? "" : "is whole but not of its global shape";
  if (s.split_dim >= int(rank)) return "has split_dim beyond its rank";
  if (s.split_groups < 1 || s.num_shards < 1 || s.shard < 0 || s.shard >= s.num_shards)
    return "has an invalid split_groups, shard or num_shards";
  const std::size_t d = std::size_t(s.split_dim);
  for (std::size_t k = 0; k < rank; ++k)
    if (k != d && s.shape[k] != s.hf_shape[k]) return "differs from its global shape off split_dim";
  const int64_t local = s.shape[d], global = s.hf_shape[d];
  if (local % s.split_groups != 0) return "has a split extent not divisible by split_groups";
  if (local > 0 && s.num_shards > (int64_t(1) << 40) / local) return "has too many shards";
  const int64_t padded = local * s.num_shards;
  if (padded < global || (s.split_groups > 1 && padded != global))
    return "has shards that do not tile its global extent";
  return "";
}

// Tensor `name`'s slicing record `r` (its entry in the file's pptrain.slicing), for a
// stored `shape`; std::invalid_argument says what is wrong with it.
ParamEntry parse_slicing(const std::string& name, const std::vector<int64_t>& shape,
                         const nlohmann::json& r) {
  ParamEntry s;
  s.name = name;
  s.shape = shape;
  s.numel = product(shape);
  if (!r.is_object() || !r.contains("global_shape") || !r["global_shape"].is_array())
    throw std::invalid_argument("has no global_shape");
  for (const auto& d : r["global_shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t(1) << 40))
      throw std::invalid_argument("has a global_shape entry that is not a size");
    s.hf_shape.push_back(d.get<int64_t>());
  }
  const std::initializer_list<std::pair<const char*, int*>> fields = {
      {"split_dim", &s.split_dim}, {"split_groups", &s.split_groups}, {"shard", &s.shard},
      {"num_shards", &s.num_shards}};
  for (auto [key, field] : fields) {
    if (!r.contains(key) || !r[key].is_number_integer() || r[key].get<int64_t>() < -1 ||
        r[key].get<int64_t>() > (int64_t(1) << 30))
      throw std::invalid_argument(std::string("has no valid ") + key);
    *field = r[key].get<int>();
  }
  if (s.split_dim < 0) s.split_dim = -1, s.split_groups = 1, s.shard = 0, s.num_shards = 1;
  const std::string why = slicing_problem(s);
  if (!why.empty()) throw std::invalid_argument(why);
  return s;
}

// The runs of one tp piece held by data-parallel ranks' optimizer files, by (tensor
// name, the writer's "tp<T>-pp<P>", shard), gathered over the files before they become
// pieces.
using FragmentedPieces = std::map<std::tuple<std::string, std::string, int>, Piece>;

// Stored tensor `name` of file i, a run of a tp piece (its record has a flat_range).
void index_fragment(OpenCheckpoint& ck, std::size_t i, const std::string& name,
                    const nlohmann::json& r, const std::string& writer, FragmentedPieces& out) {
  const SafetensorsFile& f = ck.files[i].file;
  if (!r.contains("tensor") || !r["tensor"].is_string() || !r.contains("local_shape") ||
      !r["local_shape"].is_array() || !r.contains("flat_range") || !r["flat_range"].is_array() ||
      r["flat_range"].size() != 2)
    ck.fail_in(i, "tensor " + name + " has no valid tensor, local_shape and flat_range");
  const std::string tensor = r["tensor"].get<std::string>();
  std::vector<int64_t> local_shape;
  for (const auto& d : r["local_shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t(1) << 40))
      ck.fail_in(i, "tensor " + name + " has a local_shape entry that is not a size");
    local_shape.push_back(d.get<int64_t>());
  }
  ParamEntry slicing;
  try {
    slicing = parse_slicing(tensor, local_shape, r);
  } catch (const std::invalid_argument& e) {
    ck.fail_in(i, "tensor " + name + " " + e.what());
  }
  const auto& range = r["flat_range"];
  if (!range[0].is_number_unsigned() || !range[1].is_number_unsigned() ||
      range[0].get<uint64_t>() >= range[1].get<uint64_t>() || range[1].get<uint64_t>() > slicing.numel)
    ck.fail_in(i, "tensor " + name + " has a flat_range outside its piece");
  const Fragment run{i, name, range[0].get<std::size_t>(), range[1].get<std::size_t>()};
  if (name != tensor + "@" + std::to_string(run.begin) ||
      f.shape(name) != std::vector<int64_t>{int64_t(run.end - run.begin)})
    ck.fail_in(i, "tensor " + name + " is not stored as its flat_range says");
  Piece& piece = out[{tensor, writer, slicing.shard}];
  if (piece.fragments.empty()) {
    piece.file = i;
    piece.slicing = slicing;
    piece.slicing.name = tensor;
  } else if (piece.slicing.hf_shape != slicing.hf_shape || piece.slicing.shape != slicing.shape ||
             piece.slicing.split_dim != slicing.split_dim ||
             piece.slicing.num_shards != slicing.num_shards ||
             piece.slicing.split_groups != slicing.split_groups) {
    ck.fail_in(i, "tensor " + name + " is sliced unlike the other runs of " + tensor);
  }
  piece.fragments.push_back(run);
}

// Each fragmented piece's runs must tile it exactly; then it joins the index.
void add_fragmented(OpenCheckpoint& ck, Role role, FragmentedPieces& pieces) {
  for (auto& [key, piece] : pieces) {
    auto& runs = piece.fragments;
    std::sort(runs.begin(), runs.end(), [](const Fragment& a, const Fragment& b) { return a.begin < b.begin; });
    std::size_t covered = 0;
    for (const Fragment& run : runs) {
      if (run.begin != covered)
        throw InputError(ck.dir.string() + ": tensor " + std::get<0>(key) + " of " + std::get<1>(key) +
                         (run.begin > covered ? ": elements from " + std::to_string(covered) +
                                                    " are in no optimizer file"
                                              : ": element " + std::to_string(run.begin) +
                                                    " is stored twice"));
      covered = run.end;
    }
    if (covered != piece.slicing.numel)
      throw InputError(ck.dir.string() + ": tensor " + std::get<0>(key) + " of " + std::get<1>(key) +
                       ": elements from " + std::to_string(covered) + " are in no optimizer file");
    piece.file = runs.front().file;
    ck.tensors[role][std::get<0>(key)].push_back(std::move(piece));
  }
}

// Adds file i's tensors to the index: whole tensors (version 1) or recorded slices, or
// (a data-parallel rank's optimizer file, written by `writer`) runs of slices, gathered
// in `fragmented`.
void index_file(OpenCheckpoint& ck, std::size_t i, Role role, const std::string& writer,
                FragmentedPieces& fragmented) {
  const SafetensorsFile& f = ck.files[i].file;
  nlohmann::json slicing;
  if (ck.format_version == kShardedFormatVersion) {
    auto it = f.metadata().find(kSlicingMetadataKey);
    if (it == f.metadata().end())
      ck.fail_in(i, std::string("no ") + kSlicingMetadataKey + " record in its metadata");
    slicing = nlohmann::json::parse(it->second, nullptr, false);
    if (!slicing.is_object())
      ck.fail_in(i, std::string(kSlicingMetadataKey) + " is not a JSON object");
  }
  for (const std::string& name : f.names()) {
    Piece p{i, {}, {}};
    if (ck.format_version == kShardedFormatVersion) {
      if (!slicing.contains(name)) ck.fail_in(i, "tensor " + name + " has no slicing record");
      if (slicing[name].is_object() && slicing[name].contains("flat_range")) {
        index_fragment(ck, i, name, slicing[name], writer, fragmented);
        continue;
      }
      try {
        p.slicing = parse_slicing(name, f.shape(name), slicing[name]);
      } catch (const std::invalid_argument& e) {
        ck.fail_in(i, "tensor " + name + " " + e.what());
      }
    } else {
      p.slicing.name = name;
      p.slicing.shape = p.slicing.hf_shape = f.shape(name);
      p.slicing.numel = product(p.slicing.shape);
    }
    ck.tensors[role][name].push_back(std::move(p));
  }
}

// Every tensor must be whole somewhere or have every shard of one consistent split.
void check_complete(OpenCheckpoint& ck, Role role) {
  for (const auto& [name, pieces] : ck.tensors[role]) {
    const ParamEntry& first = pieces.front().slicing;
    const ParamEntry* split = nullptr;  // the first split piece: the others must match it
    bool whole = false;
    std::set<int> shards;
    for (const Piece& p : pieces) {
      const ParamEntry& s = p.slicing;
      if (s.hf_shape != first.hf_shape)
        ck.fail_in(p.file, "tensor " + name + " has global shape " + shape_str(s.hf_shape) +
                               " but " + ck.files[pieces.front().file].name + " records " +
                               shape_str(first.hf_shape));
      whole = whole || s.replicated();
      if (s.replicated()) continue;
      if (!split) split = &s;
      if (s.split_dim != split->split_dim || s.split_groups != split->split_groups ||
          s.num_shards != split->num_shards || s.shape != split->shape)
        ck.fail_in(p.file, "tensor " + name + " is sliced unlike its other shards");
      shards.insert(s.shard);
    }
    if (whole) continue;
    const int n = split->num_shards;
    if (int(shards.size()) != n) {
      int k = 0;
      while (shards.count(k)) ++k;
      throw InputError(ck.dir.string() + ": tensor " + name + ": shard " + std::to_string(k) +
                       " of " + std::to_string(n) + " is missing");
    }
  }
}

}  // namespace

std::vector<std::size_t> piece_files(const Piece& p) {
  if (p.fragments.empty()) return {p.file};
  std::vector<std::size_t> files;
  for (const Fragment& f : p.fragments) files.push_back(f.file);
  return files;
}

void read_piece(const OpenCheckpoint& ck, const Piece& p, float* out) {
  if (p.fragments.empty()) {
    ck.files[p.file].file.copy_to(p.slicing.name, p.slicing.shape, out);
    return;
  }
  for (const Fragment& f : p.fragments)
    ck.files[f.file].file.copy_to(f.stored_name, {int64_t(f.end - f.begin)}, out + f.begin);
}

void StoredFile::verify() {
  if (verified) return;
  Checksum sum;
  sum.update(file.bytes().data(), file.bytes().size());
  const std::string got = to_hex(sum.value());
  if (got != checksum)
    throw InputError(file.path() + ": checksum mismatch (file " + got + ", meta.json " + checksum +
                     "): the file is corrupt");
  verified = true;
}

void OpenCheckpoint::fail_in(std::size_t i, const std::string& why) {
  files[i].verify();
  throw InputError(files[i].file.path() + ": " + why);
}

OpenCheckpoint open_checkpoint(const fs::path& dir, bool with_optimizer, bool verify_all) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(dir.string() + ": no such checkpoint directory");
  const std::string meta_path = (dir / "meta.json").string();
  const nlohmann::json j = read_meta(dir);
  auto bad = [&](const std::string& why) { return InputError(meta_path + ": " + why); };
  if (!j.is_object()) throw bad("not a JSON object");
  if (!j.contains("format_version") || !j["format_version"].is_number_integer())
    throw bad("no integer format_version");
  const int64_t version = j["format_version"].get<int64_t>();
  if (version != kCheckpointFormatVersion && version != kShardedFormatVersion)
    throw bad("format_version " + j["format_version"].dump() + " is not supported (expected " +
              std::to_string(kCheckpointFormatVersion) + " or " +
              std::to_string(kShardedFormatVersion) + ")");
  if (!j.contains("step") || !j["step"].is_number_integer() || j["step"].get<int64_t>() < 0)
    throw bad("no valid step");
  if (const auto named = parse_step_name(dir.filename().string());
      named && *named != j["step"].get<int64_t>())
    throw bad("step " + j["step"].dump() + " disagrees with the directory name " +
              dir.filename().string());
  if (!j.contains("config_yaml") || !j["config_yaml"].is_string()) throw bad("no config_yaml");
  if (j.value("checksum_algorithm", std::string()) != kChecksumName)
    throw bad(std::string("checksum_algorithm is not ") + kChecksumName);
  if (!j.contains("files") || !j["files"].is_object()) throw bad("no files object");
  const nlohmann::json& files = j["files"];

  OpenCheckpoint ck;
  ck.dir = dir;
  ck.format_version = int(version);
  ck.meta = {j["step"].get<int64_t>(), j["config_yaml"].get<std::string>(),
             j.value("train_state", nlohmann::json()), {}};
  std::vector<Role> roles;
  std::vector<std::string> writers;  // each file's "tp<T>-pp<P>"
  auto add = [&](const std::string& name, Role role, const std::string& writer = "") {
    ck.files.push_back(open_file(dir, name, files, meta_path));
    roles.push_back(role);
    writers.push_back(writer);
  };
  if (version == kCheckpointFormatVersion) {
    add("model.safetensors", kModel);
    if (with_optimizer) add("optimizer.safetensors", kOptimizer);
  } else {
    const nlohmann::json layout = j.value("layout", nlohmann::json());
    auto dim = [&](const char* key) {
      if (!layout.is_object() || !layout.contains(key) || !layout[key].is_number_integer() ||
          layout[key].get<int64_t>() < 1 || layout[key].get<int64_t>() > (1 << 20))
        throw bad(std::string("no valid layout.") + key);
      return layout[key].get<int>();
    };
    const int tp = dim("tp"), pp = dim("pp"), dp = dim("dp");
    const nlohmann::json by_dp = layout.value("optimizer_by_dp", nlohmann::json(false));
    if (!by_dp.is_boolean()) throw bad("layout.optimizer_by_dp is not true or false");
    std::set<std::string> expected;
    auto expect = [&](const std::string& name, bool opened, Role role, const std::string& writer) {
      if (!files.contains(name))
        throw bad(name + " is not listed: a shard of the tp=" + std::to_string(tp) + " pp=" +
                  std::to_string(pp) + " dp=" + std::to_string(dp) + " checkpoint is missing");
      expected.insert(name);
      if (opened) add(name, role, writer);
    };
    for (int p = 0; p < pp; ++p)
      for (int t = 0; t < tp; ++t) {
        const std::string writer = "tp" + std::to_string(t) + "-pp" + std::to_string(p);
        expect(shard_file_name("model", t, p), true, kModel, writer);
        if (!by_dp.get<bool>())
          expect(shard_file_name("optimizer", t, p), with_optimizer, kOptimizer, writer);
        else
          for (int d = 0; d < dp; ++d)
            expect(optimizer_dp_file_name(t, p, d), with_optimizer, kOptimizer, writer);
      }
    for (const auto& [name, entry] : files.items())
      if (!expected.count(name)) throw bad("lists " + name + ", which is no shard of its layout");
  }
  if (verify_all)
    for (StoredFile& f : ck.files) f.verify();
  FragmentedPieces fragmented;
  for (std::size_t i = 0; i < ck.files.size(); ++i) index_file(ck, i, roles[i], writers[i], fragmented);
  add_fragmented(ck, kOptimizer, fragmented);
  check_complete(ck, kModel);
  check_complete(ck, kOptimizer);
  return ck;
}

}  // namespace pptrain::ckpt
