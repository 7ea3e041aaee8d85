// Reading tokenizer.json into a Tokenizer: model (BPE), added tokens, normalizer, pre-tokenizer, post-processor and
// decoder. Anything malformed or outside the supported byte-level BPE family is rejected with an error that names
// the file and the JSON field.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_set>

#include "core/error.h"
#include "io/json_parse.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace moecel {

namespace {

using json = nlohmann::json;

struct Reader {
  const std::string& origin;

  [[noreturn]] void bad(const std::string& field, const std::string& what) const {
    fail("{}: field '{}': {}", origin, field, what);
  }
  const json& get(const json& obj, const std::string& key, const std::string& where) const {
    if (!obj.is_object()) bad(where, "expected an object");
    auto it = obj.find(key);
    if (it == obj.end()) bad(where.empty() ? key : where + "." + key, "missing");
    return *it;
  }
  std::string str(const json& obj, const std::string& key, const std::string& where) const {
    const json& v = get(obj, key, where);
    if (!v.is_string()) bad(where + "." + key, "expected a string");
    return v.get<std::string>();
  }
  bool flag(const json& obj, const std::string& key, const std::string& where, bool dflt) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return dflt;
    if (!it->is_boolean()) bad(where + "." + key, "expected true or false");
    return it->get<bool>();
  }
  int32_t id(const json& v, const std::string& field) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 0x7FFFFFFF)
      bad(field, "expected a non-negative 32-bit integer id");
    return int32_t(v.get<int64_t>());
  }
  std::string type(const json& obj, const std::string& where) const { return str(obj, "type", where); }
};

// model.vocab and model.merges (hundreds of thousands of entries) are taken out of the JSON while it is parsed
// instead of being built as a DOM and copied.
struct BigFields {
  bool have_vocab = false;
  bool have_merges = false;
  tok::TokenMap vocab;
  std::vector<std::pair<std::string, std::string>> merges;
};

