// Calibrating the GPU roofline against a measured profile bundle
// (devices/gpu/profile.h): for each op class, the compute and memory
// efficiencies and the fixed per-kernel time that make servesim's roofline
//   t = max(FLOPs / (peak x compute_utilization),
//           bytes / (bandwidth x memory_utilization)) + kernel_overhead
// fit the measured times best, FLOPs and bytes counted exactly as the
// planner and the GPU device count them for the same shapes. Classes:
//   gemm         qkv_proj, o_proj, gate_up_proj, down_proj (by tokens) and
//                lm_head (by sequences)
//   attention    every row of attention.csv
//   norm         layernorm, final_layernorm (RMSNorm)
//   activation   act_fn (SiLU and multiply)
//   embedding    embedding (a gather of the tokens' rows)
// The fit minimises the squared relative error: a grid over the two
// efficiencies (0.02 apart, then 0.002 around the best), the overhead in
// closed form for each pair (>= 0). GEMM and attention efficiencies stay in
// (0, 1]; the elementwise classes are fitted as bandwidth-bound (compute
// held at 1) with a memory efficiency up to 4: activations of a few MB stay
// in the on-chip cache, so such ops run faster than device memory would
// let them.
//
// A scenario carries the fits as cluster.xpu.roofline entries, one per
// class (CalibrationPbtxt writes them), so a model the GPU has no profile
// of is costed with caps measured on that GPU.
#ifndef SERVESIM_STUDIES_CALIBRATE_H_
#define SERVESIM_STUDIES_CALIBRATE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "devices/gpu/profile.h"
#include "devices/model.h"
#include "servesim/v1/hardware.pb.h"

namespace servesim::studies {

struct RooflineFit {
  std::string op_class;
  int64_t points = 0;
  double compute_utilization = 0, memory_utilization = 0, kernel_overhead_s = 0;
  // |t_fit / t_measured - 1| over the class's points.
  double mean_error = 0, p90_error = 0, max_error = 0;
  double uncalibrated_mean_error = 0;  // the xPU's own caps
};

// Fits the classes the bundle measures, for `model` at `tensor_parallel` on
// `xpu` (a resolved spec: peaks, bandwidth, caps set).
absl::StatusOr<std::vector<RooflineFit>> CalibrateRoofline(const devices::GpuProfile& profile,
                                                           const devices::ModelDims& model,
                                                           int64_t tensor_parallel,
                                                           const servesim::v1::XpuSpec& xpu);

// The fits as a table, and as a scenario fragment (cluster.xpu).
std::string CalibrationTable(const std::vector<RooflineFit>& fits);
std::string CalibrationPbtxt(const std::string& source, const servesim::v1::XpuSpec& xpu,
                             const std::vector<RooflineFit>& fits);

}  // namespace servesim::studies

#endif  // SERVESIM_STUDIES_CALIBRATE_H_
