// A GPU profile bundle: measured per-operator latencies of one decoder layer
// of a model on a GPU at one tensor-parallel degree, as LLMServingSim's
// profiler writes them (its "output bundle"; docs/profiles.md describes the
// format so that users can bring their own).
//
// Layout: <root>/<gpu>/<org>/<model>/<variant>/tp<N>/
//   dense.csv         layer,tokens,time_us: each operator (qkv_proj, o_proj,
//                     gate_up_proj, act_fn, down_proj, layernorm, rotary_emb,
//                     embedding, final_layernorm, qk_norm...) against the
//                     step's total tokens.
//   attention.csv     prefill_chunk,kv_prefill,n_decode,kv_decode,time_us:
//                     one layer's attention kernel for a batch of one prefill
//                     chunk attending to kv_prefill cached tokens plus
//                     n_decode decodes of kv_decode cached tokens each.
//   per_sequence.csv  layer,sequences,time_us: lm_head and sampler.
//   skew_fit.csv      optional: alpha per bucket, for decode batches whose KV
//                     lengths differ (below).
//   moe.csv           optional: tokens,activated_experts,time_us: a whole
//                     MoE block on one rank holding every expert whole,
//                     against the tokens entering it and the distinct
//                     experts they touch. Measured at TP 1 only: a tp<N>
//                     folder without one uses its sibling tp1's.
// and <variant>/meta.yaml: provenance, and the skew fit's bucket bins and
// default alpha per TP degree.
//
// Lookups (all times in seconds):
//  - Dense and per-sequence: linear interpolation in the count between the
//    two nearest grid points, exact at grid points; below the grid, the first
//    point; above it, the last point, flagged so the caller scales it (the
//    roofline anchored to that point: GpuDevice).
//  - Attention: nested linear interpolation over the grid's tree, prefill
//    chunk, then decode count, then prefill history, then decode history,
//    each bracketed among the values measured under the level above (the
//    grid is not a full product); exact at grid points. An axis past its
//    last value is clamped and flagged.
//  - A batch's several prefill chunks are one chunk of their summed tokens
//    attending to their summed histories, and its decodes one group at the
//    mean history (floor), as the profiled varlen kernel runs them. When the
//    decodes' histories differ, the time moves from the mean's toward the
//    max's: t = t(mean) + alpha (t(max) - t(mean)), alpha from skew_fit.csv
//    by bucket (prefill chunk, decode count, skew rate (mean - min) /
//    (max - min), largest history, prefill history), else meta.yaml's
//    default for the TP degree, else 0. This follows LLMServingSim's
//    trace generator (serving/core/trace_generator.py), whose bundles these
//    are.
//
// Loading checks every row: a missing column, a non-numeric, negative or
// non-finite value, unsorted or duplicate grid points are errors naming the
// file, line and column. Bundles are cached per folder (Get).
#ifndef SERVESIM_DEVICES_GPU_PROFILE_H_
#define SERVESIM_DEVICES_GPU_PROFILE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace servesim::devices {

// Points (x ascending, unique) and their times; Eval interpolates.
struct ProfileCurve {
  std::vector<double> x, t;
  // Linear between neighbours; clamped at the ends. `beyond`: x past the
  // last point (set, never cleared).
  double Eval(double at, bool* beyond) const;
  double max_x() const { return x.empty() ? 0 : x.back(); }
};

// One batch's attention as the profile sees it.
struct AttentionShapeQuery {
  double prefill_chunk = 0;  // prompt tokens of the batch's prefill chunks
  double kv_prefill = 0;     // their cached histories, summed
  double n_decode = 0;       // decodes
  double kv_decode_mean = 0, kv_decode_min = 0, kv_decode_max = 0;
};

class GpuProfile {
 public:
  // Loads the bundle in `tp_dir` (a tp<N> folder).
  static absl::StatusOr<std::shared_ptr<const GpuProfile>> Load(const std::string& tp_dir);
  // The same, loaded once per folder for the process.
  static absl::StatusOr<std::shared_ptr<const GpuProfile>> Get(const std::string& tp_dir);

