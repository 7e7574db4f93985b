// The device registry, keyed by the DeviceSpec oneof case (TensorFlow
// Serving's class_registration pattern): a device kind registers a factory
// for its config message once, at static-initialisation time, from its own
// folder. Device folders are CMake OBJECT libraries so the linker keeps the
// registration objects.
#ifndef SERVESIM_DEVICES_REGISTRY_H_
#define SERVESIM_DEVICES_REGISTRY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "devices/device.h"
#include "servesim/v1/hardware.pb.h"

namespace servesim::devices {

using DeviceFactory = absl::StatusOr<std::unique_ptr<Device>> (*)(
    const servesim::v1::DeviceSpec& spec);

// Creates the device `spec` selects. NOT_FOUND if no kind is registered for
// its oneof case; the factory's status if the spec is invalid.
absl::StatusOr<std::unique_ptr<Device>> CreateDevice(
    const servesim::v1::DeviceSpec& spec);

// Names of the registered kinds, sorted.
std::vector<std::string> RegisteredDeviceKinds();

namespace internal {
bool RegisterDevice(servesim::v1::DeviceSpec::KindCase kind_case,
                    const char* name, DeviceFactory factory);
}  // namespace internal

}  // namespace servesim::devices

// One line in a device's .cc: SERVESIM_REGISTER_DEVICE(kGpu, "gpu", &Create);
#define SERVESIM_REGISTER_DEVICE(kind_case, name, factory)              \
  [[maybe_unused]] static const bool servesim_device_registered_##kind_case = \
      ::servesim::devices::internal::RegisterDevice(                    \
          ::servesim::v1::DeviceSpec::kind_case, name, factory)

#endif  // SERVESIM_DEVICES_REGISTRY_H_
