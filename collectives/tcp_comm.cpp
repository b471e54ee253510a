// The TCP backend (collectives/tcp_comm.h): every pair of ranks holds three connections (the
// collectives' byte stream, send / recv's framed messages, and a control line that carries an
// aborting rank's reason), all non-blocking and polled with the call's deadline. Collectives are
// composed of one primitive, exchange(): send a buffer to one peer while receiving one from
// another. A closed connection names the peer (and, read from its control line, why it aborted).
#include "collectives/tcp_comm.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <tuple>
#include <vector>

#include "collectives/algorithms/algorithm.h"
#include "collectives/backend_registry.h"
#include "collectives/bootstrap_transport.h"
#include "collectives/comm_detail.h"
#include "collectives/host_reduce.h"
#include "collectives/ordered_comm.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/logging.h"

namespace meshrt {

namespace {

using detail::CallSig;
using detail::Deadline;
using detail::Op;

constexpr char kHello[] = "meshrt-tcp-v1";
enum Channel : int { kColl = 0, kP2P = 1, kControl = 2, kChannels = 3 };
constexpr int64_t kP2PMagic = 0x6d7368746370326bLL;
constexpr int kPollMs = 100;
// The pipelined ring broadcast's chunk.
constexpr size_t kRingChunk = size_t{256} << 10;

std::string sys_text(int e) { return std::strerror(e); }

// "30", "0.5".
std::string seconds_text(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

void set_nodelay(int fd) {
  const int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
    throw CommError("tcp: setsockopt(TCP_NODELAY) failed: " + sys_text(errno));
}

// Sends or receives all `n` bytes on a non-blocking socket before `dl`; false when the time ran
// out or the connection failed (`why` says which).
bool move_all(int fd, bool sending, void* p, size_t n, const Deadline& dl, std::string* why) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t k = sending ? ::send(fd, c, n, MSG_NOSIGNAL) : ::recv(fd, c, n, 0);
    if (k > 0) {
      c += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k == 0) {
      *why = "the connection closed";
      return false;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      *why = sys_text(errno);
      return false;
    }
    if (dl.passed()) {
      *why = "timed out";
      return false;
    }
    pollfd q{fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0};
    if (poll(&q, 1, kPollMs) < 0 && errno != EINTR) {
      *why = "poll failed: " + sys_text(errno);
      return false;
    }
  }
  return true;
}

bool send_line(int fd, const std::string& s, const Deadline& dl, std::string* why) {
  uint32_t n = static_cast<uint32_t>(s.size());
  return move_all(fd, true, &n, sizeof(n), dl, why) &&
         move_all(fd, true, const_cast<char*>(s.data()), s.size(), dl, why);
}

bool recv_line(int fd, std::string* s, const Deadline& dl, std::string* why) {
  uint32_t n = 0;
  if (!move_all(fd, false, &n, sizeof(n), dl, why)) return false;
  if (n > 4096) {
    *why = "a " + std::to_string(n) + "-byte line (not a meshrt tcp peer?)";
    return false;
  }
  s->assign(n, '\0');
  return move_all(fd, false, s->data(), n, dl, why);
}

// The connections of one rank of one group: fds[peer][channel] (-1 for itself).
using Links = std::vector<std::array<int, kChannels>>;

// What the world and every group split from it share: the abort state (aborting one aborts them
// all, and tells every connected peer why), every rank's listening address, and this process's
// listening socket, on which the connections of every group are accepted.
class TcpDomain {
 public:
  TcpDomain(int listen_fd, std::vector<std::string> addrs, std::string job, int world_rank)
      : listen_fd_(listen_fd), addrs_(std::move(addrs)), job_(std::move(job)), me_(world_rank) {}
  ~TcpDomain() {
    for (const auto& [key, fd] : pending_) close(fd);  // accepted, never claimed by a group
    close(listen_fd_);
  }

  bool aborted() const { return aborted_.load(); }
  std::string reason() const {
    std::lock_guard<std::mutex> lk(mu_);
    return reason_;
  }
  const std::string& address(int world_rank) const {
    return addrs_[static_cast<size_t>(world_rank)];
  }

  // The first reason wins. Every peer of every group reads it on its control line, then sees
  // the data connections close.
  void abort(const std::string& why) {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_.exchange(true)) return;
    reason_ = why;
    const Deadline dl = Deadline::after(0.2);
    for (const Links* l : links_) {
      for (const auto& fds : *l) {
        if (fds[kControl] < 0) continue;
        std::string ignored;  // best effort: a peer that is gone cannot be told
        send_line(fds[kControl], why, dl, &ignored);
        for (int fd : fds) {
          // Best effort too: a connection the peer already closed may refuse the shutdown.
          if (shutdown(fd, SHUT_RDWR) != 0) continue;
        }
      }
    }
  }
  void track(const Links* l) {
    std::lock_guard<std::mutex> lk(mu_);
    links_.insert(l);
  }
  void untrack(const Links* l) {
    std::lock_guard<std::mutex> lk(mu_);
    links_.erase(l);
  }

