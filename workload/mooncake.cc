// Mooncake JSONL traces (trace_formats.h).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "workload/row_reader.h"
#include "workload/text_reader.h"
#include "workload/trace_formats.h"

namespace servesim::workload {
namespace {

// A cursor over one line of JSON. Mooncake lines are flat objects, so this
// handles exactly what they need (strings, numbers, arrays) plus nested
// values and literals so that unknown keys of any kind can be skipped.
class JsonCursor {
 public:
  explicit JsonCursor(absl::string_view text) : text_(text) {}

  void SkipSpace() {
    while (pos_ < text_.size() &&
           absl::ascii_isspace(static_cast<unsigned char>(text_[pos_]))) {
      ++pos_;
    }
  }
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }
  bool Consume(char c) {
    SkipSpace();
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }

  // A string's raw content (escapes left as written: the keys we look for
  // have none).
  bool String(absl::string_view& out) {
    SkipSpace();
    if (Peek() != '"') return false;
    const size_t start = ++pos_;
    while (pos_ < text_.size() && text_[pos_] != '"') {
      pos_ += text_[pos_] == '\\' ? 2 : 1;
    }
    if (pos_ >= text_.size()) return false;
    out = text_.substr(start, pos_ - start);
    ++pos_;
    return true;
  }

  // Skips one value and returns its raw text.
  bool Value(absl::string_view& raw, int depth = 0) {
    SkipSpace();
    const size_t start = pos_;
    if (depth > 32) return false;  // bounds the recursion on hostile input
    const char c = Peek();
    if (c == '"') {
      absl::string_view ignored;
      if (!String(ignored)) return false;
    } else if (c == '[' || c == '{') {
      const bool object = c == '{';
      const char close = object ? '}' : ']';
      ++pos_;
      if (!Consume(close)) {
        do {
          absl::string_view ignored;
          if (object && (!String(ignored) || !Consume(':'))) return false;
          if (!Value(ignored, depth + 1)) return false;
        } while (Consume(','));
        if (!Consume(close)) return false;
      }
    } else {
      // Numbers and the literals true/false/null: a run of token bytes,
      // checked by whoever uses the value.
      while (pos_ < text_.size() &&
             (absl::ascii_isalnum(static_cast<unsigned char>(text_[pos_])) ||
              text_[pos_] == '-' || text_[pos_] == '+' || text_[pos_] == '.')) {
        ++pos_;
      }
      if (pos_ == start) return false;
    }
    raw = text_.substr(start, pos_ - start);
    return true;
  }

  size_t column() const { return pos_ + 1; }

 private:
  absl::string_view text_;
  size_t pos_ = 0;
};

constexpr absl::string_view kMooncakeFormat =
    "expected one flat JSON object per line with keys timestamp (ms), "
    "input_length, output_length";


// One flat JSON object per line.
class MooncakeRows : public RowReader {
 public:
  MooncakeRows(const std::string& path, std::unique_ptr<LineReader> lines)
      : path_(path), lines_(std::move(lines)) {}

