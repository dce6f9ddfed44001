// The data loader (io/loader/loader.h) end to end on datasets written by the Energon fixture
// builder, with the real Qwen3 tokenizer and real PNG/JPEG images: exactly-once coverage per epoch
// for every (rank, reader thread) layout, identical rows for TP peers, bit-exact resume (mid-epoch,
// across epoch boundaries, shuffle and packing buffers non-empty, offline plans), bad samples
// skipped and reported by reason, whole-dataset errors at construction, worker errors re-thrown
// with context, metadataset blends. (Throughput: bench/bench_loader.cpp.)
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "io/image/encode.h"
#include "io/loader/loader.h"
#include "io/loader/packing_plan.h"
#include "src/base/check.h"
#include "tests/error_of.h"
#include "tests/io/energon/energon_fixtures.h"

using Catch::Matchers::Contains;
using vlm::io::DataLoader;
using vlm::io::LoaderConfig;
using vlm::io::LoaderState;
using vlm::io::PackedRow;
using vlm::io::Tokenizer;
using vlm::testing::Damage;
using vlm::testing::FixtureDataset;
using vlm::testing::FixtureSample;
using vlm::testing::FixtureShard;
using vlm::testing::TempDir;

using vlm::testing::error_of;

namespace {

const std::string kTokenizer = std::string(VLM_QWEN3_TOKENIZER_DIR);
const std::string kImages = std::string(VLM_SOURCE_DIR) + "/tests/data/images/";

const Tokenizer& qwen() {
  static const Tokenizer tok = Tokenizer::from_file(kTokenizer);
  return tok;
}

std::string key_of(int k) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%06d", k);
  return buf;
}

// A conversation whose answer length varies with k (so that packing has work to do).
std::string conversation(int k, bool image) {
  std::string q = std::string(image ? "<image>\\n" : "") + "Question " + std::to_string(k) +
                  ": what is shown here?";
  std::string a;
  for (int i = 0; i <= k % 7; i++)
    a += "Answer part " + std::to_string(i) + " about sample " + std::to_string(k) + ". ";
  return R"({"conversations":[{"from":"human","value":")" + q + R"("},{"from":"gpt","value":")" +
         a + R"("}]})";
}

// A small PNG whose size and colours depend on k.
std::string png_of(int k, int64_t w = 0, int64_t h = 0) {
  vlm::io::Image img;
  img.width = w ? w : 12 + (k % 5) * 9;
  img.height = h ? h : 10 + (k % 3) * 11;
  img.rgb.resize(size_t(img.width * img.height * 3));
  for (size_t i = 0; i < img.rgb.size(); i++) img.rgb[i] = uint8_t((i * 7 + size_t(k) * 31) % 251);
  return vlm::io::encode_png(img);
}

FixtureSample sample(int k, bool image) {
  FixtureSample s;
  s.key = key_of(k);
  s.parts.push_back({"json", conversation(k, image)});
  if (image) s.parts.push_back({"png", png_of(k)});
  return s;
}

// Shards of the given sizes, samples numbered 0, 1, ... in order; split train = all shards.
FixtureDataset dataset(const std::vector<int>& shard_sizes, bool images) {
  FixtureDataset ds;
  std::vector<std::string> names;
  int k = 0;
  for (size_t i = 0; i < shard_sizes.size(); i++) {
    FixtureShard sh;
    sh.name = "shards/shard_" + key_of(int(i)) + ".tar";
    for (int j = 0; j < shard_sizes[i]; j++) sh.samples.push_back(sample(k++, images));
    names.push_back(sh.name);
    ds.shards.push_back(std::move(sh));
  }
  ds.splits = {{"train", names}};
  return ds;
}