  // Connects to world rank `to`'s listener for group `token`, channel `ch`.
  int connect_to(int to, const std::string& token, int ch, const Deadline& dl);
  // The connection world rank `from` made for group `token`, channel `ch`; -1 when none came
  // before `dl`.
  int accept_from(int from, const std::string& token, int ch, const Deadline& dl);

 private:
  int listen_fd_;
  std::vector<std::string> addrs_;  // world rank -> "a.b.c.d:port"
  std::string job_;                 // keeps other jobs' connections out
  int me_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;
  std::string reason_;
  std::set<const Links*> links_;
  std::mutex accept_mu_;
  std::map<std::tuple<std::string, int, int>, int> pending_;  // (token, from, ch) -> fd
};

int TcpDomain::connect_to(int to, const std::string& token, int ch, const Deadline& dl) {
  const std::string& where = address(to);
  const size_t colon = where.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::atoi(where.c_str() + colon + 1)));
  if (colon == std::string::npos ||
      inet_pton(AF_INET, where.substr(0, colon).c_str(), &a.sin_addr) != 1)
    throw CommError("tcp: rank " + std::to_string(to) + " published '" + where +
                    "', not an IPv4 address:port (ranks of different meshrt versions?)");
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) throw CommError("tcp: socket() failed: " + sys_text(errno));
  int err = 0;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0) {
    err = errno;
    pollfd q{fd, POLLOUT, 0};
    while (err == EINPROGRESS && !dl.passed()) {
      const int rc = poll(&q, 1, kPollMs);
      if (rc < 0 && errno != EINTR) err = errno;
      if (rc <= 0) continue;
      socklen_t len = sizeof(err);
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
  }
  std::string why = err == 0 ? "" : err == EINPROGRESS ? "timed out" : sys_text(err);
  if (err == 0) {
    set_nodelay(fd);
    const std::string hello = std::string(kHello) + " " + job_ + " " + token + " " +
                              std::to_string(me_) + " " + std::to_string(ch);
    if (send_line(fd, hello, dl, &why)) return fd;
  }
  close(fd);
  throw CommError("tcp: rank " + std::to_string(me_) + " cannot connect to rank " +
                  std::to_string(to) + " at " + where + ": " + why +
                  " (is its address reachable from this node, and no firewall in between?)");
}

