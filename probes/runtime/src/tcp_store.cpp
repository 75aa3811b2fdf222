#include "tpscope/probes/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <vector>

namespace tpscope::probes {

namespace {

constexpr uint32_t kMaxKey = 4096;
constexpr uint32_t kMaxValue = 1u << 20;
constexpr uint32_t kMaxWaitMs = 10 * 60 * 1000;
constexpr uint8_t kOk = 0, kMissing = 1, kRefused = 2, kFull = 3;

using Clock = std::chrono::steady_clock;

void putU32(std::string* out, uint32_t v) {
  const unsigned char b[4] = {static_cast<unsigned char>(v), static_cast<unsigned char>(v >> 8),
                              static_cast<unsigned char>(v >> 16), static_cast<unsigned char>(v >> 24)};
  out->append(reinterpret_cast<const char*>(b), 4);
}
uint32_t getU32(const char* p) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
}

void setNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string errnoText(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Compares in a time that does not depend on where the first difference is.
bool sameToken(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// Resolves host:port to an IPv4/IPv6 address list.
addrinfo* resolve(std::string_view host, uint16_t port, bool passive, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  const std::string h(host);
  const std::string p = std::to_string(port);
  const int rc = getaddrinfo(h.empty() ? nullptr : h.c_str(), p.c_str(), &hints, &result);
  if (rc != 0) {
    if (error) *error = "resolve " + h + ": " + gai_strerror(rc);
    return nullptr;
  }
  return result;
}

}  // namespace

// ------------------------------------------------------------------------------------------------------------------
// Server

// One thread polls every connection. Each pass: expire what is due (gets, logins, stalled requests), accept new
// connections, read and answer, wake the gets waiting for keys just set, drop the dead, send the replies.
struct TcpKvServer::Impl {
  struct Conn {
    int fd = -1;
    std::string in, out;
    bool authed = false;   // presented the server's token (always true when the server has none)
    bool waiting = false;  // a get is pending: further requests wait
    bool dead = false;     // closed; removed at the end of the pass
    std::string waitKey;
    Clock::time_point deadline;                     // waiting: when the get answers "missing"
    Clock::time_point loginBy;                      // pending (!authed): when it is dropped
    std::optional<Clock::time_point> partialSince;  // authed: a request begun and not complete
  };
  // Why process() stopped reading a connection.
  enum class Verdict { kKeep, kMalformed, kWrongToken, kFull };
  static constexpr int kAcceptBatch = 64;  // accepts per pass: a flood cannot starve the connections already in
  static constexpr auto kAcceptPause = std::chrono::milliseconds(100);  // out of file descriptors, none to evict

  int listenFd = -1;
  int wakePipe[2] = {-1, -1};
  uint16_t port = 0;
  std::thread thread;
  std::map<std::string, std::string, std::less<>> data;
  std::atomic<size_t> keys{0};
  std::vector<Conn> conns;
  std::string token;  // empty: every client is admitted
  TcpKvLimits limits;
  size_t authed = 0, pending = 0;  // live connections by kind (server thread)
  Clock::time_point acceptPausedUntil{};
  struct {
    std::atomic<uint64_t> loginTimeouts{0}, evictedPending{0}, stalledRequests{0}, malformed{0}, wrongTokens{0},
        refusedFull{0}, unreadReplies{0}, acceptFailures{0};
    std::atomic<size_t> authenticated{0}, pending{0};
  } stats;

  ~Impl() {
    if (thread.joinable()) {
      const char c = 'q';
      [[maybe_unused]] ssize_t n = write(wakePipe[1], &c, 1);
      thread.join();
    }
    for (Conn& c : conns)
      if (!c.dead) close(c.fd);
    if (listenFd >= 0) close(listenFd);
    if (wakePipe[0] >= 0) close(wakePipe[0]);
    if (wakePipe[1] >= 0) close(wakePipe[1]);
  }

  static void reply(Conn& c, uint8_t status, const std::string* value) {
    c.out.push_back(static_cast<char>(status));
    if (value != nullptr) {
      putU32(&c.out, static_cast<uint32_t>(value->size()));
      c.out += *value;
    }
  }

  // Closes `c` and counts why (one of `stats`' counters), after a last status byte when one is given (wrong token,
  // full). Counted first: a client that saw the byte finds the drop in stats().
  void drop(Conn& c, std::atomic<uint64_t>& why, std::optional<uint8_t> lastStatus = std::nullopt) {
    if (c.dead) return;
    ++why;
    --(c.authed ? authed : pending);
    publishStats();
    if (lastStatus) {
      const char byte = static_cast<char>(*lastStatus);
      [[maybe_unused]] ssize_t n = send(c.fd, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    close(c.fd);
    c.dead = true;
  }

  // The client left or its socket failed: closed, not counted as a drop.
  void closeGone(Conn& c) {
    close(c.fd);
    c.dead = true;
    --(c.authed ? authed : pending);
  }

  // 'A': the token, checked once per connection; past maxClients the store is full.
  Verdict login(Conn& c, std::string_view presented) {
    if (!token.empty() && !sameToken(presented, token)) return Verdict::kWrongToken;
    if (!c.authed) {
      if (authed >= limits.maxClients) return Verdict::kFull;
      c.authed = true;
      --pending;
      ++authed;
    }
    reply(c, kOk, nullptr);
    return Verdict::kKeep;
  }

  // Parses and answers complete requests.
  Verdict process(Conn& c, std::vector<std::string>* setKeys) {
    for (;;) {
      if (c.waiting || c.in.empty()) return Verdict::kKeep;
      const char op = c.in[0];
      if (op != 'S' && op != 'G' && op != 'A' && op != 'F') return Verdict::kMalformed;
      if (!c.authed && op != 'A') return Verdict::kMalformed;  // the first request must present the token
      if (c.in.size() < 5) return Verdict::kKeep;
      const uint32_t keyLen = getU32(c.in.data() + 1);
      if (keyLen > kMaxKey) return Verdict::kMalformed;
      size_t need = 5 + size_t{keyLen} + 4;
      if (c.in.size() < need) return Verdict::kKeep;
      std::string key = c.in.substr(5, keyLen);
      const uint32_t arg = getU32(c.in.data() + 5 + keyLen);
      if (op == 'A') {
        if (const Verdict v = login(c, key); v != Verdict::kKeep) return v;
      } else if (op == 'S' || op == 'F') {
        if (arg > kMaxValue) return Verdict::kMalformed;
        need += arg;
        if (c.in.size() < need) return Verdict::kKeep;
        if (op == 'S') {
          data.insert_or_assign(key, c.in.substr(5 + keyLen + 4, arg));
          reply(c, kOk, nullptr);
        } else {  // the first writer's value stays; both learn it
          const auto [it, inserted] = data.try_emplace(key, c.in.substr(5 + keyLen + 4, arg));
          reply(c, kOk, &it->second);
        }
        keys.store(data.size());
        setKeys->push_back(std::move(key));
      } else {
        auto it = data.find(key);
        if (it != data.end()) {
          reply(c, kOk, &it->second);
        } else {
          c.waiting = true;
          c.waitKey = std::move(key);
          c.deadline = Clock::now() + std::chrono::milliseconds(std::min(arg, kMaxWaitMs));
        }
      }
      c.in.erase(0, need);
    }
  }

  // process() and what follows from its verdict: the connection dropped with its cause counted, or its partial
  // request timed from its first byte (a get waiting, or nothing buffered, stops the clock).
  void processAndJudge(Conn& c, std::vector<std::string>* setKeys, Clock::time_point now) {
    switch (process(c, setKeys)) {
      case Verdict::kKeep:
        break;
      case Verdict::kMalformed:
        return drop(c, stats.malformed);
      case Verdict::kWrongToken:
        return drop(c, stats.wrongTokens, kRefused);
      case Verdict::kFull:
        return drop(c, stats.refusedFull, kFull);
    }
    if (c.out.size() > limits.maxUnreadBytes) return drop(c, stats.unreadReplies);
    if (c.waiting || c.in.empty()) {
      c.partialSince.reset();
    } else if (!c.partialSince) {
      c.partialSince = now;
    }
  }

  // Answers the gets that are due, drops the logins and requests that are overdue; returns poll's timeout (ms, -1:
  // none).
  int expire(Clock::time_point now) {
    Clock::time_point next = Clock::time_point::max();
    const auto due = [&](Clock::time_point at) {
      if (at <= now) return true;
      next = std::min(next, at);
      return false;
    };
    for (Conn& c : conns) {
      if (c.dead) continue;
      if (!c.authed) {
        if (due(c.loginBy)) drop(c, stats.loginTimeouts);
      } else if (c.waiting) {
        if (due(c.deadline)) {
          c.waiting = false;
          reply(c, kMissing, nullptr);
          std::vector<std::string> more;  // a pipelined request after the get: answered now
          processAndJudge(c, &more, now);
        }
      } else if (c.partialSince && due(*c.partialSince + limits.requestTimeout)) {
        drop(c, stats.stalledRequests);
      }
    }
    if (acceptPausedUntil > now) next = std::min(next, acceptPausedUntil);
    if (next == Clock::time_point::max()) return -1;
    return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(next - now).count());
  }

  // The oldest pending connection is dropped to make room; false when there is none.
  bool evictOldestPending() {
    Conn* oldest = nullptr;
    for (Conn& c : conns)
      if (!c.dead && !c.authed && (oldest == nullptr || c.loginBy < oldest->loginBy)) oldest = &c;
    if (oldest == nullptr) return false;
    drop(*oldest, stats.evictedPending);
    return true;
  }

  void acceptNew(Clock::time_point now) {
    for (int i = 0; i < kAcceptBatch; ++i) {
      const int fd = accept4(listenFd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno != EMFILE && errno != ENFILE) return;  // EAGAIN: none left; anything else: the next pass
        ++stats.acceptFailures;
        if (evictOldestPending()) continue;
        acceptPausedUntil = now + kAcceptPause;  // the listen socket stays readable: do not spin on it
        return;
      }
      Conn c;
      c.fd = fd;
      c.authed = token.empty();
      if (c.authed) {
        if (authed >= limits.maxClients) {
          close(fd);
          ++stats.refusedFull;
          continue;
        }
        ++authed;
      } else {
        if (pending >= limits.maxPending) evictOldestPending();
        ++pending;
        c.loginBy = now + limits.loginTimeout;
      }
      setNoDelay(fd);
      conns.push_back(std::move(c));
    }
  }

  // Reads and answers, then writes what it can; `ev` is the connection's poll result.
  void serviceIo(Conn& c, short ev, std::vector<std::string>* setKeys, Clock::time_point now) {
    if (ev & (POLLIN | POLLHUP | POLLERR)) {
      char buf[65536];
      const ssize_t r = read(c.fd, buf, sizeof buf);
      if (r > 0) {
        c.in.append(buf, static_cast<size_t>(r));
        if (c.in.size() > kMaxValue + kMaxKey + 64) return drop(c, stats.malformed);
        processAndJudge(c, setKeys, now);
        if (c.dead) return;
      } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        return closeGone(c);
      }
    }
    if ((ev & POLLOUT) && !c.out.empty()) {
      const ssize_t w = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (w > 0) {
        c.out.erase(0, static_cast<size_t>(w));
      } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
        closeGone(c);
      }
    }
  }

