#include "workload/prefix.h"

#include <algorithm>

namespace servesim::workload {

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t KeyOf(const char* data, size_t size) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < size; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 0x100000001b3ULL;
  }
  return Mix64(h);
}

std::vector<uint64_t> PromptBlockHashes(const PromptContent& c, int64_t input_tokens,
                                        int64_t block_tokens, uint64_t request_key) {
  std::vector<uint64_t> out;
  if (c.kind == PromptContent::Kind::kNone || block_tokens < 1) return out;
  const int64_t blocks = input_tokens / block_tokens;
  out.reserve(static_cast<size_t>(blocks));
  // Tokens the content describes: a group's prefix, or every unit's.
  const int64_t described =
      c.kind == PromptContent::Kind::kGroup
          ? std::min(c.group_tokens, input_tokens)
          : std::min<int64_t>(input_tokens, static_cast<int64_t>(c.ids.size()) * c.unit_tokens);
  const uint64_t salt = c.kind == PromptContent::Kind::kGroup && c.has_prompt
                            ? Mix64(c.prompt ^ 0x3c6ef372fe94f82bULL)
                            : Mix64(request_key ^ 0x5a17ULL);
  uint64_t prev = 0x2545f4914f6cdd1dULL;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * block_tokens, end = begin + block_tokens;
    uint64_t h;
    if (end > described) {
      // Beyond what the trace says: this request's own.
      h = Mix64(salt ^ Mix64(static_cast<uint64_t>(b)));
    } else if (c.kind == PromptContent::Kind::kGroup) {
      h = Mix64(c.group ^ Mix64(static_cast<uint64_t>(b) + 1));
    } else {
      // Every unit the block overlaps, with the overlap's offsets, so that
      // blocks inside one large unit (Mooncake's 512 tokens) differ.
      h = 0x84222325cbf29ce4ULL;
      for (int64_t u = begin / c.unit_tokens; u * c.unit_tokens < end; ++u) {
        const int64_t from = std::max(begin, u * c.unit_tokens) - u * c.unit_tokens;
        h = Mix64(h ^ c.ids[static_cast<size_t>(u)]);
        h = Mix64(h ^ static_cast<uint64_t>(from));
      }
    }
    prev = Mix64(prev ^ h);
    out.push_back(prev);
  }
  return out;
}

}  // namespace servesim::workload
