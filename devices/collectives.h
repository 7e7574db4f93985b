// Collectives from measurements: nccl-tests tables as printed, and the
// time of a collective interpolated from them (docs/collectives.md).
//
// A table is the output of one nccl-tests binary (`all_reduce_perf -b 8 -e
// 4G -f 2 -g N`, all_gather_perf, reduce_scatter_perf, alltoall_perf,
// sendrecv_perf) as it prints it: comment lines starting with '#' (the
// header naming the columns, the units line, the "#  Rank  0 Group ..."
// device lines), then one row per message size. What is read:
//  - the column named `size` (bytes; for all-gather and reduce-scatter
//    nccl-tests prints the whole gathered buffer, for all-to-all a rank's
//    whole buffer) and the first column named `time` (the out-of-place
//    time, microseconds as the units line says);
//  - the collective: the "# Collective test starting: all_reduce_perf" line
//    (nccl-tests 2.13 and later), else the file name (all_reduce,
//    all_gather, reduce_scatter, alltoall, sendrecv);
//  - the GPU count: the number of "#  Rank" device lines (every rank's GPU,
//    MPI runs included), else "nThread T nGpus G" (T x G), else a ".g<N>."
//    in the file name.
// Other lines (NCCL INFO logs, "# Avg bus bandwidth") are skipped. Errors
// name the file, the line and the column: a missing column, a size that
// does not increase, a time that is negative, zero or not a number, a unit
// that is not (B) / (us) or (ms), a table without rows.
//
// Interpolation (CollectiveCurve::Time): linear in size between measured
// sizes, so exact at each; below the smallest size, the smallest's time
// (a latency floor); above the largest, the last segment's slope carries
// on (its bandwidth). A GPU count the table lacks takes the nearest
// measured count's time scaled by the ring's traffic factor (2(n-1)/n for
// all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all; 1 for
// send/recv), as nccl-tests' bus bandwidth assumes. Both extrapolations
// are counted (CollectiveTable::counts()).
#ifndef SERVESIM_DEVICES_COLLECTIVES_H_
#define SERVESIM_DEVICES_COLLECTIVES_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "devices/ops.h"
#include "servesim/v1/hardware.pb.h"

namespace servesim::devices {

// "all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv".
absl::string_view CollectiveName(CollectiveOp op);
// The inverse; false for another name.
bool ParseCollectiveName(absl::string_view name, CollectiveOp* op);
// Bytes each GPU moves over its links per byte of nccl-tests' size, on the
// ring: 2(n-1)/n (all-reduce), (n-1)/n (all-gather, reduce-scatter,
// all-to-all), 1 (send/recv).
double RingTrafficFactor(CollectiveOp op, int gpus);

// Parses one nccl-tests output `text` read from `path` (the name is used
// for errors and, where the text does not say, the collective and the GPU
// count). The curve's `source` is "path:line" of the first row.
absl::StatusOr<servesim::v1::CollectiveCurve> ParseNcclTests(absl::string_view text,
                                                             absl::string_view path);

// The compiled-in tables of the named preset (devices/collectives/<name>/,
// listed in docs/collectives.md with their sources), or NOT_FOUND listing
// the known names.
absl::StatusOr<std::vector<servesim::v1::CollectiveCurve>> CollectivePreset(absl::string_view name);
std::vector<std::string> CollectivePresetNames();

// How often a collective was answered outside what was measured.
struct CollectiveCounts {
  int64_t measured = 0;         // within a measured table's sizes and GPU count
  int64_t below_smallest = 0;   // smaller than the smallest measured size
  int64_t above_largest = 0;    // larger than the largest
  int64_t other_gpu_count = 0;  // from another GPU count's table
};

// The measured curves of one interconnect class, ready to answer.
class CollectiveTable {
 public:
  // Curves must come from ParseNcclTests or CollectivePreset (validated);
  // INVALID_ARGUMENT names one that is not (sizes not increasing, times
  // not positive, lengths that differ).
  static absl::StatusOr<CollectiveTable> Create(
      const google::protobuf::RepeatedPtrField<servesim::v1::CollectiveCurve>& curves);
  CollectiveTable() = default;
  CollectiveTable(const CollectiveTable& o);
  CollectiveTable& operator=(const CollectiveTable& o);

  // Whether any curve measures `op` (at any GPU count).
  bool Has(CollectiveOp op) const;
  // The time of `op` among `gpus` GPUs on a message of nccl-tests' `bytes`;
  // -1 when no curve measures `op`.
  double Time(CollectiveOp op, int gpus, double bytes) const;
  // The GPU counts measured for `op`, increasing.
  std::vector<int> GpuCounts(CollectiveOp op) const;
  CollectiveCounts counts() const;
  // Every table's answers in this process so far (a run reports the
  // difference over its span, as GpuProfile::counts()).
  static CollectiveCounts ProcessCounts();

 private:
  struct Curve {
    CollectiveOp op;
    int gpus;
    std::vector<double> bytes, time_s;
  };
  // Time on one curve; `outside` says whether it left the measured sizes.
  static double Interpolate(const Curve& c, double bytes, int* outside);
  std::vector<Curve> curves_;
  mutable std::atomic<int64_t> measured_{0}, below_{0}, above_{0}, other_{0};
};

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_COLLECTIVES_H_
