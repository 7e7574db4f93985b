#include "devices/model.h"

namespace servesim::devices {

int64_t ModelDims::AttentionParamsPerLayer() const {
  if (mla()) {
    const int64_t h = num_heads, qk = d_head + rope_head_dim;
    const int64_t q = q_lora_rank > 0 ? d_model * q_lora_rank + q_lora_rank + q_lora_rank * h * qk
                                      : d_model * h * qk;
    const int64_t kv = d_model * (kv_lora_rank + rope_head_dim) + kv_lora_rank +
                       kv_lora_rank * h * (d_head + dv());
    return q + kv + h * dv() * d_model;
  }
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
  m.tied_embeddings = spec.tied_embeddings();
  m.dtype = spec.dtype() == servesim::v1::DTYPE_UNSPECIFIED ? servesim::v1::DTYPE_FP16 : spec.dtype();
  m.kv_dtype = ResolvedKvDType(spec.dtype(), spec.kv_dtype());
  m.bytes_per_element = DTypeBytes(m.dtype);
  m.act_bytes_per_element = m.dtype == servesim::v1::DTYPE_INT8 ? 1 : 2;
  m.kv_bytes_per_element = DTypeBytes(m.kv_dtype);
  m.qk_norm = spec.qk_norm();
  m.num_experts = spec.num_experts();
  m.experts_per_token = spec.experts_per_token();
  m.expert_d_ff = spec.expert_d_ff();
  m.shared_experts = spec.shared_experts();
  m.dense_layers = spec.dense_layers();
  m.routing_skew = spec.routing_skew();
  m.kv_lora_rank = spec.kv_lora_rank();
  m.q_lora_rank = spec.q_lora_rank();
  m.rope_head_dim = spec.rope_head_dim();
  m.v_head_dim = spec.v_head_dim();
  m.sliding_window = spec.sliding_window();
  m.full_attention_interval = spec.full_attention_interval();
  m.expert_dtype = ResolvedExpertDType(m.dtype, spec.expert_dtype());
  m.expert_bytes_per_element = DTypeWeightBytes(m.expert_dtype);
  return m;
}

servesim::v1::DType ResolvedExpertDType(servesim::v1::DType dtype,
                                        servesim::v1::DType expert_dtype) {
  if (expert_dtype != servesim::v1::DTYPE_UNSPECIFIED) return expert_dtype;
  return dtype == servesim::v1::DTYPE_UNSPECIFIED ? servesim::v1::DTYPE_FP16 : dtype;
}

double DTypeWeightBytes(servesim::v1::DType dtype) {
  return dtype == servesim::v1::DTYPE_MXFP4 ? 4.25 / 8 : static_cast<double>(DTypeBytes(dtype));
}

servesim::v1::DType ResolvedKvDType(servesim::v1::DType dtype, servesim::v1::DType kv_dtype) {
  if (kv_dtype != servesim::v1::DTYPE_UNSPECIFIED) return kv_dtype;
  switch (dtype) {
    case servesim::v1::DTYPE_UNSPECIFIED:
      return servesim::v1::DTYPE_FP16;
    case servesim::v1::DTYPE_FP8:
      return servesim::v1::DTYPE_BF16;
    default:
      return dtype;
  }
}

int64_t DTypeBytes(servesim::v1::DType dtype) {
  return dtype == servesim::v1::DTYPE_INT8 || dtype == servesim::v1::DTYPE_FP8 ? 1 : 2;
}

const char* DTypeName(servesim::v1::DType dtype) {
  switch (dtype) {
    case servesim::v1::DTYPE_INT8:
      return "int8";
    case servesim::v1::DTYPE_BF16:
      return "bf16";
    case servesim::v1::DTYPE_FP8:
      return "fp8";
    case servesim::v1::DTYPE_MXFP4:
      return "mxfp4";
    default:
      return "fp16";
  }
}

}  // namespace servesim::devices
