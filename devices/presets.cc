#include "devices/presets.h"

#include <cstdio>
#include <cstdlib>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/text_format.h"

namespace servesim::devices {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// ---------------------------------------------------------------- models ----
// Sources:
//  [GPT3]  Brown et al., "Language Models are Few-Shot Learners", 2020,
//          Table 2.1 (layers, d_model, heads, d_head, context 2048); FF = 4d;
//          GPT-2 BPE vocabulary of 50,257 with tied embeddings.
//  [LLAMA] Touvron et al., "LLaMA", 2023, Table 2; FF 22016 and vocab 32000
//          from the released params (SwiGLU, untied LM head).
//  [MTNLG] Smith et al., "Using DeepSpeed and Megatron to Train Megatron-
//          Turing NLG 530B", 2022, §3 (105 layers, 20480 hidden, 128 heads,
//          context 2048); d_head 160 = 20480/128; Megatron pads the GPT-2
//          vocabulary to 51,200.
//  [LLAMA2] Touvron et al., "Llama 2", 2023, Table 1 (context 4096, GQA for
//          70B) and the released config.json files (intermediate_size 11008
//          / 13824 / 28672, num_key_value_heads 8 for 70B).
//  [OPT]   Zhang et al., "OPT", 2022, Table 1 (layers, heads, d_model);
//          FF = 4d; vocab 50,272; context 2048; tied embeddings.
//  [GPT2]  Radford et al., "Language Models are Unsupervised Multitask
//          Learners", 2019, Table 2; d_head 64, FF 4d, context 1024.
//  [HF]    The released config.json of each model on the Hugging Face hub
//          (num_hidden_layers, hidden_size, num_attention_heads,
//          num_key_value_heads, head_dim, intermediate_size, vocab_size,
//          max_position_embeddings, tie_word_embeddings, torch_dtype):
//          meta-llama/Llama-3.1-8B, -70B, -405B; meta-llama/Llama-3.2-1B, -3B;
//          Qwen/Qwen3-8B, -14B, -32B (qk_norm: Qwen3 normalises each Q and K
//          head); codellama/CodeLlama-34b-hf; mistralai/Mistral-7B-v0.3 (no
//          sliding window, unlike v0.1). Llama-3.1 and Qwen3 contexts are
//          their max_position_embeddings (131,072 and 40,960). All bf16.
//  [HF-MOE] Mixture-of-experts models, from their released config.json
//          (num_experts / num_local_experts, num_experts_per_tok,
//          moe_intermediate_size; Mixtral's experts are intermediate_size
//          wide; every layer is an MoE layer: Qwen3-MoE's mlp_only_layers is
//          empty and decoder_sparse_step 1): Qwen/Qwen3-30B-A3B (30.5B
//          parameters, 3.3B active), Qwen/Qwen3-30B-A3B-Instruct-2507 (the
//          same shapes, 262,144 positions), Qwen/Qwen3-235B-A22B,
//          mistralai/Mixtral-8x7B-v0.1 (46.7B, 12.9B active),
//          mistralai/Mixtral-8x22B-v0.1. All bf16.
//  [HF-MLA] deepseek-ai/DeepSeek-V3 config.json (DeepSeek-R1 and V3.1 share
//          the architecture: serve them with this preset): 61 layers, hidden 7168, 128 heads,
//          q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128,
//          qk_rope_head_dim 64, v_head_dim 128, intermediate_size 18432 for
//          the first_k_dense_replace = 3 dense layers, 256 routed experts
//          (top 8) and 1 shared expert of moe_intermediate_size 2048, vocab
//          129,280, 163,840 positions, untied; released in FP8 (e4m3, 128 x
//          128 block scales: quantization_config) with the embedding and LM
//          head in bf16. 671B parameters, 37B active (DeepSeek-V3 technical
//          report, §1; the multi-token-prediction module's 14B is not served
//          by default and not counted). The routing's node-limited groups
//          (n_group 8, topk_group 4) are not modelled: the routing model's
//          loads are per expert.
//  [HF-OSS] openai/gpt-oss-120b and openai/gpt-oss-20b, config.json: 36 / 24
//          layers, hidden 2880, 64 query heads and 8 KV heads of 64,
//          128 / 32 experts of intermediate_size 2880 (top 4), vocab
//          201,088, 131,072 positions, untied; layer_types alternate
//          sliding_attention (window 128) and full_attention, the first
//          sliding; the experts in MXFP4 (quantization_config; attention,
//          router, embedding and LM head in bf16). 116.8B and 20.9B
//          parameters (OpenAI's gpt-oss model card, Table 1: 5.1B and 3.6B
//          active, which counts one of the embedding and unembedding).
//          Not counted: biases (q/k/v/o and experts, ~0.04%) and the
//          attention sinks (one logit per head).
// AttAcc's evaluation (§7) uses GPT-3 175B, LLaMA 65B and MT-NLG 530B.
constexpr absl::string_view kModelPresets[][2] = {
    {"gpt3-175b",  // [GPT3]
     R"pb(name: "GPT-3 175B" num_layers: 96 d_model: 12288 num_heads: 96
          num_kv_heads: 96 d_head: 128 d_ff: 49152 ff_kind: FF_KIND_GELU
          vocab_size: 50257 max_context_tokens: 2048 tied_embeddings: true)pb"},
    {"llama-65b",  // [LLAMA]
     R"pb(name: "LLaMA-65B" num_layers: 80 d_model: 8192 num_heads: 64
          num_kv_heads: 64 d_head: 128 d_ff: 22016 ff_kind: FF_KIND_SWIGLU
          vocab_size: 32000 max_context_tokens: 2048 tied_embeddings: false)pb"},
    {"mt-nlg-530b",  // [MTNLG]
     R"pb(name: "MT-NLG 530B" num_layers: 105 d_model: 20480 num_heads: 128
          num_kv_heads: 128 d_head: 160 d_ff: 81920 ff_kind: FF_KIND_GELU
          vocab_size: 51200 max_context_tokens: 2048 tied_embeddings: true)pb"},
    {"llama2-7b",  // [LLAMA2]
     R"pb(name: "LLaMA-2 7B" num_layers: 32 d_model: 4096 num_heads: 32
          num_kv_heads: 32 d_head: 128 d_ff: 11008 ff_kind: FF_KIND_SWIGLU
          vocab_size: 32000 max_context_tokens: 4096 tied_embeddings: false hf_name: "meta-llama/Llama-2-7b-hf")pb"},
    {"llama2-13b",  // [LLAMA2]
     R"pb(name: "LLaMA-2 13B" num_layers: 40 d_model: 5120 num_heads: 40
          num_kv_heads: 40 d_head: 128 d_ff: 13824 ff_kind: FF_KIND_SWIGLU
          vocab_size: 32000 max_context_tokens: 4096 tied_embeddings: false hf_name: "meta-llama/Llama-2-13b-hf")pb"},
    {"llama2-70b",  // [LLAMA2]
     R"pb(name: "LLaMA-2 70B" num_layers: 80 d_model: 8192 num_heads: 64
          num_kv_heads: 8 d_head: 128 d_ff: 28672 ff_kind: FF_KIND_SWIGLU
          vocab_size: 32000 max_context_tokens: 4096 tied_embeddings: false hf_name: "meta-llama/Llama-2-70b-hf")pb"},
    {"opt-6.7b",  // [OPT]
     R"pb(name: "OPT-6.7B" num_layers: 32 d_model: 4096 num_heads: 32
          num_kv_heads: 32 d_head: 128 d_ff: 16384 ff_kind: FF_KIND_GELU
          vocab_size: 50272 max_context_tokens: 2048 tied_embeddings: true)pb"},
    {"opt-13b",  // [OPT]
     R"pb(name: "OPT-13B" num_layers: 40 d_model: 5120 num_heads: 40
          num_kv_heads: 40 d_head: 128 d_ff: 20480 ff_kind: FF_KIND_GELU
          vocab_size: 50272 max_context_tokens: 2048 tied_embeddings: true)pb"},
    {"opt-66b",  // [OPT]
     R"pb(name: "OPT-66B" num_layers: 64 d_model: 9216 num_heads: 72
          num_kv_heads: 72 d_head: 128 d_ff: 36864 ff_kind: FF_KIND_GELU
          vocab_size: 50272 max_context_tokens: 2048 tied_embeddings: true)pb"},
    {"gpt2-medium",  // [GPT2]
     R"pb(name: "GPT-2 medium" num_layers: 24 d_model: 1024 num_heads: 16
          num_kv_heads: 16 d_head: 64 d_ff: 4096 ff_kind: FF_KIND_GELU
          vocab_size: 50257 max_context_tokens: 1024 tied_embeddings: true)pb"},
    {"gpt2-large",  // [GPT2]
     R"pb(name: "GPT-2 large" num_layers: 36 d_model: 1280 num_heads: 20
          num_kv_heads: 20 d_head: 64 d_ff: 5120 ff_kind: FF_KIND_GELU
          vocab_size: 50257 max_context_tokens: 1024 tied_embeddings: true)pb"},
    {"gpt2-xl",  // [GPT2]
     R"pb(name: "GPT-2 XL" num_layers: 48 d_model: 1600 num_heads: 25
          num_kv_heads: 25 d_head: 64 d_ff: 6400 ff_kind: FF_KIND_GELU
          vocab_size: 50257 max_context_tokens: 1024 tied_embeddings: true)pb"},
    {"llama3.1-8b",  // [HF]
     R"pb(name: "Llama-3.1-8B" num_layers: 32 d_model: 4096 num_heads: 32
          num_kv_heads: 8 d_head: 128 d_ff: 14336 ff_kind: FF_KIND_SWIGLU
          vocab_size: 128256 max_context_tokens: 131072 tied_embeddings: false
          dtype: DTYPE_BF16 hf_name: "meta-llama/Llama-3.1-8B")pb"},
    {"llama3.1-70b",  // [HF]
     R"pb(name: "Llama-3.1-70B" num_layers: 80 d_model: 8192 num_heads: 64
          num_kv_heads: 8 d_head: 128 d_ff: 28672 ff_kind: FF_KIND_SWIGLU
          vocab_size: 128256 max_context_tokens: 131072 tied_embeddings: false
          dtype: DTYPE_BF16 hf_name: "meta-llama/Llama-3.1-70B")pb"},
    {"llama3.1-405b",  // [HF]
     R"pb(name: "Llama-3.1-405B" num_layers: 126 d_model: 16384 num_heads: 128
          num_kv_heads: 8 d_head: 128 d_ff: 53248 ff_kind: FF_KIND_SWIGLU
          vocab_size: 128256 max_context_tokens: 131072 tied_embeddings: false
          dtype: DTYPE_BF16 hf_name: "meta-llama/Llama-3.1-405B")pb"},
    {"llama3.2-1b",  // [HF]
     R"pb(name: "Llama-3.2-1B" num_layers: 16 d_model: 2048 num_heads: 32
          num_kv_heads: 8 d_head: 64 d_ff: 8192 ff_kind: FF_KIND_SWIGLU
          vocab_size: 128256 max_context_tokens: 131072 tied_embeddings: true
          dtype: DTYPE_BF16 hf_name: "meta-llama/Llama-3.2-1B")pb"},
    {"llama3.2-3b",  // [HF]
     R"pb(name: "Llama-3.2-3B" num_layers: 28 d_model: 3072 num_heads: 24
          num_kv_heads: 8 d_head: 128 d_ff: 8192 ff_kind: FF_KIND_SWIGLU
          vocab_size: 128256 max_context_tokens: 131072 tied_embeddings: true
          dtype: DTYPE_BF16 hf_name: "meta-llama/Llama-3.2-3B")pb"},
    {"qwen3-8b",  // [HF]
     R"pb(name: "Qwen3-8B" num_layers: 36 d_model: 4096 num_heads: 32
          num_kv_heads: 8 d_head: 128 d_ff: 12288 ff_kind: FF_KIND_SWIGLU
          vocab_size: 151936 max_context_tokens: 40960 tied_embeddings: false
          qk_norm: true dtype: DTYPE_BF16 hf_name: "Qwen/Qwen3-8B")pb"},
    {"qwen3-14b",  // [HF]
     R"pb(name: "Qwen3-14B" num_layers: 40 d_model: 5120 num_heads: 40
          num_kv_heads: 8 d_head: 128 d_ff: 17408 ff_kind: FF_KIND_SWIGLU
          vocab_size: 151936 max_context_tokens: 40960 tied_embeddings: false
          qk_norm: true dtype: DTYPE_BF16 hf_name: "Qwen/Qwen3-14B")pb"},
    {"qwen3-32b",  // [HF]
     R"pb(name: "Qwen3-32B" num_layers: 64 d_model: 5120 num_heads: 64
          num_kv_heads: 8 d_head: 128 d_ff: 25600 ff_kind: FF_KIND_SWIGLU
          vocab_size: 151936 max_context_tokens: 40960 tied_embeddings: false
          qk_norm: true dtype: DTYPE_BF16 hf_name: "Qwen/Qwen3-32B")pb"},
    {"codellama-34b",  // [HF]
     R"pb(name: "CodeLlama-34B" num_layers: 48 d_model: 8192 num_heads: 64
          num_kv_heads: 8 d_head: 128 d_ff: 22016 ff_kind: FF_KIND_SWIGLU
          vocab_size: 32000 max_context_tokens: 16384 tied_embeddings: false
          dtype: DTYPE_BF16 hf_name: "codellama/CodeLlama-34b-Instruct-hf")pb"},
    {"mistral-7b",  // [HF]
     R"pb(name: "Mistral-7B-v0.3" num_layers: 32 d_model: 4096 num_heads: 32
          num_kv_heads: 8 d_head: 128 d_ff: 14336 ff_kind: FF_KIND_SWIGLU
          vocab_size: 32768 max_context_tokens: 32768 tied_embeddings: false
          dtype: DTYPE_BF16 hf_name: "mistralai/Mistral-7B-v0.3")pb"},
    {"qwen3-30b-a3b",  // [HF-MOE]
     R"pb(name: "Qwen3-30B-A3B" num_layers: 48 d_model: 2048 num_heads: 32
          num_kv_heads: 4 d_head: 128 d_ff: 6144 ff_kind: FF_KIND_SWIGLU
          vocab_size: 151936 max_context_tokens: 40960 tied_embeddings: false
          qk_norm: true num_experts: 128 experts_per_token: 8 expert_d_ff: 768
          dtype: DTYPE_BF16 hf_name: "Qwen/Qwen3-30B-A3B")pb"},
    {"qwen3-30b-a3b-instruct-2507",  // [HF-MOE]
     R"pb(name: "Qwen3-30B-A3B-Instruct-2507" num_layers: 48 d_model: 2048 num_heads: 32
          num_kv_heads: 4 d_head: 128 d_ff: 6144 ff_kind: FF_KIND_SWIGLU
          vocab_size: 151936 max_context_tokens: 262144 tied_embeddings: false
          qk_norm: true num_experts: 128 experts_per_token: 8 expert_d_ff: 768
          dtype: DTYPE_BF16 hf_name: "Qwen/Qwen3-30B-A3B-Instruct-2507")pb"},
    {"qwen3-235b-a22b",  // [HF-MOE]
     R"pb(name: "Qwen3-235B-A22B" num_layers: 94 d_model: 4096 num_heads: 64
          num_kv_heads: 4 d_head: 128 d_ff: 12288 ff_kind: FF_KIND_SWIGLU
          vocab_size: 151936 max_context_tokens: 40960 tied_embeddings: false
          qk_norm: true num_experts: 128 experts_per_token: 8 expert_d_ff: 1536
          dtype: DTYPE_BF16 hf_name: "Qwen/Qwen3-235B-A22B")pb"},
    {"mixtral-8x7b",  // [HF-MOE]
     R"pb(name: "Mixtral-8x7B" num_layers: 32 d_model: 4096 num_heads: 32
          num_kv_heads: 8 d_head: 128 d_ff: 14336 ff_kind: FF_KIND_SWIGLU
          vocab_size: 32000 max_context_tokens: 32768 tied_embeddings: false
          num_experts: 8 experts_per_token: 2 expert_d_ff: 14336
          dtype: DTYPE_BF16 hf_name: "mistralai/Mixtral-8x7B-v0.1")pb"},
    {"mixtral-8x22b",  // [HF-MOE]
     R"pb(name: "Mixtral-8x22B" num_layers: 56 d_model: 6144 num_heads: 48
          num_kv_heads: 8 d_head: 128 d_ff: 16384 ff_kind: FF_KIND_SWIGLU
          vocab_size: 32000 max_context_tokens: 65536 tied_embeddings: false
          num_experts: 8 experts_per_token: 2 expert_d_ff: 16384
          dtype: DTYPE_BF16 hf_name: "mistralai/Mixtral-8x22B-v0.1")pb"},
    {"deepseek-v3",  // [HF-MLA]
     R"pb(name: "DeepSeek-V3" num_layers: 61 d_model: 7168 num_heads: 128
          num_kv_heads: 128 d_head: 128 d_ff: 18432 ff_kind: FF_KIND_SWIGLU
          vocab_size: 129280 max_context_tokens: 163840 tied_embeddings: false
          kv_lora_rank: 512 q_lora_rank: 1536 rope_head_dim: 64 v_head_dim: 128
          num_experts: 256 experts_per_token: 8 expert_d_ff: 2048 shared_experts: 1
          dense_layers: 3 dtype: DTYPE_FP8 hf_name: "deepseek-ai/DeepSeek-V3")pb"},
    {"gpt-oss-120b",  // [HF-OSS]
     R"pb(name: "gpt-oss-120b" num_layers: 36 d_model: 2880 num_heads: 64
          num_kv_heads: 8 d_head: 64 d_ff: 2880 ff_kind: FF_KIND_SWIGLU
          vocab_size: 201088 max_context_tokens: 131072 tied_embeddings: false
          num_experts: 128 experts_per_token: 4 expert_d_ff: 2880
          sliding_window: 128 full_attention_interval: 2 dtype: DTYPE_BF16
          expert_dtype: DTYPE_MXFP4 hf_name: "openai/gpt-oss-120b")pb"},
    {"gpt-oss-20b",  // [HF-OSS]
     R"pb(name: "gpt-oss-20b" num_layers: 24 d_model: 2880 num_heads: 64
          num_kv_heads: 8 d_head: 64 d_ff: 2880 ff_kind: FF_KIND_SWIGLU
          vocab_size: 201088 max_context_tokens: 131072 tied_embeddings: false
          num_experts: 32 experts_per_token: 4 expert_d_ff: 2880
          sliding_window: 128 full_attention_interval: 2 dtype: DTYPE_BF16
          expert_dtype: DTYPE_MXFP4 hf_name: "openai/gpt-oss-20b")pb"},
};

// ------------------------------------------------------------------ xPUs ----
// Datasheet figures: dense (non-sparse) tensor-core throughput; memory in
// GiB as the parts expose it (80 GB parts have 81,920 MiB).
//  [A100]  NVIDIA A100 Tensor Core GPU datasheet (SXM): 312 TFLOPS FP16,
//          624 TOPS INT8; 40GB HBM2 at 1,555 GB/s; 80GB HBM2e at 2,039 GB/s.
//  [ATTACC] AttAcc §7: the baseline DGX uses "A100 with HBM3": 80 GB and
//          3.35 TB/s per GPU, 312 TFLOPS (8 GPUs: 26.8 TB/s, 2.5 PFLOPS).
//  [H100]  NVIDIA H100 Tensor Core GPU datasheet (SXM5): 989.4 TFLOPS FP16
//          and 1,979 TOPS INT8 dense; 80 GB HBM3 at 3.35 TB/s.
//          (Datasheets give dense rates as half the "with sparsity" ones.)
//  [H100P] The same datasheet, H100 PCIe: 756 TFLOPS BF16/FP16, 1,513 TFLOPS
//          FP8, 1,513 TOPS INT8; 80 GB HBM2e at 2.0 TB/s; 350 W.
//  [H200]  NVIDIA H200 Tensor Core GPU datasheet (SXM): H100 SXM's tensor
//          rates (989 TFLOPS BF16, 1,979 FP8/INT8) with 141 GB HBM3e at
//          4.8 TB/s; 700 W.
//  [B200]  NVIDIA DGX B200 / HGX B200 datasheets: per GPU 2.25 PFLOPS
//          BF16/FP16, 4.5 PFLOPS FP8 and INT8 dense (half the sparse 4.5/9),
//          180 GB HBM3e at 8 TB/s; 1,000 W.
//  [L40S]  NVIDIA L40S datasheet: 362.05 TFLOPS BF16/FP16, 733 TFLOPS FP8,
//          733 TOPS INT8 dense; 48 GB GDDR6 at 864 GB/s; 350 W.
//  [ADA]   NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090:
//          165.2 TFLOPS FP16/BF16 with FP32 accumulate (what bf16 inference
//          uses; GeForce runs it at half the FP16-accumulate rate), 330.3
//          FP8, 660.6 TOPS INT8 dense; 24 GB GDDR6X at 1,008 GB/s; 450 W.
//  [RTX6K] NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet: 96 GB
//          GDDR7 at 1,597 GB/s (the workstation card lists 1,792), 600 W,
//          4 PFLOPS FP4 with sparsity. Dense FP4 is half that and each wider
//          type halves it again (Blackwell's tensor-core ratios, as B200's):
//          1 PFLOPS FP8, 0.5 PFLOPS BF16/FP16 (DERIVED, not a listed figure).
//  [MI300X] AMD Instinct MI300X datasheet: 1,307.4 TFLOPS BF16/FP16 and
//          2,614.9 TFLOPS FP8 / TOPS INT8 dense; 192 GB HBM3 at 5.3 TB/s;
//          750 W.
//  A100 has no FP8 (peak_flops_fp8 0). TDPs: A100 SXM 400 W [A100], H100
//  SXM 700 W [H100].
//  idle_power_w: board power with a model resident and no kernel running
//  (a CUDA context held; what a serving engine's GPUs draw between
//  requests), measured by Vadari, "The Model Parking Tax", arXiv:2605.23918
//  (2026): H100 80GB HBM3 121.7 W (bare idle 71.8 W), A100 80GB 80.0 W
//  (53.7 W), L40S 102.1 W (35.6 W); memory occupancy adds < 0.02 W/GB.
//  ASSUMPTIONS: a100-40gb and AttAcc's a100-hbm3 take the A100 figure and
//  h200-sxm-141gb the H100's (the same dies). No measured figure found for
//  H100 PCIe, B200, RTX 4090, RTX PRO 6000 or MI300X: 0, not counted (set
//  cluster.xpu.idle_power_w to count it).
//  interconnect: the boards' own GPU-to-GPU links (the same datasheets): SXM
//  parts NVLink 3/4/5; H100 PCIe, L40S, RTX 4090 and RTX PRO 6000 Server
//  PCIe 5.0 / 4.0 x16 (no NVLink: all-reduces go over PCIe; the RTX 4090 has
//  no peer-to-peer at all, so NCCL stages through host memory and the pcie4
//  figures are an upper bound there); MI300X Infinity Fabric.
//  peer_to_peer: NVLink parts reach each other's memory over NVLink; the
//  RTX 4090 has no PCIe peer-to-peer ("GeForce cards do not support P2P",
//  an NCCL maintainer in NVIDIA/nccl-tests#287); the RTX PRO 6000 Blackwell
//  has it (P2P enabled between Gen5 x16 pairs, measured in the rtx6kpro
//  community wiki, sjug/rtx6kpro hardware/pcie-bandwidth.md; "PCIe
//  peer-to-peer, no NVLink" in vllm-project/vllm#56128). H100 PCIe, L40S
//  and MI300X: not stated in a source found, unset (no peer-to-peer
//  assumed; cluster.collectives.peer_to_peer sets it).
// Utilisation caps 0.8 (compute) and 0.85 (memory) are the AttAcc
// simulator's MAX_COMPUTE_UTIL / MAX_OFF_MEM_BW_UTIL (scale-snu/
// attacc_simulator, src/config.py).
// Energy (same source's ENERGY_TABLE):
//  - device memory 28.72 pJ/B = 3.59 pJ/bit, the HBM access path of
//    O'Connor et al., "Fine-Grained DRAM", MICRO'17: cell ACT/PRE 0.11, cell
//    RD/WR 0.44, column decoder to bank-group mux 1.01, BG mux to global IO
//    1.23, TSV 0.5, silicon-interposer IO 0.3 pJ/bit.
//  - 0.32 pJ per fp16 multiply-accumulate = 0.16 pJ/FLOP: the multiplier's
//    alone, the default where no busy-power figures are known.
//  - int8 at 0.08 pJ/OP is an assumption (half the fp16 energy, as the
//    multiplier area roughly quarters and operand movement halves).
// [BUSY] Busy power (docs/energy.md, "Busy GPU power"): active_power_w, the
// draw above idle while kernels run (not collectives), and a board-level
// flop_energy_pj (everything that grows with tensor-core work, not the
// multiplier alone), limited to tdp_w.
//  - h100-sxm-80gb: 282 W and 1.22 pJ/FLOP, fitted to ML.ENERGY's
//    Llama-3.1-8B curve on one H100 SXM (Leaderboard v3.0, vLLM 0.11.1,
//    batch 16-512: 513-691 W; ml-energy/blog, "LLM Inference Energy: A
//    Longitudinal Analysis", 2026), DRAM kept at 28.72 pJ/B. The 70B (4
//    GPUs) and 405B FP8 (8 GPUs) curves of the same post test it.
//  - h200-sxm-141gb: the H100's (the same die). ASSUMPTION.
//  - a100-*, l40s: the H100's shares carried over by datasheet figures.
//    ASSUMPTION: active = 0.4876 x (TDP - idle) (282 / 578.3), pJ/FLOP =
//    1.22 x (TDP / peak fp16) / (700 W / 989.4 TFLOPS): A100 156 W and
//    2.2 pJ, L40S 121 W and 1.66 pJ.
//  - int8/fp8 ops at half the FLOP figure, as above.
//  - GPUs whose idle power is unknown keep 0 W and 0.16 pJ (not counted).
// [GEMM-MEASURED] Presets of GPUs whose GEMMs have been measured carry a
// roofline { op_class: "gemm" } entry instead of the caps above for GEMMs:
// the mean of `servesim calibrate`'s GEMM fits to that GPU's bundles
// (docs/profiles.md), pinned by
// DocFiguresTest.PresetGemmCapsAreTheMeanOfTheBundlesFits.
//  - h100-sxm-80gb: bf16 GEMMs of Llama-2-7B, Llama-3.1-8B, CodeLlama-34B and
//    Qwen3-32B (1-8,192 tokens; cuBLAS through PyTorch 2.11, CUDA 13.0) timed
//    on one H100 80GB HBM3 (SXM5, 700 W) by scripts/profile_gpu.py on
//    2026-11-26 (examples/gpu_profiles/H100/): fits 0.722-0.762 compute,
//    0.802-0.828 memory, 1.0-5.1 us overhead; means 0.741, 0.821, 3.67 us.
//  - rtx-pro-6000: LLMServingSim's vLLM 0.19 bundles of Llama-3.1-8B and
//    Qwen3-32B (examples/vllm/profiles/RTXPRO6000/): 0.723, 0.957, 9.07 us.
//  - rtx-4090: its vLLM 0.19 bundle of Llama-3.1-8B: 0.946, 0.928, 7.89 us.
// kernel_overhead_s = 4 us is an assumption: the AttAcc simulator's measured
// A100 fits for layernorm and GELU have fixed terms of 6.9 and 8.3 us; a
// CUDA launch plus tail is commonly 3-5 us.
constexpr absl::string_view kXpuCommon =
    R"pb(compute_utilization: 0.8 memory_utilization: 0.85
         kernel_overhead_s: 4e-6 dram_energy_pj_per_byte: 28.72
         flop_energy_pj: 0.16 int8_op_energy_pj: 0.08)pb";
