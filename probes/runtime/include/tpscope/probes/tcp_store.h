// A small TCP key-value store implementing KvStore (runtime.h): the clock-alignment rendezvous of `tpscope capture`
// and of the tests. Not a general database: keys ≤ 4 KiB, values ≤ 1 MiB, at most 4096 clients, every wait bounded.
//
// Protocol (little-endian, one request → one reply per connection at a time):
//   request  = op:u8 ('S' set | 'G' get) key_len:u32 key [value_len:u32 value   (set)] [timeout_ms:u32 (get)]
//   reply    = status:u8 (0 ok, 1 timed out / missing) [value_len:u32 value (get, ok)]
// A malformed request closes that connection; nothing else is affected.
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
  // Listens on host:port (port 0: any free port; see port()). nullptr and `error` set on failure.
  static std::unique_ptr<TcpKvServer> listen(std::string_view host, uint16_t port, std::string* error = nullptr);
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
  // Connects, retrying until `connectTimeout` (the server may start after the client). nullptr on failure.
  static std::unique_ptr<TcpKvClient> connect(std::string_view host, uint16_t port,
                                              std::chrono::milliseconds connectTimeout = std::chrono::seconds(10),
                                              std::string* error = nullptr);
  // "host:port".
  static std::unique_ptr<TcpKvClient> connect(std::string_view hostPort,
                                              std::chrono::milliseconds connectTimeout = std::chrono::seconds(10),
                                              std::string* error = nullptr);
  ~TcpKvClient() override;

  bool set(std::string_view key, std::string_view value) noexcept override;
  std::optional<std::string> get(std::string_view key, std::chrono::milliseconds timeout) noexcept override;

 private:
  explicit TcpKvClient(int fd) : fd_(fd) {}
  bool sendAll(const void* data, size_t size, std::chrono::steady_clock::time_point deadline) noexcept;
  bool recvAll(void* data, size_t size, std::chrono::steady_clock::time_point deadline) noexcept;

  std::mutex mutex_;  // one request at a time
  int fd_ = -1;
};

}  // namespace tpscope::probes
