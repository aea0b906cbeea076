// Lets Gloo's rendezvous use a troupe::store. Gloo expects exceptions, so failures of
// the store are thrown as gloo::IoException carrying our message; the tcp transport's
// connect turns them back into errors (gloo_errors::guard).
#pragma once

#include <gloo/rendezvous/store.h>

#include <memory>

#include <troupe/store/store.hpp>

namespace troupe::collectives {

class gloo_store_adapter final : public gloo::rendezvous::Store {
 public:
  gloo_store_adapter(std::shared_ptr<store> s, duration timeout)
      : store_(std::move(s)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<store> store_;
  duration timeout_;
};

}  // namespace troupe::collectives
