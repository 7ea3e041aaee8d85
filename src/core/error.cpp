// printable_message: error text made safe to print as one terminal line (error.h).
#include "core/error.h"

namespace moecel {

std::string printable_message(std::string_view message) {
  std::string out;
  out.reserve(message.size());
  for (const char ch : message) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02X}", c);
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace moecel
