#include "studies/yaml_subset.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace servesim::studies {
namespace {

// One line that holds something: its indentation, its text without the
// indentation and the comment, and its number.
struct Line {
  int indent = 0;
  std::string text;
  int number = 0;
};

absl::Status Error(const std::string& path, int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ":", line, ": ", what));
}

// The first position outside quoted text where `stop(i, depth)` holds
// (depth: the flow brackets open there); npos if none. A quote opens
// anywhere when `quotes_anywhere`, else only at the start, after a blank or
// inside brackets (a plain scalar may hold an apostrophe).
size_t ScanOutsideQuotes(absl::string_view s, bool quotes_anywhere,
                         absl::FunctionRef<bool(size_t, int)> stop) {
  char quote = 0;
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote != 0) {
      if (c == '\\' && quote == '"') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
      continue;
    }
    if ((c == '"' || c == '\'') && (quotes_anywhere || i == 0 || depth > 0 || s[i - 1] == ' ')) {
      quote = c;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      --depth;
    } else if (stop(i, depth)) {
      return i;
    }
  }
  return absl::string_view::npos;
}

// The text before a comment: "#" at the start or after a blank, outside
// quotes.
std::string StripComment(absl::string_view s) {
  const size_t hash = ScanOutsideQuotes(s, /*quotes_anywhere=*/true, [s](size_t i, int) {
    return s[i] == '#' && (i == 0 || s[i - 1] == ' ' || s[i - 1] == '\t');
  });
  return std::string(absl::StripTrailingAsciiWhitespace(s.substr(0, hash)));
}

// The position of a mapping entry's ": " (or a final ":") outside quotes and
// brackets; npos when `s` is not a mapping entry.
size_t KeyColon(absl::string_view s) {
  return ScanOutsideQuotes(s, /*quotes_anywhere=*/false, [s](size_t i, int depth) {
    return s[i] == ':' && depth == 0 && (i + 1 == s.size() || s[i + 1] == ' ');
  });
}

bool IsSeqItem(absl::string_view s) { return s == "-" || absl::StartsWith(s, "- "); }

class Parser {
 public:
  Parser(std::vector<Line> lines, const std::string& path)
      : lines_(std::move(lines)), path_(path) {}

  absl::StatusOr<YamlNode> Document() {
    if (lines_.empty()) return YamlNode{};
    ASSIGN_OR_RETURN(YamlNode root, Block(lines_[0].indent));
    if (i_ < lines_.size()) {
      return Error(path_, lines_[i_].number, "indented where no block can start");
    }
    return root;
  }

 private:
  // The block of lines at `indent` from the current one.
  absl::StatusOr<YamlNode> Block(int indent) {
    const Depth depth(this);
    if (depth_ > kMaxDepth) return TooDeep(lines_[i_].number);
    if (IsSeqItem(lines_[i_].text)) return Sequence(indent);
    if (KeyColon(lines_[i_].text) != absl::string_view::npos) return Mapping(indent);
    // A lone scalar or flow collection.
    const Line& l = lines_[i_++];
    return Inline(l.text, l.number);
  }

  absl::StatusOr<YamlNode> Mapping(int indent) {
    YamlNode node;
    node.kind = YamlNode::Kind::kMap;
    node.line = lines_[i_].number;
    while (i_ < lines_.size() && lines_[i_].indent == indent && !IsSeqItem(lines_[i_].text)) {
      const Line& l = lines_[i_];
      const size_t colon = KeyColon(l.text);
      if (colon == absl::string_view::npos) {
        return Error(path_, l.number,
                     absl::StrCat("expected \"key: value\", found \"", l.text, "\""));
      }
      ASSIGN_OR_RETURN(
          YamlNode key_node,
          Inline(absl::StripAsciiWhitespace(absl::string_view(l.text).substr(0, colon)), l.number));
      if (!key_node.is_scalar()) return Error(path_, l.number, "a key must be a scalar");
      const std::string key = key_node.scalar;
      if (node.Find(key) != nullptr) {
        return Error(path_, l.number, absl::StrCat("duplicate key \"", key, "\""));
      }
      const absl::string_view rest =
          absl::StripAsciiWhitespace(absl::string_view(l.text).substr(colon + 1));
      const int number = l.number;
      ++i_;
      YamlNode value;
      value.line = number;
      if (!rest.empty()) {
        ASSIGN_OR_RETURN(value, Inline(rest, number));
      } else if (i_ < lines_.size() && lines_[i_].indent > indent) {
        ASSIGN_OR_RETURN(value, Block(lines_[i_].indent));
      } else if (i_ < lines_.size() && lines_[i_].indent == indent && IsSeqItem(lines_[i_].text)) {
        // A sequence may sit at its key's own indentation.
        ASSIGN_OR_RETURN(value, Sequence(indent));
      }
      node.map.push_back({key, std::move(value)});
    }
    if (i_ < lines_.size() && lines_[i_].indent > indent) {
      return Error(path_, lines_[i_].number, "indented where no block can start");
    }
    return node;
  }

