// Head-wise placement of KV heads on memory stacks (AttAcc §4.2): every KV
// head of a request lives on one stack, for all layers, so the stack can run
// that head's attention on its own. Heads of a newly admitted request are
// placed greedily, each on the stack with the least reserved KV (ties: the
// lowest index), among stacks with room for the head's whole KV (prompt +
// answer tokens). The reservation is freed when the request finishes or is
// preempted.
#ifndef SERVESIM_SCHEDULER_PLACEMENT_H_
#define SERVESIM_SCHEDULER_PLACEMENT_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"

namespace servesim::scheduler {

class StackPlacement {
 public:
  // `capacity_tokens`: KV positions of ONE head (all layers) a stack holds.
  StackPlacement(int stacks, int64_t capacity_tokens, int kv_heads);

  // Places every KV head of `slot`, reserving `tokens` positions each.
  // False, placing nothing, if some head finds no stack with room.
  bool Place(int32_t slot, int64_t tokens);
  void Release(int32_t slot);
  // Stack of each KV head of `slot` (valid while it stays placed).
  absl::Span<const int32_t> StacksOf(int32_t slot) const;
  // Changes with every Place and Release call and is never the same for two
  // placements in one process (nor 0): while it holds, StacksOf(slot) stays
  // the same for every slot.
  uint64_t generation() const { return generation_; }

  int stacks() const { return static_cast<int>(reserved_.size()); }
  int kv_heads() const { return kv_heads_; }
  int64_t capacity_tokens() const { return capacity_; }
  int64_t reserved(int stack) const { return reserved_[stack]; }
  // Largest reservation any single head may ever get.
  bool CouldEverFit(int64_t tokens) const { return tokens <= capacity_; }

 private:
  int64_t capacity_;
  uint64_t generation_;
  int kv_heads_;
  std::vector<int64_t> reserved_;
  std::vector<std::vector<int32_t>> stacks_of_;  // by slot
  std::vector<int64_t> tokens_of_;               // by slot
  void Bump();                                   // a new generation_
  bool PlaceByHeap(int64_t tokens, std::vector<int32_t>* mine);
  bool PlaceByLevels(int64_t tokens, std::vector<int32_t>* mine);
  struct Offer {
    int64_t m;  // reserved % tokens
    int stack;
    int64_t q;      // reserved / tokens
    int64_t heads;  // it has room for
  };
  std::vector<std::pair<int64_t, int>> heap_;  // PlaceByHeap's scratch
  std::vector<Offer> order_;                   // PlaceByLevels' scratch
};

}  // namespace servesim::scheduler

#endif  // SERVESIM_SCHEDULER_PLACEMENT_H_
