// CTA: Compressed Token Attention (Wang, Xu, Wang, Han, "CTA: Hardware-
// Software Co-design for Compressed Token Attention Mechanism", HPCA'23;
// from the slides).
//
// WHAT IS MODELLED
// CTA removes semantic repetition among the tokens X (the d_model-wide
// inputs of the QKV projection, LayerNorm outputs) before attention, so
// both the QKV projection and attention run on fewer rows.
//
// FUNCTIONAL KERNEL (slides steps 1-4; CtaCompress, CtaCoreAttention,
// CtaLayer, Execute):
//  - Step 1, LSH (CtaLsh): H = floor((A x + B) / w) for each token x, with
//    `hashes` direction vectors (rows of A: Gaussian, normalised to unit
//    length), B uniform in [0, w) and bucket width w, in units of the
//    token's per-element RMS (a unit-RMS token projects to N(0, 1) on a
//    random unit direction). Tokens with equal hash vectors form a cluster
//    (CIM: cluster indices in order of first appearance, as the slides'
//    x1 -> 1, x2 -> 2, x3 -> 3); a cluster's centroid is the mean of its
//    tokens (CAG).
//  - 1-level compression for query tokens (k0 centroids, table CTq) and
//    2-level for key/value tokens: level 1 (k1 centroids, CT1) and level 2
//    on the residuals x - centroid1[CT1] (k2 centroids, CT2), so that
//    x ~ c1[CT1] + c2[CT2]. The level-2 hash of a residual is computed as
//    A2 x - mean over the level-1 cluster of A2 x (= A2 (x - c1), by
//    linearity), which is also how FULL mode gets it incrementally: both
//    use CtaLevel2Keys, so they agree bit for bit.
//  - Step 1 linear transforms on the centroids: Qbar = Cq W^Q (k0 rows),
//    Kbar = [C1; C2] W^K, Vbar = [C1; C2] W^V (k1 + k2 rows): n d^2 ->
//    k0 d^2 and (k1 + k2) d^2 (per projection).
//  - Step 2: Sbar = Qbar Kbar^T / sqrt(d): k0 (k1 + k2) d.
//  - Step 3 (PAG): for query cluster c and key token j,
//    e = exp(Sbar[c, CT1_j] + Sbar[c, k1 + CT2_j] - m) is added to
//    AP[c, CT1_j] and AP[c, k1 + CT2_j] (m: the row's largest level-1 plus
//    largest level-2 score, the PPE's max subtraction), so sum(AP) = 2
//    sum_j e_j: k0 n exps instead of n^2.
//  - Step 4: O = AP Vbar / (sum(AP) / 2): k0 (k1 + k2) d.
//  With w -> 0 every distinct token is its own level-1 cluster, every
//  residual is 0 (one level-2 cluster, a zero centroid), and the output is
//  exact attention (tested).
//  CAUSAL ATTENTION (DECISION; the slides' encoder setting has no mask):
//  for a causal call (Execute, decode and prefill of a decoder model) query
//  i at position p_i may only see keys j <= p_i. Queries of one cluster
//  share their Sbar row; the PAG scans the keys in position order once per
//  query cluster (up to the cluster's last position: at most k0 n exps) and
//  each query takes a snapshot of the running AP row at its own position,
//  so step 4 has one AP row per query: n_q (k1 + k2) d. Exact at w -> 0.
//  For decode (one query) this is exactly the slides' algorithm.
//  Execute(AttentionCall) receives Q/K/V, not X. DECISION: each KV head's
//  key/value tokens are hashed on their concatenated [k_j, v_j] rows and
//  the query head's tokens on their q rows (X W with W = [W^K W^V] is a
//  linear image of X, so this is LSH of X with directions A W^T), each
//  matrix scaled to unit element RMS for hashing; centroids are then
//  directly Kbar, Vbar, Qbar (the projection is the identity).
//
// TOKEN DATA (CtaTokenGenerator; DECISION: the attention-data generator of
// devices/attention_data.h makes Q/K/V with score structure, but CTA hashes
// X and what matters is how many distinct buckets n tokens fall into):
// token j of request r at layer l is LayerNorm(e[l, z_j] + s g[r, l, j])
// with z_j ~ Zipf(zipf_exponent) over vocab_types types (word frequencies
// follow Zipf's law, so the number of distinct types among n tokens grows
// sub-linearly, Heaps' law), e[l, z] = c u[l, class(z)] + sqrt(1 - c^2)
// u'[l, z] a type embedding near its semantic class's (class(z) = z mod
// (vocab_types / types_per_class), c = class_weight; u, u' standard
// normal), g a standard normal per-token context component and s =
// context_noise. So a narrow bucket merges repeats of a word, a wider one
// related words, a very wide one unrelated words.
// Q/K/V for attention-error measurements use random per-(layer, head)
// projections scaled so that q.k / sqrt(d_head) has standard deviation
// score_std over random token pairs. The streams are seeded from
// AttentionDataSpec.seed (common/rng.h), so every host gets the same bits.
//
// CYCLE MODEL (Estimate; sizes are ASSUMPTIONS, presets.cc): an R x C
// output-stationary systolic array (slides: "each column of PEs
// accumulates" one output vector): a product with `rows` outputs along the
// PE rows, `cols` output vectors along the columns and reduction depth k
// takes ceil(rows / R) ceil(cols / C) k + R + C cycles (tiles back to back,
// the shift-up of results overlapping the next tile; one fill/drain).
//   hashing      rows = tokens, cols = hashes, k = d_model (per level)
//   CIM          3 n / cim_tokens_per_cycle (three cluster-index passes)
//   CAG          4 n d_model / cag_lanes (three averages + the residual)
//   linear       rows = H d_head, cols = k0 (Q); rows = 2 H d_head,
//                cols = k1 + k2 (K, V); k = d_model
//   scores       per head rows = k1 + k2, cols = k0, k = d_head
//   PAG          per head (k0 n) / pag_lanes exps
//   output       per head rows = d_head, cols = queries, k = k1 + k2
// Stages run one after another (cycles add); DRAM traffic (operands in
// operand_bits: X, weights, Kbar/Vbar written and read, CT tables in
// 16-bit indices, 32-bit beyond 65,536 tokens) overlaps compute: an op
// takes max(compute, bytes / bytes_per_cycle) + one DRAM latency.
// PREFILL (new_tokens > 1) is costed as above with k0 from the profile at
// new_tokens and k1 + k2 at the context length, causal (the queries'
// output rows n_new). DECODE (new_tokens = 1): the new token is hashed on
// the array (one row, kv1 + kv2 hashes) and merged into its two clusters
// (CIM 2 lookups; CAG updates the level-1 and level-2 Kbar/Vbar rows of
// every head, from the token's K/V computed on the xPU: centroids are
// linear, so the running mean of K rows is the K of the mean of X); the
// query (k0 = 1) reads Kbar and Vbar, k1 + k2 rows per head instead of L,
// and the L-entry CT1/CT2 tables: scores rows = k1 + k2, cols = 1; PAG L
// exps; output rows = d_head, cols = 1, k = k1 + k2. DECISION: decode
// appends the new token to the existing clusters (no re-clustering of
// older residuals); the counts k1(L), k2(L) are those of compressing the L
// tokens afresh (what the kernel measures), a close proxy.
// Energy: MACs x mac_pj + exps x exp_pj + CIM/CAG element ops x
// aux_op_pj + static_power_w x time + DRAM bits x dram_pj_per_bit.
//
// IN THE SERVING LOOP the planner (scheduler/planner.cc) sends the pool
// decode attention only (prefill attention and the QKV projection stay on
// the xPUs): there CTA is a decode accelerator whose compressed KV cache
// shortens what each step reads, L -> k1 + k2 rows per head. Its prefill
// role (compressed QKV + attention, the slides' setting) is costed by
// Estimate for prefill sequences (used by studies and direct calls).
//
// FIDELITY (CtaDeviceSpec.fidelity): the cluster fractions {k0/n, (k1 +
// k2)/n, k2/n} come from
//  - ANALYTIC: the preset's table (presets.cc: the slides' RL and RA
//    converted to k0/n and (k1 + k2)/n), constant in n;
//  - CALIBRATED: CtaCompress of generated tokens at Create() at each
//    calibration length (instances x one layer each), interpolated
//    log-linearly in n;
//  - FULL: for each (request_id, L) every layer of `model`: the request's
//    token projections A1 x, A2 x (and the level-1 keys) are kept per
//    request and layer and grown by one token per step (8 (kv1 + kv2)
//    bytes per token per layer); the step's k1, k2 come from re-hashing
//    the L tokens' residuals (CtaLevel2Keys: O(L (kv1 + kv2)) per layer);
//    mean over layers; memoised per (request, L). Requests' projections
//    (about 3 MB per request of 1,024 tokens at GPT-2 medium with 8 + 8
//    hashes) are kept under full_cache_bytes (2 GiB by default): above it
//    the least-recently-used requests' projections are dropped and rebuilt
//    if asked again, so results never depend on the cap (tested). At
//    GPT-2 medium in Release on one core (bench/cta_bench.cc): 0.65 s for
//    a request's first step at L = 1,024 (24 x 1,024 tokens generated and
//    hashed), then about 3 ms per step; CALIBRATED start-up 0.6 s. FULL
//    keeps a CALIBRATED profile too, for prefill chunks (no FULL state) and
//    for the description before any step is measured; it is built when
//    first needed, so a decode-only FULL run (or an agent that only
//    measures) never builds it.
// IN A POOL every unit hashes the new token and reads the CT tables (they
// are per layer, shared by all heads); Kbar/Vbar are split with the heads.
#ifndef SERVESIM_DEVICES_CTA_CTA_DEVICE_H_
#define SERVESIM_DEVICES_CTA_CTA_DEVICE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "devices/device.h"
#include "devices/prune_common.h"
#include "servesim/v1/hardware.pb.h"

