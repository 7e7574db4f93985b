// A reader for the YAML that benchmark clients write as configuration
// (inference-perf's config.yml, GuideLLM's profile.yaml): block mappings
// and sequences by indentation, plain and quoted scalars, one-line flow
// collections ({a: 1, b: [2, 3]}), comments, a leading "---".
//
// Contract: what the subset does not hold is an error naming the file and
// line, never a silent misreading: anchors and aliases (&, *), tags (!),
// block scalars (| and >), several documents, flow collections spread over
// lines, tabs in indentation, duplicate keys, and text that is indented
// where no block can start, nesting deeper than 64 levels. Scalars stay text; the accessors convert
// them (YAML 1.1's booleans, as PyYAML reads them: true/false, yes/no, on/off).
#ifndef SERVESIM_STUDIES_YAML_SUBSET_H_
#define SERVESIM_STUDIES_YAML_SUBSET_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace servesim::studies {

struct YamlNode {
  struct Entry;  // a mapping's key and value
  enum class Kind { kNull, kScalar, kMap, kSeq };
  Kind kind = Kind::kNull;
  std::string scalar;         // kScalar: the text, unquoted
  bool quoted = false;        // kScalar: written in quotes (never a number or a boolean)
  std::vector<Entry> map;     // kMap, in file order
  std::vector<YamlNode> seq;  // kSeq
  int line = 0;               // where it starts, 1-based

  bool is_map() const { return kind == Kind::kMap; }
  bool is_seq() const { return kind == Kind::kSeq; }
  bool is_scalar() const { return kind == Kind::kScalar; }
  bool is_null() const { return kind == Kind::kNull; }
  // The value under `key` of a mapping; null when absent or not a mapping.
  const YamlNode* Find(absl::string_view key) const;
};

struct YamlNode::Entry {
  std::string key;
  YamlNode value;
};

// Parses `text`; errors are INVALID_ARGUMENT "PATH:LINE: ...".
absl::StatusOr<YamlNode> ParseYaml(absl::string_view text, const std::string& path);

// A scalar as a number, an integer or a boolean; INVALID_ARGUMENT names
// PATH:LINE, the field `name` and what was found.
absl::StatusOr<double> YamlNumber(const YamlNode& node, const std::string& path,
                                  absl::string_view name);
absl::StatusOr<int64_t> YamlInteger(const YamlNode& node, const std::string& path,
                                    absl::string_view name);
absl::StatusOr<bool> YamlBool(const YamlNode& node, const std::string& path,
                              absl::string_view name);
// A scalar's text (quoted or not); an error for a mapping or a sequence.
absl::StatusOr<std::string> YamlString(const YamlNode& node, const std::string& path,
                                       absl::string_view name);

}  // namespace servesim::studies

#endif  // SERVESIM_STUDIES_YAML_SUBSET_H_