int TcpDomain::accept_from(int from, const std::string& token, int ch, const Deadline& dl) {
  std::lock_guard<std::mutex> lk(accept_mu_);
  for (;;) {
    if (auto it = pending_.find({token, from, ch}); it != pending_.end()) {
      const int fd = it->second;
      pending_.erase(it);
      return fd;
    }
    if (aborted()) throw CommError("tcp: the communicators were aborted: " + reason());
    if (dl.passed()) return -1;
    pollfd q{listen_fd_, POLLIN, 0};
    const int rc = poll(&q, 1, kPollMs);
    if (rc < 0 && errno != EINTR)
      throw CommError("tcp: poll on the listening socket failed: " + sys_text(errno));
    if (rc <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;  // the connection went away before it was accepted
    std::string hello, why, magic, job, tok;
    int r = -1, c = -1;
    if (recv_line(fd, &hello, Deadline::after(5), &why)) {
      std::istringstream is(hello);
      is >> magic >> job >> tok >> r >> c;
    }
    if (magic != kHello || job != job_ || c < 0 || c >= kChannels) {
      close(fd);  // not a peer of this job (a port scanner, a stale client): dropped
      continue;
    }
    set_nodelay(fd);
    pending_[{tok, r, c}] = fd;
  }
}

// One rank's side of a group: the shell's order and deadlines (OrderedEngine), the collectives
// composed of exchange() over the group's connections.
class TcpEngine final : public detail::OrderedEngine {
 public:
  TcpEngine(std::shared_ptr<TcpDomain> d, std::vector<int> members, int rank, std::string name,
            std::string token, CommConfig cfg)
      : OrderedEngine(rank, static_cast<int>(members.size()), std::move(name), cfg),
        dom_(std::move(d)),
        members_(std::move(members)),
        token_(std::move(token)),
        plan_(detail::AlgoWorld{"tcp", size(), 1}, config().algo) {
    std::array<int, kChannels> none;
    none.fill(-1);
    links_.assign(members_.size(), none);
  }
  ~TcpEngine() override {
    dom_->untrack(&links_);
    for (auto& fds : links_)
      for (int fd : fds)
        if (fd >= 0) close(fd);
  }

  // Collective over the members: each connects to the lower ranks and accepts the higher ones.
  void connect(const Deadline& dl) {
    for (int j = 0; j < size(); ++j) {
      for (int ch = 0; ch < kChannels; ++ch) {
        int& fd = links_[static_cast<size_t>(j)][static_cast<size_t>(ch)];
        if (j < rank()) fd = dom_->connect_to(members_[static_cast<size_t>(j)], token_, ch, dl);
      }
    }
    for (int j = rank() + 1; j < size(); ++j) {
      for (int ch = 0; ch < kChannels; ++ch) {
        const int fd = dom_->accept_from(members_[static_cast<size_t>(j)], token_, ch, dl);
        if (fd < 0) {
          throw CommError("tcp: " + rank_label(j) + " at " +
                          dom_->address(members_[static_cast<size_t>(j)]) + " never connected to " +
                          rank_label(rank()) + " of group '" + name() + "' within " +
                          seconds_text(config().timeout_s) +
                          " s (did its process fail, or is this node unreachable from it?)");
        }
        links_[static_cast<size_t>(j)][static_cast<size_t>(ch)] = fd;
      }
    }
    dom_->track(&links_);
  }

  std::string_view backend() const override { return "tcp"; }
  bool aborted() const override { return dom_->aborted(); }
  std::string abort_reason() const override { return dom_->reason(); }
  void abort_group(const std::string& why) override { dom_->abort(why); }

 private:
  std::shared_ptr<TcpDomain> dom_;
  std::vector<int> members_;  // group rank -> world rank
  std::string token_;         // names this group's connections at the listeners
  detail::AlgoPlan plan_;     // which broadcast runs each call (collectives/algorithms/)
  Links links_;

  int fd(int ch, int peer) const {
    return links_[static_cast<size_t>(peer)][static_cast<size_t>(ch)];
  }

  std::string rank_label(int g) const override {
    const int w = g >= 0 && g < size() ? members_[static_cast<size_t>(g)] : -1;
    return detail::global_rank_label(w, g, w == g && name() == "world");
  }

  // A connection to `peer` failed during `op`: aborts every group with a message naming the
  // peer and, when it aborted itself, its reason.
  [[noreturn]] void peer_failed(const Op& op, int peer, const std::string& what) {
    if (aborted()) throw_aborted(op);  // this process shut the connections down itself
    std::string why = what;
    std::string theirs, ignored;
    if (recv_line(fd(kControl, peer), &theirs, Deadline::after(0.5), &ignored))
      why = "aborted: " + theirs;
    const std::string msg = context(op) + " failed: " + rank_label(peer) + " at " +
                            dom_->address(members_[static_cast<size_t>(peer)]) + " " + why;
    abort_group(msg);
    throw CommError(msg);
  }

  // What a failed send or receive says of the peer: a connection closed or reset is its process
  // gone (or aborted: peer_failed then reads its reason).
  static std::string lost(int e, const std::string& doing) {
    if (e == ECONNRESET || e == EPIPE)
      return "closed its connection (its process failed or exited)";
    return doing + ": " + sys_text(e);
  }

  // Nothing moved for a poll interval: the abort and deadline checks.
  void idle(const Op& op, int to, int from) {
    if (aborted()) throw_aborted(op);
    if (!op.dl.passed()) return;
    std::string m;
    if (from >= 0) m = rank_label(from) + " sent nothing more";
    if (to >= 0) m += (m.empty() ? "" : " and ") + rank_label(to) + " took nothing more";
    fail_timeout(op, m + " (its state is unknown: it may not have entered this call, or be "
                         "stopped)");
  }

  // Sends `sn` bytes to `to` while receiving `rn` bytes from `from` on channel `ch` (a peer of
  // -1 or a count of 0: that side is idle), until both are done.
  void exchange(int ch, int to, const void* sbuf, size_t sn, int from, void* rbuf, size_t rn,
                const Op& op) {
    const char* sp = static_cast<const char*>(sbuf);
    char* rp = static_cast<char*>(rbuf);
    size_t sl = to >= 0 ? sn : 0, rl = from >= 0 ? rn : 0;
    while (sl > 0 || rl > 0) {
      pollfd p[2];
      int np = 0, si = -1, ri = -1;
      if (sl > 0) {
        p[np] = {fd(ch, to), POLLOUT, 0};
        si = np++;
      }
      if (rl > 0 && si >= 0 && to == from) {
        p[si].events |= POLLIN;
        ri = si;
      } else if (rl > 0) {
        p[np] = {fd(ch, from), POLLIN, 0};
        ri = np++;
      }
      const int rc = poll(p, static_cast<nfds_t>(np), kPollMs);
      if (rc < 0 && errno != EINTR)
        peer_failed(op, to >= 0 ? to : from, "poll: " + sys_text(errno));
      if (rc <= 0) {
        idle(op, sl > 0 ? to : -1, rl > 0 ? from : -1);
        continue;
      }
      if (si >= 0 && (p[si].revents & (POLLOUT | POLLERR | POLLHUP)) != 0) {
        const ssize_t w = ::send(fd(ch, to), sp, sl, MSG_NOSIGNAL);
        if (w > 0) {
          sp += w;
          sl -= static_cast<size_t>(w);
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          peer_failed(op, to, lost(errno, "could not be sent to"));
        }
      }
      if (ri >= 0 && (p[ri].revents & (POLLIN | POLLERR | POLLHUP)) != 0) {
        const ssize_t k = ::recv(fd(ch, from), rp, rl, 0);
        if (k > 0) {
          rp += k;
          rl -= static_cast<size_t>(k);
        } else if (k == 0) {
          peer_failed(op, from, lost(ECONNRESET, ""));
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          peer_failed(op, from, lost(errno, "could not be read from"));
        }
      }
    }
  }

  int right() const { return (rank() + 1) % size(); }
  int left() const { return (rank() + size() - 1) % size(); }

  // Ring all-gather in place: block b of `buf` is [off[b], off[b + 1]) bytes, rank b's own.
  void ring_gather(char* buf, const std::vector<size_t>& off, const Op& op) {
    const int n = size();
    for (int s = 0; s + 1 < n; ++s) {
      const int sb = (rank() - s + n) % n, rb = (rank() - s - 1 + n) % n;
      exchange(kColl, right(), buf + off[static_cast<size_t>(sb)],
               off[static_cast<size_t>(sb) + 1] - off[static_cast<size_t>(sb)], left(),
               buf + off[static_cast<size_t>(rb)],
               off[static_cast<size_t>(rb) + 1] - off[static_cast<size_t>(rb)], op);
    }
  }

  // Ring reduce-scatter in place: afterwards block rank() of `acc` (elements [off[b], off[b+1]))
  // holds the reduction over the ranks; avg sums (the caller divides).
  void ring_reduce(DType dt, ReduceOp rop, char* acc, const std::vector<int64_t>& off,
                   const Op& op) {
    const int n = size();
    const size_t es = dtype_size(dt);
    int64_t most = 0;
    for (int b = 0; b < n; ++b)
      most = std::max(most, off[static_cast<size_t>(b) + 1] - off[static_cast<size_t>(b)]);
    std::vector<char> tmp(static_cast<size_t>(most) * es);
    const ReduceOp r = rop == ReduceOp::Avg ? ReduceOp::Sum : rop;
    for (int s = 0; s + 1 < n; ++s) {
      const size_t sb = static_cast<size_t>((rank() - s - 1 + 2 * n) % n);
      const size_t rb = static_cast<size_t>((rank() - s - 2 + 2 * n) % n);
      const int64_t slen = off[sb + 1] - off[sb], rlen = off[rb + 1] - off[rb];
      char* mine = acc + static_cast<size_t>(off[rb]) * es;
      exchange(kColl, right(), acc + static_cast<size_t>(off[sb]) * es,
               static_cast<size_t>(slen) * es, left(), tmp.data(), static_cast<size_t>(rlen) * es,
               op);
      const void* srcs[2] = {tmp.data(), mine};
      detail::host_reduce(dt, r, srcs, 2, mine, rlen, 1);
    }
  }

  // Block b of `count` elements split over the ranks: [off[b], off[b + 1]).
  std::vector<int64_t> blocks(int64_t count) const {
    std::vector<int64_t> off(static_cast<size_t>(size()) + 1);
    for (int b = 0; b <= size(); ++b)
      off[static_cast<size_t>(b)] = count / size() * b + std::min<int64_t>(b, count % size());
    return off;
  }

  std::vector<int64_t> exchange_words(const Op& op, const std::vector<int64_t>& mine) override {
    const size_t bytes = mine.size() * sizeof(int64_t);
    std::vector<int64_t> all(mine.size() * static_cast<size_t>(size()));
    std::memcpy(all.data() + mine.size() * static_cast<size_t>(rank()), mine.data(), bytes);
    std::vector<size_t> off(static_cast<size_t>(size()) + 1);
    for (size_t b = 0; b < off.size(); ++b) off[b] = b * bytes;
    ring_gather(reinterpret_cast<char*>(all.data()), off, op);
    return all;
  }

  // Every collective and split compares the ranks' calls first: the byte streams carry no
  // framing, so a mismatched count would put the ranks out of step.
  void entering(const Op& op) override {
    if (size() <= 1) return;
    std::vector<int64_t> me(CallSig::kWords);
    std::memcpy(me.data(), &op.sig, sizeof(CallSig));
    const std::vector<int64_t> all = exchange_words(op, me);
    std::vector<CallSig> sigs(static_cast<size_t>(size()));
    std::memcpy(static_cast<void*>(sigs.data()), all.data(), all.size() * sizeof(int64_t));
    std::vector<int> globals;
    if (name() != "world") globals = members_;
    const std::string mm = detail::mismatch_message(name(), sigs, globals);
    if (!mm.empty()) throw CommError(mm);
  }

  // The ring over `count` elements of `dt` in `out` (which holds this rank's input).
  void all_reduce_ring(DType dt, ReduceOp rop, void* out, int64_t count, const Op& op) {
    const std::vector<int64_t> off = blocks(count);
    ring_reduce(dt, rop, static_cast<char*>(out), off, op);
    std::vector<size_t> boff(off.size());
    for (size_t b = 0; b < off.size(); ++b) boff[b] = static_cast<size_t>(off[b]) * dtype_size(dt);
    ring_gather(static_cast<char*>(out), boff, op);
  }

  void all_reduce(const CommCall& c, const Op& op) override {
    const size_t bytes = static_cast<size_t>(c.count) * dtype_size(c.dtype);
    if (detail::is_half_float(c.dtype)) {
      std::vector<float> wide(static_cast<size_t>(c.count));
      detail::reduce_through_f32(c.dtype, c.redop, c.in.data_ptr(), c.count, c.out.data_ptr(),
                                 c.count, size(), wide.data(), wide.data(), [&](float*, float* w) {
                                   all_reduce_ring(DType::f32, c.redop, w, c.count, op);
                                 });
      return;
    }
    if (!c.in_place && bytes > 0) std::memcpy(c.out.data_ptr(), c.in.data_ptr(), bytes);
    all_reduce_ring(c.dtype, c.redop, c.out.data_ptr(), c.count, op);
    if (c.redop == ReduceOp::Avg) detail::host_divide(c.dtype, c.out.data_ptr(), c.count, size());
  }

  // Reduce-scatter of `acc` (every rank's blocks, reduced in place) into `out`.
  void reduce_scatter_ring(DType dt, ReduceOp rop, char* acc, void* out, int64_t count,
                           const Op& op) {
    std::vector<int64_t> off(static_cast<size_t>(size()) + 1);
    for (size_t b = 0; b < off.size(); ++b) off[b] = static_cast<int64_t>(b) * count;
    ring_reduce(dt, rop, acc, off, op);
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dt);
    if (bytes > 0) std::memcpy(out, acc + static_cast<size_t>(rank()) * bytes, bytes);
  }

  void reduce_scatter(const CommCall& c, const Op& op) override {
    const int64_t all = c.count * size();
    if (detail::is_half_float(c.dtype)) {
      std::vector<float> win(static_cast<size_t>(all)), wout(static_cast<size_t>(c.count));
      detail::reduce_through_f32(c.dtype, c.redop, c.in.data_ptr(), all, c.out.data_ptr(), c.count,
                                 size(), win.data(), wout.data(), [&](float* i, float* o) {
                                   reduce_scatter_ring(DType::f32, c.redop,
                                                       reinterpret_cast<char*>(i), o, c.count, op);
                                 });
      return;
    }
    std::vector<char> acc(static_cast<size_t>(all) * dtype_size(c.dtype));
    if (!acc.empty()) std::memcpy(acc.data(), c.in.data_ptr(), acc.size());
    reduce_scatter_ring(c.dtype, c.redop, acc.data(), c.out.data_ptr(), c.count, op);
    if (c.redop == ReduceOp::Avg) detail::host_divide(c.dtype, c.out.data_ptr(), c.count, size());
  }

  void all_gather(const CommCall& c, const Op& op) override {
    const size_t bytes = static_cast<size_t>(c.count) * dtype_size(c.dtype);
    char* out = static_cast<char*>(c.out.data_ptr());
    if (!c.in_place && bytes > 0)
      std::memcpy(out + static_cast<size_t>(rank()) * bytes, c.in.data_ptr(), bytes);
    std::vector<size_t> off(static_cast<size_t>(size()) + 1);
    for (size_t b = 0; b < off.size(); ++b) off[b] = b * bytes;
    ring_gather(out, off, op);
  }

  // The root's buffer on every rank, by the algorithm the table picks for its size: a binomial
  // tree (log2 n steps of the whole buffer) for small ones, a pipelined ring for large ones
  // (the root sends it once), or linear where MESHRT_ALGO forces it.
  void broadcast(const CommCall& c, const Op& op) override {
    const size_t bytes = static_cast<size_t>(c.count) * dtype_size(c.dtype);
    char* out = static_cast<char*>(c.out.data_ptr());
    if (rank() == c.root && !c.in_place && bytes > 0) std::memcpy(out, c.in.data_ptr(), bytes);
    if (bytes == 0 || size() <= 1) return;
    const detail::Algorithm* a = plan_.pick(CommOp::Broadcast, c.bytes());
    if (a == &detail::algos::linear) {
      broadcast_linear(out, bytes, c.root, op);
    } else if (a == &detail::algos::binomial) {
      broadcast_binomial(out, bytes, c.root, op);
    } else {
      broadcast_ring(out, bytes, c.root, op);
    }
  }

  // The root sends the whole buffer to each other rank in turn.
  void broadcast_linear(char* out, size_t bytes, int root, const Op& op) {
    if (rank() != root) {
      exchange(kColl, -1, nullptr, 0, root, out, bytes, op);
      return;
    }
    for (int p = 0; p < size(); ++p)
      if (p != rank()) exchange(kColl, p, out, bytes, -1, nullptr, 0, op);
  }

  // Over ranks relative to the root (v = rank - root mod n): v receives from v - m, m its lowest
  // set bit, then sends to v + m' for every m' < m, largest first.
  void broadcast_binomial(char* out, size_t bytes, int root, const Op& op) {
    const int n = size(), v = (rank() - root + n) % n;
    int m = 1;
    for (; m < n; m <<= 1) {
      if ((v & m) != 0) {
        exchange(kColl, -1, nullptr, 0, (v - m + root) % n, out, bytes, op);
        break;
      }
    }
    for (m >>= 1; m > 0; m >>= 1)
      if (v + m < n) exchange(kColl, (v + m + root) % n, out, bytes, -1, nullptr, 0, op);
  }

  // Along the ring from the root, in chunks: each rank between receives chunk k from its left
  // while it passes chunk k - 1 to its right, so every link carries the buffer once, at once.
  void broadcast_ring(char* out, size_t bytes, int root, const Op& op) {
    const int n = size(), v = (rank() - root + n) % n;
    if (v == 0) {
      exchange(kColl, right(), out, bytes, -1, nullptr, 0, op);
      return;
    }
    if (v == n - 1) {
      exchange(kColl, -1, nullptr, 0, left(), out, bytes, op);
      return;
    }
    const size_t chunks = (bytes + kRingChunk - 1) / kRingChunk;
    auto len = [&](size_t k) { return std::min(kRingChunk, bytes - k * kRingChunk); };
    for (size_t k = 0; k <= chunks; ++k) {
      const bool pass = k > 0, take = k < chunks;
      exchange(kColl, pass ? right() : -1, pass ? out + (k - 1) * kRingChunk : nullptr,
               pass ? len(k - 1) : 0, take ? left() : -1, take ? out + k * kRingChunk : nullptr,
               take ? len(k) : 0, op);
    }
  }

  // Pairwise: in step k each rank sends to rank + k and receives from rank - k.
  void all_to_all(const CommCall& c, const Op& op) override {
    const size_t bytes = static_cast<size_t>(c.count) * dtype_size(c.dtype);
    const int n = size();
    std::vector<char> staged;
    const char* in = static_cast<const char*>(c.in.data_ptr());
    char* out = static_cast<char*>(c.out.data_ptr());
    if (c.in_place && bytes > 0) {
      staged.assign(in, in + bytes * static_cast<size_t>(n));
      in = staged.data();
    }
    const size_t me = static_cast<size_t>(rank());
    if (bytes > 0) std::memmove(out + me * bytes, in + me * bytes, bytes);
    for (int k = 1; k < n; ++k) {
      const int to = (rank() + k) % n, from = (rank() - k + n) % n;
      exchange(kColl, to, in + static_cast<size_t>(to) * bytes, bytes, from,
               out + static_cast<size_t>(from) * bytes, bytes, op);
    }
  }

  void barrier(const CommCall&, const Op& op) override { exchange_words(op, {1}); }

  // A message: {magic, count, dtype, message number}, then the elements.
  void send(const CommCall& c, const Op& op) override {
    const int64_t hdr[4] = {kP2PMagic, c.count, static_cast<int64_t>(c.dtype),
                            static_cast<int64_t>(c.seq)};
    exchange(kP2P, c.peer, hdr, sizeof(hdr), -1, nullptr, 0, op);
    exchange(kP2P, c.peer, c.in.data_ptr(), static_cast<size_t>(c.count) * dtype_size(c.dtype), -1,
             nullptr, 0, op);
  }

  void recv(const CommCall& c, const Op& op) override {
    int64_t hdr[4] = {};
    exchange(kP2P, -1, nullptr, 0, c.peer, hdr, sizeof(hdr), op);
    const bool known = hdr[2] >= 0 && hdr[2] <= static_cast<int64_t>(DType::u8);
    if (hdr[0] != kP2PMagic || !known || hdr[1] < 0 || hdr[3] != static_cast<int64_t>(c.seq)) {
      const std::string msg = context(op) + " failed: the message from " + rank_label(c.peer) +
                              " is not the one expected (message #" + std::to_string(hdr[3]) +
                              "; the connection is out of step)";
      abort_group(msg);
      throw CommError(msg);
    }
    const DType sent = static_cast<DType>(hdr[2]);
    if (hdr[1] == c.count && sent == c.dtype) {
      exchange(kP2P, -1, nullptr, 0, c.peer, c.out.data_ptr(),
               static_cast<size_t>(c.count) * dtype_size(c.dtype), op);
      return;
    }
    std::vector<char> drop(static_cast<size_t>(hdr[1]) * dtype_size(sent));
    exchange(kP2P, -1, nullptr, 0, c.peer, drop.data(), drop.size(), op);
    throw CommError("send/recv mismatch on group '" + name() + "': " + rank_label(c.peer) +
                    " sent " + std::to_string(hdr[1]) + " elements of " + dtype_name(sent) +
                    " but " + rank_label(rank()) + " receives " + dtype_name(c.dtype) +
                    " count=" + std::to_string(c.count) + " (message #" + std::to_string(c.seq) +
                    " between them)");
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& new_name,
                                      const Op& op) override;
};

