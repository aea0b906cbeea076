#include <troupe/training/buckets.hpp>

#include <algorithm>
#include <map>

namespace troupe::training {

expected<std::vector<bucket_plan>> plan_buckets(const std::vector<parameter>& params,
                                                std::size_t first_cap_bytes,
                                                std::size_t cap_bytes) {
  if (first_cap_bytes == 0 || cap_bytes == 0)
    return make_error(errc::invalid_argument, "bucket caps must be positive (first bucket cap ",
                      first_cap_bytes, " bytes, bucket cap ", cap_bytes, " bytes)");
  struct open_bucket {
    bucket_plan plan;
    std::size_t cap = 0;
  };
  std::map<std::pair<dtype, device>, open_bucket> open;
  std::vector<bucket_plan> done;
  // Each bucket is ordered by its first parameter: earliest in reverse registration.
  for (std::size_t k = params.size(); k-- > 0;) {
    const auto& p = params[k];
    auto key = std::make_pair(p.grad.type, p.grad.where);
    auto [it, fresh] = open.try_emplace(key);
    auto& b = it->second;
    if (fresh) b.cap = first_cap_bytes;
    b.plan.type = p.grad.type;
    b.plan.where = p.grad.where;
    b.plan.params.push_back(k);
    b.plan.numel += p.grad.numel;
    b.plan.nbytes += p.grad.nbytes();
    if (b.plan.nbytes >= b.cap) {
      done.push_back(std::move(b.plan));
      b.plan = {};
      b.cap = cap_bytes;
    }
  }
  for (auto& [key, b] : open)
    if (!b.plan.params.empty()) done.push_back(std::move(b.plan));
  std::stable_sort(done.begin(), done.end(), [](const bucket_plan& a, const bucket_plan& b) {
    return a.params.front() > b.params.front();
  });
  return done;
}

}  // namespace troupe::training