  absl::StatusOr<bool> Next(RawRow& row) override {
    absl::string_view line;
    ASSIGN_OR_RETURN(const bool found, lines_->NextNonBlank(line));
    if (!found) {
      if (rows_ == 0) {
        return LineError(path_, lines_->line_number() + 1,
                         absl::StrCat("no data rows (", kMooncakeFormat, ")"));
      }
      return false;
    }
    const int64_t line_number = lines_->line_number();
    JsonCursor cursor(line);
    auto malformed = [&](absl::string_view what) {
      return LineError(
          path_, line_number,
          absl::StrCat("malformed JSON at column ", cursor.column(), ": ", what,
                       " (", kMooncakeFormat, ")"));
    };
    if (!cursor.Consume('{')) return malformed("expected '{'");
    // Raw values of the three keys we need; empty when absent.
    absl::string_view values[3];
    static constexpr absl::string_view kKeys[3] = {"timestamp", "input_length",
                                                   "output_length"};
    if (!cursor.Consume('}')) {
      do {
        absl::string_view key;
        absl::string_view raw;
        if (!cursor.String(key)) return malformed("expected a quoted key");
        if (!cursor.Consume(':')) return malformed("expected ':' after a key");
        if (!cursor.Value(raw)) return malformed("expected a value");
        for (int i = 0; i < 3; ++i) {
          if (key != kKeys[i]) continue;
          if (!values[i].empty()) {
            return LineError(path_, line_number,
                             absl::StrCat("duplicate key \"", key, "\" (",
                                          kMooncakeFormat, ")"));
          }
          values[i] = raw;
        }
      } while (cursor.Consume(','));
      if (!cursor.Consume('}')) return malformed("expected ',' or '}'");
    }
    cursor.SkipSpace();
    if (!cursor.AtEnd()) return malformed("unexpected text after the object");
    for (int i = 0; i < 3; ++i) {
      if (values[i].empty()) {
        return LineError(
            path_, line_number,
            absl::StrCat("no \"", kKeys[i], "\" key (", kMooncakeFormat, ")"));
      }
    }
    if (!ParseInt64(values[0], row.timestamp_ms) || row.timestamp_ms < 0) {
      return LineError(path_, line_number,
                       absl::StrCat("timestamp is ", Quoted(values[0]),
                                    "; expected an integer number of "
                                    "milliseconds >= 0"));
    }
    ASSIGN_OR_RETURN(
        row.input_tokens,
        ParseCount(path_, line_number, "input_length", values[1], 1));
    ASSIGN_OR_RETURN(
        row.output_tokens,
        ParseCount(path_, line_number, "output_length", values[2], 1));
    row.timestamp_s = static_cast<double>(row.timestamp_ms) / 1000.0;
    row.line = line_number;
    ++rows_;
    return true;
  }

 private:
  std::string path_;
  std::unique_ptr<LineReader> lines_;
  int64_t rows_ = 0;
};

// The whole file, rows in file order, each millisecond bucket spread in
// file order wherever its rows sit (the stream needs them within the
// reorder window; this whole-file form does not).
absl::StatusOr<TraceFile> DrainMooncake(RowReader& rows) {
  std::vector<RawRow> parsed;
  RawRow raw;
  while (true) {
    ASSIGN_OR_RETURN(const bool more, rows.Next(raw));
    if (!more) break;
    parsed.push_back(raw);
  }
  std::vector<size_t> order(parsed.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return parsed[a].timestamp_ms < parsed[b].timestamp_ms;
  });
  TraceFile trace;
  trace.rows.resize(parsed.size());
  for (size_t begin = 0; begin < order.size();) {
    const int64_t ms = parsed[order[begin]].timestamp_ms;
    size_t end = begin;
    while (end < order.size() && parsed[order[end]].timestamp_ms == ms) ++end;
    for (size_t k = begin; k < end; ++k) {
      const RawRow& p = parsed[order[k]];
      TraceRow& row = trace.rows[order[k]];
      row.timestamp_s = SpreadInBucket(ms, k - begin, end - begin);
      row.input_tokens = p.input_tokens;
      row.output_tokens = p.output_tokens;
    }
    begin = end;
  }
  return trace;
}

}  // namespace

double SpreadInBucket(int64_t ms, size_t k, size_t n) {
  return (static_cast<double>(ms) +
          static_cast<double>(k) / static_cast<double>(n)) /
         1000.0;
}

std::unique_ptr<RowReader> OpenMooncakeRows(const std::string& path,
                                            std::unique_ptr<LineReader> lines) {
  return std::make_unique<MooncakeRows>(path, std::move(lines));
}

absl::StatusOr<TraceFile> ParseMooncakeTrace(absl::string_view content,
                                             const std::string& name) {
  MooncakeRows rows(name, MemoryLines(content));
  return DrainMooncake(rows);
}

absl::StatusOr<TraceFile> ReadMooncakeTrace(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<LineReader> lines, FileLines(path));
  MooncakeRows rows(path, std::move(lines));
  return DrainMooncake(rows);
}

}  // namespace servesim::workload
