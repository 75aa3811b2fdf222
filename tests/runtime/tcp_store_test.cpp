// The loopback key-value store: set/get, a get that waits for a later set, timeouts, many clients, bad input, the
// token; and its guards against strangers (issue #31): login deadline, slow-loris, the pending cap apart from the
// ranks', as many logged-in clients as the job has ranks (8,192 at once).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "tpscope/probes/tcp_store.h"

namespace tp = tpscope::probes;

namespace {

std::unique_ptr<tp::TcpKvServer> server() {
  std::string error;
  auto s = tp::TcpKvServer::listen("127.0.0.1", 0, &error);
  EXPECT_TRUE(s) << error;
  return s;
}

TEST(TcpStore, SetThenGet) {
  auto s = server();
  ASSERT_TRUE(s);
  EXPECT_NE(s->port(), 0);
  auto c = tp::TcpKvClient::connect("127.0.0.1:" + std::to_string(s->port()));
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->set("a", "1"));
  EXPECT_TRUE(c->set("b", std::string(100'000, 'x')));
  EXPECT_TRUE(c->set("empty", ""));
  EXPECT_EQ(c->get("a", std::chrono::milliseconds(100)), "1");
  EXPECT_EQ(c->get("b", std::chrono::milliseconds(100))->size(), 100'000u);
  EXPECT_EQ(c->get("empty", std::chrono::milliseconds(100)), "");
  EXPECT_TRUE(c->set("a", "2"));
  EXPECT_EQ(c->get("a", std::chrono::milliseconds(100)), "2");
  EXPECT_EQ(s->keyCount(), 3u);
}

TEST(TcpStore, GetWaitsForALaterSet) {
  auto s = server();
  ASSERT_TRUE(s);
  auto reader = tp::TcpKvClient::connect("127.0.0.1", s->port());
  auto writer = tp::TcpKvClient::connect("127.0.0.1", s->port());
  ASSERT_TRUE(reader && writer);
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(writer->set("late", "here"));
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(reader->get("late", std::chrono::seconds(5)), "here");
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(90));
  t.join();
}

TEST(TcpStore, GetTimesOutAndTheConnectionStaysUsable) {
  auto s = server();
  ASSERT_TRUE(s);
  auto c = tp::TcpKvClient::connect("127.0.0.1", s->port());
  ASSERT_TRUE(c);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(c->get("never", std::chrono::milliseconds(150)).has_value());
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, std::chrono::milliseconds(140));
  EXPECT_LT(waited, std::chrono::seconds(3));
  EXPECT_TRUE(c->set("after", "ok"));
  EXPECT_EQ(c->get("after", std::chrono::milliseconds(100)), "ok");
}

TEST(TcpStore, ManyClientsAtOnce) {
  auto s = server();
  ASSERT_TRUE(s);
  constexpr int kClients = 32;
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto c = tp::TcpKvClient::connect("127.0.0.1", s->port());
      if (!c) return;
      // Each waits for its left neighbour's key, then publishes its own: a chain through the server.
      if (i > 0 && c->get("k" + std::to_string(i - 1), std::chrono::seconds(10)) != std::to_string(i - 1)) return;
      if (c->set("k" + std::to_string(i), std::to_string(i))) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kClients);
}

TEST(TcpStore, GarbageClosesOnlyThatConnection) {
  auto s = server();
  ASSERT_TRUE(s);
  auto good = tp::TcpKvClient::connect("127.0.0.1", s->port());
  ASSERT_TRUE(good);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(s->port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const char junk[] = "Xgarbage\xff\xff\xff\xff";
  ASSERT_GT(send(fd, junk, sizeof junk, MSG_NOSIGNAL), 0);
  char buf[16];
  EXPECT_EQ(recv(fd, buf, sizeof buf, 0), 0);  // closed by the server
  close(fd);
  // A huge declared key is refused the same way, without allocating it.
  const int fd2 = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(fd2, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const char huge[] = {'S', '\xff', '\xff', '\xff', '\x7f'};
  ASSERT_GT(send(fd2, huge, sizeof huge, MSG_NOSIGNAL), 0);
  EXPECT_EQ(recv(fd2, buf, sizeof buf, 0), 0);
  close(fd2);
  EXPECT_TRUE(good->set("still", "works"));
  EXPECT_EQ(good->get("still", std::chrono::milliseconds(100)), "works");
}

TEST(TcpStore, ConnectToNothingFailsWithinTheTimeout) {
  // A port nobody listens on (bound, then closed).
  uint16_t port;
  {
    auto s = server();
    ASSERT_TRUE(s);
    port = s->port();
  }
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  auto c = tp::TcpKvClient::connect("127.0.0.1", port, std::chrono::milliseconds(200), &error);
  EXPECT_FALSE(c);
  EXPECT_FALSE(error.empty());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_FALSE(tp::TcpKvClient::connect("no-port-here", std::chrono::milliseconds(10), &error));
}

TEST(TcpStore, AClientSurvivesTheServerGoingAway) {
  auto s = server();
  ASSERT_TRUE(s);
  auto c = tp::TcpKvClient::connect("127.0.0.1", s->port());
  ASSERT_TRUE(c);
  s.reset();
  EXPECT_FALSE(c->get("x", std::chrono::milliseconds(100)).has_value());
  EXPECT_FALSE(c->set("x", "y"));
}

// Set-if-absent: of clients racing for one key, exactly one value holds and every client learns it (the first stop
// claimed on the control channel of a multi-node capture).
TEST(TcpStore, SetIfAbsentHasOneWinner) {
  auto s = server();
  ASSERT_TRUE(s);
  auto waiter = tp::TcpKvClient::connect("127.0.0.1", s->port());
  ASSERT_TRUE(waiter);
  std::thread wait([&] { EXPECT_TRUE(waiter->get("stop", std::chrono::seconds(5)).has_value()); });  // woken by it
  constexpr int kClients = 8;
  std::vector<std::string> seen(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      auto c = tp::TcpKvClient::connect("127.0.0.1", s->port());
      if (c) seen[i] = c->setIfAbsent("stop", "node " + std::to_string(i)).value_or("failed");
    });
  for (auto& t : threads) t.join();
  wait.join();
  ASSERT_EQ(seen[0].rfind("node ", 0), 0u) << seen[0];
  for (const auto& v : seen) EXPECT_EQ(v, seen[0]);
  auto c = tp::TcpKvClient::connect("127.0.0.1", s->port());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->get("stop", std::chrono::milliseconds(100)), seen[0]);
  EXPECT_EQ(c->setIfAbsent("other", ""), "");
  EXPECT_EQ(s->keyCount(), 2u);
}

// A store with a token (the control channel of `tpscope capture --nnodes`): the right token gets in, a wrong one is
// refused with a clear error and not retried, a client that presents none is dropped at its first request.
TEST(TcpStore, TokenAdmitsOnlyTheJob) {
  std::string error;
  auto s = tp::TcpKvServer::listen("127.0.0.1", 0, &error, "job-secret");
  ASSERT_TRUE(s) << error;
  auto good = tp::TcpKvClient::connect("127.0.0.1", s->port(), std::chrono::seconds(2), &error, "job-secret");
  ASSERT_TRUE(good) << error;
  EXPECT_TRUE(good->set("k", "v"));
  EXPECT_EQ(good->get("k", std::chrono::milliseconds(100)), "v");

  error.clear();
  const auto t0 = std::chrono::steady_clock::now();
  auto wrong = tp::TcpKvClient::connect("127.0.0.1", s->port(), std::chrono::seconds(5), &error, "job-secreT");
  EXPECT_FALSE(wrong);
  EXPECT_NE(error.find("refused: wrong token"), std::string::npos) << error;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));  // refused at once, not retried
  EXPECT_FALSE(tp::TcpKvClient::connect("127.0.0.1", s->port(), std::chrono::seconds(1), &error, "job"));

  auto none = tp::TcpKvClient::connect("127.0.0.1", s->port());  // connects (TCP), presents nothing
  ASSERT_TRUE(none);
  EXPECT_FALSE(none->get("k", std::chrono::milliseconds(100)).has_value());
  EXPECT_FALSE(none->connected());
  EXPECT_FALSE(none->set("k", "overwritten"));
  EXPECT_EQ(good->get("k", std::chrono::milliseconds(100)), "v");  // nothing the others sent got in
  EXPECT_EQ(s->keyCount(), 1u);

  // A store without a token admits a client that presents one (ranks with TPSCOPE_TOKEN on a one-node capture).
  auto open = server();
  ASSERT_TRUE(open);
  auto c = tp::TcpKvClient::connect("127.0.0.1", open->port(), std::chrono::seconds(2), &error, "any");
  ASSERT_TRUE(c) << error;
  EXPECT_TRUE(c->set("a", "1"));
  EXPECT_TRUE(c->connected());
}

