// Loading scenario files: protobuf text with every field's location kept,
// and `--set field.path=value` overrides.
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/read_text.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "scenario/scenario.h"

namespace servesim::scenario {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using google::protobuf::TextFormat;

class CollectErrors : public google::protobuf::io::ErrorCollector {
 public:
  explicit CollectErrors(std::string path) : path_(std::move(path)) {}
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!first_.empty()) return;
    first_ = absl::StrCat(path_, ":", line + 1, ":", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string path_;
  std::string first_;
};

std::string Dirname(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

namespace {

// The line (0-based) where `field_path`, or its nearest written ancestor,
// was written; -1 if none was. `exact`: whether the field itself was.
int LineOf(const TextFormat::ParseInfoTree* tree, absl::string_view field_path, bool* exact) {
  int line = -1;
  *exact = false;
  const Descriptor* desc = servesim::v1::Scenario::descriptor();
  const std::vector<absl::string_view> parts = absl::StrSplit(field_path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    if (tree == nullptr || desc == nullptr) break;
    // "name[i]": element i of a repeated field (else its first).
    absl::string_view name = parts[i];
    int index = 0;
    if (const size_t open = name.find('['); open != absl::string_view::npos && name.back() == ']') {
      if (!absl::SimpleAtoi(name.substr(open + 1, name.size() - open - 2), &index) || index < 0)
        break;
      name = name.substr(0, open);
    }
    const FieldDescriptor* f = desc->FindFieldByName(std::string(name));
    if (f == nullptr) break;
    const auto loc = tree->GetLocation(f, f->is_repeated() ? index : -1);
    if (loc.line < 0) break;
    line = loc.line;
    if (i + 1 == parts.size()) *exact = true;
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) break;
    tree = tree->GetTreeForNested(f, f->is_repeated() ? index : -1);
    desc = f->message_type();
  }
  return line;
}

}  // namespace

std::string LoadedScenario::Where(absl::string_view field_path) const {
  // A pool's field: where the pool sets it, else where the scenario does,
  // else the pool's nearest written ancestor (the pool at least).
  int pool_line = -1;
  if (!pool_path.empty() &&
      (absl::StartsWith(field_path, "cluster.") || absl::StartsWith(field_path, "scheduler."))) {
    const std::string pooled = absl::StrCat(pool_path, ".", field_path);
    if (overridden.count(pooled) > 0) return absl::StrCat(path, " (--set ", pooled, ")");
    bool exact = false;
    pool_line = LineOf(locations.get(), pooled, &exact);
    if (exact) return absl::StrCat(path, ":", pool_line + 1);
  }
  if (overridden.count(std::string(field_path)) > 0) {
    return absl::StrCat(path, " (--set ", field_path, ")");
  }
  bool exact = false;
  int line = LineOf(locations.get(), field_path, &exact);
  if (!exact && pool_line >= 0) line = pool_line;
  if (line < 0) return path;
  return absl::StrCat(path, ":", line + 1);
}

bool LoadedScenario::Written(absl::string_view field_path) const {
  for (const std::string& o : overridden) {
    if (o == field_path || (absl::StartsWith(o, field_path) && o.size() > field_path.size() &&
                            o[field_path.size()] == '.')) {
      return true;
    }
  }
  bool exact = false;
  return LineOf(locations.get(), field_path, &exact) >= 0 && exact;
}

absl::StatusOr<LoadedScenario> ParseScenarioText(const std::string& text,
                                                 const std::string& path) {
  LoadedScenario out;
  out.path = path;
  out.base_dir = Dirname(path);
  out.locations = std::make_shared<TextFormat::ParseInfoTree>();
  CollectErrors errors(path);
  TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(out.locations.get());
  parser.AllowUnknownField(false);
  if (!parser.ParseFromString(text, &out.proto)) {
    return absl::InvalidArgumentError(
        errors.first().empty() ? absl::StrCat(path, ": not a valid Scenario")
                               : errors.first());
  }
  return out;
}

absl::StatusOr<LoadedScenario> LoadScenarioFile(const std::string& path) {
  auto text = ReadTextFile(path, kMaxScenarioBytes,
                           "a scenario file (protobuf text, e.g. examples/*.pbtxt)");
  if (!text.ok()) {
    // A missing scenario keeps its NOT_FOUND; every other refusal says why.
    return absl::IsNotFound(text.status())
               ? absl::NotFoundError(absl::StrCat(path, ": cannot open scenario file"))
               : text.status();
  }
  const std::string& buffer = *text;
  ASSIGN_OR_RETURN(LoadedScenario loaded, ParseScenarioText(buffer, path));
  if (loaded.proto.ByteSizeLong() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", buffer.empty() ? "is empty" : "sets nothing (only comments)",
        "; expected a scenario (protobuf text, schema proto/servesim/v1/scenario.proto, e.g. "
        "examples/*.pbtxt)"));
  }
  return loaded;
}

