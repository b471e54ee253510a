// The C API on ranks as threads: worlds made by meshrt_comm_init_rank (one call per engine
// thread) and meshrt_comm_init_all (one call), every collective x dtype on engine-owned buffers
// with exact integer data, streams and events, split.
#include <atomic>
#include <memory>

#include "capi_test_util.h"

using namespace capi_test;

namespace {

// Small integers, exact in every dtype (bf16 included) and in every sum / average below.
double v(int r, int64_t i) { return 4.0 * r + 4.0 * static_cast<double>(i % 5); }

void fill(Buf& b, int r) {
  for (int64_t i = 0; i < b.size(); ++i) b.set(i, v(r, i));
}

std::string at(const char* what, const char* dt, int rank, int64_t i, double got, double want) {
  return std::string(what) + " " + dt + " rank " + std::to_string(rank) + " [" + std::to_string(i) +
         "]: got " + std::to_string(got) + ", want " + std::to_string(want);
}

void wait_and_free(meshrt_event_t e) {
  CAPI_THROW_UNLESS_OK(meshrt_event_synchronize(e));
  int done = 0;
  CAPI_THROW_UNLESS_OK(meshrt_event_query(e, &done));
  RANK_EXPECT(done == 1, "a synchronized event reports done");
  CAPI_THROW_UNLESS_OK(meshrt_event_destroy(e));
}

// Every collective and dtype on one rank of `comm` (called by every rank's thread).
void every_collective(meshrt_comm_t comm) {
  int rank = -1, n = 0;
  CAPI_THROW_UNLESS_OK(meshrt_comm_rank(comm, &rank));
  CAPI_THROW_UNLESS_OK(meshrt_comm_size(comm, &n));
  meshrt_stream_t side = nullptr, other = nullptr;
  CAPI_THROW_UNLESS_OK(meshrt_stream_create(comm, &side));
  CAPI_THROW_UNLESS_OK(meshrt_stream_create(comm, &other));
  const int64_t c = 3;  // elements per rank block
  for (const DtypeCase& d : all_dtypes()) {
    // all_reduce: each op out of place, on the side stream, then sum in place on the default one.
    const meshrt_reduce_op_t ops[] = {MESHRT_SUM, MESHRT_AVG, MESHRT_MAX, MESHRT_MIN};
    for (meshrt_reduce_op_t op : ops) {
      Buf in(d.dt, n * c), out(d.dt, n * c);
      fill(in, rank);
      meshrt_event_t e = nullptr;
      CAPI_THROW_UNLESS_OK(meshrt_all_reduce(comm, in.handle(), out.handle(), op, side, &e));
      wait_and_free(e);
      for (int64_t i = 0; i < in.size(); ++i) {
        double sum = 0, mx = v(0, i), mn = v(0, i);
        for (int r = 0; r < n; ++r) {
          sum += v(r, i);
          mx = std::max(mx, v(r, i));
          mn = std::min(mn, v(r, i));
        }
        const double want = op == MESHRT_SUM   ? sum
                            : op == MESHRT_AVG ? sum / n
                            : op == MESHRT_MAX ? mx
                                               : mn;
        RANK_EXPECT(out.get(i) == want, at("all_reduce", d.name, rank, i, out.get(i), want));
      }
    }
    {
      Buf t(d.dt, 5);
      fill(t, rank);
      meshrt_event_t e = nullptr;
      CAPI_THROW_UNLESS_OK(
          meshrt_all_reduce(comm, t.handle(), t.handle(), MESHRT_SUM, nullptr, &e));
      wait_and_free(e);
      for (int64_t i = 0; i < t.size(); ++i) {
        double sum = 0;
        for (int r = 0; r < n; ++r) sum += v(r, i);
        RANK_EXPECT(t.get(i) == sum, at("all_reduce in place", d.name, rank, i, t.get(i), sum));
      }
    }
    {  // all_gather
      Buf in(d.dt, c), out(d.dt, n * c);
      fill(in, rank);
      meshrt_event_t e = nullptr;
      CAPI_THROW_UNLESS_OK(meshrt_all_gather(comm, in.handle(), out.handle(), side, &e));
      wait_and_free(e);
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < c; ++i)
          RANK_EXPECT(out.get(r * c + i) == v(r, i),
                      at("all_gather", d.name, rank, r * c + i, out.get(r * c + i), v(r, i)));
    }
    {  // reduce_scatter
      Buf in(d.dt, n * c), out(d.dt, c);
      fill(in, rank);
      meshrt_event_t e = nullptr;
      CAPI_THROW_UNLESS_OK(
          meshrt_reduce_scatter(comm, in.handle(), out.handle(), MESHRT_SUM, nullptr, &e));
      wait_and_free(e);
      for (int64_t i = 0; i < c; ++i) {
        double sum = 0;
        for (int r = 0; r < n; ++r) sum += v(r, rank * c + i);
        RANK_EXPECT(out.get(i) == sum, at("reduce_scatter", d.name, rank, i, out.get(i), sum));
      }
    }
    {  // broadcast from the last rank, out of place and in place
      const int root = n - 1;
      Buf in(d.dt, c), out(d.dt, c), t(d.dt, c);
      fill(in, rank);
      fill(t, rank);
      meshrt_event_t e1 = nullptr, e2 = nullptr;
      CAPI_THROW_UNLESS_OK(meshrt_broadcast(comm, in.handle(), out.handle(), root, side, &e1));
      CAPI_THROW_UNLESS_OK(meshrt_broadcast(comm, nullptr, t.handle(), root, side, &e2));
      wait_and_free(e1);
      wait_and_free(e2);
      for (int64_t i = 0; i < c; ++i) {
        RANK_EXPECT(out.get(i) == v(root, i),
                    at("broadcast", d.name, rank, i, out.get(i), v(root, i)));
        RANK_EXPECT(t.get(i) == v(root, i),
                    at("broadcast in place", d.name, rank, i, t.get(i), v(root, i)));
      }
    }
    {  // all_to_all
      Buf in(d.dt, n * c), out(d.dt, n * c);
      fill(in, rank);
      meshrt_event_t e = nullptr;
      CAPI_THROW_UNLESS_OK(meshrt_all_to_all(comm, in.handle(), out.handle(), nullptr, &e));
      wait_and_free(e);
      for (int k = 0; k < n; ++k)
        for (int64_t i = 0; i < c; ++i) {
          const double want = v(k, rank * c + i);
          RANK_EXPECT(out.get(k * c + i) == want,
                      at("all_to_all", d.name, rank, k * c + i, out.get(k * c + i), want));
        }
    }
    {  // a ring of send / recv, each on its own stream (a send completes once received)
      const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
      Buf s(d.dt, c), r(d.dt, c);
      fill(s, rank);
      meshrt_event_t es = nullptr, er = nullptr;
      CAPI_THROW_UNLESS_OK(meshrt_send(comm, s.handle(), next, side, &es));
      CAPI_THROW_UNLESS_OK(meshrt_recv(comm, r.handle(), prev, other, &er));
      wait_and_free(es);
      wait_and_free(er);
      for (int64_t i = 0; i < c; ++i)
        RANK_EXPECT(r.get(i) == v(prev, i), at("recv", d.name, rank, i, r.get(i), v(prev, i)));
    }
  }
  meshrt_event_t b = nullptr;
  CAPI_THROW_UNLESS_OK(meshrt_barrier(comm, nullptr, &b));
  wait_and_free(b);
  CAPI_THROW_UNLESS_OK(meshrt_stream_destroy(side));
  CAPI_THROW_UNLESS_OK(meshrt_stream_destroy(other));
}

}  // namespace