LoaderConfig config(const std::string& root) {
  LoaderConfig c;
  c.dataset = root;
  c.tokenizer = kTokenizer;
  c.packing.seq_len = 256;
  c.packing.buffer_size = 6;
  c.packing.mrope = true;
  c.image.min_pixels = 32 * 32; // tiny images: a few tokens each
  c.image.max_pixels = 64 * 64;
  c.num_workers = 2;
  c.seed = 5;
  c.shuffle_buffer_size = 4;
  c.max_samples_per_sequence = 4;
  c.parallel_slices = 3;
  c.prefetch = 2;
  return c;
}

std::vector<PackedRow> take(DataLoader& l, size_t n) {
  std::vector<PackedRow> out;
  while (out.size() < n) {
    auto row = l.next();
    if (!row) break;
    out.push_back(std::move(*row));
  }
  return out;
}

std::vector<PackedRow> drain(DataLoader& l) { return take(l, size_t(1) << 30); }

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Bit for bit: every field the model or the trainer reads.
bool same_row(const PackedRow& a, const PackedRow& b) {
  return a.input_ids == b.input_ids && a.labels == b.labels && a.cu_seqlens == b.cu_seqlens &&
         a.position_ids == b.position_ids && same_floats(a.pixel_values, b.pixel_values) &&
         a.image_grid_thw == b.image_grid_thw && a.num_patches == b.num_patches &&
         a.patch_dim == b.patch_dim && a.real_tokens == b.real_tokens &&
         a.pad_tokens == b.pad_tokens && a.num_docs == b.num_docs &&
         a.sample_indices == b.sample_indices && a.doc_num_images == b.doc_num_images;
}

void check_well_formed(const PackedRow& r, int64_t seq_len) {
  REQUIRE(int64_t(r.input_ids.size()) == seq_len);
  REQUIRE(r.labels.size() == r.input_ids.size());
  REQUIRE(r.cu_seqlens.front() == 0);
  REQUIRE(r.cu_seqlens.back() == seq_len);
  REQUIRE(r.real_tokens + r.pad_tokens == seq_len);
  REQUIRE(int64_t(r.sample_indices.size()) == r.num_docs);
  REQUIRE(int64_t(r.pixel_values.size()) == r.num_patches * r.patch_dim);
}

std::multiset<int64_t> ids_of(const std::vector<PackedRow>& rows) {
  std::multiset<int64_t> ids;
  for (const PackedRow& r : rows) ids.insert(r.sample_indices.begin(), r.sample_indices.end());
  return ids;
}

std::multiset<int64_t> each_n_times(int64_t count, int n) {
  std::multiset<int64_t> s;
  for (int r = 0; r < n; r++)
    for (int64_t i = 0; i < count; i++) s.insert(i);
  return s;
}

} // namespace

TEST_CASE("loader: every sample exactly once per epoch across the job") {
  TempDir tmp("loader");
  vlm::testing::write_fixture(tmp.path("ds"), dataset({10, 7, 13}, false));
  for (int64_t world : {1, 2, 3, 4})
    for (int64_t threads : {1, 2}) {
      INFO("dp world " << world << ", reader threads " << threads);
      std::vector<PackedRow> all;
      for (int64_t rank = 0; rank < world; rank++) {
        LoaderConfig c = config(tmp.path("ds"));
        c.dp_rank = rank;
        c.dp_world = world;
        c.num_workers = threads;
        c.epochs = 1;
        DataLoader l(c, qwen());
        auto rows = drain(l);
        CHECK(!l.next()); // stays at the end
        CHECK(l.rows() == int64_t(rows.size()));
        for (const PackedRow& r : rows) check_well_formed(r, c.packing.seq_len);
        all.insert(all.end(), rows.begin(), rows.end());
      }
      CHECK(ids_of(all) == each_n_times(30, 1));
    }
  // Fewer samples than global workers: some workers (and rank 3 entirely) own nothing.
  vlm::testing::write_fixture(tmp.path("tiny"), dataset({2, 1}, false));
  std::vector<PackedRow> all;
  for (int64_t rank = 0; rank < 4; rank++) {
    LoaderConfig c = config(tmp.path("tiny"));
    c.dp_rank = rank;
    c.dp_world = 4;
    c.epochs = 1;
    DataLoader l(c, qwen());
    auto rows = drain(l);
    if (rank == 3) CHECK(rows.empty());
    all.insert(all.end(), rows.begin(), rows.end());
  }
  CHECK(ids_of(all) == each_n_times(3, 1));
}