  // Wakes the gets waiting for keys just set, then continues their pipelines (which may set keys in turn).
  void wakeWaiters(std::vector<std::string> setKeys, Clock::time_point now) {
    while (!setKeys.empty()) {
      std::vector<std::string> more;
      for (Conn& c : conns) {
        if (c.dead || !c.waiting) continue;
        auto it = data.find(c.waitKey);
        if (it == data.end()) continue;
        c.waiting = false;
        reply(c, kOk, &it->second);
        processAndJudge(c, &more, now);
      }
      setKeys = std::move(more);
    }
  }

  void publishStats() {
    stats.authenticated.store(authed);
    stats.pending.store(pending);
  }

  void run() {
    std::vector<pollfd> fds;
    std::vector<std::string> setKeys;
    for (;;) {
      const int timeoutMs = expire(Clock::now());
      std::erase_if(conns, [](const Conn& c) { return c.dead; });
      publishStats();
      fds.clear();
      fds.push_back({wakePipe[0], POLLIN, 0});
      const bool accepting = acceptPausedUntil <= Clock::now();
      fds.push_back({listenFd, static_cast<short>(accepting ? POLLIN : 0), 0});
      for (const Conn& c : conns) {
        fds.push_back({c.fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      }
      const int n = poll(fds.data(), fds.size(), timeoutMs);
      if (n < 0 && errno != EINTR) return;
      if (fds[0].revents != 0) return;  // shutdown
      const auto now = Clock::now();
      // Connections first, then new ones: conns[i] is fds[i + 2] until the accepts append.
      setKeys.clear();
      for (size_t i = 0; i < conns.size() && i + 2 < fds.size(); ++i) {
        if (!conns[i].dead && fds[i + 2].revents != 0) serviceIo(conns[i], fds[i + 2].revents, &setKeys, now);
      }
      if (fds[1].revents & POLLIN) acceptNew(now);
      if (!setKeys.empty()) wakeWaiters(std::move(setKeys), now);
      // Fresh replies at once (most fit in the socket buffer); the rest wait for POLLOUT. The figures first: a
      // client that has its reply finds its login in stats().
      publishStats();
      for (Conn& c : conns) {
        if (c.dead || c.out.empty()) continue;
        const ssize_t w = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) c.out.erase(0, static_cast<size_t>(w));
      }
    }
  }
};

TcpKvServer::TcpKvServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpKvServer::~TcpKvServer() = default;
uint16_t TcpKvServer::port() const { return impl_->port; }
size_t TcpKvServer::keyCount() const { return impl_->keys.load(); }

TcpKvServerStats TcpKvServer::stats() const {
  const auto& s = impl_->stats;
  TcpKvServerStats out;
  out.loginTimeouts = s.loginTimeouts.load();
  out.evictedPending = s.evictedPending.load();
  out.stalledRequests = s.stalledRequests.load();
  out.malformed = s.malformed.load();
  out.wrongTokens = s.wrongTokens.load();
  out.refusedFull = s.refusedFull.load();
  out.unreadReplies = s.unreadReplies.load();
  out.acceptFailures = s.acceptFailures.load();
  out.authenticated = s.authenticated.load();
  out.pending = s.pending.load();
  return out;
}

std::unique_ptr<TcpKvServer> TcpKvServer::listen(std::string_view host, uint16_t port, std::string* error,
                                                 std::string_view token, const TcpKvLimits& limits) {
  auto impl = std::make_unique<Impl>();
  impl->token.assign(token);
  impl->limits = limits;
  addrinfo* addrs = resolve(host, port, true, error);
  if (addrs == nullptr) return nullptr;
  for (addrinfo* a = addrs; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      impl->listenFd = fd;
      break;
    }
    if (error) *error = errnoText("bind/listen");
    close(fd);
  }
  freeaddrinfo(addrs);
  if (impl->listenFd < 0) return nullptr;
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(impl->listenFd, reinterpret_cast<sockaddr*>(&bound), &len);
  impl->port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                 : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (pipe2(impl->wakePipe, O_CLOEXEC) != 0) {
    if (error) *error = errnoText("pipe");
    return nullptr;
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<TcpKvServer>(new TcpKvServer(std::move(impl)));
}

// ------------------------------------------------------------------------------------------------------------------
// Client

std::unique_ptr<TcpKvClient> TcpKvClient::connect(std::string_view host, uint16_t port,
                                                  std::chrono::milliseconds connectTimeout, std::string* error,
                                                  std::string_view token) {
  const auto deadline = Clock::now() + connectTimeout;
  std::string lastError = "timed out";
  for (;;) {
    addrinfo* addrs = resolve(host, port, false, &lastError);
    for (addrinfo* a = addrs; a != nullptr; a = a->ai_next) {
      const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        freeaddrinfo(addrs);
        setNoDelay(fd);
        std::unique_ptr<TcpKvClient> client(new TcpKvClient(fd));
        if (token.empty()) return client;
        const int status = client->authenticate(token);
        if (status == kOk) return client;
        if (status == kRefused) {
          if (error) *error = std::string(host) + ":" + std::to_string(port) + ": refused: wrong token";
          return nullptr;
        }
        if (status == kFull) {
          if (error)
            *error = std::string(host) + ":" + std::to_string(port) +
                     ": full: the store admits no more clients (its limit is the job's ranks and nodes)";
          return nullptr;
        }
        lastError =
            "the server closed the connection (it wants a token, dropped this one among others that had "
            "not logged in yet, or is not a tpscope store)";
        addrs = nullptr;  // freed above; try again until the deadline
        break;
      }
      lastError = errnoText("connect");
      close(fd);
    }
    if (addrs != nullptr) freeaddrinfo(addrs);
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (error) *error = std::string(host) + ":" + std::to_string(port) + ": " + lastError;
  return nullptr;
}

std::unique_ptr<TcpKvClient> TcpKvClient::connect(std::string_view hostPort, std::chrono::milliseconds connectTimeout,
                                                  std::string* error, std::string_view token) {
  const size_t colon = hostPort.rfind(':');
  unsigned port = 0;
  if (colon == std::string_view::npos || colon + 1 >= hostPort.size() ||
      std::sscanf(std::string(hostPort.substr(colon + 1)).c_str(), "%u", &port) != 1 || port == 0 || port > 65535) {
    if (error) *error = "expected host:port, got '" + std::string(hostPort) + "'";
    return nullptr;
  }
  std::string_view host = hostPort.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return connect(host, static_cast<uint16_t>(port), connectTimeout, error, token);
}

int TcpKvClient::authenticate(std::string_view token) noexcept {
  if (token.size() > kMaxKey) return -1;
  try {
    std::lock_guard lock(mutex_);
    std::string msg;
    msg.push_back('A');
    putU32(&msg, static_cast<uint32_t>(token.size()));
    msg.append(token);
    putU32(&msg, 0);
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    uint8_t status = kMissing;
    if (!sendAll(msg.data(), msg.size(), deadline) || !recvAll(&status, 1, deadline)) return -1;
    return status;
  } catch (...) {
    return -1;
  }
}

bool TcpKvClient::connected() noexcept {
  std::lock_guard lock(mutex_);
  return fd_ >= 0;
}

TcpKvClient::~TcpKvClient() {
  if (fd_ >= 0) close(fd_);
}

bool TcpKvClient::sendAll(const void* data, size_t size, Clock::time_point deadline) noexcept {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd pfd{fd_, POLLOUT, 0};
    if (poll(&pfd, 1, static_cast<int>(left)) <= 0) {
      if (errno == EINTR) continue;
      return false;
    }
    const ssize_t n = send(fd_, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return false;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool TcpKvClient::recvAll(void* data, size_t size, Clock::time_point deadline) noexcept {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd pfd{fd_, POLLIN, 0};
    const int r = poll(&pfd, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t n = recv(fd_, p, size, MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return false;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool TcpKvClient::set(std::string_view key, std::string_view value) noexcept {
  if (key.size() > kMaxKey || value.size() > kMaxValue) return false;
  try {
    std::lock_guard lock(mutex_);
    if (fd_ < 0) return false;
    std::string msg;
    msg.reserve(9 + key.size() + value.size());
    msg.push_back('S');
    putU32(&msg, static_cast<uint32_t>(key.size()));
    msg.append(key);
    putU32(&msg, static_cast<uint32_t>(value.size()));
    msg.append(value);
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    uint8_t status = kMissing;
    if (!sendAll(msg.data(), msg.size(), deadline) || !recvAll(&status, 1, deadline)) {
      close(fd_);  // the stream is out of step now
      fd_ = -1;
      return false;
    }
    return status == kOk;
  } catch (...) {
    return false;
  }
}

std::optional<std::string> TcpKvClient::get(std::string_view key, std::chrono::milliseconds timeout) noexcept {
  if (key.size() > kMaxKey) return std::nullopt;
  try {
    const auto waitMs = static_cast<uint32_t>(std::clamp<int64_t>(timeout.count(), 0, kMaxWaitMs));
    std::string msg;
    msg.push_back('G');
    putU32(&msg, static_cast<uint32_t>(key.size()));
    msg.append(key);
    putU32(&msg, waitMs);
    // The server answers "missing" at its deadline; ours leaves it 5 s to do so.
    return valueRequest(msg, std::chrono::milliseconds(waitMs) + std::chrono::seconds(5));
  } catch (...) {
    return std::nullopt;
  }
}

std::optional<std::string> TcpKvClient::setIfAbsent(std::string_view key, std::string_view value) noexcept {
  if (key.size() > kMaxKey || value.size() > kMaxValue) return std::nullopt;
  try {
    std::string msg;
    msg.push_back('F');
    putU32(&msg, static_cast<uint32_t>(key.size()));
    msg.append(key);
    putU32(&msg, static_cast<uint32_t>(value.size()));
    msg.append(value);
    return valueRequest(msg, std::chrono::seconds(10));
  } catch (...) {
    return std::nullopt;
  }
}

std::optional<std::string> TcpKvClient::valueRequest(const std::string& msg, std::chrono::milliseconds limit) noexcept {
  try {
    std::lock_guard lock(mutex_);
    if (fd_ < 0) return std::nullopt;
    const auto deadline = Clock::now() + limit;
    uint8_t status = kMissing;
    auto fail = [&]() -> std::optional<std::string> {
      close(fd_);
      fd_ = -1;
      return std::nullopt;
    };
    if (!sendAll(msg.data(), msg.size(), deadline) || !recvAll(&status, 1, deadline)) return fail();
    if (status != kOk) return std::nullopt;
    char lenBytes[4];
    if (!recvAll(lenBytes, 4, deadline)) return fail();
    const uint32_t len = getU32(lenBytes);
    if (len > kMaxValue) return fail();
    std::string value(len, '\0');
    if (len > 0 && !recvAll(value.data(), len, deadline)) return fail();
    return value;
  } catch (...) {
    return std::nullopt;
  }
}

}  // namespace tpscope::probes
