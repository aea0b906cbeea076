#include <troupe/collectives/gloo/full_mesh.hpp>

#include <gloo/common/error.h>
#include <gloo/transport/context.h>
#include <gloo/transport/tcp/pair.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace troupe::collectives::gloo_mesh {

namespace {

// signalExceptionExternal is protected; a pointer to member formed in a derived class
// reaches it, which is legal C++ (the tcp transport fails pairs through fail_pair on abort).
struct pair_failer : gloo::transport::tcp::Pair {
  static constexpr auto signal = &pair_failer::signalExceptionExternal;
};

constexpr auto poll_every = std::chrono::milliseconds(20);

}  // namespace

bool fail_pair(gloo::transport::Pair* pair, const std::string& why) {
  auto* tcp = dynamic_cast<gloo::transport::tcp::Pair*>(pair);
  if (tcp == nullptr) return false;
  try {
    (void)(tcp->*pair_failer::signal)(why);
  } catch (...) {
  }
  return true;
}

void context::connect(gloo::rendezvous::Store& store, std::shared_ptr<gloo::transport::Device>& dev,
                      const interrupt_fn& interrupt) {
  std::shared_ptr<gloo::transport::Context> tc = dev->createContext(rank, size);
  tc->setTimeout(getTimeout());
  std::vector<char> mine;
  std::size_t address_size = 0;
  for (int i = 0; i < size; ++i) {
    if (i == rank) continue;
    auto bytes = tc->createPair(i)->address().bytes();
    address_size = bytes.size();
    mine.insert(mine.end(), bytes.begin(), bytes.end());
  }

  // The watcher: polls `interrupt` and fails every pair when it says so. The pairs are
  // all made above and the vector holding them never changes, so it may read them.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::optional<troupe::error> why;
  std::thread watcher;
  if (interrupt) {
    watcher = std::thread([&] {
      std::unique_lock lk(mu);
      while (!done) {
        cv.wait_for(lk, poll_every);
        if (done) return;
        lk.unlock();
        auto stop = interrupt();
        lk.lock();
        if (!stop) continue;
        why = std::move(stop);
        const std::string message = why->message();
        lk.unlock();
        for (int i = 0; i < size; ++i)
          if (i != rank) fail_pair(tc->getPair(i).get(), message);
        return;
      }
    });
  }
  auto finish = [&] {
    {
      std::lock_guard lk(mu);
      done = true;
    }
    cv.notify_all();
    if (watcher.joinable()) watcher.join();
  };
  // Whether the connect was interrupted: the watcher saw it, or (after a failure) the
  // check says so now (an interruptible store may have ended a wait first).
  auto interrupted = [&](bool ask = false) -> std::optional<troupe::error> {
    {
      std::lock_guard lk(mu);
      if (why) return why;
    }
    if (ask && interrupt) return interrupt();
    return std::nullopt;
  };

  try {
    store.set(std::to_string(rank), mine);
    for (int i = 0; i < size; ++i) {
      if (i == rank) continue;
      if (auto e = interrupted()) throw troupe::exception(*e);
      const std::string key = std::to_string(i);
      store.wait({key}, getTimeout());
      auto all = store.get(key);
      // Rank i wrote the addresses of its pairs in rank order, skipping itself.
      const std::size_t slot = static_cast<std::size_t>(rank > i ? rank - 1 : rank);
      if (address_size == 0 || all.size() < (slot + 1) * address_size)
        throw gloo::IoException("rank " + key + " published " + std::to_string(all.size()) +
                                " bytes of pair addresses; expected " +
                                std::to_string((size - 1) * address_size));
      std::vector<char> address(
          all.begin() + static_cast<std::ptrdiff_t>(slot * address_size),
          all.begin() + static_cast<std::ptrdiff_t>((slot + 1) * address_size));
      tc->getPair(i)->connect(address);
    }
  } catch (...) {
    finish();
    if (auto e = interrupted(true)) throw troupe::exception(*e);
    throw;
  }
  finish();
  if (auto e = interrupted()) throw troupe::exception(*e);
  device_ = dev;
  transportContext_ = std::move(tc);
}

}  // namespace troupe::collectives::gloo_mesh
