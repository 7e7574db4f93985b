#include "devices/reference_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "devices/interrupt.h"

namespace servesim::devices {
namespace {

absl::Status CheckTensor(const Tensor& t, const char* name) {
  if (t.shape.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " has rank ", t.shape.size(),
                     "; expected rank 3 [heads, tokens, d_head]"));
  }
  for (int64_t d : t.shape) {
    if (d < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " shape [", absl::StrJoin(t.shape, ","), "] has a dimension < 1"));
    }
  }
  const int64_t want = t.NumElements() * Tensor::ElementSize(t.type);
  if (static_cast<int64_t>(t.bytes.size()) != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " holds ", t.bytes.size(), " bytes; shape [",
        absl::StrJoin(t.shape, ","), "] needs ", want));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckAttentionShapes(const AttentionCall& call) {
  RETURN_IF_ERROR(CheckTensor(call.q, "q"));
  RETURN_IF_ERROR(CheckTensor(call.k, "k"));
  RETURN_IF_ERROR(CheckTensor(call.v, "v"));
  if (call.k.shape != call.v.shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("k shape [", absl::StrJoin(call.k.shape, ","),
                     "] differs from v shape [", absl::StrJoin(call.v.shape, ","), "]"));
  }
  if (call.q.shape[2] != call.k.shape[2]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "d_head differs: q has ", call.q.shape[2], ", k has ", call.k.shape[2]));
  }
  // model.d_head's range: the kernels' fixed-point dot products (d_head x
  // 2^46 at SpAtten's 24 bits) and per-slot buffers (AttAcc's l_split x
  // d_head) are sized for it.
  if (call.q.shape[2] > kMaxAttentionDHead) {
    return absl::InvalidArgumentError(absl::StrCat("d_head = ", call.q.shape[2],
                                                   "; expected at most ", kMaxAttentionDHead));
  }
  if (call.q.shape[0] % call.k.shape[0] != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("q has ", call.q.shape[0], " heads, not a multiple of k's ",
                     call.k.shape[0], " KV heads"));
  }
  if (call.q.shape[1] > call.k.shape[1]) {
    return absl::InvalidArgumentError(
        absl::StrCat("q has ", call.q.shape[1], " tokens but k only ",
                     call.k.shape[1], "; expected q_len <= kv_len"));
  }
  return absl::OkStatus();
}

absl::StatusOr<AttentionResult> ExactAttention(const AttentionCall& call) {
  RETURN_IF_ERROR(CheckAttentionShapes(call));
  const int64_t heads = call.q.shape[0], q_len = call.q.shape[1];
  const int64_t d = call.q.shape[2];
  const int64_t kv_heads = call.k.shape[0], kv_len = call.k.shape[1];
  const int64_t group = heads / kv_heads;
  const float scale =
      call.scale != 0 ? call.scale : 1.0f / std::sqrt(static_cast<float>(d));

  AttentionResult result;
  result.out = Tensor::Zeros(ElementType::kFp32, {heads, q_len, d});
  std::vector<float> q(d), scores(kv_len), acc(d);
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t kvh = h / group;
    for (int64_t i = 0; i < q_len; ++i) {
      if (i % 64 == 0) RETURN_IF_ERROR(PollInterrupt());
      const int64_t last = kv_len - q_len + i;  // causal: positions 0..last
      for (int64_t c = 0; c < d; ++c) q[c] = call.q.At((h * q_len + i) * d + c);
      float max_score = -INFINITY;
      for (int64_t j = 0; j <= last; ++j) {
        float s = 0;
        const int64_t base = (kvh * kv_len + j) * d;
        for (int64_t c = 0; c < d; ++c) s += q[c] * call.k.At(base + c);
        scores[j] = s * scale;
        max_score = std::max(max_score, scores[j]);
      }
      float denom = 0;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j <= last; ++j) {
        const float p = std::exp(scores[j] - max_score);
        denom += p;
        const int64_t base = (kvh * kv_len + j) * d;
        for (int64_t c = 0; c < d; ++c) acc[c] += p * call.v.At(base + c);
      }
      for (int64_t c = 0; c < d; ++c) {
        result.out.Set((h * q_len + i) * d + c, acc[c] / denom);
      }
      result.stats.kv_positions += last + 1;
      result.stats.kv_positions_read += last + 1;
      result.stats.v_rows_read += last + 1;
    }
  }
  result.stats.bytes_read = static_cast<double>(call.q.bytes.size()) +
                            static_cast<double>(call.k.bytes.size()) +
                            static_cast<double>(call.v.bytes.size());
  return result;
}

}  // namespace servesim::devices
