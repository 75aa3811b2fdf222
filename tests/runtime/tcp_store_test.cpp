// The loopback key-value store: set/get, a get that waits for a later set, timeouts, many clients, bad input, the
// token of a store that listens beyond loopback.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

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

}  // namespace