std::unique_ptr<Communicator> TcpEngine::split(int color, int key, const std::string& new_name,
                                               const Op& op) {
  const std::vector<int64_t> all = exchange_words(op, {color, key});
  if (color < 0) return nullptr;
  std::vector<std::pair<int64_t, int>> mine;  // (key, group rank) of this colour
  for (int j = 0; j < size(); ++j) {
    if (all[static_cast<size_t>(2 * j)] == color)
      mine.emplace_back(all[static_cast<size_t>(2 * j + 1)], j);
  }
  std::sort(mine.begin(), mine.end());
  std::vector<int> members;
  int me = -1;
  for (const auto& [k, j] : mine) {
    if (j == rank()) me = static_cast<int>(members.size());
    members.push_back(members_[static_cast<size_t>(j)]);
  }
  const std::string token = token_ + "." + std::to_string(op.seq()) + "." + std::to_string(color);
  auto e = std::make_shared<TcpEngine>(dom_, std::move(members), me, new_name, token, config());
  e->connect(Deadline::after(config().timeout_s));
  return detail::make_ordered_communicator(std::move(e), Device::cpu(0));
}

// A listening socket on every interface, on a port the system picks: (fd, port).
std::pair<int, int> listen_any() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) throw CommError("tcp: socket() failed: " + sys_text(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(fd, SOMAXCONN) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const int e = errno;
    close(fd);
    throw CommError("tcp: cannot listen on a TCP port of this host: " + sys_text(e));
  }
  return {fd, ntohs(a.sin_port)};
}

