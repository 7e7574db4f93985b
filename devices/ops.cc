#include "devices/ops.h"

#include <atomic>

namespace servesim::devices {

std::string_view StageName(Stage stage) {
  switch (stage) {
    case Stage::kEmbedding: return "embedding";
    case Stage::kNorm: return "norm";
    case Stage::kQkv: return "qkv";
    case Stage::kAttention: return "attention";
    case Stage::kProjection: return "projection";
    case Stage::kFf1: return "ff1";
    case Stage::kActivation: return "activation";
    case Stage::kFf2: return "ff2";
    case Stage::kResidual: return "residual";
    case Stage::kAllReduce: return "allreduce";
    case Stage::kLmHead: return "lm_head";
    case Stage::kFinalNorm: return "final_norm";
    case Stage::kMoe: return "moe";
    case Stage::kMoeDispatch: return "moe_dispatch";
    case Stage::kCount: break;
  }
  return "unknown";
}

uint64_t NewStackListId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace servesim::devices