constexpr absl::string_view kXpuPresets[][2] = {
    {"a100-40gb",  // [A100]
     R"pb(peak_flops_fp16: 312e12 peak_flops_int8: 624e12 peak_flops_fp8: 0
          memory_bytes: 42949672960 memory_bw_bytes_per_s: 1555e9 tdp_w: 400 idle_power_w: 80 profile_name: "A100"
          active_power_w: 156 flop_energy_pj: 2.2 int8_op_energy_pj: 1.1
          interconnect: "nvlink3" peer_to_peer: true)pb"},
    {"a100-80gb",  // [A100]
     R"pb(peak_flops_fp16: 312e12 peak_flops_int8: 624e12 peak_flops_fp8: 0
          memory_bytes: 85899345920 memory_bw_bytes_per_s: 2039e9 tdp_w: 400 idle_power_w: 80 profile_name: "A100"
          active_power_w: 156 flop_energy_pj: 2.2 int8_op_energy_pj: 1.1
          interconnect: "nvlink3" peer_to_peer: true)pb"},
    {"a100-hbm3",  // [ATTACC]
     R"pb(peak_flops_fp16: 312e12 peak_flops_int8: 624e12 peak_flops_fp8: 0
          memory_bytes: 85899345920 memory_bw_bytes_per_s: 3.35e12 tdp_w: 400 idle_power_w: 80
          active_power_w: 156 flop_energy_pj: 2.2 int8_op_energy_pj: 1.1
          interconnect: "nvlink3" peer_to_peer: true)pb"},
    {"h100-sxm-80gb",  // [H100], GEMM caps [GEMM-MEASURED]
     R"pb(peak_flops_fp16: 989.4e12 peak_flops_int8: 1979e12 peak_flops_fp8: 1979e12
          memory_bytes: 85899345920 memory_bw_bytes_per_s: 3.35e12 tdp_w: 700 idle_power_w: 121.7 profile_name: "H100"
          active_power_w: 282 flop_energy_pj: 1.22 int8_op_energy_pj: 0.61
          roofline { op_class: "gemm" compute_utilization: 0.741 memory_utilization: 0.821 kernel_overhead_s: 3.67e-6 }
          interconnect: "nvlink4" peer_to_peer: true)pb"},
    {"h100-pcie-80gb",  // [H100P]
     R"pb(peak_flops_fp16: 756e12 peak_flops_int8: 1513e12 peak_flops_fp8: 1513e12
          memory_bytes: 85899345920 memory_bw_bytes_per_s: 2.0e12 tdp_w: 350 idle_power_w: 0 profile_name: "H100PCIe"
          interconnect: "pcie5")pb"},
    {"h200-sxm-141gb",  // [H200]
     R"pb(peak_flops_fp16: 989.4e12 peak_flops_int8: 1979e12 peak_flops_fp8: 1979e12
          memory_bytes: 151397597184 memory_bw_bytes_per_s: 4.8e12 tdp_w: 700 idle_power_w: 121.7 profile_name: "H200"
          active_power_w: 282 flop_energy_pj: 1.22 int8_op_energy_pj: 0.61
          interconnect: "nvlink4" peer_to_peer: true)pb"},
    {"b200-180gb",  // [B200]
     R"pb(peak_flops_fp16: 2.25e15 peak_flops_int8: 4.5e15 peak_flops_fp8: 4.5e15
          memory_bytes: 193273528320 memory_bw_bytes_per_s: 8e12 tdp_w: 1000 idle_power_w: 0 profile_name: "B200"
          interconnect: "nvlink5" peer_to_peer: true)pb"},
    {"l40s",  // [L40S]
     R"pb(peak_flops_fp16: 362.05e12 peak_flops_int8: 733e12 peak_flops_fp8: 733e12
          memory_bytes: 51539607552 memory_bw_bytes_per_s: 864e9 tdp_w: 350 idle_power_w: 102.1 profile_name: "L40S"
          active_power_w: 121 flop_energy_pj: 1.66 int8_op_energy_pj: 0.83
          interconnect: "pcie4")pb"},
    {"rtx-4090",  // [ADA], GEMM caps [GEMM-MEASURED]
     R"pb(peak_flops_fp16: 165.2e12 peak_flops_int8: 660.6e12 peak_flops_fp8: 330.3e12
          memory_bytes: 25769803776 memory_bw_bytes_per_s: 1008e9 tdp_w: 450 idle_power_w: 0 profile_name: "RTX4090"
          roofline { op_class: "gemm" compute_utilization: 0.946 memory_utilization: 0.928 kernel_overhead_s: 7.89e-6 }
          interconnect: "pcie4" peer_to_peer: false)pb"},
    {"rtx-pro-6000",  // [RTX6K], GEMM caps [GEMM-MEASURED]
     R"pb(peak_flops_fp16: 500e12 peak_flops_int8: 1000e12 peak_flops_fp8: 1000e12
          memory_bytes: 103079215104 memory_bw_bytes_per_s: 1597e9 tdp_w: 600 idle_power_w: 0 profile_name: "RTXPRO6000"
          roofline { op_class: "gemm" compute_utilization: 0.723 memory_utilization: 0.957 kernel_overhead_s: 9.07e-6 }
          interconnect: "pcie5" peer_to_peer: true)pb"},
    {"mi300x",  // [MI300X]
     R"pb(peak_flops_fp16: 1307.4e12 peak_flops_int8: 2614.9e12 peak_flops_fp8: 2614.9e12
          memory_bytes: 206158430208 memory_bw_bytes_per_s: 5.3e12 tdp_w: 750 idle_power_w: 0 profile_name: "MI300X"
          interconnect: "xgmi-mi300x")pb"},
};

