// RemoteDevice's memo of the agent's answers: an op's key is its interned
// shape and its interned sequence and stack lists (KeysLocked); expected
// ops' further steps are kept as runs, keyed by the op's list relative to
// its first sequence (RunKeysLocked, FindRunLocked); answers go in by
// InsertStepsLocked (a prediction's steps) and InsertExpectedLocked (the
// expected ops, by blocks); TrimLocked empties it all past memo_bytes. Every
// member here runs with mu_ held and calls no agent. Also the helpers
// for ops that own their lists (agents/remote_device_internal.h).
#include <algorithm>
#include <cstring>
#include <deque>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/casts.h"
#include "agents/convert.h"
#include "agents/remote_device.h"
#include "agents/remote_device_internal.h"

namespace servesim::agents {

using devices::Cost;
using devices::Op;

namespace {

template <typename T>
void AppendRaw(std::string* key, const T& v) {
  key->append(reinterpret_cast<const char*>(&v), sizeof v);
}

// A sequence list's content, for interning.
void SeqListBytes(absl::Span<const devices::AttentionSeq> seqs, std::string* out) {
  out->clear();
  out->push_back('s');
  for (const devices::AttentionSeq& q : seqs) {
    AppendRaw(out, q.new_tokens);
    AppendRaw(out, q.past_tokens);
    AppendRaw(out, q.request_id);
  }
}

// The lists one call has seen: (address, length, id). The ops of a call
// share lists (head groups), so each is filled in and looked up once.
using SeenLists = std::vector<std::tuple<const void*, size_t, uint32_t>>;
// The id of the list at (data, n): 0 if empty, else the one `seen` holds,
// else `lookup()` after `fill()` (which writes its content).
template <typename Fill, typename Lookup>
uint32_t CallListId(SeenLists* seen, const void* data, size_t n, Fill&& fill, Lookup&& lookup) {
  if (n == 0) return 0;
  for (const auto& [p, size, id] : *seen) {
    if (p == data && size == n) return id;
  }
  fill();
  const uint32_t id = lookup();
  seen->emplace_back(data, n, id);
  return id;
}

void StackListBytes(absl::Span<const int32_t> stacks, std::string* out) {
  out->assign(1, 'k');
  out->append(reinterpret_cast<const char*>(stacks.data()), stacks.size() * sizeof(int32_t));
}

}  // namespace

namespace internal {

// `ops` with their sequence and stack lists copied into `seqs` and
// `stacks` (lists shared in `ops` stay shared).
void CopyOwned(absl::Span<const Op> ops, std::vector<Op>* out,
               std::deque<std::vector<devices::AttentionSeq>>* seqs,
               std::deque<std::vector<int32_t>>* stacks) {
  // (list address, length) -> index of its copy.
  std::vector<std::tuple<const void*, size_t, size_t>> seen_seqs, seen_stacks;
  for (const Op& op : ops) {
    Op o = op;
    if (!op.seqs.empty()) {
      auto it = std::find_if(seen_seqs.begin(), seen_seqs.end(), [&](const auto& e) {
        return std::get<0>(e) == op.seqs.data() && std::get<1>(e) == op.seqs.size();
      });
      if (it == seen_seqs.end()) {
        seqs->emplace_back(op.seqs.begin(), op.seqs.end());
        seen_seqs.emplace_back(op.seqs.data(), op.seqs.size(), seqs->size() - 1);
        it = seen_seqs.end() - 1;
      }
      o.seqs = (*seqs)[std::get<2>(*it)];
    }
    if (!op.kv_head_stack.empty()) {
      auto it = std::find_if(seen_stacks.begin(), seen_stacks.end(), [&](const auto& e) {
        return std::get<0>(e) == op.kv_head_stack.data() &&
               std::get<1>(e) == op.kv_head_stack.size();
      });
      if (it == seen_stacks.end()) {
        stacks->emplace_back(op.kv_head_stack.begin(), op.kv_head_stack.end());
        seen_stacks.emplace_back(op.kv_head_stack.data(), op.kv_head_stack.size(),
                                 stacks->size() - 1);
        it = seen_stacks.end() - 1;
      }
      o.kv_head_stack = (*stacks)[std::get<2>(*it)];
    }
    out->push_back(o);
  }
}

// The costs an answer to the first `answered` of `ops` holds (by blocks,
// with their steps).
size_t ExpectedCosts(absl::Span<const Op> ops, absl::Span<const int32_t> steps, size_t answered) {
  size_t n = 0;
  ForEachExpectedBlock(answered, steps.first(std::min(steps.size(), answered)),
                       [&](size_t b, size_t e, int32_t k) {
                         size_t predictable = 0;
                         for (size_t i = b; i < e; ++i) predictable += Predictable(ops[i]) ? 1 : 0;
                         n += (e - b) + static_cast<size_t>(k) * predictable;
                       });
  return n;
}

size_t OwnedBytes(const std::deque<std::vector<devices::AttentionSeq>>& seqs,
                  const std::deque<std::vector<int32_t>>& stacks, size_t ops) {
  size_t n = ops * sizeof(Op);
  for (const auto& v : seqs) n += v.size() * sizeof(devices::AttentionSeq) + 32;
  for (const auto& v : stacks) n += v.size() * sizeof(int32_t) + 32;
  return n;
}

}  // namespace internal

uint32_t RemoteDevice::InternLocked(const std::string& content) const {
  auto [it, added] = lists_.try_emplace(content, static_cast<uint32_t>(lists_.size() + 1));
  if (added) memo_bytes_ += content.size() + 64;
  return it->second;
}

uint32_t RemoteDevice::ShapeIdLocked(const Op& op) const {
  ShapeKey sk;
  sk.kind = static_cast<uint8_t>(op.kind);
  sk.stage = static_cast<uint8_t>(op.stage);
  // clang-format off
  sk.ints = {op.m,         op.n,          op.k,        op.heads,    op.kv_heads,
             op.d_head,    op.head_begin, op.head_end, op.elements, op.tokens,
             op.sequences, op.kv_latent,  op.d_rope,   op.d_value,  op.experts_total,
             op.top_k,     op.expert_matrices, op.window};
  // clang-format on
  sk.bits = {absl::bit_cast<uint64_t>(op.bytes_per_element),
             absl::bit_cast<uint64_t>(op.flops_per_element), absl::bit_cast<uint64_t>(op.bytes),
             absl::bit_cast<uint64_t>(op.routed), absl::bit_cast<uint64_t>(op.experts_touched)};
  sk.participants = op.participants;
  // A run asks few shapes, over and over: a slot of recent_shapes_, chosen
  // by a cheap mix of the fields that tell a run's shapes apart, holds the
  // last shape found there, compared whole before the table is hashed.
  uint64_t mix = (static_cast<uint64_t>(sk.kind) << 8 | sk.stage) * 0x9e3779b97f4a7c15ull;
  for (int64_t v : {op.m, op.n, op.k, op.head_begin, op.head_end, op.elements, op.tokens}) {
    mix = (mix ^ static_cast<uint64_t>(v)) * 0xff51afd7ed558ccdull;
  }
  RecentShape& recent = recent_shapes_[(mix >> 32) % recent_shapes_.size()];
  if (recent.id != 0 && recent.epoch == memo_epoch_ && recent.key == sk) return recent.id;
  auto [shape, added] = shapes_.try_emplace(sk, static_cast<uint32_t>(shapes_.size() + 1));
  if (added) memo_bytes_ += sizeof(ShapeKey) + 16;
  recent = RecentShape{sk, shape->second, memo_epoch_};
  return shape->second;
}

void RemoteDevice::RunKeysLocked(absl::Span<const Op> ops, bool add, std::vector<MemoKey>* keys,
                                 std::vector<int64_t>* offsets) const {
  thread_local std::string bytes;
  thread_local SeenLists seen;
  seen.clear();
  keys->assign(ops.size(), MemoKey{});
  offsets->assign(ops.size(), 0);
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (!Predictable(op)) continue;
    const int64_t base = op.seqs.front().past_tokens;
    const uint32_t seqs = CallListId(
        &seen, op.seqs.data(), op.seqs.size(), [] {},
        [&]() -> uint32_t {
          // A decode batch asks the same relative list step after step: one
          // of the last few found is compared with the op's sequences, and
          // only a list not among them is built and hashed.
          const size_t n = op.seqs.size();
          RecentList& recent = recent_lists_[(static_cast<uint64_t>(n) * 0x9e3779b97f4a7c15ull ^
                                              static_cast<uint64_t>(op.seqs.front().request_id)) %
                                             recent_lists_.size()];
          if (recent.id != 0 && recent.epoch == memo_epoch_ &&
              recent.bytes.size() == 1 + n * 2 * sizeof(int64_t)) {
            const char* at = recent.bytes.data() + 1;
            bool same = true;
            for (const devices::AttentionSeq& q : op.seqs) {
              int64_t rel = 0, request = 0;
              std::memcpy(&rel, at, sizeof rel);
              std::memcpy(&request, at + sizeof rel, sizeof request);
              at += 2 * sizeof(int64_t);
              if (rel != q.past_tokens - base || request != q.request_id) {
                same = false;
                break;
              }
            }
            if (same) return recent.id;
          }
          // 'r': relative lists, apart from the exact ones ('s').
          bytes.assign(1, 'r');
          for (const devices::AttentionSeq& q : op.seqs) {
            AppendRaw(&bytes, q.past_tokens - base);
            AppendRaw(&bytes, q.request_id);
          }
          uint32_t id = 0;
          if (add) {
            id = InternLocked(bytes);
          } else if (auto it = lists_.find(bytes); it != lists_.end()) {
            id = it->second;
          }
          if (id != 0) {
            recent.bytes = bytes;
            recent.id = id;
            recent.epoch = memo_epoch_;
          }
          return id;
        });
    const uint32_t stacks = CallListId(
        &seen, op.kv_head_stack.data(), op.kv_head_stack.size(), [] {},
        [&] { return StackListIdLocked(op.kv_head_stack, add); });
    if (seqs == 0 || (!op.kv_head_stack.empty() && stacks == 0)) continue;  // not interned
    MemoKey& k = (*keys)[i];
    k.shape = ShapeIdLocked(op);
    k.seq_list = seqs;
    k.stack_list = stacks;
    (*offsets)[i] = base;
  }
}