TEST_CASE("loader: several epochs cover every sample once each, in new orders") {
  TempDir tmp("loader");
  vlm::testing::write_fixture(tmp.path("ds"), dataset({6, 9, 5}, true));
  // Packing buffer 1: one sample per row, so the rows show the sampler's order itself.
  LoaderConfig c = config(tmp.path("ds"));
  c.num_workers = 1;
  c.packing.buffer_size = 1;
  c.epochs = 3;
  DataLoader l(c, qwen());
  auto rows = drain(l);
  REQUIRE(rows.size() == 60);
  std::vector<std::vector<int64_t>> epochs(3);
  for (size_t i = 0; i < rows.size(); i++) epochs[i / 20].push_back(rows[i].sample_indices.at(0));
  for (const auto& e : epochs)
    CHECK(std::multiset<int64_t>(e.begin(), e.end()) == each_n_times(20, 1));
  CHECK(epochs[0] != epochs[1]);
  CHECK(epochs[1] != epochs[2]);
  CHECK(epochs[0] != epochs[2]);

  // With packing across epoch boundaries (rows mix epochs), 2 ranks × 2 threads: every sample
  // comes exactly `epochs` times over the job.
  std::vector<PackedRow> all;
  for (int64_t rank = 0; rank < 2; rank++) {
    LoaderConfig d = config(tmp.path("ds"));
    d.dp_world = 2;
    d.dp_rank = rank;
    d.epochs = 2;
    DataLoader ld(d, qwen());
    auto r = drain(ld);
    all.insert(all.end(), r.begin(), r.end());
  }
  CHECK(ids_of(all) == each_n_times(20, 2));
}

TEST_CASE("loader: TP peers get identical rows, DP ranks different ones") {
  TempDir tmp("loader");
  vlm::testing::write_fixture(tmp.path("ds"), dataset({12, 12}, true));
  LoaderConfig c = config(tmp.path("ds"));
  c.dp_world = 2;
  c.dp_rank = 1;
  DataLoader tp0(c, qwen()), tp1(c, qwen()); // two tensor-parallel ranks of dp rank 1
  auto a = take(tp0, 12), b = take(tp1, 12);
  REQUIRE(a.size() == 12);
  REQUIRE(b.size() == 12);
  for (size_t i = 0; i < a.size(); i++) CHECK(same_row(a[i], b[i]));
  CHECK(a[0].num_patches > 0); // images (pixels) are part of the comparison
  c.dp_rank = 0;
  DataLoader other(c, qwen());
  auto o = take(other, 2);
  std::set<int64_t> mine;
  for (const PackedRow& r : a) mine.insert(r.sample_indices.begin(), r.sample_indices.end());
  for (const PackedRow& r : o)
    for (int64_t id : r.sample_indices) CHECK(mine.count(id) == 0);
}

TEST_CASE("loader: recycled pixel buffers do not change the rows") {
  TempDir tmp("loader");
  vlm::testing::write_fixture(tmp.path("ds"), dataset({12, 12}, true));
  LoaderConfig c = config(tmp.path("ds"));
  DataLoader plain(c, qwen()), recycling(c, qwen());
  auto expected = take(plain, 16);
  REQUIRE(expected.size() == 16);
  int64_t with_images = 0;
  for (const PackedRow& want : expected) {
    auto got = recycling.next();
    REQUIRE(got);
    CHECK(same_row(*got, want));
    with_images += got->num_patches > 0;
    recycling.recycle(std::move(*got)); // its buffer now holds this row's pixels: must be reset
  }
  CHECK(with_images > 8);
}