// ---- guards (issue #31) -------------------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::unique_ptr<tp::TcpKvServer> guardedServer(const tp::TcpKvLimits& limits, const char* token = "tok") {
  std::string error;
  auto s = tp::TcpKvServer::listen("127.0.0.1", 0, &error, token, limits);
  EXPECT_TRUE(s) << error;
  return s;
}

// A raw TCP connection to the store on loopback (a stranger: it speaks the protocol only as far as it likes).
int rawConnect(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool sendBytes(int fd, const std::string& bytes) {
  return send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

std::string u32(uint32_t v) {
  return {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16), static_cast<char>(v >> 24)};
}

std::string authRequest(const std::string& token) {
  return "A" + u32(static_cast<uint32_t>(token.size())) + token + u32(0);
}

// Waits up to `limit` for the server to close `fd` (reads and discards replies); true when it did.
bool closedByServer(int fd, milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buf[64];
    const ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
}

// A connection that never presents the token is dropped at the login deadline, and so is one that trickles its
// login a byte at a time (slow-loris): the deadline runs from accept, not from the last byte. Garbage is dropped
// at once. Broken guard: the idle and trickling connections stay open and the test fails.
TEST(TcpStoreGuards, SilentSlowAndGarbageStrangersAreDroppedAtTheLoginDeadline) {
  tp::TcpKvLimits limits;
  limits.loginTimeout = milliseconds(400);
  auto s = guardedServer(limits);
  ASSERT_TRUE(s);
  const int idle = rawConnect(s->port()), slow = rawConnect(s->port()), junk = rawConnect(s->port());
  ASSERT_GE(idle, 0);
  ASSERT_GE(slow, 0);
  ASSERT_GE(junk, 0);
  ASSERT_TRUE(sendBytes(junk, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_TRUE(closedByServer(junk, milliseconds(3000)));
  // The slow client sends a valid login, one byte every 100 ms: it would need 1.3 s.
  const std::string login = authRequest("tok");
  const auto t0 = Clock::now();
  bool slowClosed = false;
  for (char byte : login.substr(0, login.size() - 1)) {
    if (!sendBytes(slow, std::string(1, byte)) || closedByServer(slow, milliseconds(100))) {
      slowClosed = true;
      break;
    }
  }
  EXPECT_TRUE(slowClosed || closedByServer(slow, milliseconds(3000))) << "the slow-loris login was never dropped";
  EXPECT_TRUE(closedByServer(idle, milliseconds(3000))) << "a silent connection outlived the login deadline";
  EXPECT_GE(Clock::now() - t0, milliseconds(350));
  close(idle);
  close(slow);
  close(junk);
  const auto st = s->stats();
  EXPECT_EQ(st.loginTimeouts, 2u);
  EXPECT_EQ(st.malformed, 1u);
  EXPECT_EQ(st.pending, 0u);
  // A client that logs in at once is not affected.
  std::string error;
  auto c = tp::TcpKvClient::connect("127.0.0.1", s->port(), std::chrono::seconds(2), &error, "tok");
  ASSERT_TRUE(c) << error;
  EXPECT_TRUE(c->set("k", "v"));
}

// A logged-in client may stay idle and wait in a get far longer than any deadline (the ranks do, for the whole run);
// one that leaves a request half-sent is dropped once the request deadline passes. Broken guard: either the waiting
// client is dropped, or the half-sent request is not.
TEST(TcpStoreGuards, ALoggedInClientMayIdleAndWaitButNotStallAHalfSentRequest) {
  tp::TcpKvLimits limits;
  limits.loginTimeout = milliseconds(300);
  limits.requestTimeout = milliseconds(300);
  auto s = guardedServer(limits);
  ASSERT_TRUE(s);
  std::string error;
  auto idler = tp::TcpKvClient::connect("127.0.0.1", s->port(), std::chrono::seconds(2), &error, "tok");
  auto waiter = tp::TcpKvClient::connect("127.0.0.1", s->port(), std::chrono::seconds(2), &error, "tok");
  auto writer = tp::TcpKvClient::connect("127.0.0.1", s->port(), std::chrono::seconds(2), &error, "tok");
  ASSERT_TRUE(idler && waiter && writer) << error;
  const int stall = rawConnect(s->port());
  ASSERT_GE(stall, 0);
  ASSERT_TRUE(sendBytes(stall, authRequest("tok")));
  char status = 1;
  ASSERT_EQ(recv(stall, &status, 1, 0), 1);
  EXPECT_EQ(status, 0);
  ASSERT_TRUE(sendBytes(stall, "S" + u32(3) + "ke"));  // a set with 1 byte of its key still to come, never sent

  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(1000));
    EXPECT_TRUE(writer->set("late", "here"));
  });
  EXPECT_EQ(waiter->get("late", std::chrono::seconds(5)), "here");  // waited > 3 deadlines, not dropped
  late.join();
  EXPECT_TRUE(idler->set("after", "an idle second"));  // idle > 3 deadlines, not dropped
  EXPECT_TRUE(closedByServer(stall, milliseconds(3000))) << "a half-sent request outlived the request deadline";
  close(stall);
  const auto st = s->stats();
  EXPECT_EQ(st.stalledRequests, 1u);
  EXPECT_EQ(st.authenticated, 3u);
  EXPECT_EQ(s->keyCount(), 2u);  // the half-sent set never landed
}

