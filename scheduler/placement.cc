#include "scheduler/placement.h"

namespace servesim::scheduler {

StackPlacement::StackPlacement(int stacks, int64_t capacity_tokens, int kv_heads)
    : capacity_(capacity_tokens), kv_heads_(kv_heads), reserved_(stacks, 0) {}

bool StackPlacement::Place(int32_t slot, int64_t tokens) {
  if (static_cast<size_t>(slot) >= stacks_of_.size()) {
    stacks_of_.resize(slot + 1);
    tokens_of_.resize(slot + 1, 0);
  }
  std::vector<int32_t>& mine = stacks_of_[slot];
  mine.clear();
  for (int h = 0; h < kv_heads_; ++h) {
    int best = -1;
    for (int s = 0; s < stacks(); ++s) {
      if (reserved_[s] + tokens > capacity_) continue;
      if (best < 0 || reserved_[s] < reserved_[best]) best = s;
    }
    if (best < 0) {  // undo this request's heads
      for (int32_t s : mine) reserved_[s] -= tokens;
      mine.clear();
      return false;
    }
    reserved_[best] += tokens;
    mine.push_back(best);
  }
  tokens_of_[slot] = tokens;
  return true;
}

void StackPlacement::Release(int32_t slot) {
  if (static_cast<size_t>(slot) >= stacks_of_.size()) return;
  for (int32_t s : stacks_of_[slot]) reserved_[s] -= tokens_of_[slot];
  stacks_of_[slot].clear();
  tokens_of_[slot] = 0;
}

absl::Span<const int32_t> StackPlacement::StacksOf(int32_t slot) const {
  return stacks_of_[slot];
}

}  // namespace servesim::scheduler
