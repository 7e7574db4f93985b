#include "devices/registry.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace servesim::devices {
namespace {

struct Entry {
  std::string name;
  DeviceFactory factory;
};

// Function-local static: safe to use from other translation units' static
// initialisers.
std::map<int, Entry>& Registry() {
  static auto* registry = new std::map<int, Entry>();
  return *registry;
}

}  // namespace

namespace internal {
bool RegisterDevice(servesim::v1::DeviceSpec::KindCase kind_case,
                    const char* name, DeviceFactory factory) {
  auto [it, inserted] =
      Registry().emplace(static_cast<int>(kind_case), Entry{name, factory});
  if (!inserted) {
    std::fprintf(stderr, "servesim: device kind '%s' registered twice\n", name);
    std::abort();
  }
  return true;
}
}  // namespace internal

absl::StatusOr<std::unique_ptr<Device>> CreateDevice(
    const servesim::v1::DeviceSpec& spec) {
  auto it = Registry().find(static_cast<int>(spec.kind_case()));
  if (it == Registry().end()) {
    return absl::NotFoundError(absl::StrCat(
        "no device kind is registered for DeviceSpec field number ",
        static_cast<int>(spec.kind_case()), "; registered: ",
        absl::StrJoin(RegisteredDeviceKinds(), ", ")));
  }
  return it->second.factory(spec);
}

std::vector<std::string> RegisteredDeviceKinds() {
  std::vector<std::string> names;
  for (const auto& [unused, entry] : Registry()) names.push_back(entry.name);
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::vector<StepMeasurement>> Device::Measure(absl::Span<const StepKey>) const {
  return absl::UnimplementedError(
      absl::StrCat(Describe().kind,
                   " device: Measure needs a device that measures per decode step (FULL "
                   "fidelity of topick, spatten, cta or lad)"));
}

absl::StatusOr<std::vector<StepMeasurement>> Device::MeasureLayers(absl::Span<const StepKey>, int,
                                                                   int) const {
  return absl::UnimplementedError(
      absl::StrCat(Describe().kind,
                   " device: MeasureLayers needs a device that measures a step's layers apart "
                   "(FULL fidelity of topick or cta)"));
}

absl::Status Device::MeasureAhead(absl::Span<const StepKey>) const {
  return absl::UnimplementedError(
      absl::StrCat(Describe().kind, " device: MeasureAhead needs spatten at FULL fidelity"));
}

absl::Status Device::Absorb(absl::Span<const StepMeasurement>) const {
  return absl::UnimplementedError(
      absl::StrCat(Describe().kind,
                   " device: Absorb needs a device that measures per decode step (FULL "
                   "fidelity of topick, spatten, cta or lad)"));
}

}  // namespace servesim::devices