TEST_CASE("loader: drop_images (text models) leaves images out entirely") {
  TempDir tmp("loader");
  vlm::testing::write_fixture(tmp.path("ds"), dataset({12, 12}, true));
  LoaderConfig c = config(tmp.path("ds"));
  c.epochs = 1;
  c.chat.drop_images = true;
  DataLoader l(c, qwen());
  auto rows = drain(l);
  const int32_t pad = qwen().token_to_id("<|image_pad|>"),
                start = qwen().token_to_id("<|vision_start|>");
  int64_t docs = 0;
  for (const PackedRow& r : rows) {
    CHECK(r.num_patches == 0);
    CHECK(r.pixel_values.empty());
    CHECK(r.image_grid_thw.empty());
    CHECK(std::count(r.input_ids.begin(), r.input_ids.end(), pad) == 0);
    CHECK(std::count(r.input_ids.begin(), r.input_ids.end(), start) == 0);
    docs += r.num_docs;
  }
  CHECK(docs == 24); // every sample still trains (its answer or caption)
}

TEST_CASE("loader: resume yields exactly the rows of an uninterrupted run") {
  TempDir tmp("loader");
  vlm::testing::write_fixture(tmp.path("ds"), dataset({9, 6, 11, 8}, true));
  LoaderConfig c = config(tmp.path("ds"));
  DataLoader ref(c, qwen());
  const size_t kMore = 12;
  auto rows = take(ref, 24 + kMore);
  REQUIRE(rows.size() == 24 + kMore);

  bool saw_buffers = false, crossed_epoch = false;
  for (size_t n : {size_t(0), size_t(3), size_t(7), size_t(13), size_t(24)}) {
    INFO("saved after " << n << " rows");
    DataLoader a(c, qwen());
    take(a, n);
    LoaderState st = a.state();
    CHECK(st.rows == int64_t(n));
    for (const auto& w : st.workers)
      saw_buffers = saw_buffers || (!w.packer_buffer.empty() && !w.sampler.shuffle_buffer.empty());
    std::string bytes = st.serialize(); // what a checkpoint stores

    DataLoader b(c, qwen());
    b.restore(LoaderState::deserialize(bytes));
    auto more = take(b, kMore);
    REQUIRE(more.size() == kMore);
    for (size_t i = 0; i < kMore; i++) CHECK(same_row(more[i], rows[n + i]));
    CHECK(b.rows() == int64_t(n + kMore));
    for (size_t w = 0; w < st.workers.size(); w++)
      crossed_epoch =
          crossed_epoch || b.state().workers[w].sampler.epoch > st.workers[w].sampler.epoch;

    // Restoring a loader that already ran (threads running, rows prefetched) works the same.
    take(a, 5);
    a.restore(st);
    auto again = take(a, 4);
    for (size_t i = 0; i < again.size(); i++) CHECK(same_row(again[i], rows[n + i]));
  }
  CHECK(saw_buffers);   // some save had both a shuffle buffer and a packing buffer in flight
  CHECK(crossed_epoch); // some resumed run went on into a new epoch
}

TEST_CASE("loader: restore refuses a state of another configuration") {
  TempDir tmp("loader");
  vlm::testing::write_fixture(tmp.path("ds"), dataset({8, 8}, false));
  LoaderConfig c = config(tmp.path("ds"));
  DataLoader a(c, qwen());
  take(a, 2);
  LoaderState st = a.state();
  LoaderConfig d = c;
  d.seed = 6;
  d.packing.seq_len = 300;
  DataLoader b(d, qwen());
  std::string err = error_of([&] { b.restore(st); });
  CHECK_THAT(err, Contains("another data configuration"));
  CHECK_THAT(err, Contains("seed"));
  CHECK_THAT(err, Contains("seq_len"));
  CHECK_THAT(error_of([&] { LoaderState::deserialize("{\"format\": 1}"); }),
             Contains("loader state"));
}

