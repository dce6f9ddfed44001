// Data loader throughput on image + conversation samples, against what one GPU consumes.
//
// Builds an Energon dataset of LLaVA-style samples (a JPEG photo-sized image — 500×375 to
// 1280×960, smooth content with noise, quality 90 — and a conversation with a question and a
// 60–260 word answer), then runs the real DataLoader (read tar, parse JSON, decode JPEG,
// smart_resize + bicubic + normalize + patchify, chat template, tokenize, pack into seq_len rows,
// MRoPE ids) for one epoch with 1 and 2 reader threads, dropping each row as a trainer would.
//
// The reference is one GPU training Qwen3-VL-8B at seq_len 8192: 52.7 GFLOP per text token
// (qwen-models.md §7, text part; the vision tower only adds work per token, so this
// overestimates the GPU's appetite) at 50% MFU of an H100/H200's 989 TFLOP/s bf16 peak — a
// figure above the best published 8B numbers (performance-anchors.md B2, B9). The loader must
// produce >= 10× those tokens/s. Also printed: the bound at 100% MFU.
//
// Usage: bench_loader --tokenizer PATH [--samples N] [--seq-len N] [--dir DIR]   (--help: defaults;
//   without --dir the dataset goes to a temporary folder, removed at the end)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include <jpeglib.h> // after <cstdio>: it needs size_t and FILE

#include "bench/bench_main.h"
#include "bench/record.h"
#include "io/energon/writer.h"
#include "io/loader/loader.h"
#include "src/base/check.h"
#include "src/base/rng.h"

namespace {

std::string encode_jpeg(const std::vector<uint8_t>& rgb, int width, int height, int quality) {
  jpeg_compress_struct c{};
  jpeg_error_mgr err{};
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &out, &size);
  c.image_width = JDIMENSION(width);
  c.image_height = JDIMENSION(height);
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(&rgb[size_t(c.next_scanline) * size_t(width) * 3]);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  std::string bytes(reinterpret_cast<char*>(out), size);
  jpeg_destroy_compress(&c);
  std::free(out);
  return bytes;
}

// A photo-like picture: smooth colour gradients, a few discs, mild noise (so that JPEG sizes and
// decode costs are those of real photos, ~0.1–0.3 MB each).
std::string photo(vlm::Rng& rng, int width, int height) {
  std::vector<uint8_t> rgb(size_t(width) * size_t(height) * 3);
  double base[3], slope_x[3], slope_y[3];
  for (int ch = 0; ch < 3; ch++) {
    base[ch] = rng.uniform() * 200;
    slope_x[ch] = (rng.uniform() - 0.5) * 0.3;
    slope_y[ch] = (rng.uniform() - 0.5) * 0.3;
  }
  struct Disc {
    double x, y, r, col[3];
  };
  std::vector<Disc> discs(4);
  for (auto& d : discs) {
    d.x = rng.uniform() * width, d.y = rng.uniform() * height;
    d.r = (0.05 + 0.2 * rng.uniform()) * std::min(width, height);
    for (double& c : d.col) c = rng.uniform() * 255;
  }
  for (int y = 0; y < height; y++)
    for (int x = 0; x < width; x++) {
      double px[3];
      for (int ch = 0; ch < 3; ch++) px[ch] = base[ch] + slope_x[ch] * x + slope_y[ch] * y;
      for (const auto& d : discs)
        if ((x - d.x) * (x - d.x) + (y - d.y) * (y - d.y) < d.r * d.r)
          for (int ch = 0; ch < 3; ch++) px[ch] = d.col[ch];
      for (int ch = 0; ch < 3; ch++) {
        double v = px[ch] + (rng.uniform() - 0.5) * 24;
        rgb[(size_t(y) * size_t(width) + size_t(x)) * 3 + size_t(ch)] =
            uint8_t(std::clamp(v, 0.0, 255.0));
      }
    }
  return encode_jpeg(rgb, width, height, 90);
}

std::string conversation(vlm::Rng& rng) {
  static const char* words[] = {"the",   "image", "shows",  "a",     "red",     "circle",
                                "near",  "blue",  "square", "on",    "wooden",  "table",
                                "while", "light", "falls",  "from",  "window",  "and",
                                "there", "is",    "small",  "cup",   "beside",  "book",
                                "with",  "green", "cover",  "which", "appears", "open"};
  const int n_words = int(sizeof words / sizeof words[0]);
  std::string answer;
  int64_t len = rng.randint(60, 261);
  for (int64_t i = 0; i < len; i++) {
    answer += words[rng.randint(0, n_words)];
    answer += i % 17 == 16 ? ". " : " ";
  }
  return R"({"conversations":[{"from":"human","value":"<image>\nDescribe this picture in )"
         R"(detail."},{"from":"gpt","value":")" +
         answer + R"("}]})";
}

double cpu_seconds() { return double(std::clock()) / CLOCKS_PER_SEC; }

struct Options {
  std::string tokenizer, dir;
  int64_t samples = 600, seq_len = 8192;
};