const devices::Cost* RemoteDevice::FindRunLocked(const MemoKey& key, int64_t offset) const {
  if (key.shape == 0) return nullptr;
  auto it = runs_.find(key);
  if (it == runs_.end()) return nullptr;
  // The newest first: the run the simulation is in.
  for (uint32_t at = it->second + 1; at != 0;) {
    const Run& r = run_list_[at - 1];
    if (offset >= r.base && offset <= r.base + r.steps) {
      return &cost_pool_[run_steps_[r.first + static_cast<size_t>(offset - r.base)]];
    }
    at = r.older;
  }
  return nullptr;
}

void RemoteDevice::KeysLocked(absl::Span<const Op> ops, std::vector<MemoKey>* keys,
                              bool seqs_only) const {
  thread_local std::string bytes;
  thread_local SeenLists seen;
  seen.clear();
  auto id_of = [&](const void* data, size_t n, auto&& fill) {
    return CallListId(&seen, data, n, fill, [&] { return InternLocked(bytes); });
  };
  if (!seqs_only) keys->resize(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    MemoKey& k = (*keys)[i];
    if (seqs_only) {
      k.seq_list = id_of(op.seqs.data(), op.seqs.size(), [&] { SeqListBytes(op.seqs, &bytes); });
      continue;
    }
    k.shape = ShapeIdLocked(op);
    // A list's length is part of its content, so lists of different lengths
    // at one address are told apart by the content, not the address.
    k.seq_list = id_of(op.seqs.data(), op.seqs.size(), [&] { SeqListBytes(op.seqs, &bytes); });
    k.stack_list = CallListId(
        &seen, op.kv_head_stack.data(), op.kv_head_stack.size(), [] {},
        [&] { return StackListIdLocked(op.kv_head_stack, /*add=*/true); });
  }
}

