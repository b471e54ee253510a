// The TCP rendezvous transport (collectives/bootstrap_transport.h): rank 0 listens, every other
// rank connects once and keeps its connection for the launch; each all-gather is a star through
// rank 0. Every wait is bounded by the transport's deadline; errors name the ranks and address.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "collectives/bootstrap_transport.h"
#include "collectives/comm_detail.h"
#include "runtime/error.h"
#include "runtime/stop.h"

namespace meshrt {

namespace {

constexpr char kHello[] = "meshrt-tcp-rendezvous-v1";
constexpr uint64_t kMaxBlob = uint64_t{64} << 20;  // a rendezvous blob is small; bounds the read

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

sockaddr_in resolve(const std::string& host, int port, const LaunchNames& names) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  MESHRT_CHECK(rc == 0 && res != nullptr, "rendezvous: cannot resolve "
                                              << names.master_addr << " '" << host
                                              << "': " << gai_strerror(rc)
                                              << " (use an IPv4 address or a host name of rank 0)");
  sockaddr_in a = *reinterpret_cast<const sockaddr_in*>(res->ai_addr);
  freeaddrinfo(res);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

// A stop request (SIGINT / SIGTERM: runtime/stop.h) ends every wait at once, as it ends the file
// rendezvous's: nothing has run yet that needs finishing.
void throw_if_stopped(const std::string& waiting_for) {
  if (const int sig = stop_request(); sig != 0)
    throw CommError("rendezvous: stopped by signal " + std::to_string(sig) + " (" + strsignal(sig) +
                    ") while waiting for " + waiting_for);
}

// Waits until `fd` is readable (or writable), at most until `dl`; false when the time ran out.
// Throws when a stop is requested while it is not (`who`: what it waits for, for the message):
// as in the file rendezvous, what is ready goes through.
bool wait_fd(int fd, short events, const detail::Deadline& dl, const std::string& who) {
  for (;;) {
    const double left = dl.left_s();
    if (dl.passed()) return false;
    pollfd p{fd, events, 0};
    const int ms = static_cast<int>(std::min(left, 0.1) * 1000) + 1;
    const int rc = poll(&p, 1, ms);
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return false;
    throw_if_stopped(who);
  }
}

// The whole of `n` bytes, or an error naming `who`.
void send_all(int fd, const void* p, size_t n, const detail::Deadline& dl, const std::string& who) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    if (!wait_fd(fd, POLLOUT, dl, who))
      throw CommError("rendezvous: sending to " + who + " timed out");
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (w <= 0)
      throw CommError("rendezvous: sending to " + who + " failed: " + std::strerror(errno) +
                      " (did it fail?)");
    c += w;
    n -= static_cast<size_t>(w);
  }
}

void recv_all(int fd, void* p, size_t n, const detail::Deadline& dl, const std::string& who) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, dl, who))
      throw CommError("rendezvous: " + who + " sent nothing within the timeout");
    const ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r == 0)
      throw CommError("rendezvous: " + who +
                      " closed its connection (its process failed or "
                      "exited)");
    if (r < 0)
      throw CommError("rendezvous: reading from " + who + " failed: " + std::strerror(errno));
    c += r;
    n -= static_cast<size_t>(r);
  }
}

void send_blob(int fd, const std::string& s, const detail::Deadline& dl, const std::string& who) {
  const uint64_t n = s.size();
  send_all(fd, &n, sizeof(n), dl, who);
  send_all(fd, s.data(), s.size(), dl, who);
}

std::string recv_blob(int fd, const detail::Deadline& dl, const std::string& who) {
  uint64_t n = 0;
  recv_all(fd, &n, sizeof(n), dl, who);
  if (n > kMaxBlob)
    throw CommError("rendezvous: " + who + " announced " + std::to_string(n) +
                    " bytes (not a meshrt rendezvous peer on that port?)");
  std::string s(n, '\0');
  recv_all(fd, s.data(), n, dl, who);
  return s;
}

