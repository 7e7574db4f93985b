// Conversions between the device interface's C++ types (devices/device.h,
// devices/ops.h, devices/tensor.h) and the agent protocol's messages
// (proto/servesim/v1/agent.proto), in one place, both directions, and the
// absl::Status <-> grpc::Status mapping used at the gRPC edge.
//
// Doubles are copied, never recomputed, so a cost survives the round trip
// bit for bit. Ops that share a sequence list (or a stack list) in memory
// share one list on the wire, and decoding gives them one list again: a
// device that caches per-sequence figures across the ops of a call (AttAcc)
// sees the same sharing as in-process.
#ifndef SERVESIM_AGENTS_CONVERT_H_
#define SERVESIM_AGENTS_CONVERT_H_

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "devices/device.h"
#include "devices/ops.h"
#include "devices/tensor.h"
#include "grpcpp/support/status.h"
#include "servesim/v1/agent.pb.h"

namespace servesim::agents {

// The status at the edge: same code, same message.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// ---- Estimate ----
// Appends `ops` to `request` (ops, seq_lists, stack_lists).
void EncodeOps(absl::Span<const devices::Op> ops, servesim::v1::EstimateRequest* request);

// Ops decoded from a request; the spans point into this object.
struct DecodedOps {
  std::vector<devices::Op> ops;
  std::deque<std::vector<devices::AttentionSeq>> seq_lists;
  std::deque<std::vector<int32_t>> stack_lists;
};
// INVALID_ARGUMENT for inconsistent requests (list indices out of range,
// columns of different lengths, negative sizes) and for requests past the
// limits below, UNIMPLEMENTED for op kinds this protocol version does not
// know; messages name the field and the allowed range.
absl::Status DecodeOps(const servesim::v1::EstimateRequest& request, DecodedOps* out);

// Limits on one EstimateRequest, so that no request asks an agent for
// unbounded work or memory (a device's Estimate is linear in the sequences
// it is given, and the GPU model in a sequence's query blocks). Each is far
// above what one iteration of any scenario sends (GPT-3 175B: 96 layers x a
// few ops x a batch of hundreds).
inline constexpr int kMaxOps = 1 << 16;                // ops per request
inline constexpr int64_t kMaxSequences = 1 << 20;      // sequences in all seq_lists
inline constexpr int64_t kMaxOpSequences = 1 << 22;    // sum over attention ops of their sequences
inline constexpr int64_t kMaxStackEntries = 1 << 22;   // entries in all stack_lists
inline constexpr int64_t kMaxContextTokens = 1 << 22;  // past_tokens + new_tokens of a sequence
inline constexpr int64_t kMaxQueryTokens = int64_t{1} << 28;  // sum of new_tokens over ops' sequences
inline constexpr int64_t kMaxHeads = 1 << 16;          // heads, kv_heads, head_begin, head_end
inline constexpr int64_t kMaxDHead = 1 << 16;          // d_head
inline constexpr int64_t kMaxGemmDim = int64_t{1} << 40;   // m, n, k
inline constexpr int64_t kMaxElements = int64_t{1} << 50;  // elements
inline constexpr double kMaxPerElement = 1e6;  // bytes_per_element, flops_per_element
inline constexpr double kMaxAllReduceBytes = 1e18;  // bytes

// ---- Estimate lookahead (EstimateRequest.lookahead) ----
inline constexpr int kMaxLookahead = 256;
// Whether an op's next decode steps are costed ahead: an attention op whose
// every sequence is a decode step (new_tokens == 1).
bool Predictable(const devices::Op& op);
// Lookahead step j of `ops`: each predictable op, in order, with its
// sequences j decode steps later (past_tokens + j). Ops that share a
// sequence list share its shifted copy in `*lists`, as they would in the
// iteration that sends them. Both are replaced.
// Expected ops with steps (EstimateRequest.expected_steps) go by blocks,
// maximal runs of consecutive ops with the same steps: calls
// f(begin, end, steps) for each, in order. `steps` empty: one block, 0.
template <typename F>
void ForEachExpectedBlock(size_t n, absl::Span<const int32_t> steps, F&& f) {
  for (size_t i = 0; i < n;) {
    const int32_t k = steps.empty() ? 0 : steps[i];
    size_t j = i + 1;
    while (j < n && (steps.empty() ? 0 : steps[j]) == k) ++j;
    f(i, j, k);
    i = j;
  }
}

void LookaheadStep(absl::Span<const devices::Op> ops, int64_t j, std::vector<devices::Op>* step,
                   std::deque<std::vector<devices::AttentionSeq>>* lists);

// Costs to and from agent.proto's CostTable: bit for bit, each cost that
// equals the one before (every bit of every field) sent as a repeat.
void EncodeCosts(absl::Span<const devices::Cost> costs, servesim::v1::CostTable* out);
// Appends the table's costs to `out`; INVALID_ARGUMENT naming the entry if
// the table is malformed (a repeat first, an unknown field bit, values left
// over or missing), leaving `out` as it was.
absl::Status DecodeCosts(const servesim::v1::CostTable& table, std::vector<devices::Cost>* out);
// The same, without copying repeats: appends each new cost to `unique` and,
// per cost of the table, its position in `unique` to `index` (a repeat
// names the cost before's). Leaves both as they were on error.
absl::Status DecodeCostTable(const servesim::v1::CostTable& table,
                             std::vector<devices::Cost>* unique, std::vector<uint32_t>* index);

servesim::v1::OpKind EncodeOpKind(devices::OpKind kind);

// ---- Execute ----
void EncodeTensor(const devices::Tensor& tensor, servesim::v1::Tensor* out);
// INVALID_ARGUMENT for an unspecified type, negative dimensions, data of
// the wrong size or a NaN / infinite element; RESOURCE_EXHAUSTED above `max_bytes` (checked from the
// shape before anything is copied). `field` names the tensor in messages.
absl::StatusOr<devices::Tensor> DecodeTensor(const servesim::v1::Tensor& tensor,
                                             int64_t max_bytes, const std::string& field);

void EncodeStats(const devices::KernelStats& stats, servesim::v1::KernelStats* out);
devices::KernelStats DecodeStats(const servesim::v1::KernelStats& stats);

// ---- Measure (FULL fidelity over several agents) ----
inline constexpr int kMaxMeasureSteps = 1 << 16;   // MeasureRequest.steps
inline constexpr int kMaxMeasuredSteps = 1 << 20;  // EstimateRequest.measured, MeasureResponse
void EncodeStepKey(const devices::StepKey& k, servesim::v1::StepKey* out);
void EncodeMeasurement(const devices::StepMeasurement& m, servesim::v1::StepMeasurement* out);
// INVALID_ARGUMENT naming `field`[i] for a request id < 0, L outside
// [1, kMaxContextTokens], more than devices::kMaxStepValues values or one
// that is not finite; RESOURCE_EXHAUSTED past `max` entries.
absl::StatusOr<std::vector<devices::StepKey>> DecodeStepKeys(
    const google::protobuf::RepeatedPtrField<servesim::v1::StepKey>& keys, int max,
    const std::string& field);
absl::StatusOr<std::vector<devices::StepMeasurement>> DecodeMeasurements(
    const google::protobuf::RepeatedPtrField<servesim::v1::StepMeasurement>& measured, int max,
    const std::string& field);

// ---- Describe ----
void EncodeDescription(const devices::DeviceDescription& d, servesim::v1::DescribeResponse* out);
absl::StatusOr<devices::DeviceDescription> DecodeDescription(
    const servesim::v1::DescribeResponse& d);

}  // namespace servesim::agents

#endif  // SERVESIM_AGENTS_CONVERT_H_
