// Loopback ports for a test's ranks and captures to listen on (tests/core/spawn.h, tests/capture/capture_test_util.h).
//
// Picked below the kernel's ephemeral range (net.ipv4.ip_local_port_range, 32768–60999 by default), at random, and
// checked free by binding. A port found by binding to port 0 comes from the ephemeral range itself, where an outgoing
// connection of any process — a test running beside this one: Gloo opens many — may take it between the pick and
// the listen (EADDRINUSE in a rank's TCPStore, seen once the tests that mostly wait began to run beside others).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <random>

namespace tpscope::testing {

// Whether nothing listens on (or holds) loopback port PORT now.
inline bool loopbackPortFree(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// A loopback port P with P .. P + COUNT - 1 free, below the ephemeral range; 0 when none was found.
inline int freeListenPorts(int count = 1) {
  int low = 32768, high = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low >> high;
  const int first = 10000, last = low - count;  // [first, last]: no outgoing connection is given one of these
  if (last <= first) return 0;
  static std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(::getpid()));
  std::uniform_int_distribution<int> pick(first, last);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = pick(rng);
    bool free = true;
    for (int k = 0; k < count && free; ++k) free = loopbackPortFree(port + k);
    if (free) return port;
  }
  return 0;
}

}  // namespace tpscope::testing
