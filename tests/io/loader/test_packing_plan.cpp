// Offline packing plans (io/loader/packing_plan.h): coverage, round trip, replay, damaged files.
#include "tests/io/loader/packing_fixtures.h"

TEST_CASE("packing: offline plan covers the split once, round-trips and replays") {
  const int64_t seq_len = 256, n = 700;
  PackingConfig cfg = small_config(seq_len);
  std::vector<int32_t> lengths(n);
  for (int64_t g = 0; g < n; g++)
    lengths[size_t(g)] = vlm::io::scan_length(random_sample(g, seq_len), cfg);
  const int64_t skipped = std::count(lengths.begin(), lengths.end(), 0);
  REQUIRE(skipped > 0);

  PlanIdentity id{
      "/data/fx", "train", n, seq_len, OverlongPolicy::truncate, {{"tokenizer", "abc"}}};
  for (int64_t window : {int64_t(0), int64_t(64)}) {
    INFO("window " << window);
    PackingPlan plan = PackingPlan::build(lengths, id, {window, true, 7});
    std::vector<int> seen(size_t(n), 0);
    int64_t real = 0;
    for (int64_t r = 0; r < plan.num_rows(); r++) {
      auto idx = plan.row(r);
      auto len = plan.row_lengths(r);
      REQUIRE(std::is_sorted(idx.begin(), idx.end()));
      int64_t sum = 0;
      for (size_t k = 0; k < idx.size(); k++) {
        seen[size_t(idx[k])]++;
        CHECK(len[k] == lengths[size_t(idx[k])]);
        sum += len[k];
      }
      CHECK(sum <= seq_len);
      real += sum;
    }
    for (int64_t g = 0; g < n; g++) CHECK(seen[size_t(g)] == (lengths[size_t(g)] > 0 ? 1 : 0));
    CHECK(plan.num_skipped() == skipped);
    CHECK(plan.real_tokens() == real);
    CHECK(plan.efficiency() > 0.95);
  }

  // Deterministic; the seed only permutes rows.
  PackingPlan p1 = PackingPlan::build(lengths, id, {0, true, 7});
  PackingPlan p2 = PackingPlan::build(lengths, id, {0, true, 7});
  PackingPlan p3 = PackingPlan::build(lengths, id, {0, true, 8});
  std::vector<std::vector<int64_t>> r1, r3;
  for (int64_t r = 0; r < p1.num_rows(); r++) {
    auto a = p1.row(r), b = p2.row(r), c = p3.row(r);
    CHECK(std::vector<int64_t>(a.begin(), a.end()) == std::vector<int64_t>(b.begin(), b.end()));
    r1.emplace_back(a.begin(), a.end());
    r3.emplace_back(c.begin(), c.end());
  }
  CHECK(r1 != r3);
  std::sort(r1.begin(), r1.end());
  std::sort(r3.begin(), r3.end());
  CHECK(r1 == r3);

  // Save, load: the same plan.
  TempDir tmp;
  const std::string path = tmp.file("train.plan");
  PackingPlan written = vlm::io::write_packing_plan(path, lengths, id, {0, true, 7});
  CHECK(!fs::exists(path + ".tmp"));
  PackingPlan loaded = PackingPlan::load(path);
  REQUIRE(loaded.num_rows() == written.num_rows());
  for (int64_t r = 0; r < loaded.num_rows(); r++) {
    auto a = loaded.row(r), b = written.row(r);
    REQUIRE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
    auto la = loaded.row_lengths(r), lb = written.row_lengths(r);
    REQUIRE(std::equal(la.begin(), la.end(), lb.begin(), lb.end()));
  }
  CHECK(loaded.identity().fingerprint == id.fingerprint);
  CHECK(loaded.options().seed == 7);
  CHECK(loaded.real_tokens() == written.real_tokens());
  CHECK_NOTHROW(loaded.check_identity(id));
  PlanIdentity other = id;
  other.split = "val";
  other.seq_len = 512;
  other.fingerprint["tokenizer"] = "xyz";
  other.fingerprint["max_pixels"] = "1048576";
  std::string err = error_of([&] { loaded.check_identity(other); });
  CHECK_THAT(err, Contains("re-run `vlmtrain data pack`"));
  CHECK_THAT(err, Contains("split: plan has train, expected val"));
  CHECK_THAT(err, Contains("seq_len: plan has 256, expected 512"));
  CHECK_THAT(err, Contains("fingerprint.tokenizer: plan has 'abc', expected 'xyz'"));
  CHECK_THAT(err, Contains("fingerprint.max_pixels: plan has (missing), expected '1048576'"));
  CHECK_THAT(err, !Contains("dataset:"));

  // Replay: re-read samples, prepare, check the planned lengths, pack.
  std::map<int64_t, TokenizedSample> prepared;
  for (int64_t r = 0; r < loaded.num_rows(); r++) {
    std::vector<TokenizedSample> samples;
    for (int64_t g : loaded.row(r)) {
      samples.push_back(random_sample(g, seq_len));
      TokenizedSample s = random_sample(g, seq_len);
      vlm::io::prepare_sample(s, cfg);
      prepared[g] = s;
    }
    check_row(loaded.pack(r, samples, cfg), cfg, prepared);
  }
  // A row whose first sample was unreadable (left out by the loader) still packs.
  int64_t r2 = 0;
  while (loaded.row(r2).size() < 2) r2++;
  std::vector<TokenizedSample> partial;
  for (int64_t g : loaded.row(r2).subspan(1)) partial.push_back(random_sample(g, seq_len));
  CHECK(loaded.pack(r2, partial, cfg).num_docs == int64_t(loaded.row(r2).size()) - 1);
  // A sample whose length changed (say, a new tokenizer) is a stale plan.
  std::vector<TokenizedSample> stale;
  for (int64_t g : loaded.row(r2)) stale.push_back(random_sample(g, seq_len));
  stale[0].input_ids.insert(stale[0].input_ids.begin(), 5);
  stale[0].labels.insert(stale[0].labels.begin(), 5);
  if (stale[0].length() > seq_len) stale[0] = make_sample(stale[0].global_index, {txt(1)});
  CHECK_THROWS_WITH(loaded.pack(r2, stale, cfg), Contains("but the plan expects"));
  std::reverse(stale.begin(), stale.end());
  CHECK_THROWS_WITH(loaded.pack(r2, stale, cfg), Contains("not in the row or out of row order"));
  PackingConfig cfg512 = cfg;
  cfg512.seq_len = 512;
  CHECK_THROWS_WITH(loaded.pack(0, {}, cfg512), Contains("replayed with seq_len 512"));

  // Bad inputs to build.
  std::vector<int32_t> bad = lengths;
  bad[3] = int32_t(seq_len + 1);
  CHECK_THROWS_WITH(PackingPlan::build(bad, id, {}),
                    Contains("global index 3 has scan length 257"));
  bad.pop_back();
  CHECK_THROWS_WITH(PackingPlan::build(bad, id, {}),
                    Contains("lengths for a split of sample_count"));
}

