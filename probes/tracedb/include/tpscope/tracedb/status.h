// Error values for the trace format: errors are returned, not thrown (Perfetto's habit). A message always names
// the file and what is wrong with it, e.g. "runs/a/rank-3.db: not a tpscope trace (no 'meta' table)".
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace tpscope::tracedb {

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(std::string message) { return Status(std::move(message)); }
  bool isOk() const { return !message_.has_value(); }
  explicit operator bool() const { return isOk(); }
  const std::string& message() const {
    static const std::string kEmpty;
    return message_ ? *message_ : kEmpty;
  }

 private:
  explicit Status(std::string message) : message_(std::move(message)) {}
  std::optional<std::string> message_;
};

// A value or an error message.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT: must be an error
  bool isOk() const { return value_.has_value(); }
  explicit operator bool() const { return isOk(); }
  const std::string& error() const { return status_.message(); }
  Status status() const { return isOk() ? Status::ok() : status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace tpscope::tracedb