TEST_CASE("capi: init_rank from engine threads runs every collective x dtype", "[capi]") {
  const int n = GENERATE(2, 4);
  init_api();
  meshrt_unique_id_t id;
  CAPI_REQUIRE_OK(meshrt_get_unique_id(&id));
  const meshrt_comm_config_t cfg = test_config();
  run_ranks(n, [&](int r) {
    meshrt_comm_t comm = nullptr;
    CAPI_THROW_UNLESS_OK(meshrt_comm_init_rank(&comm, n, id, r, &cfg));
    int rank = -1, size = 0, index = -1;
    meshrt_device_type_t type = MESHRT_DEVICE_CUDA;
    CAPI_THROW_UNLESS_OK(meshrt_comm_rank(comm, &rank));
    CAPI_THROW_UNLESS_OK(meshrt_comm_size(comm, &size));
    CAPI_THROW_UNLESS_OK(meshrt_comm_device(comm, &type, &index));
    RANK_EXPECT(rank == r && size == n, "rank and size as joined");
    RANK_EXPECT(type == MESHRT_DEVICE_CPU && index == r, "CPU ranks as threads run on cpu:<rank>");
    const char* backend = nullptr;
    CAPI_THROW_UNLESS_OK(meshrt_comm_backend(comm, &backend));
    RANK_EXPECT(backend != nullptr && std::string(backend) == "host", "threads run on host");
    RANK_EXPECT(meshrt_comm_backend(comm, nullptr) == MESHRT_ERROR_INVALID_ARGUMENT,
                "a NULL name is refused");
    every_collective(comm);
    CAPI_THROW_UNLESS_OK(meshrt_comm_destroy(comm));
  });
}