uint32_t RemoteDevice::StackListIdLocked(absl::Span<const int32_t> stacks, bool add) const {
  // Every op of a run asks one of a few placements: the last found in a
  // slot chosen by the list's length and ends is compared first.
  const uint64_t mix = (static_cast<uint64_t>(stacks.size()) * 0x9e3779b97f4a7c15ull ^
                        static_cast<uint64_t>(static_cast<uint32_t>(stacks.front())) << 32 ^
                        static_cast<uint32_t>(stacks.back())) *
                       0xff51afd7ed558ccdull;
  RecentList& recent = recent_stacks_[(mix >> 32) % recent_stacks_.size()];
  const size_t bytes = stacks.size() * sizeof(int32_t);
  if (recent.id != 0 && recent.epoch == memo_epoch_ && recent.bytes.size() == 1 + bytes &&
      std::memcmp(recent.bytes.data() + 1, stacks.data(), bytes) == 0) {
    return recent.id;
  }
  thread_local std::string content;
  StackListBytes(stacks, &content);
  uint32_t id = 0;
  if (add) {
    id = InternLocked(content);
  } else if (auto it = lists_.find(content); it != lists_.end()) {
    id = it->second;
  }
  if (id != 0) recent = RecentList{content, id, memo_epoch_};
  return id;
}

