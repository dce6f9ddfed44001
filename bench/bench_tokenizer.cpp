// Tokenizer encode throughput, single thread: every line of a corpus file encoded as one
// document (as the loader does with samples). bench/bench_tokenizer.sh runs it beside HF
// `tokenizers` on the same corpus and prints the ratio.
//   bench_tokenizer --tokenizer PATH --corpus FILE [--reps N]   (--help: defaults)
// Prints the first (cold word cache) pass and the best of N warm passes, in MB/s of UTF-8 input
// per CPU second of the process (steadier than wall time on a busy machine), and the token count
// (the same as HF's when the ids agree).
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_main.h"
#include "bench/record.h"
#include "io/text/tokenizer.h"
#include "src/base/check.h"

namespace {

struct Pass {
  double seconds;
  size_t tokens;
};

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

Pass encode_all(const vlm::io::Tokenizer& tok, const std::vector<std::string_view>& docs) {
  const double t0 = cpu_seconds();
  size_t tokens = 0;
  for (std::string_view d : docs) tokens += tok.encode(d).size();
  return {cpu_seconds() - t0, tokens};
}

struct Options {
  std::string tokenizer_path, corpus_path;
  int64_t reps = 3;
};

void add_options(CLI::App& app, Options& o) {
  vlm::cli::show_defaults(app);
  app.add_option("--tokenizer", o.tokenizer_path, "tokenizer.json")->required();
  app.add_option("--corpus", o.corpus_path, "the text, one document a line")->required();
  app.add_option("--reps", o.reps, "warm passes (the best one is reported)")
      ->check(vlm::cli::at_least(1));
}

int run(const Options& o) {
  std::ifstream f(o.corpus_path, std::ios::binary);
  VLM_CHECK(f, "bench_tokenizer: cannot open corpus '", o.corpus_path, "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  const std::string corpus = ss.str();
  std::vector<std::string_view> docs;
  for (size_t start = 0; start <= corpus.size();) {
    size_t end = corpus.find('\n', start);
    if (end == std::string::npos) end = corpus.size();
    docs.push_back(std::string_view(corpus).substr(start, end - start));
    start = end + 1;
  }
  size_t bytes = 0;
  for (auto d : docs) bytes += d.size();

  const auto t0 = std::chrono::steady_clock::now();
  const vlm::io::Tokenizer tok = vlm::io::Tokenizer::from_file(o.tokenizer_path);
  const double load = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const Pass cold = encode_all(tok, docs);
  Pass best = cold;
  for (int64_t r = 0; r < o.reps; r++) {
    const Pass p = encode_all(tok, docs);
    if (p.seconds < best.seconds) best = p;
  }
  std::printf("corpus: %zu documents, %.2f MB\n", docs.size(), bytes / 1e6);
  std::printf("ours: load %.2f s; cold %.2f MB/s; warm %.2f MB/s; %zu tokens\n", load,
              bytes / cold.seconds / 1e6, bytes / best.seconds / 1e6, best.tokens);
  // The reference (HF tokenizers) runs in bench_tokenizer.sh, which pairs them.
  const std::string case_name =
      std::to_string(docs.size()) + " documents, " + std::to_string(bytes) + " bytes, one thread";
  vlm::bench::emit("bench_tokenizer", case_name + ", cold", "1", "cpu", "MBps",
                   double(bytes) / cold.seconds / 1e6);
  vlm::bench::emit("bench_tokenizer", case_name + ", warm", "1", "cpu", "MBps",
                   double(bytes) / best.seconds / 1e6);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tokenizer encode throughput, single thread, every line of a corpus one document.",
               "bench_tokenizer"};
  Options o;
  add_options(app, o);
  return vlm::bench::run_main(app, argc, argv, [&] { return run(o); });
}