TEST_CASE("capi: init_all from one thread runs every collective x dtype", "[capi]") {
  const int n = GENERATE(2, 4);
  init_api();
  const meshrt_comm_config_t cfg = test_config();
  std::vector<meshrt_comm_t> comms(static_cast<size_t>(n));
  CAPI_REQUIRE_OK(meshrt_comm_init_all(comms.data(), n, nullptr, &cfg));
  run_ranks(n, [&](int r) { every_collective(comms[static_cast<size_t>(r)]); });
  for (meshrt_comm_t c : comms) CAPI_REQUIRE_OK(meshrt_comm_destroy(c));
}

TEST_CASE("capi: streams order work through events, default stream is the comm's", "[capi]") {
  init_api();
  const int n = 2;
  std::vector<meshrt_comm_t> comms(n);
  const meshrt_comm_config_t cfg = test_config();
  CAPI_REQUIRE_OK(meshrt_comm_init_all(comms.data(), n, nullptr, &cfg));
  run_ranks(n, [&](int r) {
    meshrt_comm_t comm = comms[static_cast<size_t>(r)];
    meshrt_stream_t s1 = nullptr, s2 = nullptr, def = nullptr;
    CAPI_THROW_UNLESS_OK(meshrt_stream_create(comm, &s1));
    CAPI_THROW_UNLESS_OK(meshrt_stream_create(comm, &s2));
    CAPI_THROW_UNLESS_OK(meshrt_comm_default_stream(comm, &def));
    const meshrt_status_t st = meshrt_stream_destroy(def);
    RANK_EXPECT(st == MESHRT_ERROR_INVALID_USAGE, "the default stream cannot be destroyed");
    // a 1 MiB all-reduce on s1, then an all-reduce of its result on s2 after s1's event: the
    // second sees the first's output only if the wait orders it.
    Buf a(dl_dtype(kDLFloat, 32), 1 << 18), b(dl_dtype(kDLFloat, 32), 1 << 18);
    for (int64_t i = 0; i < a.size(); ++i) a.set(i, 1.0);
    meshrt_event_t e1 = nullptr, e2 = nullptr;
    CAPI_THROW_UNLESS_OK(meshrt_all_reduce(comm, a.handle(), a.handle(), MESHRT_SUM, s1, &e1));
    CAPI_THROW_UNLESS_OK(meshrt_stream_wait_event(s2, e1));
    CAPI_THROW_UNLESS_OK(meshrt_all_reduce(comm, a.handle(), b.handle(), MESHRT_SUM, s2, &e2));
    int done = -1;
    CAPI_THROW_UNLESS_OK(meshrt_event_query(e2, &done));
    RANK_EXPECT(done == 0 || done == 1, "query answers 0 or 1");
    CAPI_THROW_UNLESS_OK(meshrt_stream_synchronize(s2));
    CAPI_THROW_UNLESS_OK(meshrt_event_query(e2, &done));
    RANK_EXPECT(done == 1, "the event is done once its stream is synchronized");
    for (int64_t i = 0; i < b.size(); i += 4097) {
      RANK_EXPECT(b.get(i) == 2.0 * n, "b = n * (n * 1): the second all-reduce saw the first");
    }
    // NULL event pointer: no event, no hidden synchronisation; the stream's sync covers it.
    CAPI_THROW_UNLESS_OK(meshrt_barrier(comm, nullptr, nullptr));
    CAPI_THROW_UNLESS_OK(meshrt_stream_synchronize(def));
    CAPI_THROW_UNLESS_OK(meshrt_event_destroy(e1));
    CAPI_THROW_UNLESS_OK(meshrt_event_destroy(e2));
    CAPI_THROW_UNLESS_OK(meshrt_stream_destroy(s1));
    CAPI_THROW_UNLESS_OK(meshrt_stream_destroy(s2));
  });
  for (meshrt_comm_t c : comms) CAPI_REQUIRE_OK(meshrt_comm_destroy(c));
}

