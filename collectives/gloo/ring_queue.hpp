// ring_queue<T>: a first-in first-out queue on a ring of slots that grows by doubling and
// never shrinks, so that a queue that is filled and emptied once per operation allocates
// nothing once it has grown to its largest depth (a std::deque of large elements allocates
// and frees a block every few pushes). Internal to collectives/gloo; not thread-safe.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace troupe::collectives::gloo_runner {

template <class T>
class ring_queue {
 public:
  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }

  /// The oldest element; only when not empty.
  T& front() noexcept { return slots_[head_]; }
  /// Appends `v` after the newest element.
  void push_back(T&& v) {
    if (size_ == slots_.size()) grow();
    slots_[(head_ + size_) & (slots_.size() - 1)] = std::move(v);
    ++size_;
  }
  /// Removes the oldest element (left as a default-built T in its slot); only when not empty.
  void pop_front() {
    slots_[head_] = T();
    head_ = (head_ + 1) & (slots_.size() - 1);
    --size_;
  }
  void swap(ring_queue& other) noexcept {
    slots_.swap(other.slots_);
    std::swap(head_, other.head_);
    std::swap(size_, other.size_);
  }

  /// Oldest to newest (for range-for).
  class iterator {
   public:
    iterator(ring_queue* q, std::size_t i) : q_(q), i_(i) {}
    T& operator*() const noexcept { return q_->slots_[(q_->head_ + i_) & (q_->slots_.size() - 1)]; }
    iterator& operator++() noexcept {
      ++i_;
      return *this;
    }
    bool operator==(const iterator& o) const noexcept { return i_ == o.i_; }

   private:
    ring_queue* q_;
    std::size_t i_;
  };
  iterator begin() noexcept { return {this, 0}; }
  iterator end() noexcept { return {this, size_}; }

 private:
  void grow() {
    std::vector<T> bigger(slots_.empty() ? 8 : slots_.size() * 2);
    for (std::size_t i = 0; i < size_; ++i)
      bigger[i] = std::move(slots_[(head_ + i) & (slots_.size() - 1)]);
    slots_.swap(bigger);
    head_ = 0;
  }

  std::vector<T> slots_;  // a power of two of them, or none
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

}  // namespace troupe::collectives::gloo_runner