// Strangers past the pending cap push out the oldest stranger, never a rank, and never keep a rank from logging in;
// logged-in clients are capped apart (maxClients), and one more gets "full". Broken (one shared cap, or new
// connections turned away while strangers fill it): the ranks cannot get in and the test fails.
TEST(TcpStoreGuards, StrangersPastThePendingCapCannotLockTheRanksOut) {
  tp::TcpKvLimits limits;
  limits.maxPending = 16;
  limits.maxClients = 8;
  limits.loginTimeout = std::chrono::seconds(30);  // strangers outlive the test: only the cap removes them
  auto s = guardedServer(limits);
  ASSERT_TRUE(s);
  std::vector<int> strangers;
  for (int i = 0; i < 64; ++i) strangers.push_back(rawConnect(s->port()));
  std::vector<std::unique_ptr<tp::TcpKvClient>> ranks;
  for (size_t i = 0; i < limits.maxClients; ++i) {
    std::string error;
    auto c = tp::TcpKvClient::connect("127.0.0.1", s->port(), std::chrono::seconds(3), &error, "tok");
    ASSERT_TRUE(c) << "rank " << i << ": " << error;
    ASSERT_TRUE(c->set("rank/" + std::to_string(i), "in"));
    ranks.push_back(std::move(c));
    strangers.push_back(rawConnect(s->port()));  // more keep coming between the ranks
  }
  std::string error;
  EXPECT_FALSE(tp::TcpKvClient::connect("127.0.0.1", s->port(), std::chrono::seconds(3), &error, "tok"));
  EXPECT_NE(error.find("full"), std::string::npos) << error;
  const auto st = s->stats();
  EXPECT_EQ(st.authenticated, limits.maxClients);
  EXPECT_LE(st.pending, limits.maxPending);
  EXPECT_GE(st.evictedPending, strangers.size() - limits.maxPending);
  EXPECT_EQ(st.refusedFull, 1u);
  for (auto& c : ranks) EXPECT_EQ(c->get("rank/0", milliseconds(100)), "in");  // every rank still served
  ranks.pop_back();  // a rank leaves: its place is free again
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_TRUE(tp::TcpKvClient::connect("127.0.0.1", s->port(), std::chrono::seconds(3), &error, "tok")) << error;
  for (int fd : strangers)
    if (fd >= 0) close(fd);
}