namespace servesim::devices {

// One LSH hash function family: m directions of dimension dim.
struct CtaLsh {
  int64_t dim = 0;
  int hashes = 0;
  double width = 1;
  std::vector<double> a;  // hashes x dim, unit rows
  std::vector<double> b;  // hashes, uniform in [0, width)
  // Deterministic from (seed, stream).
  static CtaLsh Make(int64_t dim, int hashes, double width, uint64_t seed,
                     absl::string_view stream);
  // p[0..hashes) = A x (x scaled by `scale` first).
  void Project(const double* x, double scale, double* p) const;
  // floor((p + b) / w).
  int64_t Key(double p, int i) const;
};

// Groups n rows by their m-integer keys (row-major n x m): returns the
// cluster of each row, numbered in order of first appearance, and k.
std::vector<int32_t> CtaClusterKeys(const std::vector<int64_t>& keys, int64_t n, int m,
                                    int64_t* k);
// The same into *ct (keys: at least n x m), reusing its storage.
void CtaClusterKeysInto(const int64_t* keys, int64_t n, int m, int64_t* k,
                        std::vector<int32_t>* ct);
// Level-2 keys of n tokens from their level-2 projections p2 (n x m2) and
// level-1 clusters: floor((p2_j - mean_{i in c(j)} p2_i + b) / w), the mean
// summed in row order.
std::vector<int64_t> CtaLevel2Keys(const CtaLsh& lsh2, const std::vector<double>& p2,
                                   const std::vector<int32_t>& ct1, int64_t k1, int64_t n);
// The same into *keys (p2: at least n x m2), reusing its storage.
void CtaLevel2KeysInto(const CtaLsh& lsh2, const double* p2, const std::vector<int32_t>& ct1,
                       int64_t k1, int64_t n, std::vector<int64_t>* keys);

// A compressed token matrix.
struct CtaCompression {
  int64_t n = 0, dim = 0;
  int64_t k1 = 0, k2 = 0;          // k2 = 0 for one level
  std::vector<int32_t> ct1, ct2;   // cluster of each token per level
  std::vector<double> c1, c2;      // centroids, k1 x dim and k2 x dim
};
// Compresses x (n x dim) with one level (lsh2 null) or two. `hash_scale`
// multiplies x before hashing (1 for unit-RMS tokens).
CtaCompression CtaCompress(const double* x, int64_t n, int64_t dim, double hash_scale,
                           const CtaLsh& lsh1, const CtaLsh* lsh2);

// What a kernel run did (MACs and exps as the slides count them).
struct CtaOpCounts {
  int64_t n_q = 0, n_kv = 0;  // tokens
  int64_t k0 = 0, k1 = 0, k2 = 0;
  double hash_macs = 0;
  double linear_macs = 0, dense_linear_macs = 0;   // step 1 transforms
  double score_macs = 0, dense_score_macs = 0;     // step 2
  double pag_exps = 0, dense_exps = 0;             // step 3 (softmax)
  double output_macs = 0, dense_output_macs = 0;   // step 4
  double cag_ops = 0;
  // RL = linear / dense linear; RA = (score + output) / dense (step 2 + 4
  // MACs; DECISION: the exps, a different unit, are reported apart).
  double rl() const { return dense_linear_macs > 0 ? linear_macs / dense_linear_macs : 0; }
  double ra() const {
    const double d = dense_score_macs + dense_output_macs;
    return d > 0 ? (score_macs + output_macs) / d : 0;
  }
  CtaOpCounts& operator+=(const CtaOpCounts& o);
};

// Steps 2-4 on compressed operands: qbar k0 x d, kbar and vbar (k1 + k2) x
// d (level-1 rows first), ctq (n_q), ct1/ct2 (n_kv); query i sits at
// position n_kv - n_q + i. out: n_q x d.
void CtaCoreAttention(const double* qbar, int64_t k0, const double* kbar, const double* vbar,
                      int64_t k1, int64_t k2, const std::vector<int32_t>& ctq,
                      const std::vector<int32_t>& ct1, const std::vector<int32_t>& ct2,
                      int64_t d, double scale, bool causal, double* out, CtaOpCounts* counts);

// Hash parameters of a spec, with compress = false as w -> 0 in effect.
struct CtaHashes {
  CtaLsh q, kv1, kv2;
};
CtaHashes MakeCtaHashes(const servesim::v1::CtaSpec& spec, int64_t dim, uint64_t seed);

// One self-attention layer on X (n x d_model) with per-head projections
// (heads x d_model x d_head each, row-major): the slides' whole pipeline.
struct CtaLayerResult {
  std::vector<double> out;        // heads x n x d_head
  std::vector<double> exact;      // exact attention on the uncompressed Q/K/V
  CtaOpCounts counts;
  double relative_error = 0;      // ||out - exact|| / ||exact||
};
CtaLayerResult CtaLayer(const CtaHashes& hashes, const std::vector<double>& x, int64_t n,
                        int64_t d_model, const std::vector<double>& wq,
                        const std::vector<double>& wk, const std::vector<double>& wv,
                        int64_t heads, int64_t d_head, bool causal);

// The token generator (header, TOKEN DATA).
class CtaTokenGenerator {
 public:
  CtaTokenGenerator(uint64_t seed, int64_t d_model, const servesim::v1::CtaTokenDataSpec& spec);
  // out[0..d_model): token `position` of `request` at `layer` (unit RMS,
  // zero mean).
  void Token(int64_t request, int64_t layer, int64_t position, double* out) const;
  int64_t Type(int64_t request, int64_t position) const;
  // W^Q, W^K, W^V of (layer, head): d_model x d_head each.
  void HeadWeights(int64_t layer, int64_t head, int64_t d_head, std::vector<double>* wq,
                   std::vector<double>* wk, std::vector<double>* wv) const;
  int64_t d_model() const { return d_model_; }
  double score_std() const { return score_std_; }