std::string job_token() {
  std::random_device rd;
  std::ostringstream os;
  os << std::hex << ((static_cast<uint64_t>(rd()) << 32) ^ rd()) << getpid();
  return os.str();
}

std::string tcp_refuses(const WorldPlan& plan) {
  if (plan.device_type != DeviceType::CPU) {
    return "it moves CPU tensors; CUDA devices need a GPU backend (nccl)";
  }
  if (plan.kind == LaunchKind::Threads) {
    return "its ranks are processes; ranks that are threads of one process share memory already "
           "(host backend)";
  }
  if (plan.world_size <= 1) return "a single process has no peer to connect to";
  return "";
}

WorldFactory tcp_prepare(const WorldPlan& plan) {
  MESHRT_CHECK(plan.transport != nullptr,
               "tcp backend: " << plan.str() << " has no rendezvous to exchange addresses through");
  BootstrapTransport* tr = plan.transport;
  const CommConfig cfg = plan.config;
  return [tr, cfg](int) { return make_tcp_world_communicator(*tr, cfg); };
}

}  // namespace

namespace detail {

std::vector<NetInterface> host_interfaces() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0)
    throw CommError("tcp: cannot list this host's network interfaces (getifaddrs): " +
                    sys_text(errno));
  std::vector<NetInterface> out;
  std::set<std::string> with_ipv4;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_name == nullptr) continue;
    NetInterface i{a->ifa_name, "", (a->ifa_flags & IFF_UP) != 0,
                   (a->ifa_flags & IFF_LOOPBACK) != 0};
    char text[INET_ADDRSTRLEN] = {};
    if (a->ifa_addr != nullptr && a->ifa_addr->sa_family == AF_INET &&
        inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr, text,
                  sizeof(text)) != nullptr) {
      i.ipv4 = text;
      with_ipv4.insert(i.name);
    }
    out.push_back(std::move(i));
  }
  freeifaddrs(list);
  // One entry per IPv4 address, and one (without) for an interface that has none.
  std::vector<NetInterface> kept;
  std::set<std::string> listed;
  for (NetInterface& i : out) {
    if (!i.ipv4.empty() || (!with_ipv4.count(i.name) && listed.insert(i.name).second))
      kept.push_back(std::move(i));
  }
  return kept;
}