// ----------------------------------------------------------------- links ----
// Bandwidth per direction.
//  - NVLink 3 (A100): 600 GB/s total per GPU = 300 GB/s each way; NVLink 4
//    (H100): 900 GB/s = 450 GB/s each way (A100/H100 datasheets).
//    latency_s is the per-step latency of a ring collective, 3 us: with it an
//    8-GPU ring all-reduce of 1.57 MB (GPT-3, batch 64) takes 51 us, against
//    55 us from the AttAcc simulator's fit to measured A100 NVLink data
//    (6.06 us + 0.009 ns/B per peer step). Energy 1.3 pJ/bit = 10.4 pJ/B
//    (the AttAcc simulator's 'comm' figure, from ISSCC'23 NVLink-class IO).
//  - NVLink 5 (B200): 1.8 TB/s total per GPU = 900 GB/s each way (DGX/HGX
//    B200 datasheets); latency and energy as NVLink 4 (assumptions).
//  - MI300X Infinity Fabric (xGMI): 7 links of 64 GB/s each way to the other
//    seven OAMs of a platform, 896 GB/s aggregate bidirectional peer
//    bandwidth (AMD Instinct MI300X datasheet): 448 GB/s each way, the
//    aggregate a TP=8 ring uses (a TP=2 pair shares one link: set 64e9);
//    latency and energy as NVLink (assumptions).
//  - PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 = 31.5 GB/s; PCIe 5.0 x16:
//    63 GB/s (PCI-SIG base specs). 5 us latency and 40 pJ/B (5 pJ/bit SerDes
//    plus protocol) are assumptions.
//  - Ethernet 100G / 400G: 12.5 / 50 GB/s line rate; 10 us latency (NIC,
//    switch and stack) and 40 pJ/B are assumptions.
//  [NIC] One NIC per GPU, as DGX H100/H200 (8 x ConnectX-7, 400 Gb/s
//    InfiniBand NDR or Ethernet, one per GPU: the DGX H100/H200 user guide)
//    and HGX B200 (8 x ConnectX-7 400G; ConnectX-8 800G on B300) wire them:
//    InfiniBand NDR 400 Gb/s = 50 GB/s each way, XDR 800 Gb/s = 100 GB/s
//    (NVIDIA Quantum-2 / Quantum-X800 datasheets); RoCE 400G the same 50
//    GB/s. latency_s is a ring step's network latency over a switch: 5 us
//    (InfiniBand) and 8 us (RoCE) are assumptions of the order of NCCL's
//    own tuning model (src/graph/tuning.cc, hwLat: a ring step over the
//    network 0.9-6.6 us by protocol, over NVLink 0.4-5.7 us) plus a switch
//    hop; 40 pJ/B as Ethernet (assumption).
constexpr absl::string_view kLinkPresets[][2] = {
    {"nvlink3",
     R"pb(bandwidth_bytes_per_s: 300e9 latency_s: 3e-6 energy_pj_per_byte: 10.4)pb"},
    {"nvlink4",
     R"pb(bandwidth_bytes_per_s: 450e9 latency_s: 3e-6 energy_pj_per_byte: 10.4)pb"},
    {"nvlink5",
     R"pb(bandwidth_bytes_per_s: 900e9 latency_s: 3e-6 energy_pj_per_byte: 10.4)pb"},
    {"xgmi-mi300x",
     R"pb(bandwidth_bytes_per_s: 448e9 latency_s: 3e-6 energy_pj_per_byte: 10.4)pb"},
    {"pcie4",
     R"pb(bandwidth_bytes_per_s: 31.5e9 latency_s: 5e-6 energy_pj_per_byte: 40)pb"},
    {"pcie5",
     R"pb(bandwidth_bytes_per_s: 63e9 latency_s: 5e-6 energy_pj_per_byte: 40)pb"},
    {"ethernet-100g",
     R"pb(bandwidth_bytes_per_s: 12.5e9 latency_s: 10e-6 energy_pj_per_byte: 40)pb"},
    {"ethernet-400g",
     R"pb(bandwidth_bytes_per_s: 50e9 latency_s: 10e-6 energy_pj_per_byte: 40)pb"},
    {"infiniband-ndr",  // [NIC]
     R"pb(bandwidth_bytes_per_s: 50e9 latency_s: 5e-6 energy_pj_per_byte: 40)pb"},
    {"infiniband-xdr",  // [NIC]
     R"pb(bandwidth_bytes_per_s: 100e9 latency_s: 5e-6 energy_pj_per_byte: 40)pb"},
    {"roce-400g",  // [NIC]
     R"pb(bandwidth_bytes_per_s: 50e9 latency_s: 8e-6 energy_pj_per_byte: 40)pb"},
    {"infiniband-hdr",  // [NIC]
     R"pb(bandwidth_bytes_per_s: 25e9 latency_s: 5e-6 energy_pj_per_byte: 40)pb"},
};