std::string rank_name(int r) { return "rank " + std::to_string(r); }

// Connects `fd` to `addr`, waiting at most until `dl` (or a stop request, which throws): 0, or
// why it failed (an errno value).
int connect_fd(int fd, const sockaddr_in& addr, const detail::Deadline& dl,
               const std::string& who) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return errno;
  int err = 0;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      socklen_t len = sizeof(err);
      if (!wait_fd(fd, POLLOUT, dl, who)) {
        err = ETIMEDOUT;
      } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
        err = errno;
      }
    }
  }
  if (fcntl(fd, F_SETFL, flags) != 0 && err == 0) err = errno;
  return err;
}

class TcpTransport final : public BootstrapTransport {
 public:
  TcpTransport(const std::string& host, int port, int rank, int size, double timeout_s,
               LaunchNames names)
      : rank_(rank),
        size_(size),
        timeout_s_(timeout_s),
        where_(host + ":" + std::to_string(port)),
        names_(std::move(names)) {
    MESHRT_CHECK(size >= 1 && rank >= 0 && rank < size,
                 "rendezvous: rank " << rank << " outside [0, " << size << ")");
    MESHRT_CHECK(port > 0 && port < 65536, "rendezvous: port " << port << " is not a TCP port ("
                                                               << names_.master_port
                                                               << ": 1..65535)");
    const sockaddr_in addr = resolve(host, port, names_);
    const detail::Deadline dl = detail::Deadline::after(timeout_s);
    if (rank == 0) {
      serve(addr, dl);
    } else {
      join(addr, dl);
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string local_address() const override {
    const int fd = rank_ != 0 ? leader_.get() : size_ > 1 ? peers_[1].get() : -1;
    sockaddr_in a{};
    socklen_t len = sizeof(a);
    char text[INET_ADDRSTRLEN] = {};
    if (fd < 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
        inet_ntop(AF_INET, &a.sin_addr, text, sizeof(text)) == nullptr)
      return "";
    return text;
  }

  std::vector<std::string> all_gather(const std::string& key, const std::string& mine) override {
    const detail::Deadline dl = detail::Deadline::after(timeout_s_);
    std::vector<std::string> all(static_cast<size_t>(size_));
    if (rank_ != 0) {
      send_blob(leader_.get(), key, dl, "rank 0 at " + where_);
      send_blob(leader_.get(), mine, dl, "rank 0 at " + where_);
      for (auto& s : all) s = recv_blob(leader_.get(), dl, "rank 0 at " + where_);
      return all;
    }
    all[0] = mine;
    for (int r = 1; r < size_; ++r) {
      const int fd = peers_[static_cast<size_t>(r)].get();
      const std::string k = recv_blob(fd, dl, rank_name(r));
      if (k != key) {
        throw CommError("rendezvous: rank " + std::to_string(r) + " is at exchange '" + k +
                        "' but rank 0 at '" + key + "' (ranks running different programs?)");
      }
      all[static_cast<size_t>(r)] = recv_blob(fd, dl, rank_name(r));
    }
    for (int r = 1; r < size_; ++r) {
      for (const auto& s : all)
        send_blob(peers_[static_cast<size_t>(r)].get(), s, dl, rank_name(r));
    }
    return all;
  }

 private:
  // Rank 0: listens on the address, accepts every other rank's hello.
  void serve(const sockaddr_in& addr, const detail::Deadline& dl) {
    Fd ls(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    MESHRT_CHECK(ls.get() >= 0, "rendezvous: socket() failed: " << std::strerror(errno));
    const int one = 1;
    setsockopt(ls.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    MESHRT_CHECK(::bind(ls.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0,
                 "rendezvous: rank 0 cannot listen on " << where_ << ": " << std::strerror(errno)
                                                        << " (another job on " << names_.master_port
                                                        << "? pick a free port)");
    MESHRT_CHECK(::listen(ls.get(), size_) == 0,
                 "rendezvous: listen on " << where_ << " failed: " << std::strerror(errno));
    peers_.resize(static_cast<size_t>(size_));
    for (int got = 1; got < size_;) {
      std::vector<int> missing;
      for (int r = 1; r < size_; ++r) {
        if (peers_[static_cast<size_t>(r)].get() < 0) missing.push_back(r);
      }
      if (!wait_fd(ls.get(), POLLIN, dl,
                   detail::format_ranks(missing) + " to connect to " + where_)) {
        throw CommError("rendezvous at " + where_ + ": " + detail::format_ranks(missing) +
                        " never connected within " + std::to_string(timeout_s_) +
                        " s (is every rank started with the same " + names_.master_addr + ", " +
                        names_.master_port + " and " + names_.world_size + "?)");
      }
      Fd c(::accept4(ls.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (c.get() < 0) continue;
      setsockopt(c.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      const detail::Deadline hello_dl = detail::Deadline::after(std::min(timeout_s_, 10.0));
      std::string hello;
      try {
        hello = recv_blob(c.get(), hello_dl, "a connection to " + where_);
      } catch (const CommError&) {
        throw_if_stopped("a connection to " + where_ + " to say which rank it is");
        continue;  // not a meshrt rank (a port scanner, a stale client): ignored
      }
      int r = -1, world = -1;
      if (std::sscanf(hello.c_str(), "meshrt-tcp-rendezvous-v1 rank=%d world=%d", &r, &world) != 2)
        continue;
      MESHRT_CHECK(world == size_, "rendezvous at " << where_ << ": rank " << r << " has "
                                                    << names_.world_size << "=" << world
                                                    << " but rank 0 has " << size_);
      MESHRT_CHECK(r >= 1 && r < size_ && peers_[static_cast<size_t>(r)].get() < 0,
                   "rendezvous at " << where_ << ": a second process says it is rank " << r
                                    << " (every rank needs its own " << names_.rank << ")");
      peers_[static_cast<size_t>(r)] = std::move(c);
      ++got;
    }
  }

  // Other ranks: connect (retrying until rank 0 listens) and say who they are.
  void join(const sockaddr_in& addr, const detail::Deadline& dl) {
    const std::string who = "rank 0 at " + where_;
    auto sleep = std::chrono::milliseconds(5);
    for (;;) {
      Fd c(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      MESHRT_CHECK(c.get() >= 0, "rendezvous: socket() failed: " << std::strerror(errno));
      const int err = connect_fd(c.get(), addr, dl, who);
      if (err == 0) {
        const int one = 1;
        setsockopt(c.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        send_blob(c.get(),
                  std::string(kHello) + " rank=" + std::to_string(rank_) +
                      " world=" + std::to_string(size_),
                  dl, who);
        leader_ = std::move(c);
        return;
      }
      if (dl.passed()) {
        throw CommError("rendezvous: rank " + std::to_string(rank_) +
                        " could not reach rank 0 at " + where_ + " within " +
                        std::to_string(timeout_s_) + " s (" + std::strerror(err) +
                        "; is rank 0 started, with this " + names_.master_addr + " and " +
                        names_.master_port + "?)");
      }
      throw_if_stopped(who);
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::milliseconds(200));
    }
  }

  int rank_, size_;
  double timeout_s_;
  std::string where_;
  LaunchNames names_;
  Fd leader_;              // ranks > 0: the connection to rank 0
  std::vector<Fd> peers_;  // rank 0: the connection of each other rank
};

}  // namespace

std::unique_ptr<BootstrapTransport> make_tcp_transport(const std::string& host, int port, int rank,
                                                       int size, double timeout_s,
                                                       const LaunchNames& names) {
  return std::make_unique<TcpTransport>(host, port, rank, size, timeout_s, names);
}

}  // namespace meshrt
