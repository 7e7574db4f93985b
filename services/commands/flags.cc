#include "services/commands/flags.h"

#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace servesim::services {

int UsageError(const std::string& msg) {
  std::cerr << "servesim: " << msg << "\nRun 'servesim --help' for usage.\n";
  return kExitUsage;
}

int Fail(const absl::Status& status) {
  std::cerr << "servesim: error: " << status.message() << "\n";
  return kExitFailure;
}

void FlagParser::Value(const std::string& name, const std::string& missing, Handler handler) {
  Spec spec;
  spec.missing = missing;
  spec.handler = std::move(handler);
  flags_[name] = std::move(spec);
}

void FlagParser::Alias(const std::string& alias, const std::string& name) {
  aliases_[alias] = name;
}

void FlagParser::Inline(const std::string& name, const std::string& missing, Handler handler) {
  Spec spec;
  spec.missing = missing;
  spec.handler = std::move(handler);
  spec.inline_only = true;
  flags_[name] = std::move(spec);
}

void FlagParser::Switch(const std::string& name, std::function<void()> on) {
  Spec spec;
  spec.takes_value = false;
  spec.on = std::move(on);
  flags_[name] = std::move(spec);
}

void FlagParser::String(const std::string& name, std::string* out, const std::string& missing) {
  Value(name, missing, [out](const std::string& v) {
    *out = v;
    return std::string();
  });
}

void FlagParser::Repeated(const std::string& name, std::vector<std::string>* out,
                          const std::string& missing) {
  Value(name, missing, [out](const std::string& v) {
    out->push_back(v);
    return std::string();
  });
}

FlagParser::Result FlagParser::Parse(const std::vector<std::string>& args) {
  auto error = [](const std::string& msg) {
    UsageError(msg);
    return Result::kError;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") return Result::kHelp;
    // --flag=value as well as --flag value; -jN as well as -j N.
    std::string name = a, attached;
    bool has_attached = false;
    if (absl::StartsWith(a, "--")) {
      if (const size_t eq = a.find('='); eq != std::string::npos) {
        name = a.substr(0, eq);
        attached = a.substr(eq + 1);
        has_attached = true;
      }
    } else if (a.size() > 2 && a[0] == '-' && a[1] != '-' &&
               flags_.count(a.substr(0, 2)) + aliases_.count(a.substr(0, 2)) > 0) {
      name = a.substr(0, 2);
      attached = a.substr(2);
      has_attached = true;
    }
    if (auto al = aliases_.find(name); al != aliases_.end()) name = al->second;
    auto it = flags_.find(name);
    if (it == flags_.end()) {
      if (absl::StartsWith(a, "-")) return error(absl::StrCat("unknown option ", a));
      if (!positional_) return error(absl::StrCat("unexpected argument ", a));
      if (std::string msg = positional_(a); !msg.empty()) return error(msg);
      continue;
    }
    const Spec& spec = it->second;
    if (!spec.takes_value) {
      if (has_attached) return error(absl::StrCat(name, " takes no value"));
      spec.on();
      continue;
    }
    if (spec.inline_only && !has_attached) return error(spec.missing);
    std::string value;
    if (has_attached) {
      value = attached;
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else if (!spec.missing.empty()) {
      return error(spec.missing);
    }
    if (std::string msg = spec.handler(value); !msg.empty()) return error(msg);
  }
  return Result::kOk;
}

}  // namespace servesim::services