// ----------------------------------------------------------------- nodes ----
// Eight GPUs on one NVLink domain (the xPU preset's own link) and one NIC
// per GPU, as the vendors' datasheets give them:
//  - DGX A100: 8 x A100 80GB (NVLink 3 through NVSwitch), 8 single-port
//    ConnectX-6 VPI for the compute fabric, 200 Gb/s HDR InfiniBand.
//  - DGX H100 / DGX H200: 8 x H100 80GB / H200 141GB (NVLink 4, 900 GB/s
//    per GPU), 8 x ConnectX-7 at 400 Gb/s (NDR InfiniBand or Ethernet).
//  - HGX B200 (DGX B200): 8 x B200 (NVLink 5, 1.8 TB/s per GPU), 8 x
//    ConnectX-7 400 Gb/s compute ports.
// An Ethernet fabric: set cluster.internode { preset: "roce-400g" }.
// Host memory: 2 TB on each (the DGX A100 80GB, DGX H100, DGX H200 and
// DGX B200 datasheets; 32 x 64 GiB DIMMs, 2 TiB; the DGX B200 takes up to
// 4 TB as an option).
constexpr absl::string_view kNodePresets[][2] = {
    {"dgx-a100",
     R"pb(xpu: "a100-80gb" xpus: 8 nic: "infiniband-hdr" host_memory_bytes: 2199023255552)pb"},
    {"dgx-h100",
     R"pb(xpu: "h100-sxm-80gb" xpus: 8 nic: "infiniband-ndr" host_memory_bytes: 2199023255552)pb"},
    {"dgx-h200",
     R"pb(xpu: "h200-sxm-141gb" xpus: 8 nic: "infiniband-ndr" host_memory_bytes: 2199023255552)pb"},
    {"hgx-b200",
     R"pb(xpu: "b200-180gb" xpus: 8 nic: "infiniband-ndr" host_memory_bytes: 2199023255552)pb"},
};