namespace {

// MESHRT_SOCKET_IFNAME's entries: (exact, name or prefix); `exclude` for a leading '^'.
std::vector<std::pair<bool, std::string>> parse_ifname(const std::string& spec, bool* exclude) {
  *exclude = !spec.empty() && spec[0] == '^';
  const std::string list = spec.substr(*exclude ? 1 : 0);
  std::vector<std::pair<bool, std::string>> items;
  for (size_t at = 0;;) {
    const size_t comma = list.find(',', at);
    std::string item = list.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    const bool exact = !item.empty() && item[0] == '=';
    if (exact) item.erase(0, 1);
    if (item.empty()) {
      throw Error("MESHRT_SOCKET_IFNAME='" + spec +
                  "': an empty interface name (form: interface name prefixes separated by "
                  "commas, '=name' for an exact name, '^' before the list to exclude those; "
                  "docs/environment.md)");
    }
    items.emplace_back(exact, item);
    if (comma == std::string::npos) return items;
    at = comma + 1;
  }
}

bool named_by(const std::vector<std::pair<bool, std::string>>& items, const std::string& name) {
  for (const auto& [exact, v] : items)
    if (exact ? name == v : name.compare(0, v.size(), v) == 0) return true;
  return false;
}

// "lo (127.0.0.1), eth0 (10.0.0.2, 10.0.0.3), ib0 (down, no IPv4)"
std::string interface_list(const std::vector<NetInterface>& ifs) {
  std::vector<std::string> names;
  std::map<std::string, std::string> what;
  for (const NetInterface& i : ifs) {
    std::string& w = what[i.name];
    if (w.empty() && std::find(names.begin(), names.end(), i.name) == names.end()) {
      names.push_back(i.name);
      if (!i.up) w = "down";
    }
    if (!i.ipv4.empty()) w += (w.empty() ? "" : ", ") + i.ipv4;
  }
  std::string out;
  for (const std::string& n : names) {
    std::string w = what[n];
    if (w.empty() || w == "down") w += std::string(w.empty() ? "" : ", ") + "no IPv4";
    out += (out.empty() ? "" : ", ") + n + " (" + w + ")";
  }
  return out.empty() ? "none" : out;
}

}  // namespace