TEST_CASE("capi: thread_inline runs a call on an idle stream here, queues behind a busy one",
          "[capi]") {
  const int n = GENERATE(2, 4);
  init_api();
  std::vector<meshrt_comm_t> comms(static_cast<size_t>(n));
  const meshrt_comm_config_t cfg = test_config();
  CAPI_REQUIRE_OK(meshrt_comm_init_all(comms.data(), n, nullptr, &cfg));
  std::atomic<bool> rank0_queued{false};
  run_ranks(n, [&](int r) {
    meshrt_comm_t comm = comms[static_cast<size_t>(r)];
    meshrt_stream_t s = nullptr;  // never used before: idle
    CAPI_THROW_UNLESS_OK(meshrt_stream_create(comm, &s));
    const DLDataType f32 = dl_dtype(kDLFloat, 32);
    int prev = -1, done = -1;
    CAPI_THROW_UNLESS_OK(meshrt_thread_inline(1, &prev));
    RANK_EXPECT(prev == 0, "inline mode starts off");
    // Idle stream: the call ran on this thread and returns completed.
    Buf x(f32, 5);
    for (int64_t i = 0; i < x.size(); ++i) x.set(i, double(r + i));
    meshrt_event_t e = nullptr;
    CAPI_THROW_UNLESS_OK(meshrt_all_reduce(comm, x.handle(), x.handle(), MESHRT_SUM, s, &e));
    CAPI_THROW_UNLESS_OK(meshrt_event_query(e, &done));
    RANK_EXPECT(done == 1, "an inline call on an idle stream is done when it returns");
    CAPI_THROW_UNLESS_OK(meshrt_event_destroy(e));
    for (int64_t i = 0; i < x.size(); ++i) {
      RANK_EXPECT(x.get(i) == double(n * (n - 1) / 2 + n * i), "inline all_reduce sums");
    }
    // Busy stream: rank 0 queues a (not inline) all-reduce A that waits for the other ranks, then
    // an inline one B that reduces A's output. B must queue behind A and return at once.
    Buf a(f32, 3), b(f32, 3);
    for (int64_t i = 0; i < a.size(); ++i) a.set(i, 1.0);
    meshrt_event_t ea = nullptr, eb = nullptr;
    if (r == 0) {
      CAPI_THROW_UNLESS_OK(meshrt_thread_inline(0, &prev));
      RANK_EXPECT(prev == 1, "previous mode handed back");
      CAPI_THROW_UNLESS_OK(meshrt_all_reduce(comm, a.handle(), a.handle(), MESHRT_SUM, s, &ea));
      CAPI_THROW_UNLESS_OK(meshrt_thread_inline(1, nullptr));
      CAPI_THROW_UNLESS_OK(meshrt_all_reduce(comm, a.handle(), b.handle(), MESHRT_SUM, s, &eb));
      CAPI_THROW_UNLESS_OK(meshrt_event_query(eb, &done));
      RANK_EXPECT(done == 0, "an inline call on a busy stream queued (its peers are not there)");
      rank0_queued = true;
    } else {
      while (!rank0_queued) std::this_thread::yield();
      CAPI_THROW_UNLESS_OK(meshrt_all_reduce(comm, a.handle(), a.handle(), MESHRT_SUM, s, &ea));
      CAPI_THROW_UNLESS_OK(meshrt_all_reduce(comm, a.handle(), b.handle(), MESHRT_SUM, s, &eb));
    }
    CAPI_THROW_UNLESS_OK(meshrt_event_synchronize(eb));
    CAPI_THROW_UNLESS_OK(meshrt_event_synchronize(ea));
    for (int64_t i = 0; i < b.size(); ++i) {
      RANK_EXPECT(b.get(i) == double(n * n), "B reduced A's output: it ran after A");
    }
    CAPI_THROW_UNLESS_OK(meshrt_event_destroy(ea));
    CAPI_THROW_UNLESS_OK(meshrt_event_destroy(eb));
    CAPI_THROW_UNLESS_OK(meshrt_thread_inline(0, nullptr));
    CAPI_THROW_UNLESS_OK(meshrt_stream_destroy(s));
  });
  for (meshrt_comm_t c : comms) CAPI_REQUIRE_OK(meshrt_comm_destroy(c));
  require_status(meshrt_thread_inline(2, nullptr), MESHRT_ERROR_INVALID_ARGUMENT,
                 {"on is 2", "pass 1"});
}

