// The transformer being served, as the cost models see it.
//
// ModelDims is the resolved, validated form of servesim.v1.ModelSpec: plain
// integers read in hot loops. Derived sizes follow the standard decoder
// layout (Vaswani et al. 2017; GQA per Ainslie et al. 2023):
//   attention weights per layer = d*(h*dh) + 2*d*(kv*dh) + (h*dh)*d
//   FF weights per layer        = 2*d*d_ff (GELU) or 3*d*d_ff (SwiGLU)
//   KV elements per token       = 2 * layers * kv * dh     (AttAcc §3.2)
// Norm gains/biases are counted (2*d per norm, 2 norms per layer + final).
// Multi-head latent attention (kv_lora_rank > 0; DeepSeek-V2 §2.1,
// DeepSeek-V3; docs/models.md): per layer, the queries come from a latent
// of q_lora_rank (d*q_r + q_r*h*(dh+r), a norm of q_r) or directly (d*h*
// (dh+r)); keys and values from one latent, d*(c+r) with a norm of c, up-
// projected by c*h*(dh+dv); output dv*h*d. The cache holds the latent and
// the RoPE key: (c + r) elements per token and layer.
// Mixture of experts (num_experts > 0; docs/moe.md): the first dense_layers
// layers keep the dense FF; each other layer has a router [d x E] and
// E + shared experts of 3*d*d_e (SwiGLU) or 2*d*d_e (GELU) weights each.
#ifndef SERVESIM_DEVICES_MODEL_H_
#define SERVESIM_DEVICES_MODEL_H_

#include <cstdint>
#include <string>

#include "servesim/v1/scenario.pb.h"

namespace servesim::devices {

enum class FfKind { kGelu, kSwiGlu };

struct ModelDims {
  std::string name;
  int64_t num_layers = 0;
  int64_t d_model = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t d_head = 0;
  int64_t d_ff = 0;
  FfKind ff_kind = FfKind::kGelu;
  int64_t vocab_size = 0;
  int64_t max_context_tokens = 0;
  // Element bytes of the weights (2 for fp16 and bf16, 1 for int8 and
  // fp8), of activations between kernels (1 for int8's W8A8, else 2) and of
  // the KV cache.
  int64_t bytes_per_element = 2;
  int64_t act_bytes_per_element = 2;
  int64_t kv_bytes_per_element = 2;
  servesim::v1::DType dtype = servesim::v1::DTYPE_FP16;
  servesim::v1::DType kv_dtype = servesim::v1::DTYPE_FP16;
  bool qk_norm = false;  // per-head RMSNorm of Q and K (Qwen3)
  bool tied_embeddings = false;
  // Mixture of experts; num_experts == 0: dense.
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  int64_t expert_d_ff = 0;
  int64_t shared_experts = 0;
  int64_t dense_layers = 0;
  double routing_skew = 0;
  // Multi-head latent attention; kv_lora_rank == 0: standard attention.
  int64_t kv_lora_rank = 0;
  int64_t q_lora_rank = 0;
  int64_t rope_head_dim = 0;
  int64_t v_head_dim = 0;  // 0: d_head

  // Sliding-window attention; sliding_window == 0: every layer full.
  int64_t sliding_window = 0;
  int64_t full_attention_interval = 0;
  // The routed experts' weights (MXFP4: 4.25 bits = 0.53125 bytes).
  servesim::v1::DType expert_dtype = servesim::v1::DTYPE_FP16;
  double expert_bytes_per_element = 2;