TEST_CASE("loader: bad samples are skipped, counted by reason and reported") {
  TempDir tmp("loader");
  FixtureDataset ds = dataset({10, 6}, true);
  auto& s0 = ds.shards[0].samples;
  s0[2].parts[0].data = "{\"conversations\": [{\"from\": \"human\"";           // invalid JSON
  s0[4].parts[0].data = "{\"conversations\": []}";                             // empty conversation
  s0[6].parts[1] = {"png", vlm::testing::read_file(kImages + "bad_zlib.png")}; // corrupt image
  s0[7].parts[1] = {"jpg", vlm::testing::read_file(kImages + "bad_truncated.jpg")};
  s0[8].parts[1] = {"jpg", vlm::testing::read_file(kImages + "tiny_20x20.jpg")}; // a good JPEG
  ds.shards[1].damage = Damage::truncated_consistent; // its last tar member is cut short
  ds.exclude = {"shards/shard_000000.tar/000009"};
  vlm::testing::write_fixture(tmp.path("ds"), ds);

  LoaderConfig c = config(tmp.path("ds"));
  c.epochs = 1;
  DataLoader l(c, qwen());
  auto rows = drain(l);
  std::set<int64_t> expect;
  for (int64_t i = 0; i < 16; i++)
    if (i != 2 && i != 4 && i != 6 && i != 7 && i != 9 && i != 15) expect.insert(i);
  auto got = ids_of(rows);
  CHECK(std::set<int64_t>(got.begin(), got.end()) == expect);
  CHECK(got.size() == expect.size());

  vlm::io::SkipReport rep = l.report();
  CHECK(rep.counts == std::map<std::string, int64_t>{{"chat:invalid_json", 1},
                                                     {"chat:empty_conversation", 1},
                                                     {"image:corrupt", 1},
                                                     {"image:truncated", 1},
                                                     {"read:truncated", 1}});
  CHECK(rep.total() == 5);
  CHECK(rep.excluded == 1);
  REQUIRE(rep.examples.size() == 5);
  std::map<std::string, vlm::io::SkipExample> by_reason;
  for (const auto& e : rep.examples) by_reason[e.reason] = e;
  CHECK(by_reason["chat:invalid_json"].key == "000002");
  CHECK(by_reason["chat:invalid_json"].shard == "shards/shard_000000.tar");
  CHECK(by_reason["image:corrupt"].key == "000006");
  CHECK_THAT(by_reason["image:corrupt"].message, Contains("png"));
  CHECK(by_reason["read:truncated"].shard == "shards/shard_000001.tar");
  CHECK(by_reason["read:truncated"].sample_id == 15);
  std::string summary = rep.summary();
  CHECK_THAT(summary, Contains("5 samples skipped"));
  CHECK_THAT(summary, Contains("chat:empty_conversation: 1"));
  CHECK_THAT(summary, Contains("000004"));

  // Fewer examples kept when asked; the counts stay complete.
  c.report_examples = 2;
  DataLoader l2(c, qwen());
  drain(l2);
  CHECK(l2.report().examples.size() == 2);
  CHECK(l2.report().total() == 5);
}

