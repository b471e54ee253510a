// Chrome / Perfetto traces of a benchmark: one track per rank and stream (compute, tp comm, dp
// comm); slices are bounded by events recorded on the streams themselves (host streams stamp them
// when their worker reaches them, CUDA records timing events), so a slice is when the work ran,
// not when it was enqueued.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "dist/parallel.h"
#include "runtime/stream.h"

namespace meshrt {

class TraceRecorder {
 public:
  // `compute` is the rank's compute stream (track 0); "comm.tp" is track 1, "comm.dp" track 2,
  // any other stream gets the next free track.
  TraceRecorder(int rank, Stream& compute);

  bool enabled() const { return enabled_; }
  void set_enabled(bool on) { enabled_ = on; }
  // Starts a step: slices recorded until end_step() are timed against an event recorded on the
  // compute stream now; `host_offset_us` places that event on the trace's time axis.
  void begin_step(int step, double host_offset_us);
  // Opens a slice on `stream` (marks its current end) and a profiler range of the same name on
  // this thread (runtime/ranges.h: NVTX in CUDA builds, with `payload`, e.g. the piece's FLOPs,
  // whether or not the recorder is enabled); returns a handle for end(). `args_json` is a JSON
  // object body without braces, e.g. "\"bytes\": 4096". Calls nest on a thread.
  int begin(Stream& stream, std::string name, std::string args_json = "", uint64_t payload = 0);
  // The slice alone, no range: for work that opens its own range (collectives do).
  int begin_slice(Stream& stream, std::string name, std::string args_json = "");
  void end(int handle);
  // After every stream of the rank has been synchronised: turns the step's events into slices.
  void end_step();
  // Number of markers (events) recorded so far, for the overhead report.
  int64_t markers() const { return markers_; }
  // This rank's trace events as comma-separated Chrome trace JSON objects (no brackets),
  // including the process / thread name metadata.
  std::string serialize() const;

 private:
  static constexpr int kNone = -1, kRangeOnly = -2;  // handles that are no slice
  struct Open {
    bool ranged = false;
    Stream* stream;
    int tid;
    std::string name, args;
    Event start, stop;
  };
  int track_of(Stream& s);
  int open_slice(Stream& stream, std::string name, std::string args_json, bool ranged);

  int rank_;
  Stream& compute_;
  bool enabled_ = false;
  std::mutex mu_;
  std::map<const Stream*, int> tracks_;
  std::map<int, std::string> track_names_;
  Event base_;
  int step_ = 0;
  double base_us_ = 0;
  std::vector<Open> open_;
  std::string out_;
  int64_t markers_ = 0;
};

// The time a group's calls ran on their streams, as CommScheduler's comm_ms (events recorded on
// the stream around each call; host: exact), with their bytes and count.
class StreamTimes {
 public:
  explicit StreamTimes(std::string suffix) : suffix(std::move(suffix)) {}
  const std::string suffix;  // of the group names timed: "/cp"
  void add(Event start, Event stop, int64_t bytes);
  // Totals since reset() (blocks until the timed calls completed: call after synchronising).
  CommTimes times();
  void reset();

 private:
  std::mutex mu_;
  std::vector<std::pair<Event, Event>> pending_;
  CommTimes t_;
};

// A Communicator that forwards every call to another one and records each collective as a trace
// slice on the stream it runs on (name = op, args = group, dtype, element count and bytes).
// Splits return wrapped communicators, so a DeviceMesh built over a wrapped world traces its tp
// and dp groups too. Costs two extra stream markers per collective while the recorder is enabled.
// With `times`, the calls of the groups whose name ends in times->suffix (the cp group's sends
// and receives, which no CommScheduler issues) are also timed on their streams.
class TracingCommunicator final : public Communicator {
 public:
  TracingCommunicator(Communicator& inner, TraceRecorder* rec, StreamTimes* times = nullptr);
  TracingCommunicator(std::unique_ptr<Communicator> inner, TraceRecorder* rec,
                      StreamTimes* times = nullptr);

 private:
  TracingCommunicator(Communicator& inner, std::unique_ptr<Communicator>&& owned,
                      TraceRecorder* rec, StreamTimes* times);
};

}  // namespace meshrt