 private:
  uint64_t seed_;
  int64_t d_model_;
  double noise_, score_std_;
  int64_t classes_ = 1;
  double class_weight_ = 0;
  std::vector<double> cdf_;  // Zipf CDF over types
};

// Cluster fractions of n tokens: {k0 / n, (k1 + k2) / n, k2 / n}.
using CtaFractions = std::array<double, 3>;

// The cycle model's output for one op's share.
struct CtaCycles {
  double hash = 0, cim = 0, cag = 0, linear = 0, score = 0, pag = 0, output = 0;
  double compute() const { return hash + cim + cag + linear + score + pag + output; }
  double memory = 0;      // bytes / bytes per cycle
  double latency = 0;
  double total = 0;       // max(compute, memory) + latency
  double bytes = 0, macs = 0, exps = 0, aux_ops = 0;
};

class CtaDevice : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<Device>> Create(const servesim::v1::DeviceSpec& spec);

  DeviceDescription Describe() const override;
  absl::Status Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const override;
  absl::StatusOr<AttentionResult> Execute(const AttentionCall& call) const override;
  // FULL fidelity: the steps' fractions, measured here or elsewhere (device.h).
  absl::StatusOr<std::vector<StepMeasurement>> Measure(
      absl::Span<const StepKey> steps) const override;
  absl::Status Absorb(absl::Span<const StepMeasurement> measured) const override;
  // FULL: the clusters {level 1, level 2} of a share of every step's layers.
  absl::StatusOr<std::vector<StepMeasurement>> MeasureLayers(absl::Span<const StepKey> steps,
                                                             int part, int parts) const override;