template <typename Msg, size_t N>
std::map<std::string, Msg> ParseTable(const absl::string_view (&table)[N][2],
                                      absl::string_view common) {
  std::map<std::string, Msg> out;
  for (const auto& [name, text] : table) {
    // The common fields first, then the entry's, each parsed strictly (a
    // field written twice in one of them is a bug), so that an entry may
    // override a common figure (a measured cap, say).
    Msg msg, own;
    ParseBuiltInPreset(Msg::descriptor()->name(), name, std::string(common), &msg);
    ParseBuiltInPreset(Msg::descriptor()->name(), name, std::string(text), &own);
    msg.MergeFrom(own);
    out.emplace(std::string(name), std::move(msg));
  }
  return out;
}

const std::map<std::string, servesim::v1::ModelSpec>& Models() {
  static const auto* m =
      new auto(ParseTable<servesim::v1::ModelSpec>(kModelPresets, ""));
  return *m;
}
const std::map<std::string, servesim::v1::XpuSpec>& Xpus() {
  static const auto* m =
      new auto(ParseTable<servesim::v1::XpuSpec>(kXpuPresets, kXpuCommon));
  return *m;
}
const std::map<std::string, servesim::v1::LinkSpec>& Links() {
  static const auto* m =
      new auto(ParseTable<servesim::v1::LinkSpec>(kLinkPresets, ""));
  return *m;
}