json parse_capturing(std::string_view text, const Reader& r, BigFields& big) {
  using Event = json::parse_event_t;
  std::string keys[4];  // current key at each object depth
  bool in_vocab = false, in_merges = false;
  std::vector<std::string> pair;  // strings of the merge pair being read
  bool pair_ok = true;
  auto merge_field = [&] { return "model.merges[" + std::to_string(big.merges.size()) + "]"; };
  json::parser_callback_t cb = [&](int depth, Event ev, json& v) -> bool {
    if (ev == Event::key) {
      if (depth < 4) keys[depth] = v.get_ref<const std::string&>();
      return !(in_vocab && depth == 3);  // vocabulary members stay out of the DOM
    }
    if (depth == 2 && keys[1] == "model") {
      if (ev == Event::object_start && keys[2] == "vocab")
        in_vocab = big.have_vocab = true;
      else if (ev == Event::object_end && in_vocab)
        in_vocab = false;
      else if (ev == Event::array_start && keys[2] == "merges")
        in_merges = big.have_merges = true;
      else if (ev == Event::array_end && in_merges)
        in_merges = false;
      return true;
    }
    if (in_merges && depth == 4) {
      // Inside a ["left", "right"] pair: keep the strings here, not in the DOM.
      if (ev == Event::value && v.is_string())
        pair.push_back(v.get_ref<const std::string&>());
      else
        pair_ok = false;
      return false;
    }
    if (depth != 3) return true;
    if (in_vocab) {
      if (ev != Event::value || !v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 0x7FFFFFFF)
        r.bad("model.vocab[\"" + keys[3] + "\"]", "expected a non-negative 32-bit integer id");
      big.vocab.set(keys[3], int32_t(v.get<int64_t>()));
      return true;  // its key was dropped, so nothing is stored
    }
    if (in_merges) {
      if (ev == Event::array_start || ev == Event::object_start) {
        pair.clear();
        pair_ok = ev == Event::array_start;
        return true;  // judged when complete
      }
      if (ev == Event::value && v.is_string()) {
        // "a b": exactly one space, as HF requires.
        const std::string& m = v.get_ref<const std::string&>();
        size_t sp = m.find(' ');
        if (sp == std::string::npos || m.find(' ', sp + 1) != std::string::npos)
          r.bad(merge_field(), "expected \"left right\" with exactly one space, got \"" + m + "\"");
        big.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
      } else if (ev == Event::array_end && pair_ok && pair.size() == 2) {
        big.merges.emplace_back(std::move(pair[0]), std::move(pair[1]));
      } else if (ev == Event::value || ev == Event::array_end || ev == Event::object_end) {
        r.bad(merge_field(), "expected a string \"left right\" or a pair [\"left\", \"right\"]");
      }
      return false;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", r.origin, json_error_message(e));
  }
}

std::unique_ptr<tok::BpeModel> read_model(const Reader& r, const json& root, BigFields& big) {
  const json& m = r.get(root, "model", "");
  if (m.contains("type") && r.type(m, "model") != "BPE")
    r.bad("model.type", "only BPE models are supported, got '" + m["type"].get<std::string>() + "'");
  if (m.contains("dropout") && !m["dropout"].is_null() && !(m["dropout"].is_number() && m["dropout"] == 0))
    r.bad("model.dropout", "BPE dropout is not supported (tokenization would be random)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && !m[key].is_null() && !(m[key].is_string() && m[key].get<std::string>().empty()))
      r.bad(std::string("model.") + key, "not supported by the byte-level BPE (expected null or \"\")");
  }
  tok::BpeOptions opt;
  opt.ignore_merges = r.flag(m, "ignore_merges", "model", false);
  opt.fuse_unk = r.flag(m, "fuse_unk", "model", false);
  opt.byte_fallback = r.flag(m, "byte_fallback", "model", false);
  if (m.contains("unk_token") && !m["unk_token"].is_null()) opt.unk_token = r.str(m, "unk_token", "model");
  if (!big.have_vocab) {
    r.get(m, "vocab", "model");
    r.bad("model.vocab", "expected an object token -> id");
  }
  if (!big.have_merges) {
    r.get(m, "merges", "model");
    r.bad("model.merges", "expected an array");
  }
  return std::make_unique<tok::BpeModel>(std::move(big.vocab), big.merges, std::move(opt), r.origin);
}

void read_normalizer(const Reader& r, const json& n, const std::string& where, std::vector<NormalizerStep>& out) {
  if (n.is_null()) return;
  const std::string type = r.type(n, where);
  NormalizerStep step;
  if (type == "Sequence") {
    const json& list = r.get(n, "normalizers", where);
    if (!list.is_array()) r.bad(where + ".normalizers", "expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      read_normalizer(r, list[i], where + ".normalizers[" + std::to_string(i) + "]", out);
    return;
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    step.form = type == "NFC"    ? unicode::NormalForm::kNFC
                : type == "NFD"  ? unicode::NormalForm::kNFD
                : type == "NFKC" ? unicode::NormalForm::kNFKC
                                 : unicode::NormalForm::kNFKD;
  } else if (type == "Prepend") {
    step.kind = NormalizerStep::Kind::kPrepend;
    step.text = r.str(n, "prepend", where);
  } else if (type == "Replace") {
    step.kind = NormalizerStep::Kind::kReplace;
    const json& pat = r.get(n, "pattern", where);
    if (!pat.is_object() || !pat.contains("String"))
      r.bad(where + ".pattern", "only {\"String\": ...} patterns are supported in a Replace normalizer");
    step.text = r.str(pat, "String", where + ".pattern");
    step.replacement = r.str(n, "content", where);
  } else if (type == "Strip") {
    step.kind = NormalizerStep::Kind::kStrip;
    step.strip_left = r.flag(n, "strip_left", where, true);
    step.strip_right = r.flag(n, "strip_right", where, true);
  } else {
    r.bad(where + ".type", "unsupported normalizer '" + type +
                               "' (supported: NFC, NFD, NFKC, NFKD, Sequence, "
                               "Prepend, Replace, Strip)");
  }
  out.push_back(std::move(step));
}

tok::SplitBehavior read_behavior(const Reader& r, const json& p, const std::string& where) {
  const std::string b = r.str(p, "behavior", where);
  if (b == "Removed") return tok::SplitBehavior::kRemoved;
  if (b == "Isolated") return tok::SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return tok::SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return tok::SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return tok::SplitBehavior::kContiguous;
  r.bad(where + ".behavior", "unknown split behavior '" + b + "'");
}

// Appends the steps of one pre-tokenizer; returns true when it was the ByteLevel one (which must come last).
bool read_pre_tokenizer(const Reader& r, const json& p, const std::string& where, std::vector<PreTokenizerStep>& out) {
  const std::string type = r.type(p, where);
  if (type == "Sequence") {
    const json& list = r.get(p, "pretokenizers", where);
    if (!list.is_array()) r.bad(where + ".pretokenizers", "expected an array");
    bool byte_level = false;
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string w = where + ".pretokenizers[" + std::to_string(i) + "]";
      if (byte_level) r.bad(w, "nothing may follow the ByteLevel pre-tokenizer");
      byte_level = read_pre_tokenizer(r, list[i], w, out);
    }
    return byte_level;
  }
  if (type == "Split") {
    const json& pat = r.get(p, "pattern", where);
    std::unique_ptr<tok::Matcher> matcher;
    if (pat.is_object() && pat.contains("Regex"))
      matcher = tok::make_regex_matcher(r.str(pat, "Regex", where + ".pattern"), r.origin);
    else if (pat.is_object() && pat.contains("String"))
      matcher = tok::make_literal_matcher(r.str(pat, "String", where + ".pattern"));
    else
      r.bad(where + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    out.push_back({std::make_unique<tok::SplitStep>(std::move(matcher), read_behavior(r, p, where),
                                                    r.flag(p, "invert", where, false))});
    return false;
  }
  if (type == "ByteLevel") {
    if (r.flag(p, "add_prefix_space", where, true)) out.push_back({nullptr});
    if (r.flag(p, "use_regex", where, true))
      out.push_back({std::make_unique<tok::SplitStep>(tok::make_regex_matcher(std::string(tok::kGpt2Pattern), r.origin),
                                                      tok::SplitBehavior::kIsolated, false)});
    return true;
  }
  r.bad(where + ".type", "unsupported pre-tokenizer '" + type + "' (supported: ByteLevel, Split, Sequence)");
}

// Post-processor passes for single sequences.
void read_post_processor(const Reader& r, const json& p, const std::string& where, const tok::TokenMap& ids,
                         std::vector<std::vector<PostItem>>& out) {
  if (p.is_null()) return;
  const std::string type = r.type(p, where);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    const json& list = r.get(p, "processors", where);
    if (!list.is_array()) r.bad(where + ".processors", "expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      read_post_processor(r, list[i], where + ".processors[" + std::to_string(i) + "]", ids, out);
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto special = [&](const char* key) {
      const json& v = r.get(p, key, where);
      if (!v.is_array() || v.size() != 2) r.bad(where + "." + key, "expected [token, id]");
      return r.id(v[1], where + "." + key + "[1]");
    };
    out.push_back({PostItem{false, {special("cls")}}, PostItem{true, {}}, PostItem{false, {special("sep")}}});
    return;
  }
  if (type == "TemplateProcessing") {
    const json& single = r.get(p, "single", where);
    const json& specials = r.get(p, "special_tokens", where);
    if (!single.is_array()) r.bad(where + ".single", "expected an array");
    std::vector<PostItem> pass;
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string w = where + ".single[" + std::to_string(i) + "]";
      const json& item = single[i];
      if (item.is_object() && item.contains("Sequence")) {
        if (r.str(item["Sequence"], "id", w + ".Sequence") != "A")
          r.bad(w, "a single-sequence template can only use $A");
        pass.push_back({true, {}});
      } else if (item.is_object() && item.contains("SpecialToken")) {
        const std::string name = r.str(item["SpecialToken"], "id", w + ".SpecialToken");
        const json& tokj = r.get(specials, name, where + ".special_tokens");
        const json& list = r.get(tokj, "ids", where + ".special_tokens." + name);
        if (!list.is_array()) r.bad(where + ".special_tokens." + name + ".ids", "expected an array");
        PostItem it;
        for (size_t k = 0; k < list.size(); ++k) it.ids.push_back(r.id(list[k], where + ".special_tokens." + name));
        pass.push_back(std::move(it));
      } else {
        r.bad(w, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
    }
    out.push_back(std::move(pass));
    return;
  }
  r.bad(where + ".type",
        "unsupported post-processor '" + type +
            "' (supported: ByteLevel, TemplateProcessing, RobertaProcessing, BertProcessing, Sequence)");
}

void check_decoder(const Reader& r, const json& d, const std::string& where) {
  if (d.is_null()) r.bad(where, "missing: a ByteLevel decoder is required");
  const std::string type = r.type(d, where);
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& list = r.get(d, "decoders", where);
    if (list.is_array() && list.size() == 1) return check_decoder(r, list[0], where + ".decoders[0]");
  }
  r.bad(where + ".type", "unsupported decoder '" + type + "' (only ByteLevel is supported)");
}

}  // namespace

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& origin) {
  auto im = std::make_unique<Impl>();
  im->origin = origin;
  Reader r{im->origin};
  BigFields big;
  json root = parse_capturing(json_text, r, big);
  if (!root.is_object()) r.bad("(root)", "expected an object");

  im->model = read_model(r, root, big);
  if (root.contains("normalizer")) read_normalizer(r, root["normalizer"], "normalizer", im->normalizer);
  if (!root.contains("pre_tokenizer") || root["pre_tokenizer"].is_null())
    r.bad("pre_tokenizer", "missing: a ByteLevel pre-tokenizer is required");
  if (!read_pre_tokenizer(r, root["pre_tokenizer"], "pre_tokenizer", im->pre_tokenizer))
    r.bad("pre_tokenizer", "must end with a ByteLevel pre-tokenizer (only byte-level BPE is supported)");
  if (im->pre_tokenizer.size() == 1 && im->pre_tokenizer[0].split)
    im->fast_split = im->pre_tokenizer[0].split->isolated_cover();
  check_decoder(r, root.contains("decoder") ? root["decoder"] : json(), "decoder");

  // Added tokens: HF uses the model's id when the content is in the vocabulary and otherwise numbers new tokens
  // from the vocabulary's size on, in file order, whatever "id" says (the two agree in well-formed files).
  const tok::TokenMap& vocab = im->model->vocab();
  int32_t next_new_id = int32_t(vocab.size());
  std::vector<tok::AddedToken> added;
  std::unordered_set<std::string> special_contents;
  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    const json& list = root["added_tokens"];
    if (!list.is_array()) r.bad("added_tokens", "expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string w = "added_tokens[" + std::to_string(i) + "]";
      tok::AddedToken t;
      t.content = r.str(list[i], "content", w);
      r.id(r.get(list[i], "id", w), w + ".id");
      t.special = r.flag(list[i], "special", w, false);
      t.single_word = r.flag(list[i], "single_word", w, false);
      t.lstrip = r.flag(list[i], "lstrip", w, false);
      t.rstrip = r.flag(list[i], "rstrip", w, false);
      t.normalized = r.flag(list[i], "normalized", w, !t.special);
      if (t.content.empty()) continue;
      if (!unicode::is_valid_utf8(t.content)) r.bad(w + ".content", "not valid UTF-8");
      if (int32_t id = vocab.find(t.content); id >= 0)
        t.id = id;
      else if (int32_t seen = im->added_ids.find(t.content); seen >= 0)
        t.id = seen;
      else
        t.id = next_new_id++;
      if (t.special) special_contents.insert(t.content);
      im->added_ids.set(t.content, t.id);
      added.push_back(std::move(t));
    }
  }
  // Special tokens first, then the others, in file order (HF's order when patterns tie).
  std::stable_partition(added.begin(), added.end(), [](const tok::AddedToken& t) { return t.special; });
  std::vector<tok::AddedToken> raw, norm;
  std::vector<std::string> raw_pat, norm_pat;
  for (const tok::AddedToken& t : added) {
    if (t.normalized) {
      std::string storage;
      norm_pat.emplace_back(im->normalize(t.content, storage));
      norm.push_back(t);
    } else {
      raw_pat.push_back(t.content);
      raw.push_back(t);
    }
  }
  im->raw_added = tok::AddedTokenMatcher(std::move(raw), raw_pat);
  im->normalized_added = tok::AddedTokenMatcher(std::move(norm), norm_pat);

  if (root.contains("post_processor"))
    read_post_processor(r, root["post_processor"], "post_processor", im->added_ids, im->post);

  // Id tables: the model vocabulary, then added tokens (which win, as in HF's id_to_token).
  int32_t max_id = -1;
  vocab.for_each([&](std::string_view, int32_t id) { max_id = std::max(max_id, id); });
  for (const tok::AddedToken& t : added) max_id = std::max(max_id, t.id);
  if (max_id >= (1 << 24)) r.bad("model.vocab", "ids must be below 16777216, got " + std::to_string(max_id));
  im->vocab_size = max_id + 1;
  im->tokens.assign(size_t(im->vocab_size), std::string());
  im->flags.assign(size_t(im->vocab_size), 0);
  vocab.for_each([&](std::string_view token, int32_t id) {
    im->tokens[id] = token;
    im->flags[id] = Impl::kHasToken;
  });
  // HF decodes (and names) a normalized added token by its normalized form, e.g. "\uFB01x" under NFKC as "fix".
  for (const tok::AddedToken& t : added) {
    std::string storage;
    im->tokens[t.id] = t.normalized ? std::string(im->normalize(t.content, storage)) : t.content;
    im->flags[t.id] = Impl::kHasToken;
  }
  // ByteLevel decoding: a token whose characters all belong to the byte table becomes those bytes; any other
  // token (e.g. an added "  ") is kept as its UTF-8 text.
  im->decoded_off.assign(size_t(im->vocab_size) + 1, 0);
  for (int32_t id = 0; id < im->vocab_size; ++id) {
    im->decoded_off[id] = uint32_t(im->decoded.size());
    const std::string& t = im->tokens[id];
    if (special_contents.count(t) && (im->flags[id] & Impl::kHasToken)) im->flags[id] |= Impl::kSpecial;
    std::string bytes;
    bool all_mapped = true;
    for (size_t i = 0; i < t.size() && all_mapped;) {
      int b = tok::char_to_byte(unicode::next_codepoint(t, i));
      if (b < 0) all_mapped = false;
      bytes.push_back(char(b));
    }
    im->decoded += all_mapped ? bytes : t;
  }
  im->decoded_off[size_t(im->vocab_size)] = uint32_t(im->decoded.size());
  return Tokenizer(std::move(im));
}

Tokenizer Tokenizer::load(const std::string& tokenizer_json_path) {
  std::error_code ec;
  if (std::filesystem::is_directory(tokenizer_json_path, ec))
    fail("{}: is a directory; pass the tokenizer.json file inside it", tokenizer_json_path);
  std::ifstream f(tokenizer_json_path, std::ios::binary);
  if (!f) fail("{}: cannot open tokenizer file", tokenizer_json_path);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("{}: read error", tokenizer_json_path);
  return from_json(ss.str(), tokenizer_json_path);
}

}  // namespace moecel