TEST_CASE("loader: whole-dataset problems are clear errors at construction") {
  TempDir tmp("loader");
  FixtureDataset no_meta = dataset({3}, false);
  no_meta.write_nv_meta = false;
  vlm::testing::write_fixture(tmp.path("no_meta"), no_meta);
  vlm::testing::write_fixture(tmp.path("ok"), dataset({3}, false));
  FixtureDataset no_index = dataset({3}, false);
  no_index.shards[0].damage = Damage::missing_index;
  vlm::testing::write_fixture(tmp.path("no_index"), no_index);

  LoaderConfig c = config(tmp.path("no_meta"));
  CHECK_THAT(error_of([&] { DataLoader l(c, qwen()); }), Contains(".nv-meta"));
  c = config(tmp.path("missing"));
  CHECK_THAT(error_of([&] { DataLoader l(c, qwen()); }), Contains("neither a prepared dataset"));
  c = config(tmp.path("no_index"));
  CHECK_THAT(error_of([&] { DataLoader l(c, qwen()); }), Contains(".tar.idx"));
  c = config(tmp.path("ok"));
  c.split = "val";
  CHECK_THAT(error_of([&] { DataLoader l(c, qwen()); }), Contains("val"));
  c = config(tmp.path("ok"));
  c.tokenizer = tmp.path("nothing_here");
  CHECK_THAT(error_of([&] { DataLoader l(c); }), Contains("tokenizer"));
  c = config(tmp.path("ok"));
  c.packing.image_token_id = 5;
  CHECK_THAT(error_of([&] { DataLoader l(c, qwen()); }), Contains("image_token_id"));
  c = config(tmp.path("ok"));
  c.num_workers = 0;
  CHECK_THAT(error_of([&] { DataLoader l(c, qwen()); }), Contains("num_workers"));
  c.num_workers = 100000; // would spend minutes building samplers: a stated bound
  CHECK_THAT(error_of([&] { DataLoader l(c, qwen()); }),
             Contains("num_workers must be in [1, 256]"));
  // An empty split (`test: []`) opens; reading from it is refused with the reason.
  FixtureDataset with_empty = dataset({3}, false);
  with_empty.splits.push_back({"test", {}});
  vlm::testing::write_fixture(tmp.path("empty_split"), with_empty);
  c = config(tmp.path("empty_split"));
  c.split = "test";
  CHECK_THAT(error_of([&] { DataLoader l(c, qwen()); }),
             Contains("split 'test' is empty: no shards listed"));
}

TEST_CASE("loader: a worker error is re-thrown by next() with context") {
  TempDir tmp("loader");
  FixtureDataset ds = dataset({8}, false);
  ds.shards[0].samples[3].parts[0].data = "{\"conversations\": []}";
  vlm::testing::write_fixture(tmp.path("ds"), ds);
  LoaderConfig c = config(tmp.path("ds"));
  c.num_workers = 1;
  DataLoader a(c, qwen());
  LoaderState st = a.state();
  // A state whose packing buffer holds a sample that is unusable now (as after the data
  // changed under a checkpoint).
  st.workers[0].packer_buffer = {3};
  DataLoader b(c, qwen());
  b.restore(st);
  std::string err = error_of([&] { b.next(); });
  CHECK_THAT(err, Contains("reader worker 0"));
  CHECK_THAT(err, Contains("sample id 3"));
  CHECK_THAT(err, Contains("empty_conversation"));
  CHECK_THAT(error_of([&] { b.next(); }), Contains("reader worker 0")); // stays failed
}

TEST_CASE("loader: a rank whose every sample is bad fails with the skip report") {
  TempDir tmp("loader");
  FixtureDataset ds = dataset({4}, false);
  for (auto& s : ds.shards[0].samples) s.parts[0].data = "not json";
  vlm::testing::write_fixture(tmp.path("ds"), ds);
  LoaderConfig c = config(tmp.path("ds")); // epochs = 0: would loop forever without the guard
  DataLoader l(c, qwen());
  std::string err = error_of([&] { l.next(); });
  CHECK_THAT(err, Contains("no usable sample"));
  CHECK_THAT(err, Contains("chat:invalid_json"));
}

TEST_CASE("loader: validation order is sequential per worker, round robin over workers") {
  TempDir tmp("loader");
  vlm::testing::write_fixture(tmp.path("ds"), dataset({5, 5}, false));
  LoaderConfig c = config(tmp.path("ds"));
  c.training = false;
  c.epochs = 1;
  c.packing.buffer_size = 1;
  DataLoader l(c, qwen());
  std::vector<int64_t> ids;
  for (const PackedRow& r : drain(l)) ids.push_back(r.sample_indices.at(0));
  CHECK(ids == std::vector<int64_t>{0, 5, 1, 6, 2, 7, 3, 8, 4, 9});
}

