#include <troupe/world/world.hpp>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include <troupe/collectives/group.hpp>
#include <troupe/collectives/process_group.hpp>
#include <troupe/core/log.hpp>
#include <troupe/core/metrics.hpp>
#include <troupe/core/net_address.hpp>
#include <troupe/core/settings.hpp>
#include <troupe/core/trace.hpp>
#include <troupe/membership/service.hpp>
#include <troupe/rpc/agent.hpp>
#include <troupe/rpc/backend_registry.hpp>
#include <troupe/store/cluster_store.hpp>
#include <troupe/store/prefix_store.hpp>
#include <troupe/world/trace_clock.hpp>

namespace troupe {

namespace {

// Reports members whose RPC connection broke to the job's membership, from a thread of its
// own: declare_dead waits on the store, which an agent's listener must not. The listener
// holds it weakly, so a late event after shutdown finds nothing.
class death_reporter {
 public:
  death_reporter(std::shared_ptr<membership::service> members, duration timeout)
      : members_(std::move(members)), timeout_(timeout), thread_([this] { run(); }) {}
  ~death_reporter() {
    {
      std::lock_guard lk(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void report(std::string name, std::string why) {
    {
      std::lock_guard lk(mu_);
      queue_.emplace_back(std::move(name), std::move(why));
    }
    cv_.notify_all();
  }

 private:
  void run() {
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return quit_ || !queue_.empty(); });
      if (quit_) return;
      auto [who, why] = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      if (auto r = members_->declare_dead(who, strcat("its RPC connection broke: ", why), timeout_);
          !r)
        TROUPE_LOG(log_level::warn, "world", "could not report worker '", who,
                   "' to the job's membership: ", r.error().message());
      lk.lock();
    }
  }

  std::shared_ptr<membership::service> members_;
  duration timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, std::string>> queue_;  // name, what broke
  bool quit_ = false;
  std::thread thread_;  // last: starts after the rest is built
};

}  // namespace

struct world::impl {
  cluster_env env;
  int rank = 0;
  int size = 1;
  std::string address;
  duration timeout{};
  cluster_store job;
  std::shared_ptr<collectives::process_group> group;
  std::shared_ptr<rpc::agent> agent;
  // An elastic world: the membership, and the group that follows it.
  std::shared_ptr<troupe::membership::service> members;
  std::unique_ptr<collectives::elastic_group> elastic;
  // An elastic world's RPC agent follows the epochs (docs/membership.md): the members an
  // epoch takes out are expelled from it, and a member whose RPC connection breaks is
  // reported to the membership.
  std::uint64_t epoch_subscription = 0;
  std::uint64_t rpc_listener = 0;
  std::shared_ptr<death_reporter> reporter;

  std::mutex mu;
  bool done = false;
  std::optional<error> first_error;

  ~impl() { (void)shutdown(timeout); }