TEST_CASE("capi: split makes sub-communicators that reduce within their colour", "[capi]") {
  init_api();
  const int n = 4;
  std::vector<meshrt_comm_t> comms(n);
  const meshrt_comm_config_t cfg = test_config();
  CAPI_REQUIRE_OK(meshrt_comm_init_all(comms.data(), n, nullptr, &cfg));
  run_ranks(n, [&](int r) {
    meshrt_comm_t sub = nullptr, none = reinterpret_cast<meshrt_comm_t>(1);
    // colours 0 / 1 by parity, keyed in reverse: the new rank order is reversed.
    CAPI_THROW_UNLESS_OK(meshrt_comm_split(comms[static_cast<size_t>(r)], r % 2, -r, &sub));
    int sr = -1, ss = 0;
    CAPI_THROW_UNLESS_OK(meshrt_comm_rank(sub, &sr));
    CAPI_THROW_UNLESS_OK(meshrt_comm_size(sub, &ss));
    RANK_EXPECT(ss == 2 && sr == (r < 2 ? 1 : 0), "split by parity, ranked by key");
    Buf t(dl_dtype(kDLInt, 64), 4);
    for (int64_t i = 0; i < 4; ++i) t.set(i, r);
    CAPI_THROW_UNLESS_OK(
        meshrt_all_reduce(sub, t.handle(), t.handle(), MESHRT_SUM, nullptr, nullptr));
    meshrt_stream_t def = nullptr;
    CAPI_THROW_UNLESS_OK(meshrt_comm_default_stream(sub, &def));
    CAPI_THROW_UNLESS_OK(meshrt_stream_synchronize(def));
    RANK_EXPECT(t.get(0) == (r % 2 == 0 ? 0 + 2 : 1 + 3), "sum over the colour's ranks");
    CAPI_THROW_UNLESS_OK(
        meshrt_comm_split(comms[static_cast<size_t>(r)], MESHRT_SPLIT_NO_COLOR, 0, &none));
    RANK_EXPECT(none == nullptr, "no colour, no communicator");
    CAPI_THROW_UNLESS_OK(meshrt_comm_destroy(sub));
  });
  for (meshrt_comm_t c : comms) CAPI_REQUIRE_OK(meshrt_comm_destroy(c));
}