const std::map<std::string, servesim::v1::NodeSpec>& Nodes() {
  static const auto* m = new auto(ParseTable<servesim::v1::NodeSpec>(kNodePresets, ""));
  return *m;
}

template <typename Msg>
absl::StatusOr<Msg> Find(const std::map<std::string, Msg>& table,
                         absl::string_view name, absl::string_view what) {
  auto it = table.find(std::string(name));
  if (it == table.end()) {
    std::vector<std::string> names;
    for (const auto& [n, unused] : table) names.push_back(n);
    return absl::NotFoundError(absl::StrCat("unknown ", what, " preset \"",
                                            name, "\"; known: ",
                                            absl::StrJoin(names, ", ")));
  }
  return it->second;
}

template <typename Msg>
std::vector<std::string> Names(const std::map<std::string, Msg>& table) {
  std::vector<std::string> names;
  for (const auto& [n, unused] : table) names.push_back(n);
  return names;
}

}  // namespace

absl::StatusOr<servesim::v1::ModelSpec> ModelPreset(absl::string_view name) {
  return Find(Models(), name, "model");
}
absl::StatusOr<servesim::v1::XpuSpec> XpuPreset(absl::string_view name) {
  return Find(Xpus(), name, "xpu");
}
absl::StatusOr<servesim::v1::LinkSpec> LinkPreset(absl::string_view name) {
  return Find(Links(), name, "link");
}
absl::StatusOr<servesim::v1::NodeSpec> NodePreset(absl::string_view name) {
  return Find(Nodes(), name, "node");
}
std::vector<std::string> ModelPresetNames() { return Names(Models()); }
std::vector<std::string> XpuPresetNames() { return Names(Xpus()); }
std::vector<std::string> LinkPresetNames() { return Names(Links()); }
std::vector<std::string> NodePresetNames() { return Names(Nodes()); }

