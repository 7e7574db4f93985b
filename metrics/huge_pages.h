// Memory for the records a run keeps to its end, on transparent huge pages.
#ifndef SERVESIM_METRICS_HUGE_PAGES_H_
#define SERVESIM_METRICS_HUGE_PAGES_H_

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace servesim::metrics {

// What the records kept for the whole run cost (report.html's iterations,
// the percentiles' runs of equal gaps) is mostly the first touch of their
// memory: one page fault per 4 KiB page, a few microseconds each on a
// virtual machine. Memory from here is aligned to 2 MiB and advised as
// transparent huge pages (madvise MADV_HUGEPAGE, a no-op where the system
// has them off): one fault per 2 MiB.
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

inline void* AllocateHugeAdvised(size_t bytes) {
  const size_t rounded = (bytes + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(kHugePageBytes,
                               (rounded + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes);
  if (p == nullptr) throw std::bad_alloc();
  madvise(p, rounded, MADV_HUGEPAGE);  // advice only: a failure changes nothing
  return p;
}

// A std::allocator that puts allocations of 2 MiB or more on huge pages.
template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: allocators convert
  T* allocate(size_t n) {
    if (n * sizeof(T) < kHugePageBytes) return std::allocator<T>().allocate(n);
    return static_cast<T*>(AllocateHugeAdvised(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) {
    if (n * sizeof(T) < kHugePageBytes) {
      std::allocator<T>().deallocate(p, n);
    } else {
      std::free(p);
    }
  }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
};

// An append-only list of trivially copyable records, read in insertion
// order: no copy as it grows (a vector's doubling touches twice the
// memory). Blocks double from 64 records up to 2 MiB, and those of 2 MiB
// are on huge pages, so a short list costs little and a long one one fault
// per 2 MiB.
template <typename T>
class HugeBlocks {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  static constexpr size_t kMaxPerBlock = kHugePageBytes / sizeof(T);

  void push_back(const T& v) {
    if (blocks_.empty() || last_size_ == blocks_.back().capacity) AddBlock();
    blocks_.back().data[last_size_++] = v;
    ++size_;
  }
  T& back() { return blocks_.back().data[last_size_ - 1]; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  void clear() {
    for (Block& b : blocks_) b.Free();
    blocks_.clear();
    size_ = last_size_ = 0;
  }
  HugeBlocks() = default;
  HugeBlocks(const HugeBlocks&) = delete;
  HugeBlocks& operator=(const HugeBlocks&) = delete;
  HugeBlocks(HugeBlocks&& o) noexcept
      : blocks_(std::move(o.blocks_)), size_(o.size_), last_size_(o.last_size_) {
    o.blocks_.clear();
    o.size_ = o.last_size_ = 0;
  }
  HugeBlocks& operator=(HugeBlocks&& o) noexcept {
    if (this != &o) {
      clear();
      blocks_ = std::move(o.blocks_);
      size_ = o.size_;
      last_size_ = o.last_size_;
      o.blocks_.clear();
      o.size_ = o.last_size_ = 0;
    }
    return *this;
  }
  ~HugeBlocks() { clear(); }

  // Calls f(const T&) on every record, in insertion order.
  template <typename F>
  void ForEach(F&& f) const {
    for (size_t b = 0; b < blocks_.size(); ++b) {
      const size_t n = b + 1 == blocks_.size() ? last_size_ : blocks_[b].capacity;
      for (size_t i = 0; i < n; ++i) f(blocks_[b].data[i]);
    }
  }
  // Appends every record to `out` and empties the list, each block freed
  // once copied (the two hold everything at once for one block at most).
  template <typename V>
  void DrainInto(V* out) {
    out->reserve(out->size() + size_);
    for (size_t b = 0; b < blocks_.size(); ++b) {
      const size_t n = b + 1 == blocks_.size() ? last_size_ : blocks_[b].capacity;
      out->insert(out->end(), blocks_[b].data, blocks_[b].data + n);
      blocks_[b].Free();
    }
    clear();  // the blocks are freed: this drops their entries
  }

 private:
  struct Block {
    T* data = nullptr;
    size_t capacity = 0;
    void Free() {
      if (data == nullptr) return;
      if (capacity == kMaxPerBlock) {
        std::free(data);
      } else {
        std::allocator<T>().deallocate(data, capacity);
      }
      data = nullptr;
    }
  };
  void AddBlock() {
    const size_t cap =
        std::min(kMaxPerBlock, blocks_.empty() ? size_t{64} : 2 * blocks_.back().capacity);
    T* data = cap == kMaxPerBlock ? static_cast<T*>(AllocateHugeAdvised(kHugePageBytes))
                                  : std::allocator<T>().allocate(cap);
    blocks_.push_back({data, cap});
    last_size_ = 0;
  }
  std::vector<Block> blocks_;
  size_t size_ = 0, last_size_ = 0;  // all records; those in the last block
};

}  // namespace servesim::metrics

#endif  // SERVESIM_METRICS_HUGE_PAGES_H_
