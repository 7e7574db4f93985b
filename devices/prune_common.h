// Shared by the token-pruning devices (topick, spatten): the keep/prune
// profile their fidelity modes feed the cycle model with, and the attention
// data their kernels run on in CALIBRATED and FULL modes.
#ifndef SERVESIM_DEVICES_PRUNE_COMMON_H_
#define SERVESIM_DEVICES_PRUNE_COMMON_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "devices/attention_data.h"
#include "devices/ops.h"
#include "servesim/v1/hardware.pb.h"

namespace servesim::devices {

// A profile: for each context length lengths[i] (ascending), a row of
// per-token fractions (what each device means by them is in its header).
// Eval(L) interpolates linearly in log L between the two nearest lengths
// and holds the end rows beyond the ends.
struct KeepProfile {
  std::vector<double> lengths;
  std::vector<std::vector<double>> rows;
  std::vector<double> Eval(double context_len) const;
};

// Generator parameters from the spec's data message (unset fields keep the
// AttentionDataParams defaults).
AttentionDataParams DataParamsFromProto(const servesim::v1::AttentionDataSpec& spec,
                                        int64_t d_head);
// The generator, or the .npy directory when data.npy_dir is set (d_head
// then comes from the files).
absl::StatusOr<std::unique_ptr<AttentionSource>> MakeAttentionSource(
    const servesim::v1::AttentionDataSpec& spec, int64_t d_head);

const char* FidelityName(servesim::v1::PruneFidelity f);

// The query heads an attention op covers on this device: [head_begin,
// head_end) or all of them.
int64_t OpHeadCount(const Op& op);

// Calibration lengths and instances with defaults (128 .. 2048; 4).
std::vector<int64_t> CalibrationLengths(const servesim::v1::PruneCalibrationSpec& c);
int CalibrationInstances(const servesim::v1::PruneCalibrationSpec& c);

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_PRUNE_COMMON_H_
