// Attention data the functional kernels of the pruning accelerators run on:
// a synthetic generator of decode-step Q/K/V, and a loader for tensors
// captured from a real model (.npy).
//
// WHAT IS MODELLED (the generator)
// One attention instance is (seed, request, layer, head). Its query at
// position t (the decode step whose context is positions 0..t, L = t + 1)
// and its key/value at position j are built so that the scaled scores
// s_j = q_t . k_j / sqrt(d_head) are a sum of three terms:
//   s_j = sink_logit * [j == 0]                                  (sink)
//       + recency_logit * (1/F) sum_f cos(2^(f/2) (t - j) / recency_tokens)
//                                                                (recency)
//       + spread * lambda_j * (u_t . g_j)                        (content)
//  - sink: the first token draws extra weight in most heads (Token-Picker
//    §3.1 and Fig. 4a: "recently generated tokens and the first token often
//    carry more weights"). Dimension 0 carries it.
//  - recency: F = 8 rotary pairs (dimensions 1..16), RoPE-like: the
//    kernel is 1 at distance 0, about 0.36 at recency_tokens / 4, and
//    oscillates around 0 (standard deviation 1 / sqrt(2F) = 0.25) beyond
//    recency_tokens.
//  - content: g_j is a standard normal vector in the remaining d_head - 17
//    dimensions, lambda_j = sqrt(nu / chi2_nu) (so lambda_j (u . g_j) is
//    Student-t with nu = tail_dof: heavy tails), and u_t a unit vector. The
//    spread (the score scale) is drawn once per instance, log-uniform in
//    [spread_min, spread_max]: wide instances have few dominant tokens,
//    narrow ones many (Token-Picker Fig. 3: 4.6% vs 23.5% of tokens above
//    1e-3 in two instances of the same layer, head and length).
//  - step-to-step stability: k_j and v_j depend only on (instance, j), so a
//    position's K/V never change; u_t = cos(theta t) a + sin(theta t) b
//    for orthonormal a, b of the instance, so the query drifts by
//    query_drift_rad_per_step per step.
//  - v_j: standard normal per element.
// Every stream is derived from a hash of (seed, request, layer, head,
// position, tensor), so any tensor can be generated alone, in any order, on
// any host, with the same bits (common/rng.h; normals from the Irwin-Hall
// sum of four 16-bit uniforms, variance-matched, for speed).
//
// PARAMETERS (AttentionDataParams; defaults fitted so that at L = 1024 the
// fraction of tokens with probability > 1e-3 is about 23% at the lowest
// spread and about 5% at the highest, as tests/attention_data_test.cc
// asserts)
//   seed                    master seed of all streams
//   d_head                  >= 24
//   sink_logit              score bonus of token 0: 6
//   recency_logit           score bonus at distance 0: 3
//   recency_tokens          recency length scale, tokens: 16
//   spread_min, spread_max  per-instance content score scale: 0.6 .. 2.0
//   tail_dof                Student-t degrees of freedom nu: 8
//   query_drift_rad_per_step  0.02
//
// THE .npy LAYOUT (LoadNpyHead): DIR/layer{L}_head{H}_{q,k,v}.npy, each a
// C-order little-endian fp16 ('<f2') or fp32 ('<f4') array of shape
// [T, d_head]: row t of q is the query of position t, rows of k and v the
// key and value of each position. The decode step with context length L
// uses q row L - 1 and k, v rows 0..L-1.
#ifndef SERVESIM_DEVICES_ATTENTION_DATA_H_
#define SERVESIM_DEVICES_ATTENTION_DATA_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/rng.h"
#include "devices/device.h"
#include "devices/tensor.h"

