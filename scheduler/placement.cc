#include "scheduler/placement.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <limits>

namespace servesim::scheduler {
namespace {

uint64_t NextGeneration() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

StackPlacement::StackPlacement(int stacks, int64_t capacity_tokens, int kv_heads)
    : capacity_(capacity_tokens),
      generation_(NextGeneration()),
      kv_heads_(kv_heads),
      reserved_(stacks, 0) {}

void StackPlacement::Bump() { generation_ = NextGeneration(); }

bool StackPlacement::Place(int32_t slot, int64_t tokens) {
  Bump();
  if (static_cast<size_t>(slot) >= stacks_of_.size()) {
    stacks_of_.resize(slot + 1);
    tokens_of_.resize(slot + 1, 0);
  }
  std::vector<int32_t>& mine = stacks_of_[slot];
  mine.clear();
  if (tokens <= 0) {
    if (!PlaceByHeap(tokens, &mine)) return false;
  } else if (!PlaceByLevels(tokens, &mine)) {
    return false;
  }
  tokens_of_[slot] = tokens;
  return true;
}

// The greedy rule: each head in turn to the least reserved stack with room,
// ties to the lowest index. With a min-heap of (reserved, index) over the
// stacks with room, in O(heads log stacks); a stack that loses its room
// leaves the heap (reservations only grow here).
bool StackPlacement::PlaceByHeap(int64_t tokens, std::vector<int32_t>* mine) {
  heap_.clear();
  for (int s = 0; s < stacks(); ++s) {
    if (reserved_[s] + tokens <= capacity_) heap_.emplace_back(reserved_[s], s);
  }
  std::make_heap(heap_.begin(), heap_.end(), std::greater<>());
  for (int h = 0; h < kv_heads_; ++h) {
    if (heap_.empty()) {  // undo this request's heads
      for (int32_t s : *mine) reserved_[s] -= tokens;
      mine->clear();
      return false;
    }
    std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
    const int best = heap_.back().second;
    reserved_[best] += tokens;
    mine->push_back(best);
    if (reserved_[best] + tokens <= capacity_) {
      heap_.back().first = reserved_[best];
      std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
    } else {
      heap_.pop_back();
    }
  }
  return true;
}

// The same picks without a heap. Every head of the request adds the same
// `tokens` (t > 0), so stack s offers the values r_s, r_s + t, r_s + 2t, ...
// (while they leave room for t more), and the greedy takes the smallest
// (value, index) of all offers, one after another: the first kv_heads of
// them in sorted order. Writing r_s = q_s t + m_s (0 <= m_s < t), an offer's
// value is (q_s + k) t + m_s, so they sort by level L = q_s + k, then by
// (m_s, s). The stacks are sorted once by (m_s, s) and the levels walked
// upwards, each taking every stack that offers at that level; a level
// where none does is skipped to the next stack's q_s.
bool StackPlacement::PlaceByLevels(int64_t tokens, std::vector<int32_t>* mine) {
  // (m_s, s, q_s, heads it can still take) of the stacks with room.
  order_.clear();
  int64_t room = 0;
  for (int s = 0; s < stacks(); ++s) {
    if (reserved_[s] + tokens > capacity_) continue;
    const int64_t heads = (capacity_ - reserved_[s]) / tokens;
    order_.push_back({reserved_[s] % tokens, s, reserved_[s] / tokens, heads});
    room += heads;
  }
  if (room < kv_heads_) return false;  // nothing reserved yet
  std::sort(order_.begin(), order_.end(), [](const Offer& a, const Offer& b) {
    return a.m != b.m ? a.m < b.m : a.stack < b.stack;
  });
  int64_t level = std::numeric_limits<int64_t>::max();
  for (const Offer& o : order_) level = std::min(level, o.q);
  int64_t left = kv_heads_;
  while (left > 0) {
    int64_t next = std::numeric_limits<int64_t>::max();  // the next level offered
    for (const Offer& o : order_) {
      if (o.q > level) {
        next = std::min(next, o.q);
        continue;
      }
      if (level - o.q >= o.heads) continue;  // its room is used up
      mine->push_back(o.stack);
      reserved_[o.stack] += tokens;
      if (--left == 0) break;
      if (level - o.q + 1 < o.heads) next = std::min(next, level + 1);
    }
    level = next;  // room >= kv_heads: some stack still offers
  }
  return true;
}

void StackPlacement::Release(int32_t slot) {
  if (static_cast<size_t>(slot) >= stacks_of_.size()) return;
  Bump();
  for (int32_t s : stacks_of_[slot]) reserved_[s] -= tokens_of_[slot];
  stacks_of_[slot].clear();
  tokens_of_[slot] = 0;
}

absl::Span<const int32_t> StackPlacement::StacksOf(int32_t slot) const {
  return stacks_of_[slot];
}

}  // namespace servesim::scheduler
