#include "src/train/cmd_generate.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/chat_format.h"
#include "io/image_decode.h"
#include "io/image_processor_config.h"
#include "io/tokenizer.h"
#include "model/model_spec.h"
#include "src/base/check.h"
#include "src/base/logging.h"
#include "src/core/device.h"
#include "src/train/generate.h"

namespace vlm::train {

namespace {

namespace fs = std::filesystem;

const char* kUsage = R"(usage: vlmtrain generate --model DIR --prompt TEXT [options]
  Greedy decoding (KV cache) of the HF snapshot DIR for one user turn: the image (if any), then
  TEXT; prints the assistant's answer.
  --image FILE           a PNG or JPEG shown to a vision-language model before the text
  --max-new-tokens N     stop after N tokens (default 64) if <|im_end|> has not come
  --tokenizer PATH       tokenizer.json or its folder (default DIR)
  --device cpu|cuda[:N]  where to run (default cpu)
  --dtype f32|bf16       parameter and compute dtype (default f32)
  --min-pixels N, --max-pixels N   image size bounds (default: DIR/preprocessor_config.json,
                         else 65536 and 16777216)
)";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  VLM_CHECK(f, "generate: cannot open --image ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int64_t parse_count(const std::string& text, const std::string& what) {
  size_t used = 0;
  int64_t v = -1;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
  }
  VLM_CHECK(used == text.size() && v > 0, "generate: ", what, " must be a positive integer, got '",
            text, "'");
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
      max_new_tokens = parse_count(value(), a);
    else if (a == "--min-pixels")
      min_pixels = parse_count(value(), a);
    else if (a == "--max-pixels")
      max_pixels = parse_count(value(), a);
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
  check_device_available(device, "generate: --device");

  if (tokenizer_path.empty()) tokenizer_path = model_dir;
  if (fs::is_directory(tokenizer_path))
    tokenizer_path = (fs::path(tokenizer_path) / "tokenizer.json").string();
  VLM_CHECK(fs::exists(tokenizer_path), "generate: no tokenizer at ", tokenizer_path,
            " (pass --tokenizer)");
  const io::Tokenizer tok = io::Tokenizer::from_file(tokenizer_path);
  auto net = model::load_pretrained(model_dir, dtype);
  VLM_CHECK(image_path.empty() || net->has_vision(), "generate: --image ", image_path,
            " given, but the model in ", model_dir, " (", net->summary(), ") has no vision tower");
  net->to(device);

  io::ChatSample chat;
  chat.kind = io::SampleKind::conversation;
  chat.messages = {{"user", {}}};
  GenerateInput in;
  in.vocab_limit = tok.vocab_size();
  std::vector<int64_t> image_tokens;
  if (!image_path.empty()) {
    const fs::path pp = fs::path(model_dir) / "preprocessor_config.json";
    io::ImageProcessorConfig cfg =
        fs::exists(pp) ? io::read_image_processor_config(pp.string()) : io::ImageProcessorConfig{};
    if (min_pixels > 0) cfg.min_pixels = min_pixels;
    if (max_pixels > 0) cfg.max_pixels = max_pixels;
    const std::string ext = fs::path(image_path).extension().string();
    io::ProcessedImage p;
    try {
      p = io::preprocess_image(io::decode_image(read_file(image_path), ext), cfg);
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

  const std::vector<int32_t> stop = {tok.token_to_id("<|im_end|>"),
                                     tok.token_to_id("<|endoftext|>")};
  std::vector<int32_t> out = greedy_generate(*net, in, max_new_tokens, stop, device);
  const bool stopped = !out.empty() && (out.back() == stop[0] || out.back() == stop[1]);
  if (stopped) out.pop_back();
  std::printf("%s\n", tok.decode(out, true).c_str());
  log_info("generate: ", in.prompt.size(), " prompt tokens, ", out.size(), " generated",
           stopped ? "" : " (token limit reached)");
  return 0;
}

} // namespace vlm::train
