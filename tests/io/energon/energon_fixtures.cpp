#include "tests/io/energon/energon_fixtures.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace vlm::testing {
namespace {

constexpr size_t kBlock = 512;

size_t padded(size_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

void put_octal(std::string& h, size_t off, size_t width, uint64_t v) {
  // width - 1 octal digits, then NUL (the ustar convention for numeric fields)
  std::string digits(width - 1, '0');
  for (size_t i = width - 1; i-- > 0; v >>= 3) digits[i] = char('0' + (v & 7));
  h.replace(off, width - 1, digits);
  h[off + width - 1] = '\0';
}

void put_string(std::string& h, size_t off, size_t width, const std::string& s) {
  h.replace(off, std::min(width, s.size()), s.substr(0, width));
}

std::string index_path(const std::string& tar_path) { return tar_path + ".idx"; }

std::string yaml_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

void apply_damage(const std::string& tar_path, const FixtureShard& shard,
                  const std::vector<uint64_t>& idx) {
  std::string ipath = index_path(tar_path);
  switch (shard.damage) {
  case Damage::none: break;
  case Damage::missing_index: fs::remove(ipath); break;
  case Damage::short_index:
    write_index(ipath, std::vector<uint64_t>(idx.begin(), idx.end() - 1));
    break;
  case Damage::truncated:
  case Damage::truncated_consistent: {
    // Cut in the middle of the data of the last member of the last sample.
    std::string tar = read_file(tar_path);
    size_t last_size = shard.samples.back().parts.back().data.size();
    uint64_t cut = idx.back() - padded(last_size) + last_size / 2;
    write_file(tar_path, tar.substr(0, cut));
    if (shard.damage == Damage::truncated_consistent) {
      std::vector<uint64_t> moved = idx;
      moved.back() = cut;
      write_index(ipath, moved);
    }
    break;
  }
  case Damage::shifted_offset: {
    std::vector<uint64_t> moved = idx;
    moved.at(1) += kBlock;
    write_index(ipath, moved);
    break;
  }
  case Damage::garbage_header: {
    std::string tar = read_file(tar_path);
    tar.replace(idx.at(1), kBlock, std::string(kBlock, '\xAB'));
    write_file(tar_path, tar);
    break;
  }
  case Damage::index_past_end: {
    std::vector<uint64_t> moved = idx;
    moved.at(1) = uint64_t(fs::file_size(tar_path)) + 4096;
    write_index(ipath, moved);
    break;
  }
  }
}

} // namespace

// ---------------------------------------------------------------------------------------------

TempDir::TempDir(const std::string& tag) {
  std::random_device rd;
  dir = fs::temp_directory_path() /
        ("vlm_test_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
  fs::create_directories(dir);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(dir, ec);
}

std::string tar_header(const std::string& name, uint64_t size, char type, LongNames magic,
                       bool base256_size) {
  std::string h(kBlock, '\0');
  put_string(h, 0, 100, name);
  put_octal(h, 100, 8, type == '5' ? 0755 : 0644);
  put_octal(h, 108, 8, 0);
  put_octal(h, 116, 8, 0);
  if (base256_size) {
    h[124] = char(0x80);
    for (int i = 0; i < 8; i++) h[124 + 11 - i] = char((size >> (8 * i)) & 0xff); // rest 0
  } else {
    put_octal(h, 124, 12, size);
  }
  put_octal(h, 136, 12, 1700000000);
  h[156] = type;
  if (magic == LongNames::gnu) {
    put_string(h, 257, 8, std::string("ustar  \0", 8));
  } else {
    put_string(h, 257, 6, std::string("ustar\0", 6));
    put_string(h, 263, 2, "00");
  }
  // Checksum: the unsigned byte sum with the field itself read as 8 spaces.
  h.replace(148, 8, std::string(8, ' '));
  uint64_t sum = 0;
  for (unsigned char c : h) sum += c;
  char buf[8];
  std::snprintf(buf, sizeof buf, "%06o", unsigned(sum));
  h.replace(148, 6, buf);
  h[154] = '\0';
  h[155] = ' ';
  return h;
}

std::string pax_record(const std::string& key, const std::string& value) {
  // The length prefix counts itself, so grow it until it is consistent.
  std::string body = " " + key + "=" + value + "\n";
  size_t len = body.size() + 1;
  while (std::to_string(len).size() + body.size() != len) len++;
  return std::to_string(len) + body;
}

void TarWriter::add_data(const std::string& data) {
  bytes_ += data;
  bytes_.append(padded(data.size()) - data.size(), '\0');
}

void TarWriter::add_long_name(const std::string& name) {
  if (long_names_ == LongNames::gnu) {
    bytes_ += tar_header("././@LongLink", name.size() + 1, 'L', LongNames::gnu);
    add_data(name + std::string(1, '\0'));
  } else {
    std::string rec = pax_record("path", name);
    bytes_ += tar_header("././@PaxHeader", rec.size(), 'x', LongNames::pax);
    add_data(rec);
  }
}

uint64_t TarWriter::add_file(const std::string& name, const std::string& data) {
  uint64_t offset = bytes_.size();
  if (name.size() > 100) add_long_name(name);
  bytes_ += tar_header(name, data.size(), '0', long_names_);
  add_data(data);
  return offset;
}

uint64_t TarWriter::add_dir(const std::string& name) {
  uint64_t offset = bytes_.size();
  if (name.size() > 100) add_long_name(name);
  bytes_ += tar_header(name, 0, '5', long_names_);
  return offset;
}

uint64_t TarWriter::add_file_base256_size(const std::string& name, const std::string& data) {
  uint64_t offset = bytes_.size();
  bytes_ += tar_header(name, data.size(), '0', LongNames::gnu, /*base256_size=*/true);
  add_data(data);
  return offset;
}

uint64_t TarWriter::add_file_pax_size(const std::string& name, const std::string& data) {
  uint64_t offset = bytes_.size();
  std::string rec = pax_record("size", std::to_string(data.size()));
  bytes_ += tar_header("././@PaxHeader", rec.size(), 'x', LongNames::pax);
  add_data(rec);
  bytes_ += tar_header(name, 0, '0', LongNames::pax);
  add_data(data);
  return offset;
}

uint64_t TarWriter::add_pax_global(const std::map<std::string, std::string>& records) {
  uint64_t offset = bytes_.size();
  std::string recs;
  for (const auto& [k, v] : records) recs += pax_record(k, v);
  bytes_ += tar_header("././@PaxGlobalHeader", recs.size(), 'g', LongNames::pax);
  add_data(recs);
  return offset;
}

std::string TarWriter::finish(size_t record) const {
  std::string out = bytes_ + std::string(2 * kBlock, '\0');
  if (record > 0 && out.size() % record != 0) out.append(record - out.size() % record, '\0');
  return out;
}

// ---------------------------------------------------------------------------------------------

void write_fixture(const std::string& root, const FixtureDataset& ds) {
  fs::create_directories(root);
  std::vector<std::pair<std::string, int64_t>> counts;
  for (const FixtureShard& shard : ds.shards) {
    TarWriter tw(shard.long_names);
    if (shard.leading_members) {
      tw.add_dir("meta/");
      tw.add_file("__meta__", "m");
    }
    std::vector<uint64_t> idx;
    for (const FixtureSample& s : shard.samples) {
      for (size_t p = 0; p < s.parts.size(); p++) {
        uint64_t off = tw.add_file(s.key + "." + s.parts[p].name, s.parts[p].data);
        if (p == 0) idx.push_back(off);
      }
    }
    idx.push_back(tw.size());
    std::string tar_path = (fs::path(root) / shard.name).string();
    fs::create_directories(fs::path(tar_path).parent_path());
    write_file(tar_path, tw.finish());
    write_index(index_path(tar_path), idx);
    apply_damage(tar_path, shard, idx);
    counts.emplace_back(shard.name,
                        shard.info_count >= 0 ? shard.info_count : int64_t(shard.samples.size()));
  }
  if (!ds.write_nv_meta) return;

  fs::path meta = fs::path(root) / ".nv-meta";
  fs::create_directories(meta);
  std::ostringstream info;
  if (ds.info_yaml) {
    info << "shard_counts:\n";
    for (auto& [name, n] : counts) info << "  " << yaml_quote(name) << ": " << n << "\n";
    write_file((meta / ".info.yaml").string(), info.str());
  } else {
    info << "{\n  \"energon_version\": \"7.3.2\",\n  \"shard_counts\": {";
    for (size_t i = 0; i < counts.size(); i++)
      info << (i ? ",\n" : "\n") << "    " << json_quote(counts[i].first) << ": "
           << counts[i].second;
    info << "\n  }\n}\n";
    write_file((meta / ".info.json").string(), info.str());
  }

  std::ostringstream split;
  if (ds.split_json) {
    split << "{\"split_parts\": {";
    for (size_t i = 0; i < ds.splits.size(); i++) {
      split << (i ? ", " : "") << json_quote(ds.splits[i].first) << ": [";
      for (size_t j = 0; j < ds.splits[i].second.size(); j++)
        split << (j ? ", " : "") << json_quote(ds.splits[i].second[j]);
      split << "]";
    }
    split << "}, \"exclude\": [";
    for (size_t j = 0; j < ds.exclude.size(); j++)
      split << (j ? ", " : "") << json_quote(ds.exclude[j]);
    split << "]}\n";
    write_file((meta / "split.json").string(), split.str());
  } else {
    split << "split_parts:\n";
    for (auto& [name, patterns] : ds.splits) {
      split << "  " << name << ":" << (patterns.empty() ? " []\n" : "\n");
      for (auto& p : patterns) split << "  - " << yaml_quote(p) << "\n";
    }
    split << "exclude:" << (ds.exclude.empty() ? " []\n" : "\n");
    for (auto& e : ds.exclude) split << "- " << yaml_quote(e) << "\n";
    write_file((meta / "split.yaml").string(), split.str());
  }

  std::ostringstream dy;
  dy << "__module__: megatron.energon\n__class__: " << ds.dataset_class << "\n";
  if (!ds.subflavors.empty()) {
    dy << "subflavors:\n";
    for (auto& [k, v] : ds.subflavors) dy << "  " << k << ": " << v << "\n";
  }
  if (!ds.part_filter.empty()) {
    dy << "part_filter: [";
    for (size_t i = 0; i < ds.part_filter.size(); i++) dy << (i ? ", " : "") << ds.part_filter[i];
    dy << "]\n";
  }
  write_file((meta / "dataset.yaml").string(), dy.str());
  write_file((meta / "index.uuid").string(), "5f0c2a3e-8d1b-4c6a-9e7f-0a1b2c3d4e5f");
}

std::string fx_basic_json(int k) {
  return "{\"conversations\":[{\"from\":\"human\",\"value\":\"<image>\\nDescribe.\"},"
         "{\"from\":\"gpt\",\"value\":\"cap " +
         std::to_string(k) + "\"}]}";
}

std::string fx_basic_jpg(int k) {
  std::string s = "\xff\xd8\xff\xe0 fake jpeg " + std::to_string(k) + " ";
  for (int i = 0; i < 64; i++) s += char((k * 31 + i * 7) & 0xff);
  return s + "\xff\xd9";
}

FixtureDataset fx_basic() {
  FixtureDataset ds;
  int k = 0;
  int shard = 0;
  for (int n : {3, 2, 1}) {
    char name[64];
    std::snprintf(name, sizeof name, "shards/shard_%06d.tar", shard++);
    FixtureShard s;
    s.name = name;
    for (int i = 0; i < n; i++, k++) {
      char key[16];
      std::snprintf(key, sizeof key, "%06d", k);
      s.samples.push_back({key, {{"json", fx_basic_json(k)}, {"jpg", fx_basic_jpg(k)}}});
    }
    ds.shards.push_back(std::move(s));
  }
  ds.splits = {{"train", {"shards/shard_{000000..000001}.tar"}},
               {"val", {"shards/shard_000002.tar"}},
               {"test", {}}};
  ds.exclude = {"shards/shard_000001.tar/000004"};
  ds.subflavors = {{"type_dataset", "llava_recap"}};
  return ds;
}

std::string fx_edge_long_key() { return "sub/" + std::string(110, 'k'); }

void write_fx_edge(const std::string& root, LongNames long_names) {
  TarWriter tw(long_names);
  tw.add_dir("sub/");
  tw.add_file("__meta__", "x");
  std::vector<uint64_t> idx;
  idx.push_back(tw.add_file("sub/000000.json", "{\"a\": 1}"));
  tw.add_file("sub/000000.seg.mask.png", std::string(700, '\x07'));
  tw.add_file("README", "not a sample member");
  idx.push_back(tw.add_file(fx_edge_long_key() + ".txt", "long key text"));
  idx.push_back(tw.add_file("sub/000002.txt", "two"));
  idx.push_back(tw.size());
  fs::create_directories(root);
  write_file((fs::path(root) / "edge.tar").string(), tw.finish());
  write_index((fs::path(root) / "edge.tar.idx").string(), idx);
  fs::path meta = fs::path(root) / ".nv-meta";
  fs::create_directories(meta);
  write_file((meta / ".info.json").string(), "{\"shard_counts\": {\"edge.tar\": 3}}\n");
  write_file((meta / "split.yaml").string(), "split_parts:\n  train:\n  - edge.tar\n");
  write_file((meta / "dataset.yaml").string(),
             "__module__: megatron.energon\n__class__: CrudeWebdataset\n");
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("cannot write " + path);
  out.write(data.data(), std::streamsize(data.size()));
}

std::vector<uint64_t> read_index(const std::string& path) {
  std::string raw = read_file(path);
  std::vector<uint64_t> out(raw.size() / 8);
  std::memcpy(out.data(), raw.data(), out.size() * 8);
  return out;
}

void write_index(const std::string& path, const std::vector<uint64_t>& offsets) {
  std::string raw(offsets.size() * 8, '\0');
  std::memcpy(raw.data(), offsets.data(), raw.size());
  write_file(path, raw);
}

} // namespace vlm::testing
