#include "devices/model.h"

namespace servesim::devices {

int64_t ModelDims::AttentionParamsPerLayer() const {
  const int64_t q = num_heads * d_head;
  const int64_t kv = num_kv_heads * d_head;
  return d_model * q + 2 * d_model * kv + q * d_model;
}

int64_t ModelDims::FfParamsPerLayer() const {
  return (ff_kind == FfKind::kSwiGlu ? 3 : 2) * d_model * d_ff;
}

// GELU models (GPT, OPT) use LayerNorm, weight and bias; SwiGLU ones
// (LLaMA, Qwen, Mistral) RMSNorm, a weight only; Qwen3 adds a per-head
// RMSNorm of Q and K (d_head weights each).
int64_t ModelDims::NormParams() const {
  return ff_kind == FfKind::kSwiGlu ? d_model : 2 * d_model;
}

int64_t ModelDims::ParamsPerLayer() const {
  return AttentionParamsPerLayer() + FfParamsPerLayer() + 2 * NormParams() +
         (qk_norm ? 2 * d_head : 0);
}

int64_t ModelDims::EmbeddingParams() const {
  return (tied_embeddings ? 1 : 2) * vocab_size * d_model;
}

int64_t ModelDims::TotalParams() const {
  return num_layers * ParamsPerLayer() + EmbeddingParams() + NormParams() +
         MoeLayers() * (MoeParamsPerLayer() - FfParamsPerLayer());
}

int64_t ModelDims::ActiveParams() const {
  return TotalParams() - MoeLayers() * (num_experts - experts_per_token) * ExpertParams();
}

ModelDims ModelDimsFromSpec(const servesim::v1::ModelSpec& spec) {
  ModelDims m;
  m.name = spec.name();
  m.num_layers = spec.num_layers();
  m.d_model = spec.d_model();
  m.num_heads = spec.num_heads();
  m.num_kv_heads = spec.num_kv_heads();
  m.d_head = spec.d_head();
  m.d_ff = spec.d_ff();
  m.ff_kind = spec.ff_kind() == servesim::v1::FF_KIND_SWIGLU ? FfKind::kSwiGlu
                                                             : FfKind::kGelu;
  m.vocab_size = spec.vocab_size();
  m.max_context_tokens = spec.max_context_tokens();
  m.bytes_per_element = spec.dtype() == servesim::v1::DTYPE_INT8 ? 1 : 2;
  m.tied_embeddings = spec.tied_embeddings();
  m.dtype = spec.dtype() == servesim::v1::DTYPE_UNSPECIFIED ? servesim::v1::DTYPE_FP16 : spec.dtype();
  m.qk_norm = spec.qk_norm();
  m.num_experts = spec.num_experts();
  m.experts_per_token = spec.experts_per_token();
  m.expert_d_ff = spec.expert_d_ff();
  m.shared_experts = spec.shared_experts();
  m.dense_layers = spec.dense_layers();
  m.routing_skew = spec.routing_skew();
  return m;
}

const char* DTypeName(servesim::v1::DType dtype) {
  switch (dtype) {
    case servesim::v1::DTYPE_INT8:
      return "int8";
    case servesim::v1::DTYPE_BF16:
      return "bf16";
    default:
      return "fp16";
  }
}

}  // namespace servesim::devices
