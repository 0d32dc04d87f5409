// shardopt-plan: a small JSON reader for what the planner reads: the rows
// of shardopt-bench-comm --json and shardopt-bench-optim --json (one object
// per line) and the JSON strings of a checkpoint's metadata
// (shardopt.params). Objects, arrays, strings (with \" \\ \/ \b \f \n \r
// \t and \u escapes of the Basic Multilingual Plane), numbers, true, false
// and null; anything else is an error naming the position.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace plan {

struct Json {
  enum class Kind { null, boolean, number, string, array, object } kind = Kind::null;
  bool b = false;
  double num = 0.0;
  std::string str;
  std::vector<Json> items;              // array
  std::map<std::string, Json> members;  // object

  // The member `key` of an object, or null if absent (or not an object).
  const Json* get(const std::string& key) const {
    if (kind != Kind::object) return nullptr;
    const auto it = members.find(key);
    return it == members.end() ? nullptr : &it->second;
  }
  bool is_number() const { return kind == Kind::number; }
  bool is_string() const { return kind == Kind::string; }
};

// A malformed text: what and where (a byte offset).
struct JsonError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class JsonParser {
 public:
  explicit JsonParser(std::string_view text) : s_(text) {}

  // The one value the text holds (surrounding blanks allowed).
  Json parse() {
    Json v = value(0);
    blanks();
    if (pos_ != s_.size()) fail("unexpected text after the value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw JsonError(what + " at byte " + std::to_string(pos_ + 1));
  }
  void blanks() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  bool take(char c) {
    blanks();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail(std::string("expected '") + c + "'");
  }
  bool word(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }

  Json value(int depth) {
    if (depth > 64) fail("nesting deeper than 64");
    blanks();
    if (pos_ >= s_.size()) fail("unexpected end of the text");
    Json v;
    const char c = s_[pos_];
    if (c == '{') {
      ++pos_;
      v.kind = Json::Kind::object;
      if (take('}')) return v;
      do {
        blanks();
        if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a member name");
        std::string key = string();
        expect(':');
        v.members[key] = value(depth + 1);
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      ++pos_;
      v.kind = Json::Kind::array;
      if (take(']')) return v;
      do v.items.push_back(value(depth + 1));
      while (take(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Json::Kind::string;
      v.str = string();
    } else if (word("true")) {
      v.kind = Json::Kind::boolean;
      v.b = true;
    } else if (word("false")) {
      v.kind = Json::Kind::boolean;
    } else if (word("null")) {
    } else {
      v.kind = Json::Kind::number;
      v.num = number();
    }
    return v;
  }

  double number() {
    const std::size_t start = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    const auto digits = [&] {
      const std::size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ > d;
    };
    if (!digits()) fail("expected a value");
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (!digits()) fail("expected digits after '.'");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!digits()) fail("expected an exponent");
    }
    return std::stod(std::string(s_.substr(start, pos_ - start)));
  }

  std::string string() {
    ++pos_;  // the opening quote
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated string");
      const char e = s_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          if (pos_ + 4 > s_.size()) fail("short \\u escape");
          unsigned cp = 0;
          for (int k = 0; k < 4; ++k) {
            const char h = s_[pos_++];
            cp <<= 4;
            if (h >= '0' && h <= '9')
              cp |= unsigned(h - '0');
            else if (h >= 'a' && h <= 'f')
              cp |= unsigned(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F')
              cp |= unsigned(h - 'A' + 10);
            else
              fail("bad \\u escape");
          }
          // UTF-8 of a code point of the Basic Multilingual Plane.
          if (cp < 0x80) {
            out += char(cp);
          } else if (cp < 0x800) {
            out += char(0xC0 | (cp >> 6));
            out += char(0x80 | (cp & 0x3F));
          } else {
            out += char(0xE0 | (cp >> 12));
            out += char(0x80 | ((cp >> 6) & 0x3F));
            out += char(0x80 | (cp & 0x3F));
          }
          break;
        }
        default:
          fail(std::string("bad escape '\\") + e + "'");
      }
    }
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

inline Json parse_json(std::string_view text) { return JsonParser(text).parse(); }

}  // namespace plan
