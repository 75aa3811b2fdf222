// Clock alignment: a fake store with a known offset, the NTP estimate through threads and through the TCP store.
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "tpscope/probes/runtime.h"
#include "tpscope/probes/tcp_store.h"

namespace tp = tpscope::probes;
namespace db = tpscope::tracedb;

namespace {

int64_t realNow() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// The clock of the thread calling it: real time plus this thread's skew.
thread_local int64_t t_skew = 0;
int64_t skewedNow() { return realNow() + t_skew; }

// In-memory store; an optional one-way delay on every set (the "network").
class FakeStore : public tp::KvStore {
 public:
  explicit FakeStore(std::chrono::microseconds setDelay = {}) : delay_(setDelay) {}
  bool set(std::string_view key, std::string_view value) noexcept override {
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    std::lock_guard lock(mutex_);
    data_[std::string(key)] = std::string(value);
    cv_.notify_all();
    return true;
  }
  std::optional<std::string> get(std::string_view key, std::chrono::milliseconds timeout) noexcept override {
    std::unique_lock lock(mutex_);
    const std::string k(key);
    if (!cv_.wait_for(lock, timeout, [&] { return data_.count(k) > 0; })) return std::nullopt;
    return data_[k];
  }

 private:
  std::chrono::microseconds delay_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
};

// A store that plays rank 0 itself: every pong carries "rank 0's clock" = the real clock + kOffset, read after a
// fixed delay, so the true offset and the RTT are known.
class ScriptedRankZeroStore : public tp::KvStore {
 public:
  ScriptedRankZeroStore(int64_t offsetNs, std::chrono::microseconds oneWay) : offset_(offsetNs), oneWay_(oneWay) {}
  bool set(std::string_view key, std::string_view) noexcept override {
    ++sets_;
    lastKey_ = std::string(key);
    return true;
  }
  std::optional<std::string> get(std::string_view key, std::chrono::milliseconds) noexcept override {
    if (key.substr(0, key.size() - 4) != lastKey_.substr(0, lastKey_.size() - 4)) return std::nullopt;
    std::this_thread::sleep_for(oneWay_);
    const int64_t t0 = realNow() + offset_;
    std::this_thread::sleep_for(oneWay_);
    return std::to_string(t0);
  }
  int sets() const { return sets_; }

 private:
  int64_t offset_;
  std::chrono::microseconds oneWay_;
  std::string lastKey_;
  int sets_ = 0;
};

TEST(ClockAlign, FakeStoreWithAKnownOffset) {
  constexpr int64_t kOffset = 123'456'789;  // rank 0 is 123 ms ahead
  ScriptedRankZeroStore store(kOffset, std::chrono::microseconds(200));
  tp::ClockAlignOptions o;
  o.rounds = 8;
  const tp::ClockOffset c = tp::alignClock(store, 1, 2, "t", o, &realNow);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c.rounds, 8);
  EXPECT_EQ(store.sets(), 8);
  EXPECT_GE(c.uncertaintyNs, 200'000);  // at least the scripted one-way delay
  EXPECT_LE(std::abs(c.offsetNs - kOffset), c.uncertaintyNs);
  EXPECT_LT(std::abs(c.offsetNs - kOffset), 2'000'000);  // symmetric delays: the midpoint is close
}

TEST(ClockAlign, TwoRanksThroughAStoreRecoverTheSkew) {
  for (const int64_t skew : {int64_t{-5'000'000'000}, int64_t{0}, int64_t{987'654'321}}) {
    FakeStore store(std::chrono::microseconds(50));
    tp::ClockOffset zero, one;
    std::thread rank0([&] {
      t_skew = 0;
      zero = tp::alignClock(store, 0, 2, "skew" + std::to_string(skew), {}, &skewedNow);
    });
    std::thread rank1([&] {
      t_skew = skew;  // rank 1's clock is `skew` ahead: rank 0 = rank 1 − skew
      one = tp::alignClock(store, 1, 2, "skew" + std::to_string(skew), {}, &skewedNow);
    });
    rank0.join();
    rank1.join();
    EXPECT_EQ(zero.offsetNs, 0);
    ASSERT_TRUE(one.ok());
    EXPECT_EQ(one.rounds, 16);
    EXPECT_LE(std::abs(one.offsetNs - (-skew)), one.uncertaintyNs + 1000) << "skew " << skew;
    EXPECT_LT(one.uncertaintyNs, 50'000'000);
  }
}

TEST(ClockAlign, AMissingRankZeroFailsWithinTheTimeout) {
  FakeStore store;
  tp::ClockAlignOptions o;
  o.timeout = std::chrono::milliseconds(100);
  const auto t0 = std::chrono::steady_clock::now();
  const tp::ClockOffset c = tp::alignClock(store, 1, 2, "nobody", o);
  EXPECT_FALSE(c.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  // Rank 0 skips ranks that never show up, within one budget for all of them (not one timeout each).
  const auto t1 = std::chrono::steady_clock::now();
  const tp::ClockOffset z = tp::alignClock(store, 0, 16, "nobody", o);
  EXPECT_EQ(z.offsetNs, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::milliseconds(1500));  // 2 × 100 ms + 15 × 50 ms
}

TEST(ClockAlign, ThreeRanksOverTheTcpStore) {
  std::string error;
  auto server = tp::TcpKvServer::listen("127.0.0.1", 0, &error);
  ASSERT_TRUE(server) << error;
  const int64_t skews[3] = {0, 2'000'000'000, -750'000};
  tp::ClockOffset results[3];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      auto client = tp::TcpKvClient::connect("127.0.0.1", server->port());
      ASSERT_TRUE(client);
      t_skew = skews[r];
      results[r] = tp::alignClock(*client, r, 3, "tcp", {}, &skewedNow);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 1; r < 3; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r;
    EXPECT_LE(std::abs(results[r].offsetNs + skews[r]), results[r].uncertaintyNs + 1000) << "rank " << r;
    EXPECT_LT(results[r].uncertaintyNs, 20'000'000) << "loopback round trips are short";
  }
}


}  // namespace
