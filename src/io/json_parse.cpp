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
    fail("{}: invalid JSON: {}", what, e.what());
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