// As many logged-in clients as the job has ranks: 8,192 simulated ranks each log in with the token, publish a key
// and read their neighbour's, all connected at once (the old store stopped accepting at 4,096). Needs 2 descriptors
// a client in this process (client and server end): the soft open-file limit is raised to the hard one.
TEST(TcpStoreGuards, EightThousandRankClientsLogInAtOnce) {
  constexpr int kRanks = 8192, kThreads = 16;
  rlimit rl{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
  constexpr rlim_t kNeed = 2 * kRanks + 256;
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < kNeed)
    GTEST_SKIP() << "RLIMIT_NOFILE hard limit " << rl.rlim_max << " < " << kNeed << " descriptors this test needs";
  const rlim_t oldSoft = rl.rlim_cur;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < kNeed) {
    rl.rlim_cur = rl.rlim_max;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
  }
  tp::TcpKvLimits limits;
  limits.maxClients = kRanks;  // the job's ranks, as capture sizes it
  auto s = guardedServer(limits);
  ASSERT_TRUE(s);
  std::vector<std::unique_ptr<tp::TcpKvClient>> clients(kRanks);
  std::atomic<int> connected{0}, published{0}, read{0};
  const auto t0 = Clock::now();
  auto each = [&](auto&& body) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        for (int r = t; r < kRanks; r += kThreads) body(r);
      });
    for (auto& th : threads) th.join();
  };
  each([&](int r) {
    clients[r] = tp::TcpKvClient::connect("127.0.0.1", s->port(), std::chrono::seconds(60), nullptr, "tok");
    if (!clients[r]) return;
    ++connected;
    if (clients[r]->set("rank/" + std::to_string(r), std::to_string(r))) ++published;
  });
  const double connectS = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_EQ(connected.load(), kRanks);
  EXPECT_EQ(published.load(), kRanks);
  EXPECT_EQ(s->stats().authenticated, static_cast<size_t>(kRanks));
  each([&](int r) {
    const int next = (r + 1) % kRanks;
    if (clients[r]->get("rank/" + std::to_string(next), std::chrono::seconds(30)) == std::to_string(next)) ++read;
  });
  EXPECT_EQ(read.load(), kRanks);
  std::string error;
  EXPECT_FALSE(tp::TcpKvClient::connect("127.0.0.1", s->port(), std::chrono::seconds(5), &error, "tok"));
  EXPECT_NE(error.find("full"), std::string::npos) << error;
  std::printf("%d rank clients: logged in and published in %.2f s, all read in %.2f s\n", kRanks, connectS,
              std::chrono::duration<double>(Clock::now() - t0).count());
  // The server closes first: its ends wait in TIME_WAIT on its one port, not 8,192 of the machine's ephemeral ports
  // (for a minute, other tests' connects and binds would fail).
  s.reset();
  clients.clear();
  rl.rlim_cur = oldSoft;
  setrlimit(RLIMIT_NOFILE, &rl);
}

}  // namespace
