// A binary min-heap over the items 0..n-1, each in it at most once with a
// key that can change: Set and Remove in O(log n), the least item in O(1).
// Items compare by (key, item), so ties go to the lower item.
#ifndef SERVESIM_METRICS_KEY_HEAP_H_
#define SERVESIM_METRICS_KEY_HEAP_H_

#include <cstddef>
#include <utility>
#include <vector>

namespace servesim::metrics {

class KeyHeap {
 public:
  explicit KeyHeap(int n) : pos_(static_cast<size_t>(n), -1), key_(static_cast<size_t>(n), 0) {}

  bool empty() const { return heap_.empty(); }
  int top() const { return heap_.front(); }  // not empty()
  double key(int item) const { return key_[static_cast<size_t>(item)]; }

  // Puts `item` in with `key`, or moves it to `key`.
  void Set(int item, double key) {
    const auto i = static_cast<size_t>(item);
    if (pos_[i] < 0) {
      key_[i] = key;
      pos_[i] = static_cast<int>(heap_.size());
      heap_.push_back(item);
      Up(pos_[i]);
      return;
    }
    const double old = key_[i];
    key_[i] = key;
    if (key < old) {
      Up(pos_[i]);
    } else if (key > old) {
      Down(pos_[i]);
    }
  }

  // Takes `item` out, if it is in.
  void Remove(int item) {
    const auto i = static_cast<size_t>(item);
    const int p = pos_[i];
    if (p < 0) return;
    const int last = heap_.back();
    heap_.pop_back();
    pos_[i] = -1;
    if (last == item) return;
    heap_[static_cast<size_t>(p)] = last;
    pos_[static_cast<size_t>(last)] = p;
    Up(p);
    Down(pos_[static_cast<size_t>(last)]);
  }

 private:
  bool Less(int a, int b) const {
    const double ka = key(a), kb = key(b);
    return ka < kb || (ka == kb && a < b);
  }
  void Swap(int p, int q) {
    std::swap(heap_[static_cast<size_t>(p)], heap_[static_cast<size_t>(q)]);
    pos_[static_cast<size_t>(heap_[static_cast<size_t>(p)])] = p;
    pos_[static_cast<size_t>(heap_[static_cast<size_t>(q)])] = q;
  }
  void Up(int p) {
    while (p > 0) {
      const int parent = (p - 1) / 2;
      if (!Less(heap_[static_cast<size_t>(p)], heap_[static_cast<size_t>(parent)])) return;
      Swap(p, parent);
      p = parent;
    }
  }
  void Down(int p) {
    const int n = static_cast<int>(heap_.size());
    while (true) {
      int least = p;
      for (const int c : {2 * p + 1, 2 * p + 2}) {
        if (c < n && Less(heap_[static_cast<size_t>(c)], heap_[static_cast<size_t>(least)])) {
          least = c;
        }
      }
      if (least == p) return;
      Swap(p, least);
      p = least;
    }
  }

  std::vector<int> heap_;  // items, heap-ordered
  std::vector<int> pos_;   // per item: its index in heap_, -1 when out
  std::vector<double> key_;
};

}  // namespace servesim::metrics

#endif  // SERVESIM_METRICS_KEY_HEAP_H_
