// Exact scaled-dot-product attention, the reference every accelerator's
// functional kernel is tested against: softmax(q k^T * scale) v per head,
// causal, with fp32 accumulation and a max-subtracted softmax. Grouped-query
// attention maps query head h to KV head h / (heads / kv_heads).
#ifndef SERVESIM_DEVICES_REFERENCE_ATTENTION_H_
#define SERVESIM_DEVICES_REFERENCE_ATTENTION_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "devices/device.h"

namespace servesim::devices {

// The largest head dimension a kernel takes: model.d_head's range.
inline constexpr int64_t kMaxAttentionDHead = 4096;

// INVALID_ARGUMENT, naming the tensor and dimension, unless q is
// [heads, q_len, d], k and v are [kv_heads, kv_len, d], heads is a multiple
// of kv_heads, 1 <= q_len <= kv_len, d <= kMaxAttentionDHead and byte
// sizes match the shapes.
absl::Status CheckAttentionShapes(const AttentionCall& call);

absl::StatusOr<AttentionResult> ExactAttention(const AttentionCall& call);

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_REFERENCE_ATTENTION_H_
