// What a trace says about a prompt's content: enough to tell which of its
// leading KV blocks other prompts share, for prefix caching
// (scheduler/prefix_cache.h). A trace can say it three ways:
//  - a group (CSV prefix_group, prefix_tokens): the first group_tokens
//    tokens are the group's, so two requests of a group share
//    min(their group_tokens) tokens; with a prompt (CSV prompt_id) the rest
//    is the prompt's, so requests of one prompt share all of it (a client
//    that sends its prompts again: inference-perf's shared-prefix data);
//  - unit ids (Mooncake hash_ids): one id per unit of unit_tokens tokens
//    (512 in the Mooncake traces); equal ids at equal positions, after equal
//    ids before them, mean equal content;
//  - token ids (the token-id JSONL format): unit_tokens = 1.
// PromptBlockHashes turns any of them into one hash per full KV block,
// chained (block b's hash covers blocks 0..b), as vLLM hashes blocks.
#ifndef SERVESIM_WORKLOAD_PREFIX_H_
#define SERVESIM_WORKLOAD_PREFIX_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace servesim::workload {

struct PromptContent {
  enum class Kind : uint8_t { kNone, kGroup, kUnits };
  Kind kind = Kind::kNone;
  // kGroup.
  uint64_t group = 0;
  int64_t group_tokens = 0;
  // kGroup: the prompt past the group's tokens, when the trace names it
  // (has_prompt); otherwise the request's own.
  bool has_prompt = false;
  uint64_t prompt = 0;
  // kUnits: ids in prompt order, each covering unit_tokens tokens.
  std::vector<uint64_t> ids;
  int64_t unit_tokens = 0;
};

// 64-bit mix (splitmix64's finaliser): deterministic on every host.
uint64_t Mix64(uint64_t x);
// A string's 64-bit key (FNV-1a 64, then mixed), for group names.
uint64_t KeyOf(const char* data, size_t size);

// Chained hashes of the prompt's full blocks of `block_tokens` tokens
// (floor(input_tokens / block_tokens) of them). Blocks the content does not
// describe (beyond a group's tokens, past the last id) hash from the
// prompt's key when it has one, else from `request_key`, so only the
// request itself (re-prefilling after a preemption) can find them. Empty
// for Kind::kNone.
std::vector<uint64_t> PromptBlockHashes(const PromptContent& content, int64_t input_tokens,
                                        int64_t block_tokens, uint64_t request_key);

}  // namespace servesim::workload

#endif  // SERVESIM_WORKLOAD_PREFIX_H_