namespace servesim::devices {

// Approximately standard normal from one 64-bit draw: the Irwin-Hall sum
// of four 16-bit uniforms, centred and scaled to unit variance (the
// generators' fast normal: the generator here and CTA's token generator).
inline float FastNormal(Rng& rng) {
  const uint64_t x = rng.NextU64();
  double sum = 0;
  for (int i = 0; i < 4; ++i) sum += (static_cast<double>((x >> (16 * i)) & 0xffff) + 0.5);
  return static_cast<float>((sum / 65536.0 - 2.0) * 1.7320508075688772);
}

struct AttentionDataParams {
  uint64_t seed = 1;
  int64_t d_head = 64;
  double sink_logit = 6.0;
  double recency_logit = 3.0;
  double recency_tokens = 16.0;
  double spread_min = 0.6;
  double spread_max = 2.0;
  double tail_dof = 8.0;
  double query_drift_rad_per_step = 0.02;
};

// INVALID_ARGUMENT naming the field and its allowed range.
absl::Status ValidateAttentionDataParams(const AttentionDataParams& p);

// Which attention instance: one head of one layer of one request.
struct AttentionInstance {
  int64_t request = 0;
  int64_t layer = 0;
  int64_t head = 0;
};

// Where a kernel's decode-step Q/K/V come from.
class AttentionSource {
 public:
  virtual ~AttentionSource() = default;
  virtual int64_t d_head() const = 0;
  // One decode step with context length `context_len` (>= 1): q [1, 1, d],
  // k and v [1, context_len, d], fp32.
  virtual absl::StatusOr<AttentionCall> DecodeStep(const AttentionInstance& instance,
                                                   int64_t context_len) const = 0;
  // The pieces of DecodeStep, for callers that keep K/V between steps (the
  // devices' FULL mode, prune_common.h): both sources give a position the
  // same K and V in every step whose context includes it, so rows generated
  // once stay valid. StepQuery writes q (d floats) of the step with context
  // length `context_len`; KeyValueRows writes the K (and, if v is not null,
  // V) rows of positions [begin, end) row-major, (end - begin) x d floats
  // each, equal to rows begin..end-1 of DecodeStep(instance, end). The
  // defaults go through DecodeStep.
  virtual absl::Status StepQuery(const AttentionInstance& instance, int64_t context_len,
                                 float* q) const;
  virtual absl::Status KeyValueRows(const AttentionInstance& instance, int64_t begin,
                                    int64_t end, float* k, float* v) const;
};

class AttentionDataGenerator : public AttentionSource {
 public:
  static absl::StatusOr<AttentionDataGenerator> Create(const AttentionDataParams& params);

  int64_t d_head() const override { return p_.d_head; }
  absl::StatusOr<AttentionCall> DecodeStep(const AttentionInstance& instance,
                                           int64_t context_len) const override;
  // Direct, without building the whole step.
  absl::Status StepQuery(const AttentionInstance& instance, int64_t context_len,
                         float* q) const override;
  absl::Status KeyValueRows(const AttentionInstance& instance, int64_t begin, int64_t end,
                            float* k, float* v) const override;

  // The pieces, each written to out[0..d_head).
  void Query(const AttentionInstance& instance, int64_t position, float* out) const;
  void Key(const AttentionInstance& instance, int64_t position, float* out) const;
  void Value(const AttentionInstance& instance, int64_t position, float* out) const;
  // The instance's content score scale, in [spread_min, spread_max].
  double Spread(const AttentionInstance& instance) const;
  const AttentionDataParams& params() const { return p_; }

 private:
  explicit AttentionDataGenerator(const AttentionDataParams& p) : p_(p) {}
  AttentionDataParams p_;
};

// ----------------------------------------------------------------- .npy --

// Reads a .npy file (format 1.0-3.0, '<f2' or '<f4', C order, any shape,
// finite values). INVALID_ARGUMENT / NOT_FOUND naming the file and what is
// wrong with it.
absl::StatusOr<Tensor> LoadNpy(const std::string& path);
// The same on a file's contents; `name` stands for the file in messages.
absl::StatusOr<Tensor> ParseNpy(absl::string_view data, const std::string& name);
// Writes `t` as a version 1.0 .npy file ('<f2' or '<f4', C order).
absl::Status WriteNpy(const std::string& path, const Tensor& t);

// Q, K and V of one (layer, head), each [T, d_head] (see the layout above).
struct NpyHead {
  Tensor q, k, v;
};
absl::StatusOr<NpyHead> LoadNpyHead(const std::string& dir, int64_t layer, int64_t head);

// Serves decode steps from a directory in the layout above. Files are read
// on each call (no cache); the request id is ignored (one capture).
class NpyAttentionSource : public AttentionSource {
 public:
  // Reads layer 0 head 0 to learn d_head.
  static absl::StatusOr<NpyAttentionSource> Create(const std::string& dir);
  int64_t d_head() const override { return d_head_; }
  absl::StatusOr<AttentionCall> DecodeStep(const AttentionInstance& instance,
                                           int64_t context_len) const override;

 private:
  NpyAttentionSource(std::string dir, int64_t d) : dir_(std::move(dir)), d_head_(d) {}
  std::string dir_;
  int64_t d_head_ = 0;
};

// The decode step of context length `context_len` from one head's captured
// tensors. INVALID_ARGUMENT if context_len is not in [1, T].
absl::StatusOr<AttentionCall> DecodeStepFromHead(const NpyHead& head, int64_t context_len);

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_ATTENTION_DATA_H_
