// The per-worker sample order (io/energon/sampler.h): the partition against megatron-energon's own
// Sharder output (tests/data/sampler/sharder_vectors.json, tools/golden/gen_sampler.py),
// exactly-once coverage per epoch over every (rank, worker) of a job, different orders per epoch,
// identical streams for TP peers, validation order, empty workers, blends, and exact
// save/restore (through JSON) at every kind of position.
#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "io/energon/sampler.h"
#include "src/base/check.h"

using Catch::Matchers::Contains;
using vlm::io::BlendMode;
using vlm::io::Sampler;
using vlm::io::SamplerConfig;
using vlm::io::SamplerSource;
using vlm::io::SamplerState;

namespace {

nlohmann::json load_vectors() {
  std::ifstream f(VLM_SOURCE_DIR "/tests/data/sampler/sharder_vectors.json");
  REQUIRE(f.good());
  return nlohmann::json::parse(f);
}

SamplerConfig base_config(std::vector<int64_t> counts) {
  SamplerConfig c;
  c.sources = {SamplerSource{std::move(counts)}};
  c.seed = 7;
  c.shuffle_buffer_size = 5;
  c.max_samples_per_sequence = 3;
  c.parallel_slices = 2;
  return c;
}

// The ids a sampler returns in its first `epochs` epochs, grouped by epoch.
std::vector<std::vector<int64_t>> run_epochs(Sampler& s, int64_t epochs) {
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(epochs));
  for (;;) {
    auto id = s.next();
    if (!id || s.epoch() >= epochs) break;
    out[size_t(s.epoch())].push_back(*id);
  }
  return out;
}

std::vector<int64_t> take(Sampler& s, int64_t n) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; i++) {
    auto id = s.next();
    if (!id) break;
    out.push_back(*id);
  }
  return out;
}

SamplerState json_round_trip(const SamplerState& s) {
  return SamplerState::from_json(nlohmann::json::parse(s.to_json().dump()));
}

} // namespace

TEST_CASE("sampler: partition matches energon's Sharder") {
  nlohmann::json v = load_vectors();
  for (const auto& [n, expected] : v.at("bit_reversal").items())
    CHECK(vlm::io::generalized_bit_reversal(std::stoll(n)) == expected.get<std::vector<int64_t>>());
  int cases = 0;
  for (const auto& c : v.at("cases")) {
    auto counts = c.at("shard_counts").get<std::vector<int64_t>>();
    int64_t msps = c.at("max_samples_per_sequence").is_null()
                       ? 0
                       : c.at("max_samples_per_sequence").get<int64_t>();
    int64_t world = c.at("world_size").get<int64_t>();
    for (int64_t rank = 0; rank < world; rank++) {
      INFO("case " << c.at("name").get<std::string>() << " rank " << rank);
      auto got = vlm::io::shard_rank_workers(
          counts, c.at("start").get<int64_t>(), c.at("end").get<int64_t>(), rank, world,
          c.at("num_workers").get<int64_t>(), msps, c.at("rotation_offset").get<int64_t>());
      CHECK(got == c.at("ranks").at(size_t(rank)).get<std::vector<std::vector<int64_t>>>());
    }
    cases++;
  }
  CHECK(cases >= 300);
}

TEST_CASE("sampler: every sample exactly once per epoch across the job") {
  // 3 shards (boundaries inside worker ranges), msps cuts, a shuffle buffer and several open
  // slices: for each job layout, the union over all (rank, worker) streams of each epoch is the
  // whole split, each index once; per epoch the order differs.
  const std::vector<int64_t> counts{13, 7, 17};
  const int64_t total = 37, epochs = 3;
  for (int64_t world : {1, 2, 3, 4})
    for (int64_t workers : {1, 2})
      for (int64_t buffer : {0, 5}) {
        INFO("world " << world << " workers " << workers << " buffer " << buffer);
        std::vector<std::multiset<int64_t>> per_epoch(epochs);
        std::vector<std::vector<int64_t>> job_order(epochs); // all workers' streams, concatenated
        int64_t owned = 0;
        for (int64_t r = 0; r < world; r++)
          for (int64_t w = 0; w < workers; w++) {
            SamplerConfig c = base_config(counts);
            c.dp_rank = r;
            c.dp_world = world;
            c.worker = w;
            c.num_workers = workers;
            c.shuffle_buffer_size = buffer;
            c.epochs = epochs;
            Sampler s(c);
            owned += s.num_samples();
            auto e = run_epochs(s, epochs);
            CHECK(!s.next()); // `epochs` ends the stream
            for (int64_t k = 0; k < epochs; k++) {
              CHECK(int64_t(e[size_t(k)].size()) == s.num_samples());
              per_epoch[size_t(k)].insert(e[size_t(k)].begin(), e[size_t(k)].end());
              job_order[size_t(k)].insert(job_order[size_t(k)].end(), e[size_t(k)].begin(),
                                          e[size_t(k)].end());
            }
          }
        CHECK(owned == total);
        for (int64_t k = 0; k < epochs; k++) {
          std::multiset<int64_t> all;
          for (int64_t i = 0; i < total; i++) all.insert(i);
          CHECK(per_epoch[size_t(k)] == all);
        }
        // A new order every epoch (tiny workers may repeat theirs; the job as a whole does not).
        CHECK(std::set<std::vector<int64_t>>(job_order.begin(), job_order.end()).size() ==
              size_t(epochs));
      }
}