  // The kernel with its counts (Execute's decision on Q/K/V, header).
  absl::StatusOr<std::pair<AttentionResult, CtaOpCounts>> RunKernel(
      const AttentionCall& call) const;
  // Systolic-array cycles of a product (header).
  double GemmCycles(double rows, double cols, double depth) const;
  // Cycle model of one sequence on `heads` heads of d_head, with k0 query
  // and k_kv key/value centroids.
  CtaCycles SeqCycles(int64_t new_tokens, int64_t past_tokens, int64_t heads, int64_t d_head,
                      double k0, double k_kv) const;
  // The fractions the fidelity mode gives for (request_id, n).
  absl::StatusOr<CtaFractions> Fractions(int64_t request_id, int64_t n) const;
  double BytesPerCycle() const;
  int64_t d_model() const { return d_model_; }
  const servesim::v1::CtaSpec& spec() const { return spec_.cta(); }
  // The keep profile (FULL fidelity calibrates it when first needed).
  const KeepProfile& profile() const {
    EnsureProfile();
    return profile_;
  }
  double calibration_s() const { return calibration_s_; }
  const CtaTokenGenerator& tokens() const { return *tokens_; }
  const CtaHashes& hashes() const { return hashes_; }

 private:
  explicit CtaDevice(const servesim::v1::CtaDeviceSpec& spec);
  absl::Status Calibrate() const;
  // FULL fidelity measures every decode step, so its profile (used only
  // for prefill chunks and for the description before any step) is
  // calibrated on first use, not at creation: a run that never needs it,
  // or an agent that only measures, does not pay for it. Thread-safe.
  void EnsureProfile() const;
  absl::StatusOr<CtaFractions> FullFractions(int64_t request_id, int64_t n) const;
  // FULL: the clusters {level 1, level 2} summed over layers
  // [layer_begin, layer_end) of the request's first n tokens.
  absl::StatusOr<std::array<double, 2>> FullCounts(int64_t request_id, int64_t n,
                                                   int32_t layer_begin, int32_t layer_end) const;
  static CtaFractions FractionsOfCounts(int64_t n, int layers, const std::array<double, 2>& k);