  // Layers attending to the whole context, and to the window only; layer
  // l is full when (l + 1) is a multiple of full_attention_interval.
  int64_t FullAttentionLayers() const {
    if (sliding_window <= 0) return num_layers;
    return full_attention_interval > 0 ? num_layers / full_attention_interval : 0;
  }
  int64_t SlidingLayers() const { return num_layers - FullAttentionLayers(); }
  bool mla() const { return kv_lora_rank > 0; }
  int64_t dv() const { return v_head_dim > 0 ? v_head_dim : d_head; }
  // Cached elements per token and layer on one xPU: the latent and RoPE key
  // (MLA, on every xPU of a TP group), else K and V of `kv_heads` heads.
  int64_t KvElementsPerLayer(int64_t kv_heads) const {
    return mla() ? kv_lora_rank + rope_head_dim : 2 * kv_heads * d_head;
  }
  bool moe() const { return num_experts > 0; }
  int64_t MoeLayers() const { return moe() ? num_layers - dense_layers : 0; }
  int64_t DenseFfLayers() const { return num_layers - MoeLayers(); }
  // One expert's weights (also one shared expert's).
  int64_t ExpertParams() const {
    return (ff_kind == FfKind::kSwiGlu ? 3 : 2) * d_model * expert_d_ff;
  }
  // Routed experts' weights, all layers: what expert parallelism splits.
  int64_t RoutedExpertParams() const { return MoeLayers() * num_experts * ExpertParams(); }
  // An MoE layer's FF block: router, routed and shared experts.
  int64_t MoeParamsPerLayer() const {
    return d_model * num_experts + (num_experts + shared_experts) * ExpertParams();
  }
  // Weights one token's forward pass reads (routed experts: top-k only).
  int64_t ActiveParams() const;

  // Weights every xPU of a tensor-parallel group holds whole: MLA's query
  // and KV down-projections and their norms (vLLM's replicated
  // fused_qkv_a_proj); 0 for other models.
  int64_t ReplicatedParams() const {
    if (!mla()) return 0;
    return num_layers *
           (d_model * (q_lora_rank + kv_lora_rank + rope_head_dim) + q_lora_rank + kv_lora_rank);
  }

  // Parameter counts.
  int64_t AttentionParamsPerLayer() const;
  int64_t FfParamsPerLayer() const;
  int64_t NormParams() const;      // one norm's weights (and biases)
  int64_t ParamsPerLayer() const;  // attention + (dense) FF + 2 norms
  int64_t EmbeddingParams() const;  // token embedding (+ LM head if untied)
  int64_t TotalParams() const;
  // FP8 checkpoints keep the embedding and LM head in 16 bits (vLLM
  // quantizes the linear layers only).
  // Routed experts at their own element type.
  double WeightBytes() const {
    return double(TotalParams()) * double(bytes_per_element) +
           (dtype == servesim::v1::DTYPE_FP8 ? double(EmbeddingParams()) : 0.0) +
           double(RoutedExpertParams()) * (expert_bytes_per_element - double(bytes_per_element));
  }

  // KV-cache bytes one token occupies across all layers and KV heads.
  int64_t KvBytesPerToken() const {
    return num_layers * KvElementsPerLayer(num_kv_heads) * kv_bytes_per_element;
  }
  // Number of FF weight matrices that read the layer input (gate+up for
  // SwiGLU, one for GELU).
  int64_t FfInputMatrices() const { return ff_kind == FfKind::kSwiGlu ? 2 : 1; }
};

// Converts a resolved ModelSpec (every optional field set; see
// scenario/scenario.h) to ModelDims.
ModelDims ModelDimsFromSpec(const servesim::v1::ModelSpec& spec);

// "fp16", "bf16", "int8", "fp8" or "mxfp4".
const char* DTypeName(servesim::v1::DType dtype);
// The KV cache's dtype: kv_dtype when set, else the weights' (16-bit for
// FP8 weights: vLLM's kv_cache_dtype "auto" keeps the activations' type).
servesim::v1::DType ResolvedKvDType(servesim::v1::DType dtype, servesim::v1::DType kv_dtype);
// Bytes per element of a dtype: 1 for int8 and fp8, else 2 (MXFP4, which
// is not a whole byte, has DTypeWeightBytes).
int64_t DTypeBytes(servesim::v1::DType dtype);
// Bytes per weight, MXFP4 included: 4 bits plus an 8-bit scale per 32.
double DTypeWeightBytes(servesim::v1::DType dtype);
// The routed experts' dtype: expert_dtype when set, else the weights'.
servesim::v1::DType ResolvedExpertDType(servesim::v1::DType dtype,
                                        servesim::v1::DType expert_dtype);

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_MODEL_H_
