#include "src/cli/cmd_generate.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "io/image/decode.h"
#include "io/image/processor_config.h"
#include "io/text/chat_format.h"
#include "io/text/tokenizer.h"
#include "io/text/unicode.h"
#include "model/generate.h"
#include "model/model_spec.h"
#include "src/base/check.h"
#include "src/base/logging.h"
#include "src/cli/args.h"
#include "src/core/device.h"
#include "src/train/checkpoint.h"

namespace vlm::cli {

namespace {

namespace fs = std::filesystem;

struct GenerateOptions {
  std::string model_dir, prompt, image_path, tokenizer_path;
  int64_t max_new_tokens = 64, min_pixels = -1, max_pixels = -1;
  std::string device = "cpu", dtype = "f32";
};

// The bytes of --image: a regular file (not a device or a pipe) of at most kMaxImageFileBytes,
// its size checked before it is read.
std::string read_image_file(const std::string& path) {
  std::error_code ec;
  VLM_CHECK(fs::exists(path, ec), "generate: cannot open --image ", path, ": no such file");
  VLM_CHECK(fs::is_regular_file(path, ec), "generate: --image ", path,
            " is not a regular file (a folder, a device or a pipe)");
  const uintmax_t size = fs::file_size(path, ec);
  VLM_CHECK(!ec && size <= uintmax_t(io::kMaxImageFileBytes), "generate: --image ", path, " has ",
            size, " bytes; image files of at most ", io::kMaxImageFileBytes, " bytes are read");
  std::ifstream f(path, std::ios::binary);
  VLM_CHECK(f, "generate: cannot open --image ", path);
  std::string bytes(size_t(size), '\0');
  f.read(bytes.data(), std::streamsize(size));
  VLM_CHECK(f.gcount() == std::streamsize(size), "generate: cannot read --image ", path);
  return bytes;
}

// The image of --image as the model's input: preprocessed by the snapshot's processor config
// (or the options' pixel bounds), its tokens counted into `image_tokens`.
void add_image(const GenerateOptions& o, const io::Tokenizer& tok, model::GenerateInput& in,
               io::ChatSample& chat, std::vector<int64_t>& image_tokens) {
  const std::string& image_path = o.image_path;
  const int64_t min_pixels = o.min_pixels, max_pixels = o.max_pixels;
  const fs::path pp = fs::path(o.model_dir) / "preprocessor_config.json";
  io::ImageProcessorConfig cfg =
      fs::exists(pp) ? io::read_image_processor_config(pp.string()) : io::ImageProcessorConfig{};
  if (min_pixels > 0) cfg.min_pixels = min_pixels;
  if (max_pixels > 0) cfg.max_pixels = max_pixels;
  VLM_CHECK(cfg.min_pixels <= cfg.max_pixels,
            "generate: the image size bounds disagree: "
            "min_pixels ",
            cfg.min_pixels, " (", min_pixels > 0 ? "--min-pixels" : pp.string(),
            ") is above max_pixels ", cfg.max_pixels, " (",
            max_pixels > 0 ? "--max-pixels" : pp.string(), ")");
  const std::string ext = fs::path(image_path).extension().string();
  const std::string bytes = read_image_file(image_path);
  io::ProcessedImage p;
  try {
    p = io::preprocess_image(io::decode_image(bytes, ext), cfg);
  } catch (const Error& e) {
    VLM_FAIL("generate: --image ", image_path, ": ", e.what());
  }
  in.pixel_values = std::move(p.pixel_values);
  in.patch_dim = p.patch_dim;
  in.grids = {p.grid_thw};
  in.spatial_merge_size = cfg.merge_size;
  in.image_token_id = tok.token_to_id("<|image_pad|>");
  VLM_CHECK(in.image_token_id >= 0, "generate: the tokenizer ", o.tokenizer_path,
            " has no <|image_pad|> token for the image");
  chat.image_parts = {"image"};
  chat.messages[0].content.push_back(io::ContentItem{true, "", 0});
  image_tokens.push_back(p.num_tokens());
  log_info("generate: ", image_path, " -> ", p.grid_thw[1], "x", p.grid_thw[2], " patches, ",
           p.num_tokens(), " image tokens");
}

// The prompt's ids: one user turn (the image, then the text) and the assistant's header, checked
// to fit the model's positions with max_new_tokens more.
void build_prompt(const GenerateOptions& o, const io::Tokenizer& tok, const model::CausalLM& net,
                  model::GenerateInput& in) {
  io::ChatSample chat;
  chat.kind = io::SampleKind::conversation;
  chat.messages = {{"user", {}}};
  std::vector<int64_t> image_tokens;
  if (!o.image_path.empty()) add_image(o, tok, in, chat, image_tokens);
  if (!o.prompt.empty()) chat.messages[0].content.push_back(io::ContentItem{false, o.prompt, -1});
  VLM_CHECK(!chat.messages[0].content.empty(), "generate: the prompt is empty and no --image");
  in.prompt = io::tokenize_chat(chat, tok, image_tokens).input_ids;
  in.prompt.push_back(tok.token_to_id("<|im_start|>"));
  for (int32_t id : tok.encode("assistant\n")) in.prompt.push_back(id);
  // The whole sequence within the model's positions (max_position_embeddings): beyond them its
  // rotary positions were never trained, and the KV cache would grow without end.
  if (const int64_t most = net.max_positions(); most > 0) {
    const int64_t prompt_tokens = int64_t(in.prompt.size());
    VLM_CHECK(prompt_tokens < most, "generate: the prompt is ", prompt_tokens, " tokens (--prompt",
              o.image_path.empty() ? "" : " and --image", "), but the model takes at most ", most,
              " positions (max_position_embeddings)");
    VLM_CHECK(prompt_tokens + o.max_new_tokens <= most, "generate: --max-new-tokens ",
              o.max_new_tokens, " after a prompt of ", prompt_tokens,
              " tokens goes past the model's ", most,
              " positions (max_position_embeddings); at most ", most - prompt_tokens);
  }
}

} // namespace

int cmd_generate(const std::vector<std::string>& args) {
  GenerateOptions o;
  CLI::App app{"Greedy decoding (KV cache) of the model in --model for one user turn: the image "
               "(if any), then the prompt; prints the assistant's answer. --model: an HF "
               "snapshot, a step_N checkpoint, or a training output folder (what its `latest` "
               "names).",
               "vlmtrain generate"};
  show_defaults(app);
  app.add_option("--model", o.model_dir, "the model folder")->required();
  app.add_option("--prompt", o.prompt, "the user's text (UTF-8)")->required();
  app.add_option("--image", o.image_path,
                 "a PNG or JPEG shown to a vision-language model before the text");
  app.add_option("--max-new-tokens", o.max_new_tokens,
                 "stop after N tokens if <|im_end|> has not come; the prompt and N fit the "
                 "model's max_position_embeddings")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  app.add_option("--tokenizer", o.tokenizer_path,
                 "tokenizer.json or its folder (default: --model)");
  app.add_option("--device", o.device, "cpu or cuda[:N]");
  app.add_option("--dtype", o.dtype, "parameter and compute dtype")
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--min-pixels", o.min_pixels,
                 "smallest image size in pixels (-1: the snapshot's preprocessor_config.json, "
                 "else 65536)")
      ->check(CLI::Range(int64_t(1), io::kMaxDecodePixels));
  app.add_option("--max-pixels", o.max_pixels,
                 "largest image size in pixels (-1: the snapshot's preprocessor_config.json, "
                 "else 16777216)")
      ->check(CLI::Range(int64_t(1), io::kMaxDecodePixels));
  if (!parse_args(app, args)) return 0;
  VLM_CHECK(io::unicode::utf8_find_invalid(o.prompt) == std::string::npos,
            "generate: --prompt is not valid UTF-8 (at byte ",
            io::unicode::utf8_find_invalid(o.prompt), ")");
  VLM_CHECK(o.min_pixels < 0 || o.max_pixels < 0 || o.min_pixels <= o.max_pixels,
            "generate: --min-pixels ", o.min_pixels, " is above --max-pixels ", o.max_pixels);
  const Device device = parse_device(o.device);
  const DType dtype = parse_model_dtype(o.dtype, "--dtype");
  check_device_available(device, "generate: --device");