  servesim::v1::CtaDeviceSpec spec_;
  int64_t d_model_ = 1024;
  // Written once: at creation, or by EnsureProfile under profile_once_.
  mutable KeepProfile profile_;
  mutable std::once_flag profile_once_;
  mutable std::atomic<bool> profile_ready_{false};
  bool level_split_known_ = false;  // k2 measured (not ANALYTIC)
  mutable double calibration_s_ = 0;
  std::unique_ptr<CtaTokenGenerator> tokens_;
  CtaHashes hashes_;  // on d_model-wide tokens
  // FULL: per request, per layer, the tokens' level-1 keys (kv1 per token)
  // and level-2 projections (kv2 per token).
  struct FullLayer {
    std::vector<int64_t> keys1;
    std::vector<double> p2;
    int64_t tokens = 0;  // projected so far
  };
  struct FullRequest {
    std::mutex mu;
    std::vector<FullLayer> layers;
    int64_t bytes = 0;     // as last accounted under memo_mu_
    uint64_t last_use = 0;
  };
  mutable std::mutex memo_mu_;
  mutable std::map<int64_t, std::shared_ptr<FullRequest>> requests_;
  mutable int64_t full_bytes_ = 0;
  mutable uint64_t use_clock_ = 0;
  mutable int64_t full_builds_ = 0;  // requests (re)built from token 0

 public:
  // FULL: bytes of projections held, and requests built from token 0 so
  // far (rebuilds after eviction included).
  int64_t full_bytes() const;
  int64_t full_builds() const;
  mutable std::map<std::pair<int64_t, int64_t>, CtaFractions> memo_;
  mutable FreshSteps fresh_;  // guarded by memo_mu_
};

// Named presets: cta_0 (default), cta_0.5, cta_1, dense.
absl::StatusOr<servesim::v1::CtaSpec> CtaPreset(absl::string_view name);
std::vector<std::string> CtaPresetNames();
// The ANALYTIC table of a preset: {k0 / n, (k1 + k2) / n} from the slides'
// RL and RA; NOT_FOUND for a preset without one.
absl::StatusOr<std::array<double, 2>> CtaAnalyticFractions(absl::string_view preset);
// Solves RL = (a + 2b) / 3, RA = a b for a = k0 / n, b = (k1 + k2) / n
// (the root with the larger b).
std::array<double, 2> CtaFractionsFromReductions(double rl, double ra);

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_CTA_CTA_DEVICE_H_
