#include <troupe/core/tensor.hpp>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

#include <troupe/core/strcat.hpp>

namespace troupe {

std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::uint8:
      return "uint8";
    case dtype::int8:
      return "int8";
    case dtype::int16:
      return "int16";
    case dtype::int32:
      return "int32";
    case dtype::int64:
      return "int64";
    case dtype::float16:
      return "float16";
    case dtype::bfloat16:
      return "bfloat16";
    case dtype::float32:
      return "float32";
    case dtype::float64:
      return "float64";
    case dtype::boolean:
      return "bool";
  }
  return "invalid";
}

bool is_valid_dtype(std::uint8_t raw) noexcept {
  return raw <= static_cast<std::uint8_t>(dtype::boolean);
}

namespace {

// Large blocks are recycled: a fresh 16 MiB buffer costs thousands of page faults, which
// is a third of a 16 MiB loopback echo. Blocks of 256 KiB and more, rounded up to 64 KiB,
// go back to this cache when their last tensor drops them (at most 512 MiB kept).
class block_cache {
 public:
  static constexpr std::size_t min_cached = 256 * 1024;
  static constexpr std::size_t max_kept = std::size_t{512} << 20;

  static std::size_t rounded(std::size_t n) { return (n + 65535) & ~std::size_t{65535}; }

  std::byte* take(std::size_t n) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = free_.find(n);
    if (it == free_.end() || it->second.empty()) return nullptr;
    auto* p = it->second.back();
    it->second.pop_back();
    kept_ -= n;
    return p;
  }
  void give(std::byte* p, std::size_t n) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (kept_ + n <= max_kept) {
        free_[n].push_back(p);
        kept_ += n;
        return;
      }
    }
    ::operator delete (p, std::align_val_t{64});
  }
  ~block_cache() {
    for (auto& [n, v] : free_)
      for (auto* p : v) ::operator delete (p, std::align_val_t{64});
  }

 private:
  std::mutex mu_;
  std::map<std::size_t, std::vector<std::byte*>> free_;
  std::size_t kept_ = 0;
};

block_cache& cache() {
  static block_cache* c = new block_cache();  // outlives every static tensor
  return *c;
}

}  // namespace

std::shared_ptr<std::byte> allocate_aligned(std::size_t n) {
  if (n < block_cache::min_cached) {
    auto* p = static_cast<std::byte*>(::operator new (n == 0 ? 1 : n, std::align_val_t{64}));
    return std::shared_ptr<std::byte>(
        p, [](std::byte* q) { ::operator delete (q, std::align_val_t{64}); });
  }
  std::size_t r = block_cache::rounded(n);
  std::byte* p = cache().take(r);
  if (!p) p = static_cast<std::byte*>(::operator new (r, std::align_val_t{64}));
  return std::shared_ptr<std::byte>(p, [r](std::byte* q) { cache().give(q, r); });
}

expected<tensor> tensor::wrap(void* data, dtype type, std::vector<std::int64_t> shape, device dev,
                              std::vector<std::int64_t> strides, std::shared_ptr<void> owner) {
  if (element_size(type) == 0)
    return make_error(errc::invalid_argument, "tensor::wrap: dtype value ", static_cast<int>(type),
                      " is not a dtype");
  std::int64_t n = 1;
  for (auto d : shape) {
    if (d < 0)
      return make_error(errc::invalid_argument, "tensor::wrap: dimension ", d,
                        " is negative; dimensions must be >= 0");
    n *= d;
  }
  if (!strides.empty() && strides.size() != shape.size())
    return make_error(errc::invalid_argument, "tensor::wrap: ", strides.size(),
                      " strides given for a tensor of rank ", shape.size(),
                      "; give one stride per dimension or none for contiguous data");
  for (auto s : strides)
    if (s < 0)
      return make_error(errc::invalid_argument, "tensor::wrap: stride ", s,
                        " is negative; only non-negative strides are supported");
  if (data == nullptr && n > 0)
    return make_error(errc::invalid_argument, "tensor::wrap: null data for ", n, " elements");
  tensor t;
  t.data_ = data;
  t.type_ = type;
  t.device_ = dev;
  t.shape_ = std::move(shape);
  t.strides_ = std::move(strides);
  t.owner_ = std::move(owner);
  if (t.is_contiguous()) t.strides_.clear();
  return t;
}

tensor tensor::wrap(const tensor_view& v) {
  tensor t;
  t.data_ = v.data;
  t.type_ = v.type;
  t.device_ = v.where;
  t.shape_ = {static_cast<std::int64_t>(v.numel)};
  return t;
}

expected<tensor_view> tensor::view() const {
  if (!is_contiguous())
    return make_error(errc::invalid_argument, "tensor::view: ", *this,
                      " is not contiguous; call contiguous() for a packed copy first");
  return tensor_view{data_, type_, static_cast<std::size_t>(numel()), device_};
}

tensor tensor::zeros(dtype type, std::vector<std::int64_t> shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d < 0 ? 0 : d;
  std::size_t bytes_n = static_cast<std::size_t>(n) * element_size(type);
  auto mem = allocate_aligned(bytes_n);
  std::memset(mem.get(), 0, bytes_n);
  tensor t;
  t.data_ = mem.get();
  t.type_ = type;
  t.shape_ = std::move(shape);
  t.owner_ = std::shared_ptr<void>(mem, mem.get());
  return t;
}

std::int64_t tensor::numel() const noexcept {
  std::int64_t n = 1;
  for (auto d : shape_) n *= d;
  return n;
}

bool tensor::is_contiguous() const noexcept {
  if (strides_.empty()) return true;
  std::int64_t expect = 1;
  for (std::size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != expect) return false;
    expect *= shape_[i];
  }
  return true;
}

tensor tensor::contiguous() const {
  if (is_contiguous()) return *this;
  tensor out = zeros(type_, shape_);
  out.device_ = device_;
  std::size_t es = element_size(type_);
  auto n = numel();
  std::vector<std::int64_t> idx(shape_.size(), 0);
  auto* src = static_cast<const std::byte*>(data_);
  auto* dst = static_cast<std::byte*>(out.data_);
  for (std::int64_t k = 0; k < n; ++k) {
    std::int64_t off = 0;
    for (std::size_t i = 0; i < idx.size(); ++i) off += idx[i] * strides_[i];
    std::memcpy(dst + static_cast<std::size_t>(k) * es, src + static_cast<std::size_t>(off) * es,
                es);
    for (std::size_t i = idx.size(); i-- > 0;) {
      if (++idx[i] < shape_[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}

tensor tensor::with_device(device d) const {
  tensor t = *this;
  t.device_ = d;
  return t;
}

tensor tensor::with_stream(void* cuda_stream) const {
  tensor t = *this;
  t.stream_ = cuda_stream;
  return t;
}

bool same_values(const tensor& a, const tensor& b) {
  if (a.type_ != b.type_ || a.shape_ != b.shape_) return false;
  tensor ca = a.contiguous(), cb = b.contiguous();
  return a.nbytes() == 0 || std::memcmp(ca.data_, cb.data_, a.nbytes()) == 0;
}

std::ostream& operator<<(std::ostream& os, const tensor& t) {
  os << "tensor(" << to_string(t.type()) << ", [";
  for (std::size_t i = 0; i < t.shape().size(); ++i) os << (i ? ", " : "") << t.shape()[i];
  return os << "], " << t.dev() << ")";
}

}  // namespace troupe