void RemoteDevice::TrimLocked() const {
  // An entry's share: its slot (a flat map keeps ~1/0.875 slots per entry)
  // and control byte.
  constexpr size_t kEntryBytes = sizeof(std::pair<const MemoKey, MemoEntry>) * 8 / 7 + 1;
  if (memo_bytes_ + memo_.size() * kEntryBytes <= options_.memo_bytes) return;
  // Emptied in place: the tables keep their capacity, so refilling them
  // does not grow and fault their pages in again.
  memo_.erase(memo_.begin(), memo_.end());
  runs_.erase(runs_.begin(), runs_.end());
  run_list_.clear();
  run_steps_.clear();
  cost_pool_.clear();
  lists_.erase(lists_.begin(), lists_.end());
  shapes_.erase(shapes_.begin(), shapes_.end());
  windows_.clear();       // prefetches in flight keep theirs; their answers are dropped
  pending_keys_.clear();  // their ids are void; a duplicate hint costs only its answer
  memo_bytes_ = 0;
  ++memo_epoch_;
}

void RemoteDevice::InsertStepsLocked(uint64_t id, const Window& window, int from, int steps,
                                     absl::Span<const Cost> costs, size_t at) const {
  thread_local std::vector<Op> step;
  thread_local std::deque<std::vector<devices::AttentionSeq>> shifted;
  thread_local std::vector<MemoKey> step_keys;
  for (int j = from; j < from + steps; ++j) {
    LookaheadStep(window.ops, j, &step, &shifted);
    // The steps differ only in their sequence lists.
    KeysLocked(step, &step_keys, /*seqs_only=*/j > from);
    for (size_t i = 0; i < step.size(); ++i) {
      memo_.emplace(step_keys[i], MemoEntry{costs[at++], j, id});
    }
    stats_.predicted_ops += static_cast<int64_t>(step.size());
  }
}

void RemoteDevice::InsertExpectedLocked(const OwnedOps& expected, int answered,
                                        absl::Span<const Cost> unique,
                                        absl::Span<const uint32_t> index, size_t at) const {
  thread_local std::vector<MemoKey> fresh, run_keys;
  thread_local std::vector<int64_t> offsets;
  const std::vector<MemoKey>* keys = &expected.keys;
  if (expected.epoch != memo_epoch_) {  // the memo was emptied: list ids are void
    KeysLocked(expected.ops, &fresh);
    keys = &fresh;
  }
  for (const MemoKey& k : *keys) pending_keys_.erase(k);
  const absl::Span<const Op> ops = expected.ops;
  const absl::Span<const int32_t> steps = expected.steps;
  const size_t n = static_cast<size_t>(answered);
  if (n == 0) return;
  // The answer's costs join the pool once; the runs' steps name them.
  const auto pool_base = static_cast<uint32_t>(cost_pool_.size());
  cost_pool_.insert(cost_pool_.end(), unique.begin(), unique.end());
  memo_bytes_ += unique.size() * sizeof(Cost);
  ForEachExpectedBlock(
      n, steps.first(std::min(steps.size(), n)), [&](size_t b, size_t e, int32_t k) {
        // The block's costs at step 0, then, for j = 1..k, those of its
        // predictable ops at step j (agent.proto's order).
        const size_t block = at;
        const size_t size = e - b;
        size_t predictable = 0;
        if (k > 0) {
          RunKeysLocked(ops.subspan(b, size), /*add=*/true, &run_keys, &offsets);
          for (size_t i = b; i < e; ++i) predictable += Predictable(ops[i]) ? 1 : 0;
        }
        size_t rank = 0;
        for (size_t i = b; i < e; ++i) {
          const size_t now = block + (i - b);
          if (k == 0 || !Predictable(ops[i])) {
            memo_.emplace((*keys)[i], MemoEntry{unique[index[now]], -1, 0});
            continue;
          }
          const size_t r = rank++;
          const MemoKey& key = run_keys[i - b];
          if (key.shape == 0) continue;
          Run run{offsets[i - b], k, static_cast<uint32_t>(run_steps_.size()), 0};
          run_steps_.push_back(pool_base + index[now]);
          for (int32_t j = 1; j <= k; ++j) {
            run_steps_.push_back(
                pool_base + index[block + size + static_cast<size_t>(j - 1) * predictable + r]);
          }
          const auto newest = static_cast<uint32_t>(run_list_.size());
          auto [slot, added] = runs_.try_emplace(key, newest);
          if (!added) {
            run.older = slot->second + 1;
            slot->second = newest;
          }
          run_list_.push_back(run);
          // Its steps, itself, and a new key's slot and control byte.
          memo_bytes_ += (static_cast<size_t>(k) + 1) * sizeof(uint32_t) + sizeof(Run) +
                         (added ? sizeof(std::pair<const MemoKey, uint32_t>) * 8 / 7 + 1 : 0);
        }
        at = block + size + static_cast<size_t>(k) * predictable;
        stats_.expected_ops += static_cast<int64_t>(size + static_cast<size_t>(k) * predictable);
      });
}

}  // namespace servesim::agents