absl::Status ApplyOverride(LoadedScenario* scenario,
                           absl::string_view assignment) {
  const size_t eq = assignment.find('=');
  if (eq == absl::string_view::npos || eq == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--set ", assignment, ": expected field.path=value"));
  }
  const std::string path(absl::StripAsciiWhitespace(assignment.substr(0, eq)));
  const std::string value(absl::StripAsciiWhitespace(assignment.substr(eq + 1)));
  Message* msg = &scenario->proto;
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    const Descriptor* desc = msg->GetDescriptor();
    const FieldDescriptor* f = desc->FindFieldByName(parts[i]);
    if (f == nullptr) {
      std::vector<std::string> names;
      for (int j = 0; j < desc->field_count(); ++j) names.push_back(desc->field(j)->name());
      return absl::InvalidArgumentError(absl::StrCat(
          "--set ", path, ": ", desc->name(), " has no field \"", parts[i],
          "\"; its fields: ", absl::StrJoin(names, ", ")));
    }
    if (f->is_repeated()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--set ", path, ": ", f->name(), " is a list; --set takes scalars"));
    }
    const Reflection* r = msg->GetReflection();
    const bool last = i + 1 == parts.size();
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (last) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--set ", path, ": ", f->name(),
            " is a message; name one of its scalar fields"));
      }
      msg = r->MutableMessage(msg, f);
      continue;
    }
    if (!last) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--set ", path, ": ", f->name(), " is a scalar; nothing below it"));
    }
    bool ok = true;
    std::string expected;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: {
        int32_t v;
        ok = absl::SimpleAtoi(value, &v);
        if (ok) r->SetInt32(msg, f, v);
        expected = "a 32-bit integer";
        break;
      }
      case FieldDescriptor::CPPTYPE_INT64: {
        int64_t v;
        ok = absl::SimpleAtoi(value, &v);
        if (ok) r->SetInt64(msg, f, v);
        expected = "an integer";
        break;
      }
      case FieldDescriptor::CPPTYPE_UINT32: {
        uint32_t v;
        ok = absl::SimpleAtoi(value, &v);
        if (ok) r->SetUInt32(msg, f, v);
        expected = "a non-negative integer";
        break;
      }
      case FieldDescriptor::CPPTYPE_UINT64: {
        uint64_t v;
        ok = absl::SimpleAtoi(value, &v);
        if (ok) r->SetUInt64(msg, f, v);
        expected = "a non-negative integer";
        break;
      }
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        double v;
        ok = absl::SimpleAtod(value, &v) && std::isfinite(v);
        if (ok) r->SetDouble(msg, f, v);
        expected = "a finite number";
        break;
      }
      case FieldDescriptor::CPPTYPE_FLOAT: {
        float v;
        ok = absl::SimpleAtof(value, &v) && std::isfinite(v);
        if (ok) r->SetFloat(msg, f, v);
        expected = "a finite number";
        break;
      }
      case FieldDescriptor::CPPTYPE_BOOL: {
        bool v;
        ok = absl::SimpleAtob(value, &v);
        if (ok) r->SetBool(msg, f, v);
        expected = "true or false";
        break;
      }
      case FieldDescriptor::CPPTYPE_STRING:
        r->SetString(msg, f, value);
        break;
      case FieldDescriptor::CPPTYPE_ENUM: {
        const auto* e = f->enum_type();
        const EnumValueDescriptor* ev = e->FindValueByName(value);
        if (ev == nullptr) {
          // Accept the name without the type prefix, e.g. CHUNKED_PREFILL
          // (the prefix is what precedes UNSPECIFIED in value 0).
          ev = e->FindValueByName(
              absl::StrCat(absl::StripSuffix(e->value(0)->name(), "UNSPECIFIED"), value));
        }
        ok = ev != nullptr;
        if (ok) r->SetEnumValue(msg, f, ev->number());
        std::vector<std::string> names;
        for (int j = 1; j < e->value_count(); ++j) names.push_back(e->value(j)->name());
        expected = absl::StrCat("one of ", absl::StrJoin(names, ", "));
        break;
      }
      case FieldDescriptor::CPPTYPE_MESSAGE:
        break;
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--set ", path, "=", value, ": expected ", expected));
    }
  }
  scenario->overridden.insert(path);
  return absl::OkStatus();
}

absl::Status AnnotateFieldError(const LoadedScenario& scenario,
                                const absl::Status& status) {
  if (status.ok()) return status;
  const absl::string_view msg = status.message();
  size_t end = 0;
  while (end < msg.size() &&
         (absl::ascii_isalnum(static_cast<unsigned char>(msg[end])) ||
          msg[end] == '_' || msg[end] == '.')) {
    ++end;
  }
  const absl::string_view path = msg.substr(0, end);
  const absl::string_view top = path.substr(0, path.find('.'));
  if (top.empty() ||
      servesim::v1::Scenario::descriptor()->FindFieldByName(std::string(top)) == nullptr) {
    return status;
  }
  return absl::Status(status.code(),
                      absl::StrCat(scenario.Where(path), ": ", msg));
}

}  // namespace servesim::scenario
