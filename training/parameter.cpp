#include <troupe/training/parameter.hpp>

#include <set>

namespace troupe::training {

expected<void> check_parameters(const std::vector<parameter>& params) {
  std::set<std::string> names;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    std::string who = strcat("parameter ", i, " ('", p.name, "')");
    if (p.name.empty())
      return make_error(errc::invalid_argument, "parameter ", i,
                        " has no name; give each parameter a name for messages");
    if (!names.insert(p.name).second)
      return make_error(errc::invalid_argument, who, " has the same name as an earlier one");
    if (p.value.type != p.grad.type)
      return make_error(errc::invalid_argument, who, ": value is ", to_string(p.value.type),
                        " but grad is ", to_string(p.grad.type), "; they must match");
    if (!is_floating(p.value.type))
      return make_error(errc::invalid_argument, who, " is ", to_string(p.value.type),
                        "; only floating-point parameters are trained");
    if (p.value.numel != p.grad.numel)
      return make_error(errc::invalid_argument, who, ": value has ", p.value.numel,
                        " elements but grad has ", p.grad.numel);
    if (p.value.where != p.grad.where)
      return make_error(errc::invalid_argument, who, ": value is on ", p.value.where.to_string(),
                        " but grad on ", p.grad.where.to_string());
    if (p.value.numel > 0 && (!p.value.data || !p.grad.data))
      return make_error(errc::invalid_argument, who, " has a null data pointer");
    if (p.value.data == p.grad.data && p.value.numel > 0)
      return make_error(errc::invalid_argument, who,
                        ": value and grad share memory; give the gradient its own buffer");
  }
  return ok();
}

}  // namespace troupe::training
