// A small TCP key-value store implementing KvStore (runtime.h): the clock-alignment rendezvous of `tpscope capture`
// and of the tests. Not a general database: keys ≤ 4 KiB, values ≤ 1 MiB, every wait bounded, every connection
// bounded in count and in time (TcpKvLimits).
//
// Protocol (little-endian, one request → one reply per connection at a time):
//   request  = op:u8 ('S' set | 'F' set if absent | 'G' get | 'A' auth) key_len:u32 key
//              [value_len:u32 value (set, set if absent)] [timeout_ms:u32 (get)] [0:u32 (auth; the key is the token)]
//   reply    = status:u8 (0 ok, 1 timed out / missing, 2 refused: wrong token, 3 full: the store admits no more
//              clients) [value_len:u32 value (get, set if absent: ok)]
// A malformed request closes that connection; nothing else is affected.
//
// Token. A server started with a token (every store `tpscope capture` runs, on loopback too) answers a connection
// only after its first request, 'A' with that token; a wrong token gets "refused" and the connection is closed, any
// other first request closes it at once. A server without a token accepts 'A' with any token, so a client that has
// one (TPSCOPE_TOKEN) works with both.
//
// Strangers. Whoever can reach the port can connect, so a connection that has not presented the token is
// "pending": it has `loginTimeout` to do so and is dropped then; pending connections are capped apart from the
// authenticated ones (`maxPending`), and a new one past the cap drops the oldest pending one, never an
// authenticated one. A client that logs in sends its token at once, so strangers can cost a rank a retry at most
// (TcpKvClient::connect retries until its timeout), never its place. An authenticated client may stay idle for the
// whole job and wait in a get; only a request it leaves half-sent for `requestTimeout` drops it (slow-loris).
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

// What a server admits, and how long it waits for a client (see the top).
struct TcpKvLimits {
  // Authenticated connections at once. A job's store needs one per rank and one per node capture: capture sets it
  // from the job's size. One more gets "full" at its 'A' (a server without a token: is closed at accept).
  size_t maxClients = 4096;
  // Connections that have not presented the token yet (a server with a token), counted apart from maxClients.
  size_t maxPending = 256;
  // From accept to the token accepted; a pending connection silent or slow past it is dropped.
  std::chrono::milliseconds loginTimeout{5'000};
  // From the first byte of an authenticated client's request to its last. The client's own limit on a request is
  // 10 s, so a request left partial this long is a stalled or hostile client.
  std::chrono::milliseconds requestTimeout{30'000};
  // Replies a client has not read (bytes); a client that sends requests and never reads is dropped past it.
  size_t maxUnreadBytes = 8u << 20;
};

// What a server did with the connections it dropped or refused (totals since listen()), and what it holds now.
struct TcpKvServerStats {
  uint64_t loginTimeouts = 0;    // pending past loginTimeout
  uint64_t evictedPending = 0;   // pending, dropped for a newer one past maxPending
  uint64_t stalledRequests = 0;  // authenticated, a request partial past requestTimeout
  uint64_t malformed = 0;        // a malformed request, or a first request other than 'A' (server with a token)
  uint64_t wrongTokens = 0;
  uint64_t refusedFull = 0;      // past maxClients
  uint64_t unreadReplies = 0;    // past maxUnreadBytes
  uint64_t acceptFailures = 0;   // accept() failed (out of file descriptors: EMFILE, ENFILE)
  size_t authenticated = 0;      // connections now
  size_t pending = 0;
};

class TcpKvServer {
 public:
  // Listens on host:port (port 0: any free port; see port(); host "": every interface). nullptr and `error` set on
  // failure. A non-empty `token` admits only clients that present it (see the top).
  static std::unique_ptr<TcpKvServer> listen(std::string_view host, uint16_t port, std::string* error = nullptr,
                                             std::string_view token = {}, const TcpKvLimits& limits = {});
  ~TcpKvServer();  // stops the server thread, closes every connection
  TcpKvServer(const TcpKvServer&) = delete;
  TcpKvServer& operator=(const TcpKvServer&) = delete;

  uint16_t port() const;
  size_t keyCount() const;
  // Any thread; a snapshot (each figure read on its own).
  TcpKvServerStats stats() const;

  struct Impl;

 private:
  explicit TcpKvServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class TcpKvClient final : public KvStore {
 public:
  // Connects, retrying until `connectTimeout` (the server may start after the client, or drop this connection
  // among strangers' before it logged in), and presents `token` when it is not empty. nullptr on failure; a refused
  // token or a full store is not retried (`error` then names it: "refused: wrong token", "full: ...").
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
  // 'A' with the token; the server's status byte (0 ok, 2 refused, 3 full), or -1 when the exchange failed.
  int authenticate(std::string_view token) noexcept;

  std::mutex mutex_;  // one request at a time
  int fd_ = -1;
};

}  // namespace tpscope::probes
