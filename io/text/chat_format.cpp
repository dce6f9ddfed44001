#include "io/text/chat_format.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "io/text/unicode.h"

namespace vlm::io {

namespace {

using nlohmann::json;

constexpr const char* kImageLiteral = "<image>";

bool is_image_part(const std::string& part) {
  // Part names may hold dots ("0.jpg", "seg.mask.png"): the extension is the last component.
  auto dot = part.rfind('.');
  std::string ext = dot == std::string::npos ? part : part.substr(dot + 1);
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

[[noreturn]] void reject(const RawSample& s, const std::string& reason, const std::string& what) {
  throw ChatFormatError(reason, "sample " + s.shard + "/" + s.key + ": " + what);
}

std::string normalize_role(const std::string& role) {
  if (role == "human" || role == "user") return "user";
  if (role == "gpt" || role == "assistant") return "assistant";
  if (role == "system") return "system";
  return "user"; // the reference maps unknown roles to user
}

// Removes every "<image>" literal and the whitespace it leaves at either end; returns how many
// literals there were.
int strip_image_literals(std::string& text) {
  int n = 0;
  for (size_t at; (at = text.find(kImageLiteral)) != std::string::npos; n++)
    text.erase(at, std::char_traits<char>::length(kImageLiteral));
  if (n > 0) {
    size_t b = text.find_first_not_of(" \t\r\n");
    size_t e = text.find_last_not_of(" \t\r\n");
    text = b == std::string::npos ? std::string() : text.substr(b, e - b + 1);
  }
  return n;
}

std::string text_of(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "";
  return v.dump();
}

// One turn of a "conversations"/"messages" list: text plus how many images it asked for.
struct Turn {
  std::string role;
  std::string text;
  int image_requests = 0; // <image> literals or {"type": "image"} items
};

std::vector<Turn> read_turns(const RawSample& s, const json& list) {
  std::vector<Turn> turns;
  for (const auto& m : list) {
    if (!m.is_object()) reject(s, "invalid_json", "a conversation turn is not an object");
    Turn t;
    t.role =
        normalize_role(m.contains("from") ? text_of(m["from"]) : text_of(m.value("role", json())));
    const json& c = m.contains("value") ? m["value"] : m.value("content", json());
    if (c.is_array()) { // [{"type": "text", "text": ...}, {"type": "image"}]
      for (const auto& item : c) {
        std::string type = item.is_object() ? item.value("type", "") : "";
        if (type == "image")
          t.image_requests++;
        else if (type == "text")
          t.text += text_of(item.value("text", json()));
      }
    } else {
      t.text = text_of(c);
    }
    t.image_requests += strip_image_literals(t.text);
    turns.push_back(std::move(t));
  }
  return turns;
}

// Messages from turns: image i goes first into the turn holding the i-th image request, or into
// the first user turn when there are fewer requests than images (the reference cookers' rule).
std::vector<Message> place_images(const RawSample& s, const std::vector<Turn>& turns, int images) {
  std::vector<Message> msgs(turns.size());
  int first_user = -1;
  for (size_t i = 0; i < turns.size(); i++) {
    msgs[i].role = turns[i].role;
    if (first_user < 0 && turns[i].role == "user") first_user = int(i);
  }
  int next_image = 0;
  for (size_t i = 0; i < turns.size() && next_image < images; i++)
    for (int r = 0; r < turns[i].image_requests && next_image < images; r++)
      msgs[i].content.push_back({true, "", next_image++});
  if (next_image < images) {
    if (first_user < 0) reject(s, "no_user_turn", "images but no user turn to put them in");
    auto& c = msgs[size_t(first_user)].content;
    for (; next_image < images; next_image++) c.insert(c.begin(), {true, "", next_image});
  }
  for (size_t i = 0; i < turns.size(); i++) msgs[i].content.push_back({false, turns[i].text, -1});
  return msgs;
}

json parse_json(const RawSample& s, const std::string& part) {
  try {
    return json::parse(s.parts.at(part));
  } catch (const json::exception& e) {
    reject(s, "invalid_json", "part '" + part + "' is not valid JSON: " + e.what());
  }
}

} // namespace

namespace {

// The chat of a sample whose JSON parsed; json type errors (a number where a string belongs)
// reach parse_chat_sample, which turns them into a skip like any other bad sample.
ChatSample chat_of(const RawSample& s) {
  ChatSample out;
  for (const auto& [name, bytes] : s.parts)
    if (is_image_part(name)) out.image_parts.push_back(name);
  std::sort(out.image_parts.begin(), out.image_parts.end());
  int images = int(out.image_parts.size());
  auto sub = s.subflavors.find("type_dataset");
  std::string type = sub == s.subflavors.end() ? "" : sub->second;
  bool has_json = s.parts.count("json") != 0, has_txt = s.parts.count("txt") != 0;

  auto caption = [&](const std::string& text) {
    if (images == 0) reject(s, "missing_image", "a caption sample needs an image part");
    out.kind = SampleKind::caption;
    out.messages = {{"user", {}}, {"assistant", {{false, text, -1}}}};
    for (int i = 0; i < images; i++) out.messages[0].content.push_back({true, "", i});
  };

  if (type == "llava_recap") { // caption = conversations[1].value; the human prompt is dropped
    if (!has_json) reject(s, "missing_part", "type_dataset llava_recap needs a json part");
    json j = parse_json(s, "json");
    if (!j.contains("conversations") || !j["conversations"].is_array() ||
        j["conversations"].size() < 2)
      reject(s, "empty_conversation", "llava_recap sample without conversations[1]");
    caption(text_of(j["conversations"][1].value("value", json())));
    return out;
  }
  if (type == "llava_recap_mn5" || (has_txt && !has_json && images > 0)) {
    if (!has_txt) reject(s, "missing_part", "a caption sample needs a txt part");
    caption(s.parts.at("txt"));
    return out;
  }
  if (has_json) {
    json j = parse_json(s, "json");
    const char* key = j.contains("conversations") ? "conversations"
                      : j.contains("messages")    ? "messages"
                                                  : nullptr;
    if (key) {
      if (!j[key].is_array() || j[key].empty())
        reject(s, "empty_conversation", std::string("'") + key + "' is empty or not a list");
      std::vector<Turn> turns = read_turns(s, j[key]);
      bool has_answer = std::any_of(turns.begin(), turns.end(),
                                    [](const Turn& t) { return t.role == "assistant"; });
      if (!has_answer) reject(s, "no_assistant_turn", "the conversation has no assistant turn");
      out.kind = SampleKind::conversation;
      out.messages = place_images(s, turns, images);
      return out;
    }
    if (j.contains("text") && j["text"].is_string() && images == 0) {
      out.kind = SampleKind::text;
      out.text = j["text"].get<std::string>();
      if (out.text.empty()) reject(s, "empty_text", "the text is empty");
      return out;
    }
    reject(s, "unknown_json", "json part has neither 'conversations', 'messages' nor 'text'");
  }
  if (has_txt) {
    out.kind = SampleKind::text;
    out.text = s.parts.at("txt");
    if (out.text.empty()) reject(s, "empty_text", "the txt part is empty");
    return out;
  }
  reject(s, "missing_part", "no txt or json part");
}

// Every text the chat holds is valid UTF-8, so tokenizing it cannot fail on the bytes (JSON
// strings are checked by the JSON parser; txt parts are raw bytes).
void check_utf8(const RawSample& s, const ChatSample& chat) {
  auto check = [&](const std::string& text, const char* what) {
    const size_t bad = unicode::utf8_find_invalid(text);
    if (bad != std::string::npos)
      reject(s, "invalid_utf8",
             std::string(what) + " is not valid UTF-8 (byte offset " + std::to_string(bad) + ")");
  };
  check(chat.text, "the text");
  for (const Message& m : chat.messages)
    for (const ContentItem& c : m.content) check(c.text, "a message");
}

} // namespace

ChatSample parse_chat_sample(const RawSample& s) {
  ChatSample chat;
  try {
    chat = chat_of(s);
  } catch (const json::exception& e) {
    reject(s, "invalid_json",
           std::string("part 'json' has a value of the wrong type: ") + e.what());
  }
  check_utf8(s, chat);
  return chat;
}

std::string render_chat(const ChatSample& s) {
  if (s.kind == SampleKind::text) return s.text;
  std::string out;
  for (const auto& m : s.messages) {
    out += "<|im_start|>" + m.role + "\n";
    for (const auto& c : m.content)
      out += c.is_image ? std::string("<|vision_start|><|image_pad|><|vision_end|>") : c.text;
    out += "<|im_end|>\n";
  }
  return out;
}

TokenizedChat tokenize_chat(const ChatSample& s, const Tokenizer& tok,
                            const std::vector<int64_t>& image_tokens, const ChatFormatOptions& o) {
  TokenizedChat out;
  auto emit = [&](const std::vector<int32_t>& ids, bool train) {
    out.input_ids.insert(out.input_ids.end(), ids.begin(), ids.end());
    out.labels.insert(out.labels.end(), ids.size(), -100);
    if (train) std::copy(ids.begin(), ids.end(), out.labels.end() - int64_t(ids.size()));
  };
  if (s.kind == SampleKind::text) {
    emit(tok.encode(s.text), true);
    if (o.text_eos) emit({tok.token_to_id("<|endoftext|>")}, true);
    return out;
  }
  VLM_CHECK(image_tokens.size() == s.image_parts.size(), "tokenize_chat: ", image_tokens.size(),
            " image token counts for ", s.image_parts.size(), " images");
  const int32_t im_start = tok.token_to_id("<|im_start|>"), im_end = tok.token_to_id("<|im_end|>");
  const int32_t vision_start = tok.token_to_id("<|vision_start|>");
  const int32_t vision_end = tok.token_to_id("<|vision_end|>");
  const int32_t image_pad = tok.token_to_id("<|image_pad|>");
  const std::vector<int32_t> newline = tok.encode("\n");
  for (const auto& m : s.messages) {
    bool answer = m.role == "assistant";
    emit({im_start}, false);
    // The role line and the text up to the next special token are one piece of text, encoded
    // together exactly as a tokenizer sees the rendered chat. Not trained on: the role's tokens
    // and the one token after them (the newline, possibly merged with whitespace that starts the
    // answer) — the reference's "answer starts 2 tokens after `assistant`".
    std::string pending = m.role + "\n";
    size_t role_bytes = m.role.size();
    auto flush = [&] {
      if (pending.empty()) return;
      std::vector<int32_t> ids = tok.encode(pending);
      size_t header = 0;
      if (role_bytes > 0) {
        for (size_t covered = 0; header < ids.size() && covered < role_bytes; header++)
          covered += tok.decode({ids[header]}).size();
        header = std::min(ids.size(), header + 1);
      }
      std::vector<int32_t> head(ids.begin(), ids.begin() + int64_t(header));
      std::vector<int32_t> body(ids.begin() + int64_t(header), ids.end());
      emit(head, false);
      emit(body, answer);
      pending.clear();
      role_bytes = 0;
    };
    for (const auto& c : m.content) {
      if (!c.is_image) {
        pending += c.text;
        continue;
      }
      flush();
      // Image tokens are inputs only, even inside an answer.
      emit({vision_start}, false);
      emit(std::vector<int32_t>(size_t(image_tokens[size_t(c.image_index)]), image_pad), false);
      emit({vision_end}, false);
    }
    flush();
    emit({im_end}, answer);
    emit(newline, answer);
  }
  return out;
}

} // namespace vlm::io
