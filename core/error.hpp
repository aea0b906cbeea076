// The one error type of troupe: a code, a message that says what was wrong and what to
// do, and the context it happened in (which worker, which operation).
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace troupe {

/// What kind of failure an `error` reports. Stable values: they travel on the wire.
enum class errc : std::uint8_t {
  /// An operation did not finish before its deadline.
  timeout = 1,
  /// An argument or configuration value is malformed or out of range.
  invalid_argument,
  /// A named thing (key, worker, function, actor, backend) does not exist.
  not_found,
  /// A named thing exists already and names must be unique.
  already_exists,
  /// The connection to a peer or server broke; the peer may be dead.
  connection_lost,
  /// The peer left the group in an orderly way before the operation finished.
  peer_left,
  /// The operation was cancelled because its owner aborted or shut down.
  aborted,
  /// A peer sent bytes that do not follow the protocol (wrong version, bad frame).
  protocol_error,
  /// A peer refused us, or we refused a peer, for lack of the shared secret.
  unauthorized,
  /// A resource or service is not available on this machine or in this build.
  unavailable,
  /// A result was never produced because its producer went away.
  broken_promise,
  /// The object was shut down; no further operations are accepted.
  shut_down,
  /// The operation is valid in general but not supported in this combination.
  unsupported,
  /// User code (an RPC target, a continuation, a handler) raised an error; the message
  /// carries its text and the error names the worker it ran on.
  user_error,
  /// A bug in troupe or a broken invariant; please report it.
  internal,
  /// The job's membership moved to a new epoch while the operation was pending (a member
  /// died, left or joined), or this worker is no longer in the epoch; the message names the
  /// new epoch and who left or came (docs/membership.md).
  membership_changed,
};

/// The name of a code, e.g. "timeout".
std::string_view to_string(errc code) noexcept;

/// Parses a name written by `to_string(errc)`; returns false if unknown.
bool from_string(std::string_view name, errc& out) noexcept;

/// An error value: cheap to move, printable, carried through `expected` and `future`.
/// One pointer wide: a success path that carries an empty one (every `expected<void>`
/// does) builds, moves and destroys a null pointer, not three strings.
class error {
 public:
  /// An internal error with no message; only a placeholder to assign over.
  error() = default;
  /// An error of kind `code`; `message` says what went wrong and what to do.
  error(errc code, std::string message)
      : rep_(std::make_unique<rep>(rep{code, std::move(message), {}, {}})) {}
  ///@{
  /// Copies are deep; moves leave the source a placeholder (internal, no message).
  error(const error& o) : rep_(o.rep_ ? std::make_unique<rep>(*o.rep_) : nullptr) {}
  error& operator=(const error& o) {
    if (this != &o) rep_ = o.rep_ ? std::make_unique<rep>(*o.rep_) : nullptr;
    return *this;
  }
  error(error&&) noexcept = default;
  error& operator=(error&&) noexcept = default;
  ~error() = default;
  ///@}

  /// The kind of error.
  errc code() const noexcept { return rep_ ? rep_->code : errc::internal; }
  /// What went wrong and what to do, without the worker and operation.
  const std::string& message() const noexcept { return rep_ ? rep_->message : none(); }
  /// The worker the error concerns (may be empty).
  const std::string& worker() const noexcept { return rep_ ? rep_->worker : none(); }
  /// The operation that failed, e.g. "store.get" (may be empty).
  const std::string& operation() const noexcept { return rep_ ? rep_->operation : none(); }

  ///@{
  /// Adds context; the first worker/operation set is kept (innermost is most precise).
  error&& with_worker(std::string name) && { return std::move(add(&rep::worker, std::move(name))); }
  error&& with_operation(std::string op) && {
    return std::move(add(&rep::operation, std::move(op)));
  }
  error& with_worker(std::string name) & { return add(&rep::worker, std::move(name)); }
  error& with_operation(std::string op) & { return add(&rep::operation, std::move(op)); }
  ///@}

  /// "timeout in store.get on worker 'w1': <message>".
  std::string to_string() const;

  /// Same code and message (the context is not compared).
  friend bool operator==(const error& a, const error& b) noexcept {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  struct rep {
    errc code = errc::internal;
    std::string message;
    std::string worker;
    std::string operation;
  };
  static const std::string& none() noexcept;
  error& add(std::string rep::*field, std::string value) {
    if (!rep_) rep_ = std::make_unique<rep>();
    if ((*rep_.*field).empty()) *rep_.*field = std::move(value);
    return *this;
  }
  std::unique_ptr<rep> rep_;
};

std::ostream& operator<<(std::ostream& os, const error& e);
std::ostream& operator<<(std::ostream& os, errc code);

/// The exception form of `error`, thrown only by `expected::value()` and at API edges
/// that must throw (constructors). Never escapes an I/O thread.
class exception : public std::runtime_error {
 public:
  /// Carries `e`; what() is e.to_string().
  explicit exception(error e) : std::runtime_error(e.to_string()), error_(std::move(e)) {}
  /// The error it carries.
  const troupe::error& err() const noexcept { return error_; }
  /// The kind of the error it carries.
  errc code() const noexcept { return error_.code(); }

 private:
  troupe::error error_;
};

/// Shorthand for building an error: make_error(errc::timeout, "waited ", 3, " s").
template <class... Ts>
error make_error(errc code, const Ts&... parts);

}  // namespace troupe

#include <troupe/core/strcat.hpp>

template <class... Ts>
troupe::error troupe::make_error(errc code, const Ts&... parts) {
  return error(code, strcat(parts...));
}