SocketAddress choose_socket_address(const std::vector<NetInterface>& ifs, const std::string& ifname,
                                    const std::string& rendezvous) {
  const bool set = !ifname.empty();
  if (!set && !rendezvous.empty()) {  // the interface its peers already reached it on
    SocketAddress a{rendezvous, "", rendezvous.compare(0, 4, "127.") == 0};
    for (const NetInterface& i : ifs)
      if (i.ipv4 == rendezvous) a.interface = i.name;
    return a;
  }
  bool exclude = false;
  const auto items = parse_ifname(set ? ifname : "^docker,lo", &exclude);
  std::vector<const NetInterface*> ok;
  for (const NetInterface& i : ifs)
    if (i.up && !i.ipv4.empty() && named_by(items, i.name) != exclude && (set || !i.loopback))
      ok.push_back(&i);
  if (ok.empty() && set) {
    throw Error("MESHRT_SOCKET_IFNAME='" + ifname + "': no interface " +
                (exclude ? "outside" : "named by") +
                " it is up with an IPv4 address; this host's interfaces: " + interface_list(ifs) +
                ". Name one of those that has an IPv4 address, or unset it (docs/environment.md)");
  }
  if (ok.empty()) {  // no interface but docker's or loopback: any up one, loopback last
    for (const NetInterface& i : ifs)
      if (i.up && !i.ipv4.empty() && !i.loopback) ok.push_back(&i);
    for (const NetInterface& i : ifs)
      if (i.up && !i.ipv4.empty() && i.loopback) ok.push_back(&i);
  }
  if (ok.empty()) return {"127.0.0.1", "", true};
  const NetInterface* pick = nullptr;
  for (const NetInterface* i : ok)
    if (!rendezvous.empty() && i->ipv4 == rendezvous) pick = i;
  for (const NetInterface* i : ok)
    if (pick == nullptr && !i->loopback) pick = i;
  if (pick == nullptr) pick = ok.front();
  return {pick->ipv4, pick->name, pick->loopback};
}

}  // namespace detail