  // The curve of dense (or per-sequence) layer `name`; null if the bundle
  // has none.
  const ProfileCurve* Dense(absl::string_view name) const;
  const ProfileCurve* PerSequence(absl::string_view name) const;
  // One layer's attention time for `q`. `clamped`: the query with every axis
  // held to the grid (equal to `q` when nothing was beyond it), for the
  // caller's anchored extrapolation.
  double Attention(const AttentionShapeQuery& q, AttentionShapeQuery* clamped) const;
  // The skew fit's alpha for `q` (0 when the decodes' histories are equal).
  double SkewAlpha(const AttentionShapeQuery& q) const;
  // One MoE block's time for `tokens` tokens touching `experts` distinct
  // experts: linear in the experts among those measured at each of the two
  // nearest token counts (each row clamped to its own range), then linear
  // in the tokens; exact at grid points. `beyond`: tokens or experts past
  // the grid's largest (the caller anchors the roofline there), with the
  // clamped query in *clamped_tokens, *clamped_experts. 0 without moe.csv.
  bool has_moe() const { return !moe_.empty(); }
  double Moe(double tokens, double experts, bool* beyond, double* clamped_tokens,
             double* clamped_experts) const;

  // Every measured point, for calibration: dense and per-sequence curves by
  // layer, and the attention table's rows (prefill_chunk, kv_prefill,
  // n_decode, kv_decode, seconds).
  const std::map<std::string, ProfileCurve, std::less<>>& dense() const { return dense_; }
  const std::map<std::string, ProfileCurve, std::less<>>& per_sequence() const {
    return per_sequence_;
  }
  struct AttentionPoint {
    double prefill_chunk, kv_prefill, n_decode, kv_decode, time_s;
  };
  const std::vector<AttentionPoint>& attention_points() const { return attention_points_; }

  const std::string& dir() const { return dir_; }
  // FNV-1a 64 of the files' bytes, hex.
  const std::string& fingerprint() const { return fingerprint_; }
  int tensor_parallel() const { return tp_; }
  const std::string& gpu_name() const { return gpu_name_; }  // meta.yaml's `gpu`

  // Lookups answered, and answered beyond the grid, since loading (all
  // devices using the bundle; for run_info.json, never for results).
  struct Counts {
    int64_t lookups = 0, beyond_grid = 0, missing_layer = 0;
  };
  Counts counts() const;
  void Count(bool beyond) const;
  void CountMissing() const { missing_.fetch_add(1, std::memory_order_relaxed); }

 private:
  struct Node;  // one level of the attention tree
  double Interp(const Node& node, int depth, const double* query, double* clamped) const;
  // Load's parts: attention.csv's grid and tree; the optional MoE block
  // (its file's bytes into the fingerprint `*h`); the optional skew fit
  // (skew_fit.csv's text `skew`, meta.yaml's scalars `yaml` at `meta_path`).
  absl::Status LoadAttention(const std::string& path, const std::string& text);
  absl::Status LoadMoe(const std::string& tp_dir, uint64_t* h);
  absl::Status LoadSkewFit(const std::string& tp_dir, const std::string& skew,
                           const std::string& meta_path,
                           const std::map<std::string, std::string>& yaml);

  std::string dir_, fingerprint_, gpu_name_;
  int tp_ = 1;
  std::map<std::string, ProfileCurve, std::less<>> dense_, per_sequence_;
  std::shared_ptr<Node> attention_;
  std::vector<AttentionPoint> attention_points_;
  // Skew fit: bins and labels per axis, alpha per bucket key.
  struct Bins {
    std::vector<double> edges;
    std::vector<std::string> labels;
    const std::string* Label(double v) const;
  };
  Bins n_bins_, sr_bins_, kvb_bins_, kp_bins_;
  std::map<std::string, double> alpha_;
  std::map<double, ProfileCurve> moe_;  // tokens -> time against experts
  double moe_max_experts_ = 0;
  double alpha_default_ = 0;
  mutable std::atomic<int64_t> lookups_{0}, beyond_{0}, missing_{0};
};

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_GPU_PROFILE_H_