  expected<void> shutdown(duration t) {
    std::lock_guard<std::mutex> lk(mu);
    if (done) return first_error ? expected<void>(*first_error) : ok();
    done = true;
    auto keep = [&](expected<void> r) {
      if (!r && !first_error) first_error = std::move(r).error();
    };
    if (members && epoch_subscription != 0) members->unsubscribe(epoch_subscription);
    if (agent && rpc_listener != 0) agent->remove_membership_listener(rpc_listener);
    if (agent) keep(agent->shutdown(t));
    reporter.reset();
    if (elastic) elastic->shutdown(t);
    if (group) group->shutdown(t);
    if (members) keep(members->shutdown(t));
    // Every rank says it is done; the rank hosting the store waits for all of them, so
    // that nobody loses the store while still using it. (An elastic world never hosts it.)
    if (job.scoped && env.world_size > 1 && !members) {
      keep(job.scoped->set(strcat("troupe/finished/", env.rank), "1"));
      if (job.hosted) {
        std::vector<std::string> keys;
        for (int r = 0; r < env.world_size; ++r) keys.push_back(strcat("troupe/finished/", r));
        if (auto w = job.scoped->wait(keys, t); !w)
          TROUPE_LOG(log_level::warn, "world", "closing the job's store before every rank shut ",
                     "down: ", w.error().message());
      }
    }
    agent.reset();
    elastic.reset();
    group.reset();
    members.reset();
    job = {};
    trace::flush();
    if (first_error) return *first_error;
    return ok();
  }
};

world::world(std::shared_ptr<impl> i) : impl_(std::move(i)) {}

int world::rank() const noexcept { return impl_->rank; }
int world::size() const noexcept { return impl_->size; }
int world::local_rank() const noexcept { return impl_->env.local_rank; }
int world::local_size() const noexcept { return impl_->env.local_world_size; }
const cluster_env& world::env() const noexcept { return impl_->env; }
const std::string& world::address() const noexcept { return impl_->address; }
const std::shared_ptr<troupe::store>& world::store() const noexcept { return impl_->job.scoped; }
collectives::process_group& world::group() const noexcept { return *impl_->group; }
const std::shared_ptr<collectives::process_group>& world::group_ptr() const noexcept {
  return impl_->group;
}
const std::shared_ptr<rpc::agent>& world::rpc() const noexcept { return impl_->agent; }
const std::shared_ptr<troupe::membership::service>& world::membership() const noexcept {
  return impl_->members;
}
collectives::elastic_group* world::elastic() const noexcept { return impl_->elastic.get(); }
bool world::hosts_store() const noexcept { return impl_->job.hosted; }

expected<void> world::shutdown(duration timeout) {
  return impl_->shutdown(timeout > duration::zero() ? timeout : impl_->timeout);
}

namespace {

// An elastic world's RPC agent: a dynamic group whose membership is the job's. It joins
// after the group of its epoch is built (so every member has seen the epochs before its
// own), expels whoever an epoch takes out with that epoch's membership_changed error, and
// reports a broken connection to the membership, which then decides.
expected<void> start_elastic_rpc(world::impl& i, init_options& o, const std::string& name,
                                 const membership::epoch& built) {
  auto ro = std::move(o.rpc_options);
  ro.store = i.job.scoped;
  ro.init_method.clear();
  ro.init_timeout = i.timeout;
  if (ro.listen_host.empty()) ro.listen_host = i.address;
  ro.membership_tag = i.members->self().incarnation;
  auto made = rpc::init_rpc(name, -1, std::nullopt, std::move(ro));
  if (!made) return std::move(made).error();
  i.agent = std::shared_ptr<rpc::agent>(std::move(*made));
  std::weak_ptr<rpc::agent> weak = i.agent;
  i.epoch_subscription =
      i.members->on_epoch([weak](const membership::epoch& before, const membership::epoch& after) {
        auto a = weak.lock();
        if (!a) return;
        for (const auto& m : before.members)
          if (!after.contains(m.name, m.incarnation))
            a->expel(m.name, m.incarnation, membership::membership_changed_error(before, after));
      });
  // Whoever the epoch already took out while this agent was joining is not a member.
  {
    const auto now = i.members->current();
    for (const auto& w : i.agent->workers())
      if (w.name != name && !now.contains(w.name))
        i.agent->expel(w.name, {},
                       make_error(errc::membership_changed, "worker '", w.name,
                                  "' is not in epoch ", now.number, " (", now.names(), ")"));
  }
  // init returns when every member of the epoch its group was built for (and still in the
  // job) is in the RPC group too, so that init's group and agent hold the same workers. They
  // start their agents right after that same build. (Not the current epoch's: a member of
  // a later one waits for this process to take part in building its group.)
  for (auto d = deadline::after(i.timeout);;) {
    const auto now = i.members->current();
    std::string missing;
    for (const auto& m : built.members)
      if (now.contains(m.name, m.incarnation) && !i.agent->worker(m.name))
        missing += (missing.empty() ? "" : ", ") + m.name;
    if (missing.empty()) break;
    if (d.expired())
      return make_error(errc::timeout, "the RPC agent of ", name, " did not see ", missing,
                        " of epoch ", built.number, " (", built.names(),
                        ") join the RPC group within ", format_duration(i.timeout),
                        "; their init may have failed (see their logs)");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  i.reporter = std::make_shared<death_reporter>(
      i.members, std::min<duration>(i.timeout, std::chrono::seconds(10)));
  std::weak_ptr<death_reporter> to = i.reporter;
  i.rpc_listener = i.agent->add_membership_listener([to](const rpc::membership_event& e) {
    if (e.change != rpc::membership_change::unreachable) return;
    if (auto r = to.lock()) r->report(e.worker.name, e.reason.message());
  });
  return ok();
}

// init's elastic path: joins the membership and builds the world group of its epoch, and
// on request the RPC agent that follows it.
expected<void> init_elastic(world::impl& i, init_options& o) {
  if (i.job.hosted || !i.job.scoped || i.job.url.starts_with("memory://"))
    return make_error(errc::invalid_argument,
                      "an elastic world needs a store that outlives "
                      "every worker, such as troupe-run's; this process would hold the job's "
                      "store itself (",
                      i.job.url.empty() ? std::string("none offered") : i.job.url,
                      "); run it under troupe-run --failure-policy replace, or set "
                      "TROUPE_STORE_URL to a store of the job");
  membership::service_options mo;
  mo.name = strcat(o.rpc_name_prefix, i.env.rank);
  mo.op_timeout = std::min<duration>(i.timeout, std::chrono::seconds(10));
  auto scoped = std::make_shared<prefix_store>(i.job.scoped, "membership");
  auto joined = membership::service::join(scoped, mo, i.timeout);
  if (!joined) return std::move(joined).error();
  i.members = std::shared_ptr<membership::service>(std::move(*joined));
  collectives::elastic_options eo;
  eo.name = o.group_name;
  if (!o.backend.empty()) eo.backend = o.backend;
  eo.build_timeout = i.timeout;
  auto eg = collectives::elastic_group::make(i.members, i.job.scoped, eo);
  if (!eg) return std::move(eg).error();
  i.elastic = std::move(*eg);
  auto view = i.elastic->rebuild(i.timeout);
  if (!view) return std::move(view).error();
  i.group = view->group;
  i.rank = i.group->rank();
  i.size = i.group->size();
  TROUPE_LOG(log_level::info, "world", mo.name, " joined an elastic world: epoch ",
             view->epoch.number, ", rank ", i.rank, " of ", i.size);
  if (o.rpc) TROUPE_TRY(start_elastic_rpc(i, o, mo.name, view->epoch));
  return ok();
}

}  // namespace

expected<world> init(init_options o) {
  metrics::start_export_from_env();  // under troupe-run --metrics-port
  auto i = std::make_shared<world::impl>();
  i->timeout = o.timeout > duration::zero() ? o.timeout : default_timeout();
  // A failed init leaves nothing to shut down politely: the others fail on their own.
  auto fail = [&i](error e) -> expected<world> {
    i->done = true;
    return std::move(e).with_operation("troupe::init");
  };
  auto env = detect_cluster_env();
  if (!env) {
    if (env.error().code() != errc::not_found || o.require_launcher)
      return fail(std::move(env).error());
    env = cluster_env{};  // no launcher: a world of one
  }
  i->env = std::move(*env);
  // The address first: a wrong interface or address fails before anything waits.
  auto address = local_address();
  if (!address) return fail(std::move(address).error());
  i->address = std::move(*address);
  auto job = open_cluster_store(i->env, i->timeout);
  if (!job) return fail(std::move(job).error());
  i->job = std::move(*job);
  if (i->job.hosted)
    TROUPE_LOG(log_level::info, "world", "rank 0 hosts the job's store at ", i->job.url);

  i->rank = i->env.rank;
  i->size = i->env.world_size;
  const bool elastic = o.elastic.value_or(settings::elastic.value().value_or("") == "1");
  if (elastic) {
    auto built = init_elastic(*i, o);
    if (!built) return fail(std::move(built).error());
    return world(std::move(i));
  }

  collectives::world_options wo;
  wo.rank = i->env.rank;
  wo.size = i->env.world_size;
  wo.store = i->job.scoped;
  wo.backend = o.backend;
  wo.name = o.group_name;
  wo.timeout = i->timeout;
  auto group = collectives::init_world(wo);
  if (!group) return fail(std::move(group).error());
  i->group = std::move(*group);

  if (o.rpc) {
    auto ro = std::move(o.rpc_options);
    ro.store = i->job.scoped;
    ro.init_method.clear();
    ro.init_timeout = i->timeout;
    if (ro.listen_host.empty()) ro.listen_host = i->address;
    auto agent = rpc::init_rpc(strcat(o.rpc_name_prefix, i->env.rank), i->env.rank,
                               i->env.world_size, std::move(ro));
    if (!agent) return fail(std::move(agent).error());
    i->agent = std::shared_ptr<rpc::agent>(std::move(*agent));
  } else if (trace::enabled() && i->env.world_size > 1 && i->job.scoped) {
    // The RPC agent measures the trace's clock offset by ping; without one, the store does.
    auto measured = detail::measure_trace_clock(*i->job.scoped, i->env.rank, i->env.world_size, 8,
                                                deadline::after(i->timeout));
    if (!measured)
      TROUPE_LOG(log_level::warn, "trace",
                 "no clock offset against rank 0: ", measured.error().message());
  }
  return world(std::move(i));
}

}  // namespace troupe