  absl::StatusOr<YamlNode> Sequence(int indent) {
    YamlNode node;
    node.kind = YamlNode::Kind::kSeq;
    node.line = lines_[i_].number;
    while (i_ < lines_.size() && lines_[i_].indent == indent && IsSeqItem(lines_[i_].text)) {
      Line& l = lines_[i_];
      const std::string rest = l.text.size() > 1 ? l.text.substr(1) : std::string();
      const size_t skip = rest.find_first_not_of(' ');
      if (skip == std::string::npos) {
        // "-" alone: the item is the block below, or null.
        ++i_;
        if (i_ < lines_.size() && lines_[i_].indent > indent) {
          ASSIGN_OR_RETURN(YamlNode item, Block(lines_[i_].indent));
          node.seq.push_back(std::move(item));
        } else {
          YamlNode null;
          null.line = l.number;
          node.seq.push_back(null);
        }
        continue;
      }
      // The item's text starts a block at its own column: "- rate: 1"
      // continues with "  duration: 30" below it.
      l.indent = indent + 1 + static_cast<int>(skip);
      l.text = rest.substr(skip);
      ASSIGN_OR_RETURN(YamlNode item, Block(l.indent));
      node.seq.push_back(std::move(item));
    }
    return node;
  }

  // A scalar or a one-line flow collection.
  absl::StatusOr<YamlNode> Inline(absl::string_view s, int number) {
    size_t pos = 0;
    ASSIGN_OR_RETURN(YamlNode node, Flow(s, &pos, number, /*in_flow=*/false));
    while (pos < s.size() && s[pos] == ' ') ++pos;
    if (pos != s.size()) {
      return Error(path_, number, absl::StrCat("unexpected \"", s.substr(pos), "\""));
    }
    return node;
  }

  absl::StatusOr<YamlNode> Flow(absl::string_view s, size_t* pos, int number, bool in_flow) {
    const Depth depth(this);
    if (depth_ > kMaxDepth) return TooDeep(number);
    while (*pos < s.size() && s[*pos] == ' ') ++*pos;
    YamlNode node;
    node.line = number;
    if (*pos == s.size()) return node;
    const char c = s[*pos];
    if (c == '&' || c == '*') {
      return Error(path_, number,
                   "anchors and aliases (& and *) are not read here; write the value out");
    }
    if (c == '!') return Error(path_, number, "tags (!) are not read here");
    if ((c == '|' || c == '>') && !in_flow) {
      return Error(path_, number,
                   "block scalars (| and >) are not read here; write the value on one line");
    }
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      node.kind = c == '{' ? YamlNode::Kind::kMap : YamlNode::Kind::kSeq;
      ++*pos;
      while (true) {
        while (*pos < s.size() && s[*pos] == ' ') ++*pos;
        if (*pos == s.size()) {
          return Error(path_, number,
                       absl::StrCat("'", std::string(1, c),
                                    "' not closed on its line (flow "
                                    "collections over several lines are not read here)"));
        }
        if (s[*pos] == close) {
          ++*pos;
          return node;
        }
        if (node.is_map()) {
          ASSIGN_OR_RETURN(YamlNode key, Flow(s, pos, number, true));
          if (!key.is_scalar()) return Error(path_, number, "a key must be a scalar");
          while (*pos < s.size() && s[*pos] == ' ') ++*pos;
          if (*pos == s.size() || s[*pos] != ':') {
            return Error(path_, number, absl::StrCat("expected ':' after \"", key.scalar, "\""));
          }
          ++*pos;
          ASSIGN_OR_RETURN(YamlNode value, Flow(s, pos, number, true));
          if (node.Find(key.scalar) != nullptr) {
            return Error(path_, number, absl::StrCat("duplicate key \"", key.scalar, "\""));
          }
          node.map.push_back({key.scalar, std::move(value)});
        } else {
          ASSIGN_OR_RETURN(YamlNode item, Flow(s, pos, number, true));
          node.seq.push_back(std::move(item));
        }
        while (*pos < s.size() && s[*pos] == ' ') ++*pos;
        // Each item ends at a comma or the closing bracket.
        if (*pos < s.size() && s[*pos] == ',') {
          ++*pos;
        } else if (*pos < s.size() && s[*pos] != close) {
          return Error(path_, number,
                       absl::StrCat("expected ',' or '", std::string(1, close), "' at \"",
                                    s.substr(*pos, 20), "\""));
        }
      }
    }
    node.kind = YamlNode::Kind::kScalar;
    if (c == '"' || c == '\'') {
      node.quoted = true;
      ++*pos;
      while (true) {
        if (*pos >= s.size()) return Error(path_, number, "quoted text not closed on its line");
        const char d = s[(*pos)++];
        if (d == c) {
          if (c == '\'' && *pos < s.size() && s[*pos] == '\'') {
            node.scalar.push_back('\'');  // '' in single quotes
            ++*pos;
            continue;
          }
          return node;
        }
        if (c == '"' && d == '\\' && *pos < s.size()) {
          const char e = s[(*pos)++];
          node.scalar.push_back(e == 'n' ? '\n' : e == 't' ? '\t' : e);
          continue;
        }
        node.scalar.push_back(d);
      }
    }
    // A plain scalar: to the end, or in a flow collection to , ] } or ": ".
    const size_t start = *pos;
    while (*pos < s.size()) {
      const char d = s[*pos];
      if (in_flow && (d == ',' || d == ']' || d == '}')) break;
      if (in_flow && d == ':' && (*pos + 1 == s.size() || s[*pos + 1] == ' ')) break;
      ++*pos;
    }
    node.scalar = std::string(absl::StripAsciiWhitespace(s.substr(start, *pos - start)));
    if (node.scalar == "~" || node.scalar == "null" || node.scalar == "Null" ||
        node.scalar == "NULL") {
      node.kind = YamlNode::Kind::kNull;
      node.scalar.clear();
    }
    return node;
  }

  // Nesting is bounded, so that no input runs the stack out.
  static constexpr int kMaxDepth = 64;
  struct Depth {
    explicit Depth(Parser* p) : p(p) { ++p->depth_; }
    ~Depth() { --p->depth_; }
    Parser* p;
  };
  absl::Status TooDeep(int number) const {
    return Error(path_, number, absl::StrCat("nested deeper than ", kMaxDepth, " levels"));
  }

  std::vector<Line> lines_;
  const std::string& path_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

