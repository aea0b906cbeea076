#include <troupe/collectives/gloo/store_adapter.hpp>

#include <gloo/common/error.h>

#include <cstring>

namespace troupe::collectives {

namespace {
[[noreturn]] void fail(const troupe::error& e) { throw gloo::IoException(e.to_string()); }
}  // namespace

void gloo_store_adapter::set(const std::string& key, const std::vector<char>& data) {
  auto r = store_->set(key, std::as_bytes(std::span(data.data(), data.size())), timeout_);
  if (!r) fail(r.error());
}

std::vector<char> gloo_store_adapter::get(const std::string& key) {
  auto r = store_->get(key, timeout_);
  if (!r) fail(r.error());
  std::vector<char> out(r->size());
  std::memcpy(out.data(), r->data(), r->size());
  return out;
}

void gloo_store_adapter::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void gloo_store_adapter::wait(const std::vector<std::string>& keys,
                              const std::chrono::milliseconds& timeout) {
  auto r = store_->wait(keys, std::chrono::duration_cast<duration>(timeout));
  if (!r) fail(r.error());
}

}  // namespace troupe::collectives