  // A step_N checkpoint, an HF snapshot, or a folder of checkpoints (its `latest`).
  o.model_dir = train::resolve_checkpoint_path(o.model_dir, "generate: --model");
  if (o.tokenizer_path.empty()) o.tokenizer_path = o.model_dir;
  if (fs::is_directory(o.tokenizer_path))
    o.tokenizer_path = (fs::path(o.tokenizer_path) / "tokenizer.json").string();
  VLM_CHECK(fs::exists(o.tokenizer_path), "generate: no tokenizer at ", o.tokenizer_path,
            " (pass --tokenizer)");
  const io::Tokenizer tok = io::Tokenizer::from_file(o.tokenizer_path);
  auto net = train::load_checkpoint_model(o.model_dir, dtype, "generate: --model");
  VLM_CHECK(tok.vocab_size() <= net->vocab_size(), "generate: the tokenizer ", o.tokenizer_path,
            " has ", tok.vocab_size(), " tokens but the model in ", o.model_dir, " has vocab_size ",
            net->vocab_size(), " (--tokenizer of another model?)");
  VLM_CHECK(o.image_path.empty() || net->has_vision(), "generate: --image ", o.image_path,
            " given, but the model in ", o.model_dir, " (", net->summary(),
            ") has no vision tower");
  net->to(device);

  model::GenerateInput in;
  in.vocab_limit = tok.vocab_size();
  build_prompt(o, tok, *net, in);
  const std::vector<int32_t> stop = {tok.token_to_id("<|im_end|>"),
                                     tok.token_to_id("<|endoftext|>")};
  std::vector<int32_t> out = model::greedy_generate(*net, in, o.max_new_tokens, stop, device);
  const bool stopped = !out.empty() && (out.back() == stop[0] || out.back() == stop[1]);
  if (stopped) out.pop_back();
  std::printf("%s\n", tok.decode(out, true).c_str());
  log_info("generate: ", in.prompt.size(), " prompt tokens, ", out.size(), " generated",
           stopped ? "" : " (token limit reached)");
  return 0;
}

} // namespace vlm::cli