TEST_CASE("packing: plan load rejects damaged files") {
  TempDir tmp;
  const std::string path = tmp.file("p.plan");
  std::vector<int32_t> lengths{5, 3, 0, 8, 2, 7, 6, 1};
  PlanIdentity id{"ds", "train", 8, 10, OverlongPolicy::drop, {}};
  vlm::io::write_packing_plan(path, lengths, id, {0, false, 0});
  const std::string good = read_bytes(path);
  const std::string bad_path = tmp.file("bad.plan");
  auto load_error = [&](const std::string& bytes) {
    write_bytes(bad_path, bytes);
    return error_of([&] { PackingPlan::load(bad_path); });
  };
  REQUIRE(load_error(good).empty());
  CHECK(PackingPlan::load(path).identity().overlong == OverlongPolicy::drop);

  CHECK_THAT(error_of([&] { PackingPlan::load(tmp.file("missing.plan")); }),
             Contains("missing.plan") && Contains("cannot open"));
  std::string b = good;
  b[0] = 'X';
  CHECK_THAT(load_error(b), Contains("bad.plan") && Contains("bad magic"));
  CHECK_THAT(load_error(good.substr(0, good.size() - 1)), Contains("truncated or corrupted"));
  b = good;
  b[b.size() - 5] ^= 1; // a length byte
  CHECK_THAT(load_error(b), Contains("checksum"));
  b = good;
  auto at = b.find("\"version\":1");
  REQUIRE(at != std::string::npos);
  b[at + 10] = '2';
  CHECK_THAT(load_error(b), Contains("format version 2"));
  b = good;
  at = b.find("\"seq_len\":10");
  REQUIRE(at != std::string::npos);
  b.replace(at, 12, "\"seq_len\":\"x");
  CHECK_THAT(load_error(b), Contains("bad header"));

  // A structurally wrong body with a valid checksum: duplicate global index.
  uint64_t hlen = 0;
  std::memcpy(&hlen, good.data() + 8, 8);
  const size_t body = 16 + size_t(hlen);
  PackingPlan plan = PackingPlan::load(path);
  const size_t rows = size_t(plan.num_rows()), idx_at = body + (rows + 1) * 8;
  b = good;
  std::memcpy(&b[idx_at + 8], &b[idx_at], 8); // entry 1 := entry 0
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = body; i < b.size(); i++) h = (h ^ uint8_t(b[i])) * 0x100000001b3ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  at = b.find("\"body_fnv1a64\":\"");
  REQUIRE(at != std::string::npos);
  b.replace(at + 16, 16, hex);
  std::string err = load_error(b);
  CHECK_THAT(err, Contains("appears in more than one place"));
}