void ParseBuiltInPreset(absl::string_view kind, absl::string_view name,
                        const std::string& text, Message* out) {
  const google::protobuf::FieldDescriptor* preset = out->GetDescriptor()->FindFieldByName("preset");
  if (!google::protobuf::TextFormat::ParseFromString(text, out) || preset == nullptr ||
      preset->type() != google::protobuf::FieldDescriptor::TYPE_STRING) {
    std::fprintf(stderr, "servesim: bad built-in %s preset '%s'\n", std::string(kind).c_str(),
                 std::string(name).c_str());
    std::abort();
  }
  out->GetReflection()->SetString(out, preset, std::string(name));
}

absl::Status RequireResolved(const Message& spec, absl::string_view device,
                             absl::string_view preset_fn) {
  const auto* desc = spec.GetDescriptor();
  const auto* refl = spec.GetReflection();
  for (int i = 0; i < desc->field_count(); ++i) {
    const auto* f = desc->field(i);
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE && f->has_presence() &&
        !refl->HasField(spec, f)) {
      return absl::InvalidArgumentError(
          absl::StrCat(device, " device: ", f->name(),
                       " is not set; expected a resolved spec (every field set, e.g. from ",
                       preset_fn, ")"));
    }
  }
  return absl::OkStatus();
}

