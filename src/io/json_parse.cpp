// Strict JSON parsing: duplicate keys and absurd nesting are errors, found with nlohmann's parse callback.
#include "io/json_parse.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace moecel {

std::string json_error_message(const nlohmann::json::exception& e) {
  // nlohmann quotes the bytes it last read verbatim, so a non-UTF-8 file would put raw invalid bytes into the
  // message: non-ASCII bytes are shown as \xNN.
  std::string msg;
  for (const char* p = e.what(); *p; ++p) {
    const auto b = static_cast<unsigned char>(*p);
    msg += b < 0x80 ? std::string(1, *p) : fmt::format("\\x{:02X}", b);
  }
  return msg;
}

nlohmann::json parse_json_strict(std::string_view text, const std::string& what, int max_depth) {
  using nlohmann::json;
  // One key set per open object; keys always belong to the innermost open object.
  std::vector<std::set<std::string>> open_objects;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) -> bool {
    if (depth > max_depth) fail("{}: JSON nested deeper than {} levels", what, max_depth);
    switch (event) {
      case json::parse_event_t::object_start: open_objects.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!open_objects.empty() && !open_objects.back().insert(key).second) {
          fail("{}: duplicate key '{}' (each name may appear only once)", what, key);
        }
        break;
      }
      default: break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", what, json_error_message(e));
  }
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open ({})", path, std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("{}: read error", path);
  return ss.str();
}

}  // namespace moecel