// Writes the Energon dataset of `o.samples` image + conversation samples into `dir`.
void write_dataset(const Options& o, const std::string& dir) {
  const int sizes[][2] = {{500, 375},  {640, 480},  {800, 600}, {1024, 768},
                          {1280, 720}, {1280, 960}, {480, 640}, {768, 1024}};
  vlm::Rng rng(7);
  std::vector<vlm::io::WriterSample> train;
  size_t image_bytes = 0;
  auto t_make = std::chrono::steady_clock::now();
  for (int64_t k = 0; k < o.samples; k++) {
    const int* wh = sizes[rng.randint(0, int64_t(std::size(sizes)))];
    char key[24];
    std::snprintf(key, sizeof key, "%06lld", (long long)k);
    std::string jpg = photo(rng, wh[0], wh[1]);
    image_bytes += jpg.size();
    train.push_back({key, {{"jpg", std::move(jpg)}, {"json", conversation(rng)}}});
  }
  vlm::io::write_energon_dataset(dir, {{"train", std::move(train)}});
  std::printf("dataset: %lld image+conversation samples, mean JPEG %.0f KB, written in %.1f s\n",
              (long long)o.samples, double(image_bytes) / double(o.samples) / 1024,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_make).count());
}

// Tokens/s of Qwen3-VL-8B on one H100/H200 (see the header comment) at 50% and 100% MFU.
struct GpuAppetite {
  double tokens_50, tokens_100;
};

// One epoch of the DataLoader over `dir` with `threads` reader threads, each row dropped; prints
// its rates against the GPU's.
void run_loader(const Options& o, const std::string& dir, int64_t threads, GpuAppetite gpu) {
  vlm::io::LoaderConfig c;
  c.dataset = dir;
  c.tokenizer = o.tokenizer;
  c.packing.seq_len = o.seq_len;
  c.packing.buffer_size = 100;
  c.packing.mrope = true;
  c.num_workers = threads;
  c.epochs = 1;
  c.seed = 1;
  vlm::io::DataLoader loader(c);
  auto t0 = std::chrono::steady_clock::now();
  double cpu0 = cpu_seconds();
  int64_t docs = 0, tokens = 0, rows = 0, patches = 0;
  while (auto r = loader.next()) {
    docs += r->num_docs;
    tokens += r->real_tokens;
    patches += r->num_patches;
    rows++;
    loader.recycle(std::move(*r));
  }
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double cpu = cpu_seconds() - cpu0;
  VLM_CHECK(docs == o.samples, "bench_loader: the loader yielded ", docs, " of ", o.samples,
            " samples:\n", loader.report().summary());
  double tok_s = double(tokens) / sec;
  std::printf("loader, %lld reader thread%s: %.1f samples/s, %.0f tokens/s, %.2f rows/s "
              "(%.0f tokens and %.0f patches per sample, %.1f ms CPU per sample) = %.1fx one "
              "GPU's consumption at 50%% MFU (target >= 10x), %.1fx at 100%%\n",
              (long long)threads, threads > 1 ? "s" : "", double(docs) / sec, tok_s,
              double(rows) / sec, double(tokens) / double(docs), double(patches) / double(docs),
              1e3 * cpu / double(docs), tok_s / gpu.tokens_50, tok_s / gpu.tokens_100);
  // The reference: what one GPU consumes at 50% MFU (the target is a ratio >= 10).
  vlm::bench::emit("bench_loader",
                   std::to_string(o.samples) + " image+conversation samples, seq " +
                       std::to_string(o.seq_len) + ", " + std::to_string(threads) +
                       " reader threads",
                   "1", "cpu", "tokens_per_s", tok_s, gpu.tokens_50);
  std::fflush(stdout);
}

void add_options(CLI::App& app, Options& o) {
  vlm::cli::show_defaults(app);
  app.add_option("--tokenizer", o.tokenizer, "tokenizer.json or its folder")->required();
  app.add_option("--samples", o.samples, "image + conversation samples of the dataset")
      ->check(vlm::cli::at_least(1));
  app.add_option("--seq-len", o.seq_len, "tokens per packed row")->check(vlm::cli::at_least(1));
  app.add_option("--dir", o.dir, "the dataset's folder (default: a temporary one)");
}

int run(const Options& o) {
  const bool own_dir = o.dir.empty();
  const std::string dir = own_dir ? (std::filesystem::temp_directory_path() /
                                     ("vlm_bench_loader_" + std::to_string(getpid())))
                                        .string()
                                  : o.dir;
  write_dataset(o, dir);

  // Qwen3-VL-8B on one H100/H200 (see the header comment).
  const double flop_per_token = 52.7e9, peak = 989e12;
  const GpuAppetite gpu{0.5 * peak / flop_per_token, peak / flop_per_token};
  std::printf("one GPU, Qwen3-VL-8B at seq %lld: %.0f tokens/s at 50%% MFU (%.0f at 100%%)\n",
              (long long)o.seq_len, gpu.tokens_50, gpu.tokens_100);

  for (int64_t threads : {1, 2}) run_loader(o, dir, threads, gpu);
  if (own_dir) std::filesystem::remove_all(dir);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"Data loader throughput on image + conversation samples, against what one GPU "
               "consumes.",
               "bench_loader"};
  Options o;
  add_options(app, o);
  return vlm::bench::run_main(app, argc, argv, [&] { return run(o); });
}
