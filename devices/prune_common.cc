#include "devices/prune_common.h"

#include <algorithm>
#include <cmath>

#include "common/status_macros.h"

namespace servesim::devices {

std::vector<double> KeepProfile::Eval(double context_len) const {
  if (lengths.empty()) return {};
  if (context_len <= lengths.front()) return rows.front();
  if (context_len >= lengths.back()) return rows.back();
  const size_t hi = static_cast<size_t>(
      std::upper_bound(lengths.begin(), lengths.end(), context_len) - lengths.begin());
  const size_t lo = hi - 1;
  const double w = (std::log(context_len) - std::log(lengths[lo])) /
                   (std::log(lengths[hi]) - std::log(lengths[lo]));
  std::vector<double> out(rows[lo].size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = rows[lo][i] + w * (rows[hi][i] - rows[lo][i]);
  return out;
}

AttentionDataParams DataParamsFromProto(const servesim::v1::AttentionDataSpec& s, int64_t d_head) {
  AttentionDataParams p;
  p.d_head = d_head;
  if (s.has_seed()) p.seed = s.seed();
  if (s.has_sink_logit()) p.sink_logit = s.sink_logit();
  if (s.has_recency_logit()) p.recency_logit = s.recency_logit();
  if (s.has_recency_tokens()) p.recency_tokens = s.recency_tokens();
  if (s.has_spread_min()) p.spread_min = s.spread_min();
  if (s.has_spread_max()) p.spread_max = s.spread_max();
  if (s.has_tail_dof()) p.tail_dof = s.tail_dof();
  if (s.has_query_drift_rad_per_step()) p.query_drift_rad_per_step = s.query_drift_rad_per_step();
  return p;
}

absl::StatusOr<std::unique_ptr<AttentionSource>> MakeAttentionSource(
    const servesim::v1::AttentionDataSpec& spec, int64_t d_head) {
  if (!spec.npy_dir().empty()) {
    ASSIGN_OR_RETURN(NpyAttentionSource src, NpyAttentionSource::Create(spec.npy_dir()));
    return std::unique_ptr<AttentionSource>(new NpyAttentionSource(std::move(src)));
  }
  ASSIGN_OR_RETURN(AttentionDataGenerator gen,
                   AttentionDataGenerator::Create(DataParamsFromProto(spec, d_head)));
  return std::unique_ptr<AttentionSource>(new AttentionDataGenerator(std::move(gen)));
}

const char* FidelityName(servesim::v1::PruneFidelity f) {
  switch (f) {
    case servesim::v1::PRUNE_FIDELITY_CALIBRATED:
      return "calibrated";
    case servesim::v1::PRUNE_FIDELITY_FULL:
      return "full";
    default:
      return "analytic";
  }
}

int64_t OpHeadCount(const Op& op) {
  const int64_t end = op.head_end < 0 ? op.heads : std::min(op.head_end, op.heads);
  return std::max<int64_t>(0, end - std::max<int64_t>(0, op.head_begin));
}

std::vector<int64_t> CalibrationLengths(const servesim::v1::PruneCalibrationSpec& c) {
  if (c.lengths_size() == 0) return {128, 256, 512, 1024, 2048};
  std::vector<int64_t> v(c.lengths().begin(), c.lengths().end());
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

int CalibrationInstances(const servesim::v1::PruneCalibrationSpec& c) {
  return c.has_instances() ? c.instances() : 4;
}

}  // namespace servesim::devices
