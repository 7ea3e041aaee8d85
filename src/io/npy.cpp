// NumPy .npy reading and writing for float32 arrays. The header is a Python dict literal
// ({'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }) that is parsed here by a small strict scanner.
#include "io/npy.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>

#include "core/error.h"

namespace moecel {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr uint64_t kMaxHeaderBytes = 1u << 20;

// Scanner over the header dict literal; every error names the file.
class DictScanner {
 public:
  DictScanner(const std::string& path, const std::string& text) : path_(path), s_(text) {}

  std::map<std::string, std::string> parse() {
    std::map<std::string, std::string> out;  // key -> raw value text
    expect('{');
    for (;;) {
      skip_ws();
      if (peek() == '}') break;
      std::string key = quoted();
      expect(':');
      skip_ws();
      std::string value = raw_value();
      if (!out.emplace(key, value).second) bad(fmt::format("duplicate key '{}'", key));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') bad("expected ',' or '}'");
    }
    ++pos_;
    skip_ws();
    if (pos_ != s_.size()) bad("trailing characters after the header dict");
    return out;
  }

  [[noreturn]] void bad(const std::string& what) const {
    fail("{}: malformed .npy header at offset {}: {}", path_, pos_, what);
  }

 private:
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t' || s_[pos_] == '\r')) ++pos_;
  }
  void expect(char c) {
    skip_ws();
    if (peek() != c) bad(fmt::format("expected '{}'", c));
    ++pos_;
  }
  std::string quoted() {
    char q = peek();
    if (q != '\'' && q != '"') bad("expected a quoted key");
    size_t end = s_.find(q, pos_ + 1);
    if (end == std::string::npos) bad("unterminated string");
    std::string out = s_.substr(pos_ + 1, end - pos_ - 1);
    pos_ = end + 1;
    return out;
  }
  // A string, a word (True/False), or a parenthesized tuple, returned verbatim.
  std::string raw_value() {
    size_t start = pos_;
    char c = peek();
    if (c == '\'' || c == '"') {
      quoted();
    } else if (c == '(') {
      size_t end = s_.find(')', pos_);
      if (end == std::string::npos) bad("unterminated tuple");
      pos_ = end + 1;
    } else {
      while (pos_ < s_.size() && std::isalnum(static_cast<unsigned char>(s_[pos_]))) ++pos_;
      if (pos_ == start) bad("expected a value");
    }
    return s_.substr(start, pos_ - start);
  }

  const std::string& path_;
  const std::string& s_;
  size_t pos_ = 0;
};

Shape parse_shape(const std::string& path, const std::string& tuple) {
  // "(2, 3)", "(5,)" or "()"
  Shape shape;
  size_t i = 1;
  auto bad = [&] { fail("{}: malformed .npy shape '{}'", path, tuple); };
  if (tuple.size() < 2 || tuple.front() != '(' || tuple.back() != ')') bad();
  const size_t end = tuple.size() - 1;
  while (i < end) {
    while (i < end && tuple[i] == ' ') ++i;
    if (i == end) break;
    if (!std::isdigit(static_cast<unsigned char>(tuple[i]))) bad();
    uint64_t v = 0;
    while (i < end && std::isdigit(static_cast<unsigned char>(tuple[i]))) {
      if (__builtin_mul_overflow(v, 10u, &v) || __builtin_add_overflow(v, uint64_t(tuple[i] - '0'), &v)) bad();
      ++i;
    }
    while (i < end && tuple[i] == 'L') ++i;  // Python 2 longs in old files
    if (v > uint64_t(std::numeric_limits<int64_t>::max())) bad();
    shape.push_back(int64_t(v));
    while (i < end && tuple[i] == ' ') ++i;
    if (i < end && tuple[i] != ',') bad();
    if (i < end) ++i;
  }
  if (shape.size() == 1 && tuple.find(',') == std::string::npos) bad();  // "(5)" is not a tuple
  return shape;
}

}  // namespace