TEST_CASE("sampler: TP peers get identical streams, DP ranks disjoint ones") {
  SamplerConfig c = base_config({40, 25});
  c.dp_world = 2;
  c.num_workers = 2;
  c.worker = 1;
  Sampler tp0(c), tp1(c); // two tensor-parallel ranks of dp_rank 0: the same config
  auto a = take(tp0, 200), b = take(tp1, 200);
  CHECK(a == b);
  c.dp_rank = 1;
  Sampler other(c);
  auto o = take(other, 16);
  std::set<int64_t> sa(a.begin(), a.end());
  for (int64_t id : o) CHECK(sa.count(id) == 0);
}

TEST_CASE("sampler: seeds change the order, not the set") {
  SamplerConfig c = base_config({30});
  c.epochs = 1;
  Sampler s1(c);
  c.seed = 8;
  Sampler s2(c);
  auto a = take(s1, 100), b = take(s2, 100);
  CHECK(a != b);
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  CHECK(a == b);
}

TEST_CASE("sampler: open slices are read sequentially") {
  // One open slice and no buffer: the stream is whole slices, one after the other, in an order
  // that changes per epoch.
  SamplerConfig c = base_config({10, 10, 10});
  c.shuffle_buffer_size = 0;
  c.parallel_slices = 1;
  c.max_samples_per_sequence = 4;
  c.epochs = 2;
  Sampler s(c);
  const auto& sl = s.slices(0);
  REQUIRE(sl == std::vector<int64_t>{0, 5, 10, 15, 20, 25, 30}); // 10 > 6 -> round(2.5) = 2
  auto e = run_epochs(s, 2);
  for (const auto& ep : e) {
    REQUIRE(ep.size() == 30);
    for (size_t i = 0; i < ep.size(); i += 5) {
      CHECK(ep[i] % 5 == 0);
      for (size_t k = 1; k < 5; k++) CHECK(ep[i + k] == ep[i] + int64_t(k));
    }
  }
  CHECK(e[0] != e[1]);
}

TEST_CASE("sampler: validation order is sequential") {
  SamplerConfig c = base_config({6, 5});
  c.shuffle = false;
  c.dp_world = 2;
  c.dp_rank = 1;
  c.epochs = 2;
  Sampler s(c);
  // 11 samples over 2 workers: bit-reversal gives worker 0 the extra one -> rank 1 owns [6, 11).
  auto e = run_epochs(s, 2);
  CHECK(e[0] == std::vector<int64_t>{6, 7, 8, 9, 10});
  CHECK(e[1] == e[0]);
}

TEST_CASE("sampler: a worker may own no sample") {
  SamplerConfig c = base_config({3});
  c.dp_world = 4;
  c.dp_rank = 3; // 3 samples over 4 workers
  Sampler s(c);
  CHECK(s.num_samples() == 0);
  CHECK(!s.next());
  CHECK(s.slices(0) == std::vector<int64_t>{3});
  Sampler copy(c);
  copy.restore(json_round_trip(s.state()));
  CHECK(!copy.next());
}