const YamlNode* YamlNode::Find(absl::string_view key) const {
  if (kind != Kind::kMap) return nullptr;
  for (const Entry& e : map) {
    if (e.key == key) return &e.value;
  }
  return nullptr;
}

absl::StatusOr<YamlNode> ParseYaml(absl::string_view text, const std::string& path) {
  std::vector<Line> lines;
  int number = 0;
  bool started = false;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++number;
    if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
    const std::string s = StripComment(raw);
    const size_t first = s.find_first_not_of(' ');
    if (first == std::string::npos) continue;
    if (s[first] == '\t') {
      return Error(path, number, "a tab in the indentation (YAML indents with spaces)");
    }
    const std::string body = s.substr(first);
    if (body == "---" || absl::StartsWith(body, "--- ")) {
      if (started) return Error(path, number, "a second document (---) is not read here");
      continue;
    }
    if (body == "...") break;
    if (body[0] == '%') return Error(path, number, "directives (%) are not read here");
    started = true;
    lines.push_back({static_cast<int>(first), body, number});
  }
  Parser parser(std::move(lines), path);
  return parser.Document();
}

absl::StatusOr<double> YamlNumber(const YamlNode& node, const std::string& path,
                                  absl::string_view name) {
  double v = 0;
  if (!node.is_scalar() || node.quoted || !absl::SimpleAtod(node.scalar, &v) || !std::isfinite(v)) {
    return Error(path, node.line,
                 absl::StrCat(name, " is ",
                              node.is_scalar() ? absl::StrCat("\"", node.scalar, "\"")
                              : node.is_map()  ? "a mapping"
                              : node.is_seq()  ? "a sequence"
                                               : "empty",
                              "; expected a number"));
  }
  return v;
}

absl::StatusOr<int64_t> YamlInteger(const YamlNode& node, const std::string& path,
                                    absl::string_view name) {
  ASSIGN_OR_RETURN(const double v, YamlNumber(node, path, name));
  if (v != std::floor(v) || std::fabs(v) > 9e15) {
    return Error(path, node.line,
                 absl::StrCat(name, " is ", node.scalar, "; expected a whole number"));
  }
  return static_cast<int64_t>(v);
}

absl::StatusOr<bool> YamlBool(const YamlNode& node, const std::string& path,
                              absl::string_view name) {
  if (node.is_scalar() && !node.quoted) {
    const std::string s = absl::AsciiStrToLower(node.scalar);
    if (s == "true" || s == "yes" || s == "on") return true;
    if (s == "false" || s == "no" || s == "off") return false;
  }
  return Error(
      path, node.line,
      absl::StrCat(name, " is ",
                   node.is_scalar() ? absl::StrCat("\"", node.scalar, "\"") : "not a scalar",
                   "; expected true or false"));
}

absl::StatusOr<std::string> YamlString(const YamlNode& node, const std::string& path,
                                       absl::string_view name) {
  if (node.is_scalar()) return node.scalar;
  if (node.is_null()) return std::string();
  return Error(
      path, node.line,
      absl::StrCat(name, " is a ", node.is_map() ? "mapping" : "sequence", "; expected a scalar"));
}

}  // namespace servesim::studies
