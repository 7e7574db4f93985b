// Sets of KV block hashes in least-recently-used order: the order itself
// (HashLru), and with a capacity (BlockLru): a lower KV tier of one
// replica (scheduler/prefix_cache.h), or a cluster-wide store that a
// pool's replicas share (Mooncake Store; LMCache's remote backend;
// docs/kv_tiers.md, "Cluster store"), where a block any replica stores,
// any replica of the pool can load.
//
// Contract: plain code, deterministic, not thread-safe. Replicas that
// share a store must call it in simulated-time order (their engines then
// step through SimGrid, none ahead of the others).
#ifndef SERVESIM_SCHEDULER_KV_STORE_H_
#define SERVESIM_SCHEDULER_KV_STORE_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace servesim::scheduler {

// A doubly linked list of hashes, least recently used first, in a slab of
// nodes named by index: no allocation per node once the slab has grown,
// and a node's index stays valid until it is erased.
class HashLru {
 public:
  // Appends `hash` as the most recently used; returns its node.
  int32_t PushBack(uint64_t hash) {
    int32_t i;
    if (!free_.empty()) {
      i = free_.back();
      free_.pop_back();
    } else {
      i = static_cast<int32_t>(nodes_.size());
      nodes_.push_back({});
    }
    nodes_[static_cast<size_t>(i)] = {hash, tail_, -1};
    Link(i);
    ++size_;
    return i;
  }
  void Erase(int32_t i) {
    Unlink(i);
    free_.push_back(i);
    --size_;
  }
  void MoveToBack(int32_t i) {
    if (i == tail_) return;
    Unlink(i);
    nodes_[static_cast<size_t>(i)].prev = tail_;
    nodes_[static_cast<size_t>(i)].next = -1;
    Link(i);
  }
  // The least recently used node (size() > 0).
  int32_t front() const { return head_; }
  // The node after i, towards the most recent (-1: i is the last).
  int32_t next(int32_t i) const { return nodes_[static_cast<size_t>(i)].next; }
  uint64_t hash(int32_t i) const { return nodes_[static_cast<size_t>(i)].hash; }
  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  struct Node {
    uint64_t hash = 0;
    int32_t prev = -1, next = -1;
  };
  // Links node i (its prev already tail_) at the back.
  void Link(int32_t i) {
    if (tail_ >= 0) {
      nodes_[static_cast<size_t>(tail_)].next = i;
    } else {
      head_ = i;
    }
    tail_ = i;
  }
  void Unlink(int32_t i) {
    const Node& n = nodes_[static_cast<size_t>(i)];
    (n.prev >= 0 ? nodes_[static_cast<size_t>(n.prev)].next : head_) = n.next;
    (n.next >= 0 ? nodes_[static_cast<size_t>(n.next)].prev : tail_) = n.prev;
  }
  std::vector<Node> nodes_;
  std::vector<int32_t> free_;
  int32_t head_ = -1, tail_ = -1;
  int64_t size_ = 0;
};

class BlockLru {
 public:
  explicit BlockLru(int64_t capacity_blocks) : capacity_(capacity_blocks) {}

  bool Contains(uint64_t hash) const { return where_.contains(hash); }

  // Makes `hash` the most recently used block: inserted (true), or
  // refreshed if it was there (false). A full set first lets its least
  // recently used block go, into *evicted (and *has_evicted = true).
  // `home`: where an inserted block lives (a cluster store's: the replica
  // whose node's DRAM holds it); a refreshed block keeps its own.
  bool Put(uint64_t hash, uint64_t* evicted, bool* has_evicted, int32_t home = 0) {
    *has_evicted = false;
    if (auto it = where_.find(hash); it != where_.end()) {
      lru_.MoveToBack(it->second);
      return false;
    }
    if (capacity_ <= 0) return false;
    if (lru_.size() >= capacity_) {
      const int32_t victim = lru_.front();
      *evicted = lru_.hash(victim);
      *has_evicted = true;
      lru_.Erase(victim);
      where_.erase(*evicted);
    }
    const int32_t node = lru_.PushBack(hash);
    if (static_cast<size_t>(node) >= home_.size()) home_.resize(static_cast<size_t>(node) + 1);
    home_[static_cast<size_t>(node)] = home;
    where_.emplace(hash, node);
    return true;
  }
  // A block read: now the most recently used. `hash` must be there.
  void Touch(uint64_t hash) { lru_.MoveToBack(where_.at(hash)); }
  // Where `hash` lives (Put's `home`). `hash` must be there.
  int32_t home(uint64_t hash) const { return home_[static_cast<size_t>(where_.at(hash))]; }

  int64_t capacity_blocks() const { return capacity_; }
  int64_t blocks() const { return lru_.size(); }

 private:
  int64_t capacity_;
  HashLru lru_;
  absl::flat_hash_map<uint64_t, int32_t> where_;  // hash -> its node in lru_
  std::vector<int32_t> home_;                     // per node of lru_
};

}  // namespace servesim::scheduler

#endif  // SERVESIM_SCHEDULER_KV_STORE_H_