void FillUnset(const Message& source, Message* target) {
  const Reflection* src = source.GetReflection();
  const Reflection* dst = target->GetReflection();
  std::vector<const FieldDescriptor*> fields;
  src->ListFields(source, &fields);  // only fields `source` sets
  for (const FieldDescriptor* f : fields) {
    if (f->is_repeated()) {
      if (dst->FieldSize(*target, f) == 0) {
        for (int i = 0; i < src->FieldSize(source, f); ++i) {
          switch (f->cpp_type()) {
            case FieldDescriptor::CPPTYPE_MESSAGE:
              dst->AddMessage(target, f)->CopyFrom(
                  src->GetRepeatedMessage(source, f, i));
              break;
            default:
              break;  // no repeated scalars in presets
          }
        }
      }
      continue;
    }
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      FillUnset(src->GetMessage(source, f), dst->MutableMessage(target, f));
      continue;
    }
    if (dst->HasField(*target, f)) continue;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        dst->SetInt32(target, f, src->GetInt32(source, f));
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        dst->SetInt64(target, f, src->GetInt64(source, f));
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        dst->SetUInt32(target, f, src->GetUInt32(source, f));
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        dst->SetUInt64(target, f, src->GetUInt64(source, f));
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        dst->SetDouble(target, f, src->GetDouble(source, f));
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        dst->SetFloat(target, f, src->GetFloat(source, f));
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        dst->SetBool(target, f, src->GetBool(source, f));
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        dst->SetEnumValue(target, f, src->GetEnumValue(source, f));
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        dst->SetString(target, f, src->GetString(source, f));
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        break;
    }
  }
}

}  // namespace servesim::devices