TEST_CASE("loader: offline packing plan: coverage, resume, identity check") {
  TempDir tmp("loader");
  vlm::testing::write_fixture(tmp.path("ds"), dataset({10, 9, 7}, true));
  LoaderConfig c = config(tmp.path("ds"));
  vlm::io::SkipReport scan_report;
  std::vector<int32_t> lengths = vlm::io::scan_sample_lengths(c, 2, &scan_report, &qwen());
  REQUIRE(lengths.size() == 26);
  for (int32_t n : lengths) CHECK(n > 0);
  CHECK(scan_report.total() == 0);
  vlm::io::PlanOptions opt;
  opt.seed = 3;
  vlm::io::PackingPlan plan = vlm::io::write_packing_plan(tmp.path("plan.bin"), lengths,
                                                          vlm::io::loader_plan_identity(c), opt);
  c.packing_plan = tmp.path("plan.bin");

  // Every plan row exactly once per epoch over 2 ranks × 2 threads, as the plan packed it.
  std::multiset<std::vector<int64_t>> planned, got;
  for (int64_t r = 0; r < plan.num_rows(); r++)
    planned.insert(std::vector<int64_t>(plan.row(r).begin(), plan.row(r).end()));
  for (int64_t rank = 0; rank < 2; rank++) {
    LoaderConfig d = c;
    d.dp_world = 2;
    d.dp_rank = rank;
    d.epochs = 1;
    DataLoader l(d, qwen());
    for (const PackedRow& row : drain(l)) {
      check_well_formed(row, d.packing.seq_len);
      got.insert(row.sample_indices);
    }
  }
  CHECK(got == planned);

  // Resume.
  DataLoader ref(c, qwen());
  auto rows = take(ref, 10);
  DataLoader a(c, qwen());
  take(a, 4);
  DataLoader b(c, qwen());
  b.restore(LoaderState::deserialize(a.state().serialize()));
  auto more = take(b, 6);
  for (size_t i = 0; i < more.size(); i++) CHECK(same_row(more[i], rows[4 + i]));

  // A plan made for another seq_len (or tokenizer, images, data) is refused up front.
  LoaderConfig other = c;
  other.packing.seq_len = 300;
  CHECK_THAT(error_of([&] { DataLoader l(other, qwen()); }), Contains("seq_len"));
  other = c;
  other.image.max_pixels = 128 * 128;
  CHECK_THAT(error_of([&] { DataLoader l(other, qwen()); }), Contains("made for other data"));
}

TEST_CASE("loader: metadataset blend draws from its datasets by weight") {
  TempDir tmp("loader");
  vlm::testing::write_fixture(tmp.path("dsA"), dataset({10, 10}, false));
  vlm::testing::write_fixture(tmp.path("dsB"), dataset({12}, true));
  vlm::testing::write_file(tmp.path("mix.yaml"), R"(__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
    - weight: 3
      path: ./dsA
    - weight: 1
      path: ./dsB
      subset: {range: [0, 6]}
)");
  LoaderConfig c = config(tmp.path("mix.yaml"));
  DataLoader l(c, qwen());
  std::map<int64_t, int64_t> per_source;
  auto rows = take(l, 60);
  for (const PackedRow& r : rows)
    for (int64_t id : r.sample_indices) {
      int64_t src = vlm::io::sample_id_source(id), index = vlm::io::sample_id_index(id);
      per_source[src]++;
      CHECK(index < (src == 0 ? 20 : 6));
    }
  REQUIRE(per_source.size() == 2);
  double share = double(per_source[0]) / double(per_source[0] + per_source[1]);
  CHECK(share > 0.65);
  CHECK(share < 0.85);
  // Resume works through a blend too.
  DataLoader a(c, qwen());
  take(a, 9);
  DataLoader b(c, qwen());
  b.restore(a.state());
  auto more = take(b, 5);
  for (size_t i = 0; i < more.size(); i++) CHECK(same_row(more[i], rows[9 + i]));
}