void write_npy(const std::string& path, const Shape& shape, const float* data) {
  uint64_t numel = 1;
  for (int64_t d : shape) {
    MOECEL_CHECK(d >= 0, "{}: cannot write negative shape {}", path, shape_str(shape));
    MOECEL_CHECK(!__builtin_mul_overflow(numel, uint64_t(d), &numel), "{}: shape {} overflows", path, shape_str(shape));
  }
  MOECEL_CHECK(data != nullptr || numel == 0, "{}: no data to write", path);
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_str(shape) + ", }";
  // Version 1.0 has a 2-byte header length (2.0: 4 bytes); magic + version + length + header, ending in '\n',
  // is padded with spaces to a multiple of 64 bytes so the data starts aligned.
  auto padded = [&](size_t prefix) { return prefix + dict.size() + 1 + (64 - (prefix + dict.size() + 1) % 64) % 64; };
  const bool v2 = padded(kMagicLen + 4) - (kMagicLen + 4) > 65535;
  const size_t prefix = kMagicLen + 2 + (v2 ? 4 : 2);
  dict.append(padded(prefix) - prefix - dict.size() - 1, ' ');
  dict += '\n';
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail("{}: cannot create ({})", path, std::strerror(errno));
  f.write(kMagic, kMagicLen);
  const char version[2] = {char(v2 ? 2 : 1), 0};
  f.write(version, 2);
  const uint32_t hlen = uint32_t(dict.size());
  unsigned char len[4] = {uint8_t(hlen), uint8_t(hlen >> 8), uint8_t(hlen >> 16), uint8_t(hlen >> 24)};
  f.write(reinterpret_cast<const char*>(len), v2 ? 4 : 2);
  f.write(dict.data(), std::streamsize(dict.size()));
  // Data is little-endian f32; every supported host is little-endian.
  if (numel > 0) f.write(reinterpret_cast<const char*>(data), std::streamsize(numel * 4));
  f.close();
  if (!f) fail("{}: write failed", path);
}

void write_npy(const std::string& path, const NpyArray& a) {
  MOECEL_CHECK(int64_t(a.data.size()) == shape_numel(a.shape), "{}: shape {} needs {} floats, got {}", path,
               shape_str(a.shape), shape_numel(a.shape), a.data.size());
  write_npy(path, a.shape, a.data.data());
}

NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) fail("{}: cannot open ({})", path, std::strerror(errno));
  const uint64_t file_size = uint64_t(f.tellg());
  f.seekg(0);
  char pre[10];
  if (file_size < 10 || !f.read(pre, 10)) fail("{}: too short to be a .npy file ({} bytes)", path, file_size);
  if (std::memcmp(pre, kMagic, kMagicLen) != 0) fail("{}: not a .npy file (bad magic)", path);
  const int major = static_cast<unsigned char>(pre[6]), minor = static_cast<unsigned char>(pre[7]);
  if (!((major == 1 || major == 2 || major == 3) && minor == 0)) {
    fail("{}: unsupported .npy version {}.{} (expected 1.0, 2.0 or 3.0)", path, major, minor);
  }
  uint64_t hlen = 0;
  uint64_t prefix = 10;
  if (major == 1) {
    hlen = uint64_t(static_cast<unsigned char>(pre[8])) | uint64_t(static_cast<unsigned char>(pre[9])) << 8;
  } else {
    char more[2];
    if (file_size < 12 || !f.read(more, 2)) fail("{}: truncated .npy preamble", path);
    for (int i = 3; i >= 0; --i) {
      unsigned char b = static_cast<unsigned char>(i < 2 ? pre[8 + i] : more[i - 2]);
      hlen = (hlen << 8) | b;
    }
    prefix = 12;
  }
  if (hlen > kMaxHeaderBytes || hlen > file_size - prefix) {
    fail("{}: header length {} runs past the end of the {} byte file", path, hlen, file_size);
  }
  std::string header(size_t(hlen), '\0');
  if (!f.read(header.data(), std::streamsize(hlen))) fail("{}: truncated .npy header", path);

  DictScanner scan(path, header);
  auto dict = scan.parse();
  for (const char* key : {"descr", "fortran_order", "shape"}) {
    if (!dict.count(key)) fail("{}: .npy header lacks '{}'", path, key);
  }
  if (dict.size() != 3) fail("{}: .npy header has unexpected keys (expected descr, fortran_order, shape)", path);
  const std::string& descr = dict["descr"];
  if (descr != "'<f4'" && descr != "\"<f4\"")
    fail("{}: dtype {} is not supported (expected '<f4', float32)", path, descr);
  if (dict["fortran_order"] != "False") {
    fail("{}: fortran_order {} is not supported (expected False, C order)", path, dict["fortran_order"]);
  }
  NpyArray a;
  a.shape = parse_shape(path, dict["shape"]);
  uint64_t numel = 1;
  for (int64_t d : a.shape) {
    if (__builtin_mul_overflow(numel, uint64_t(d), &numel)) fail("{}: shape {} overflows", path, shape_str(a.shape));
  }
  uint64_t nbytes;
  if (__builtin_mul_overflow(numel, uint64_t(4), &nbytes)) fail("{}: shape {} overflows", path, shape_str(a.shape));
  const uint64_t data_bytes = file_size - prefix - hlen;
  if (data_bytes != nbytes) {
    fail("{}: shape {} needs {} bytes of data, the file has {}", path, shape_str(a.shape), nbytes, data_bytes);
  }
  a.data.resize(size_t(numel));
  if (numel > 0 && !f.read(reinterpret_cast<char*>(a.data.data()), std::streamsize(nbytes))) {
    fail("{}: read error", path);
  }
  return a;
}

}  // namespace moecel
