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
#include "src/core/device.h"
#include "src/train/checkpoint.h"

namespace vlm::cli {

namespace {

namespace fs = std::filesystem;

const char* kUsage = R"(usage: vlmtrain generate --model DIR --prompt TEXT [options]
  Greedy decoding (KV cache) of the model in DIR for one user turn: the image (if any), then
  TEXT; prints the assistant's answer. DIR: an HF snapshot, a step_N checkpoint, or a training
  output folder (what its `latest` names).
  --image FILE           a PNG or JPEG shown to a vision-language model before the text
  --max-new-tokens N     stop after N tokens (default 64) if <|im_end|> has not come; the prompt
                         and N fit the model's max_position_embeddings
  --tokenizer PATH       tokenizer.json or its folder (default DIR)
  --device cpu|cuda[:N]  where to run (default cpu)
  --dtype f32|bf16       parameter and compute dtype (default f32)
  --min-pixels N, --max-pixels N   image size bounds (default: DIR/preprocessor_config.json,
                         else 65536 and 16777216)
)";

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

// A positive integer of at most `most`, naming the option otherwise.
int64_t parse_count(const std::string& text, const std::string& what, int64_t most) {
  size_t used = 0;
  int64_t v = -1;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
  }
  VLM_CHECK(used == text.size() && v > 0 && v <= most, "generate: ", what,
            " must be an integer in [1, ", most, "], got '", text, "'");
  return v;
}

} // namespace

int cmd_generate(const std::vector<std::string>& args) {
  std::string model_dir, prompt, image_path, tokenizer_path;
  int64_t max_new_tokens = 64, min_pixels = -1, max_pixels = -1;
  bool have_prompt = false;
  Device device = Device::cpu();
  DType dtype = DType::f32;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      VLM_CHECK(i + 1 < args.size(), "option ", a, " needs a value\n", kUsage);
      return args[++i];
    };
    if (a == "--model")
      model_dir = value();
    else if (a == "--prompt")
      prompt = value(), have_prompt = true;
    else if (a == "--image")
      image_path = value();
    else if (a == "--tokenizer")
      tokenizer_path = value();
    else if (a == "--max-new-tokens")
      max_new_tokens = parse_count(value(), a, int64_t(1) << 30);
    else if (a == "--min-pixels")
      min_pixels = parse_count(value(), a, io::kMaxDecodePixels);
    else if (a == "--max-pixels")
      max_pixels = parse_count(value(), a, io::kMaxDecodePixels);
    else if (a == "--device")
      device = parse_device(value());
    else if (a == "--dtype")
      dtype = parse_model_dtype(value(), "--dtype");
    else if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    } else
      VLM_FAIL("unknown option '", a, "' for `vlmtrain generate`\n", kUsage);
  }
  VLM_CHECK(!model_dir.empty() && have_prompt, "generate: --model and --prompt are required\n",
            kUsage);
  VLM_CHECK(io::unicode::utf8_find_invalid(prompt) == std::string::npos,
            "generate: --prompt is not valid UTF-8 (at byte ",
            io::unicode::utf8_find_invalid(prompt), ")");
  VLM_CHECK(min_pixels < 0 || max_pixels < 0 || min_pixels <= max_pixels, "generate: --min-pixels ",
            min_pixels, " is above --max-pixels ", max_pixels);
  check_device_available(device, "generate: --device");

  // A step_N checkpoint, an HF snapshot, or a folder of checkpoints (its `latest`).
  model_dir = train::resolve_checkpoint_path(model_dir, "generate: --model");
  if (tokenizer_path.empty()) tokenizer_path = model_dir;
  if (fs::is_directory(tokenizer_path))
    tokenizer_path = (fs::path(tokenizer_path) / "tokenizer.json").string();
  VLM_CHECK(fs::exists(tokenizer_path), "generate: no tokenizer at ", tokenizer_path,
            " (pass --tokenizer)");
  const io::Tokenizer tok = io::Tokenizer::from_file(tokenizer_path);
  auto net = train::load_checkpoint_model(model_dir, dtype, "generate: --model");
  VLM_CHECK(tok.vocab_size() <= net->vocab_size(), "generate: the tokenizer ", tokenizer_path,
            " has ", tok.vocab_size(), " tokens but the model in ", model_dir, " has vocab_size ",
            net->vocab_size(), " (--tokenizer of another model?)");
  VLM_CHECK(image_path.empty() || net->has_vision(), "generate: --image ", image_path,
            " given, but the model in ", model_dir, " (", net->summary(), ") has no vision tower");
  net->to(device);

  io::ChatSample chat;
  chat.kind = io::SampleKind::conversation;
  chat.messages = {{"user", {}}};
  model::GenerateInput in;
  in.vocab_limit = tok.vocab_size();
  std::vector<int64_t> image_tokens;
  if (!image_path.empty()) {
    const fs::path pp = fs::path(model_dir) / "preprocessor_config.json";
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
    VLM_CHECK(in.image_token_id >= 0, "generate: the tokenizer ", tokenizer_path,
              " has no <|image_pad|> token for the image");
    chat.image_parts = {"image"};
    chat.messages[0].content.push_back(io::ContentItem{true, "", 0});
    image_tokens.push_back(p.num_tokens());
    log_info("generate: ", image_path, " -> ", p.grid_thw[1], "x", p.grid_thw[2], " patches, ",
             p.num_tokens(), " image tokens");
  }
  if (!prompt.empty()) chat.messages[0].content.push_back(io::ContentItem{false, prompt, -1});
  VLM_CHECK(!chat.messages[0].content.empty(), "generate: the prompt is empty and no --image");
  in.prompt = io::tokenize_chat(chat, tok, image_tokens).input_ids;
  in.prompt.push_back(tok.token_to_id("<|im_start|>"));
  for (int32_t id : tok.encode("assistant\n")) in.prompt.push_back(id);
  // The whole sequence within the model's positions (max_position_embeddings): beyond them its
  // rotary positions were never trained, and the KV cache would grow without end.
  if (const int64_t most = net->max_positions(); most > 0) {
    const int64_t prompt_tokens = int64_t(in.prompt.size());
    VLM_CHECK(prompt_tokens < most, "generate: the prompt is ", prompt_tokens, " tokens (--prompt",
              image_path.empty() ? "" : " and --image", "), but the model takes at most ", most,
              " positions (max_position_embeddings)");
    VLM_CHECK(prompt_tokens + max_new_tokens <= most, "generate: --max-new-tokens ", max_new_tokens,
              " after a prompt of ", prompt_tokens, " tokens goes past the model's ", most,
              " positions (max_position_embeddings); at most ", most - prompt_tokens);
  }

  const std::vector<int32_t> stop = {tok.token_to_id("<|im_end|>"),
                                     tok.token_to_id("<|endoftext|>")};
  std::vector<int32_t> out = model::greedy_generate(*net, in, max_new_tokens, stop, device);
  const bool stopped = !out.empty() && (out.back() == stop[0] || out.back() == stop[1]);
  if (stopped) out.pop_back();
  std::printf("%s\n", tok.decode(out, true).c_str());
  log_info("generate: ", in.prompt.size(), " prompt tokens, ", out.size(), " generated",
           stopped ? "" : " (token limit reached)");
  return 0;
}

} // namespace vlm::cli
