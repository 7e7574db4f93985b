#include "scheduler/placement.h"

#include <algorithm>
#include <functional>

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
  // The greedy choice with a min-heap of (reserved, index) over the stacks
  // with room: the least reserved, ties to the lowest index, as a scan over
  // every stack per head would pick, in O(heads log stacks). A stack that
  // loses its room leaves the heap (reservations only grow here).
  heap_.clear();
  for (int s = 0; s < stacks(); ++s) {
    if (reserved_[s] + tokens <= capacity_) heap_.emplace_back(reserved_[s], s);
  }
  std::make_heap(heap_.begin(), heap_.end(), std::greater<>());
  for (int h = 0; h < kv_heads_; ++h) {
    if (heap_.empty()) {  // undo this request's heads
      for (int32_t s : mine) reserved_[s] -= tokens;
      mine.clear();
      return false;
    }
    std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
    const int best = heap_.back().second;
    reserved_[best] += tokens;
    mine.push_back(best);
    if (reserved_[best] + tokens <= capacity_) {
      heap_.back().first = reserved_[best];
      std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
    } else {
      heap_.pop_back();
    }
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
