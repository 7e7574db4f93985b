// Named model and hardware presets (ramulator2's standard tables are the
// model): facts from model cards and vendor datasheets, each cited in
// presets.cc. A scenario names a preset and may override any field; the
// normaliser (scenario/normalize.cc) fills the fields it leaves unset.
#ifndef SERVESIM_DEVICES_PRESETS_H_
#define SERVESIM_DEVICES_PRESETS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "servesim/v1/hardware.pb.h"
#include "servesim/v1/scenario.pb.h"

namespace servesim::devices {

// Each returns NOT_FOUND, listing the known names, for an unknown name.
absl::StatusOr<servesim::v1::ModelSpec> ModelPreset(absl::string_view name);
absl::StatusOr<servesim::v1::XpuSpec> XpuPreset(absl::string_view name);
absl::StatusOr<servesim::v1::LinkSpec> LinkPreset(absl::string_view name);
absl::StatusOr<servesim::v1::NodeSpec> NodePreset(absl::string_view name);

std::vector<std::string> ModelPresetNames();
std::vector<std::string> XpuPresetNames();
std::vector<std::string> LinkPresetNames();
std::vector<std::string> NodePresetNames();

// Parses one compiled-in preset of `kind` (protobuf text `text`) into
// `out` and sets its `preset` field to `name`. The tables are compiled in,
// so a parse failure is a programming error that every test run catches: it
// aborts with the kind and name.
void ParseBuiltInPreset(absl::string_view kind, absl::string_view name,
                        const std::string& text, google::protobuf::Message* out);

// Copies into `target` every field that `source` sets and `target` does not
// (scalars with presence, non-zero enums, non-empty strings; sub-messages
// recursively). Both must be the same message type.
void FillUnset(const google::protobuf::Message& source,
               google::protobuf::Message* target);

// A device's Create() check that its spec is resolved: every scalar field
// with presence is set (sub-messages are the device's to check).
// INVALID_ARGUMENT "<device> device: <field> is not set; expected a resolved
// spec (every field set, e.g. from <preset_fn>)" for the first one missing.
absl::Status RequireResolved(const google::protobuf::Message& spec, absl::string_view device,
                             absl::string_view preset_fn);

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_PRESETS_H_
