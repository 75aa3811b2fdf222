// A small TCP key-value store implementing KvStore (runtime.h): the clock-alignment rendezvous of `tpscope capture`
// and of the tests. Not a general database: keys ≤ 4 KiB, values ≤ 1 MiB, at most 4096 clients, every wait bounded.
//
// Protocol (little-endian, one request → one reply per connection at a time):
//   request  = op:u8 ('S' set | 'F' set if absent | 'G' get | 'A' auth) key_len:u32 key
//              [value_len:u32 value (set, set if absent)] [timeout_ms:u32 (get)] [0:u32 (auth; the key is the token)]
//   reply    = status:u8 (0 ok, 1 timed out / missing, 2 refused) [value_len:u32 value (get, set if absent: ok)]
// A malformed request closes that connection; nothing else is affected.
//
// Token. A server started with a token (one that listens beyond loopback: `tpscope capture --nnodes`) answers a
// connection only after its first request, 'A' with that token; a wrong token gets "refused" and the connection is
// closed, any other first request closes it at once. A server without a token accepts 'A' with any token, so a
// client that has one (TPSCOPE_TOKEN) works with both.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "tpscope/probes/runtime.h"

namespace tpscope::probes {

class TcpKvServer {
 public:
  // Listens on host:port (port 0: any free port; see port(); host "": every interface). nullptr and `error` set on
  // failure. A non-empty `token` admits only clients that present it (see the top).
  static std::unique_ptr<TcpKvServer> listen(std::string_view host, uint16_t port, std::string* error = nullptr,
                                             std::string_view token = {});
  ~TcpKvServer();  // stops the server thread, closes every connection
  TcpKvServer(const TcpKvServer&) = delete;
  TcpKvServer& operator=(const TcpKvServer&) = delete;

  uint16_t port() const;
  size_t keyCount() const;

  struct Impl;

 private:
  explicit TcpKvServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class TcpKvClient final : public KvStore {
 public:
  // Connects, retrying until `connectTimeout` (the server may start after the client), and presents `token` when
  // it is not empty. nullptr on failure; a refused token is not retried (`error` then starts with "refused").
  static std::unique_ptr<TcpKvClient> connect(std::string_view host, uint16_t port,
                                              std::chrono::milliseconds connectTimeout = std::chrono::seconds(10),
                                              std::string* error = nullptr, std::string_view token = {});
  // "host:port".
  static std::unique_ptr<TcpKvClient> connect(std::string_view hostPort,
                                              std::chrono::milliseconds connectTimeout = std::chrono::seconds(10),
                                              std::string* error = nullptr, std::string_view token = {});
  ~TcpKvClient() override;

  bool set(std::string_view key, std::string_view value) noexcept override;
  std::optional<std::string> get(std::string_view key, std::chrono::milliseconds timeout) noexcept override;
  // Sets `key` to `value` unless it is set; returns the value it holds then — ours, or the first writer's (one
  // winner among clients racing for it). nullopt on failure.
  std::optional<std::string> setIfAbsent(std::string_view key, std::string_view value) noexcept;
  // False once the connection failed (the server went away): every later call fails too.
  bool connected() noexcept;

 private:
  explicit TcpKvClient(int fd) : fd_(fd) {}
  bool sendAll(const void* data, size_t size, std::chrono::steady_clock::time_point deadline) noexcept;
  bool recvAll(void* data, size_t size, std::chrono::steady_clock::time_point deadline) noexcept;
  // Sends `msg` and reads a reply that carries a value (get, set if absent) within `limit`.
  std::optional<std::string> valueRequest(const std::string& msg, std::chrono::milliseconds limit) noexcept;
  // 'A' with the token; the server's status byte (0 ok, 2 refused), or -1 when the exchange failed.
  int authenticate(std::string_view token) noexcept;

  std::mutex mutex_;  // one request at a time
  int fd_ = -1;
};

}  // namespace tpscope::probes