TEST_CASE("sampler: restore continues exactly") {
  // Save at every position of the first 2.5 epochs (mid-slice, shuffle buffer full or draining,
  // right at an epoch boundary), restore into a fresh sampler through JSON, and compare the next
  // 40 ids with the uninterrupted stream.
  SamplerConfig c = base_config({9, 4, 11});
  c.parallel_slices = 3;
  c.shuffle_buffer_size = 6;
  c.num_workers = 2;
  c.worker = 1;
  Sampler ref(c);
  const int64_t n = ref.num_samples();
  REQUIRE(n == 12);
  std::vector<int64_t> stream = take(ref, 5 * n / 2 + 40);
  Sampler live(c);
  bool saw_draining = false, saw_full_buffer = false;
  for (int64_t k = 0; k < 5 * n / 2; k++) {
    SamplerState st = live.state();
    saw_draining = saw_draining || (st.draining && !st.shuffle_buffer.empty());
    saw_full_buffer = saw_full_buffer || st.shuffle_buffer.size() == 5;
    Sampler resumed(c);
    resumed.restore(json_round_trip(st));
    CHECK(resumed.epoch() == live.epoch());
    auto next = take(resumed, 40);
    CHECK(std::equal(next.begin(), next.end(), stream.begin() + k));
    live.next();
  }
  CHECK(saw_draining);
  CHECK(saw_full_buffer);
}

TEST_CASE("sampler: restore refuses a state from another layout") {
  SamplerConfig c = base_config({20});
  Sampler a(c);
  take(a, 3);
  SamplerState st = a.state();
  c.num_workers = 2;
  Sampler b(c);
  CHECK_THROWS_WITH(b.restore(st), Contains("another configuration"));
  c = base_config({20});
  c.seed = 99;
  Sampler d(c);
  CHECK_THROWS_WITH(d.restore(st), Contains("another configuration"));
  CHECK_THROWS_WITH(SamplerState::from_json(nlohmann::json::parse("{\"layout\": 1}")),
                    Contains("malformed"));
}

TEST_CASE("sampler: weighted blend draws in proportion and never ends") {
  SamplerConfig c;
  c.sources = {SamplerSource{{50}, 0, -1, 3.0}, SamplerSource{{50}, 0, 20, 1.0}};
  c.blend = BlendMode::weights;
  c.seed = 3;
  c.shuffle_buffer_size = 10;
  Sampler s(c);
  std::map<int64_t, int64_t> per_source;
  for (int64_t id : take(s, 4000)) {
    per_source[vlm::io::sample_id_source(id)]++;
    if (vlm::io::sample_id_source(id) == 1) CHECK(vlm::io::sample_id_index(id) < 20); // subset
  }
  CHECK(per_source[0] + per_source[1] == 4000);
  CHECK(std::abs(double(per_source[0]) / 4000.0 - 0.75) < 0.03);
  SamplerConfig bad = c;
  bad.epochs = 1;
  CHECK_THROWS_WITH(Sampler(bad), Contains("no epochs"));
}

TEST_CASE("sampler: epochized blend gives exact counts per meta-epoch") {
  SamplerConfig c;
  c.sources = {SamplerSource{{10}, 0, -1, 1.0, 2.0}, SamplerSource{{8}, 0, -1, 1.0, 0.5}};
  c.blend = BlendMode::repetitions;
  c.shuffle_buffer_size = 4;
  c.epochs = 2;
  c.max_samples_per_sequence = 2;
  Sampler s(c);
  auto e = run_epochs(s, 2);
  CHECK(!s.next());
  for (const auto& ep : e) {
    std::map<int64_t, int64_t> count;
    for (int64_t id : ep) count[id]++;
    int64_t from0 = 0, from1 = 0;
    for (auto [id, k] : count) {
      if (vlm::io::sample_id_source(id) == 0) {
        CHECK(k == 2); // repetitions 2: every sample twice
        from0 += k;
      } else {
        CHECK(k == 1); // 0.5: half of the source, no sample twice
        from1 += k;
      }
    }
    CHECK(from0 == 20);
    CHECK(from1 == 4);
  }
}

TEST_CASE("sampler: rejects bad configs with clear messages") {
  SamplerConfig c = base_config({5});
  c.dp_rank = 2;
  c.dp_world = 2;
  CHECK_THROWS_WITH(Sampler(c), Contains("dp_rank 2"));
  c = base_config({5});
  c.sources[0].end = 9;
  CHECK_THROWS_WITH(Sampler(c), Contains("subset"));
  c = base_config({5});
  c.sources.push_back(c.sources[0]);
  CHECK_THROWS_WITH(Sampler(c), Contains("blend mode"));
}
