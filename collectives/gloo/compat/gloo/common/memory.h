// Stand-in for Gloo's gloo/common/memory.h, which Debian's libgloo-dev (0.0~git20220518)
// does not install although gloo/transport/tcp/pair.h includes it. collectives/gloo only
// needs pair.h to name tcp::Pair (see fail_pairs in gloo_group.cpp): it never builds a
// Pair nor touches its members, so these templates only have to make pair.h compile.
// CMake puts this folder on the include path only when the real header is missing.
#pragma once

#include <memory>

namespace gloo {

template <typename T>
class NonOwningPtr {
 public:
  NonOwningPtr() = default;
  T* get() const { return ptr_; }
  T* operator->() const { return ptr_; }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  T* ptr_ = nullptr;
};

template <typename T>
class WeakNonOwningPtr {
 public:
  WeakNonOwningPtr() = default;
  NonOwningPtr<T> lock() const { return {}; }

 private:
  std::weak_ptr<T> weak_;
  T* ptr_ = nullptr;
};

template <typename T>
class ShareableNonOwningPtr {
 public:
  ShareableNonOwningPtr() = default;

 private:
  std::shared_ptr<T> ptr_;
};

}  // namespace gloo
