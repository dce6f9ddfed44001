#include "io/energon/writer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "src/base/check.h"

namespace vlm::io {

namespace fs = std::filesystem;

namespace {

constexpr size_t kBlock = 512;

// An octal field of `width` bytes: digits, then NUL.
void put_octal(char* field, size_t width, uint64_t value) {
  std::snprintf(field, width, "%0*llo", int(width - 1), (unsigned long long)value);
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  VLM_CHECK(f.good(), "energon writer: cannot create '", path.string(), "'");
  f.write(bytes.data(), std::streamsize(bytes.size()));
  VLM_CHECK(f.good(), "energon writer: failed writing '", path.string(), "'");
}

} // namespace

uint64_t TarBuilder::add_file(const std::string& name, const std::string& data) {
  char h[kBlock] = {};
  // ustar: names longer than 100 bytes are split at a '/' into prefix (155) + name (100).
  std::string prefix, base = name;
  if (name.size() > 100) {
    size_t cut = name.rfind('/', 155);
    VLM_CHECK(cut != std::string::npos && name.size() - cut - 1 <= 100 && cut <= 155,
              "tar writer: member name '", name, "' does not fit a ustar header");
    prefix = name.substr(0, cut);
    base = name.substr(cut + 1);
  }
  std::memcpy(h, base.data(), base.size());
  put_octal(h + 100, 8, 0644);
  put_octal(h + 108, 8, 0);
  put_octal(h + 116, 8, 0);
  put_octal(h + 124, 12, data.size());
  put_octal(h + 136, 12, 0);
  h[156] = '0';
  std::memcpy(h + 257, "ustar", 6);
  std::memcpy(h + 263, "00", 2);
  std::memcpy(h + 345, prefix.data(), prefix.size());
  std::memset(h + 148, ' ', 8); // the checksum is computed with its own field as spaces
  unsigned sum = 0;
  for (size_t i = 0; i < kBlock; i++) sum += (unsigned char)h[i];
  std::snprintf(h + 148, 8, "%06o", sum);
  uint64_t offset = bytes_.size();
  bytes_.append(h, kBlock);
  bytes_ += data;
  bytes_.append((kBlock - data.size() % kBlock) % kBlock, '\0');
  return offset;
}

std::string TarBuilder::finish() const { return bytes_ + std::string(2 * kBlock, '\0'); }

void write_energon_dataset(const std::string& root,
                           const std::map<std::string, std::vector<WriterSample>>& splits,
                           const EnergonWriteOptions& options) {
  VLM_CHECK(options.samples_per_shard > 0, "energon writer: samples_per_shard must be > 0");
  VLM_CHECK(!fs::exists(root), "energon writer: '", root, "' already exists");
  for (const auto& [name, bytes] : options.extra_files) {
    const fs::path rel(name);
    VLM_CHECK(!name.empty() && rel.is_relative() && rel.has_filename() &&
                  std::none_of(rel.begin(), rel.end(), [](const fs::path& c) { return c == ".."; }),
              "energon writer: extra file '", name, "' is not a file path inside the dataset");
  }
  fs::path final_root = fs::path(root).lexically_normal();
  if (!final_root.has_filename()) final_root = final_root.parent_path(); // "out/" -> "out"
  fs::path tmp = final_root;
  tmp += ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp / ".nv-meta");

  nlohmann::ordered_json counts = nlohmann::ordered_json::object();
  std::string split_yaml = "split_parts:\n";
  for (const auto& [split, samples] : splits) {
    split_yaml += "  " + split + ":\n";
    fs::create_directories(tmp / split);
    for (size_t first = 0, shard = 0; first < samples.size();
         first += size_t(options.samples_per_shard), shard++) {
      char name[64];
      std::snprintf(name, sizeof name, "%s/shard_%06zu.tar", split.c_str(), shard);
      TarBuilder tar;
      std::vector<uint64_t> idx;
      size_t last = std::min(samples.size(), first + size_t(options.samples_per_shard));
      for (size_t i = first; i < last; i++) {
        const WriterSample& s = samples[i];
        VLM_CHECK(!s.parts.empty(), "energon writer: sample '", s.key, "' has no parts");
        for (size_t p = 0; p < s.parts.size(); p++) {
          uint64_t at = tar.add_file(s.key + "." + s.parts[p].first, s.parts[p].second);
          if (p == 0) idx.push_back(at);
        }
      }
      idx.push_back(tar.end_offset());
      write_file(tmp / name, tar.finish());
      std::string idx_bytes(idx.size() * 8, '\0');
      std::memcpy(idx_bytes.data(), idx.data(), idx_bytes.size()); // little-endian hosts only
      write_file(tmp / (std::string(name) + ".idx"), idx_bytes);
      counts[name] = int64_t(last - first);
      split_yaml += std::string("  - ") + name + "\n";
    }
  }
  split_yaml += "exclude: []\n";

  std::string dataset_yaml = "__module__: megatron.energon\n__class__: CrudeWebdataset\n";
  if (!options.subflavors.empty()) {
    dataset_yaml += "subflavors:\n";
    for (const auto& [k, v] : options.subflavors) dataset_yaml += "  " + k + ": " + v + "\n";
  }
  nlohmann::ordered_json info;
  info["energon_version"] = "vlmtrain";
  info["shard_counts"] = counts;
  write_file(tmp / ".nv-meta" / "dataset.yaml", dataset_yaml);
  write_file(tmp / ".nv-meta" / "split.yaml", split_yaml);
  write_file(tmp / ".nv-meta" / ".info.json", info.dump(2) + "\n");
  for (const auto& [name, bytes] : options.extra_files) {
    const fs::path rel(name);
    if (rel.has_parent_path()) fs::create_directories(tmp / rel.parent_path());
    write_file(tmp / rel, bytes);
  }
  if (final_root.has_parent_path()) fs::create_directories(final_root.parent_path());
  fs::rename(tmp, final_root);
}

} // namespace vlm::io