std::unique_ptr<Communicator> make_tcp_world_communicator(BootstrapTransport& tr,
                                                          CommConfig config) {
  const std::string ifname = env_or("MESHRT_SOCKET_IFNAME");
  const detail::SocketAddress at =
      detail::choose_socket_address(detail::host_interfaces(), ifname, tr.local_address());
  if (at.loopback_only && ifname.empty() && tr.local_address().empty()) {
    MESHRT_LOG_WARN("tcp backend: rank "
                    << tr.rank() << " publishes the loopback address " << at.address
                    << " (no other interface is up with an IPv4 address): its peers must run on "
                       "this machine");
  }
  const std::string& host = at.address;
  const auto [fd, port] = listen_any();
  const std::string mine =
      host + ":" + std::to_string(port) + " " + (tr.rank() == 0 ? job_token() : std::string("-"));
  std::vector<std::string> answers;
  try {
    answers = tr.all_gather("tcp.listen", mine);
  } catch (...) {
    close(fd);
    throw;
  }
  std::vector<std::string> addrs;
  for (size_t j = 0; j < answers.size(); ++j) {
    const std::string& a = answers[j];
    if (a.find(':') == std::string::npos || a.find(' ') == std::string::npos) {
      close(fd);
      throw CommError("tcp: rank " + std::to_string(j) + " published '" + a +
                      "' at the rendezvous, not 'address:port token' (ranks of different meshrt "
                      "versions?)");
    }
    addrs.push_back(a.substr(0, a.find(' ')));
  }
  const std::string job = answers[0].substr(answers[0].find(' ') + 1);
  auto dom = std::make_shared<TcpDomain>(fd, std::move(addrs), job, tr.rank());
  std::vector<int> world(static_cast<size_t>(tr.size()));
  for (int j = 0; j < tr.size(); ++j) world[static_cast<size_t>(j)] = j;
  auto e = std::make_shared<TcpEngine>(dom, std::move(world), tr.rank(), "world", "w", config);
  e->connect(Deadline::after(config.timeout_s > 0 ? config.timeout_s : 1e9));
  MESHRT_LOG_DEBUG("tcp backend: rank "
                   << tr.rank() << " of " << tr.size() << " listens on " << host << ":" << port
                   << " (" << (at.interface.empty() ? "the rendezvous' address" : at.interface)
                   << ")");
  return detail::make_ordered_communicator(std::move(e), Device::cpu(0));
}

namespace detail {

void register_tcp_backend(std::vector<CommBackend>& registry) {
  add_collective_backend(registry, {"tcp", 15, tcp_refuses, tcp_prepare});
}

}  // namespace detail

}  // namespace meshrt
