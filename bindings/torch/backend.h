// meshrt as a torch.distributed backend: a c10d::Backend over one meshrt communicator, reached
// through meshrt's C API only (include/meshrt/meshrt.h). See docs/torch.md.
#pragma once

#include <meshrt/meshrt.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace meshrt_torch {

// What one call enqueued: the completion events, the tensors that must live until they fire,
// and the work to do once they did (unpacking, copies back into non-contiguous outputs).
struct Pending {
  std::vector<meshrt_event_t> events;
  std::vector<at::Tensor> keep;
  std::vector<std::function<void()>> finish;     // run in order once every event succeeded
  std::vector<std::function<void()>> copy_back;  // then these
  std::vector<at::Tensor> outputs;               // the Work's result() and its future's value
  // One enqueued meshrt call: its event, and the tensors it reads or writes kept until it ran.
  void add(meshrt_event_t ev, std::initializer_list<at::Tensor> tensors) {
    events.push_back(ev);
    keep.insert(keep.end(), tensors);
  }
};

class MeshrtWork;

// Completes the futures of works nobody waits on (DDP's comm hooks, FSDP2): one thread, started
// on the first getFuture() of a pending work, stopped with the backend.
class Completer {
 public:
  ~Completer();
  void push(c10::intrusive_ptr<MeshrtWork> work);
  void stop();  // finishes what was queued, then joins the thread

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<MeshrtWork>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

class MeshrtWork : public c10d::Work {
 public:
  MeshrtWork(int rank, c10d::OpType type, std::string op, Pending pending,
             std::weak_ptr<Completer> completer);
  ~MeshrtWork() override;
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // Waits for (block) or polls the events, then runs the finishing steps; true once done.
  bool finalize(bool block);

 private:
  void complete_future_locked();
  int rank_;
  std::string op_;
  Pending pending_;
  size_t next_event_ = 0;
  std::weak_ptr<Completer> completer_;
  std::mutex mu_;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class MeshrtBackend : public c10d::Backend {
 public:
  // Bootstraps a communicator over torch's store: rank 0 listens on a free TCP port and publishes
  // it there; CPU ranks of one node then share memory (meshrt's shm backend).
  static c10::intrusive_ptr<MeshrtBackend> create(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank, int size, double timeout_s);
  MeshrtBackend(meshrt_comm_t comm, c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                double timeout_s);
  ~MeshrtBackend() override;
  const std::string getBackendName() const override { return "meshrt"; }
  meshrt_comm_t comm() const { return comm_; }
  void shutdown() override;
  void abort() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

 private:
  c10::intrusive_ptr<c10d::Work> make_work(c10d::OpType type, const char* op, Pending p);
  [[noreturn]] void fail(const std::string& op, const std::string& cause) const;
  void check(meshrt_status_t s, const std::string& op) const;
  // Enqueue one meshrt collective on contiguous CPU tensors; the event and tensors go to p.
  void all_reduce_into(Pending& p, const at::Tensor& buf, c10d::ReduceOp op, const char* name);
  void all_gather_into(Pending& p, const at::Tensor& in, const at::Tensor& out, const char* name);
  void reduce_scatter_into(Pending& p, const at::Tensor& in, const at::Tensor& out,
                           c10d::ReduceOp op, const char* name);
  void broadcast_into(Pending& p, const at::Tensor& buf, int root, const char* name);
  void all_to_all_into(Pending& p, const at::Tensor& in, const at::Tensor& out, const char* name);
  void all_to_all_uneven(Pending& p, const at::Tensor& in, const at::Tensor& out,
                         std::vector<int64_t> out_splits, std::vector<int64_t> in_splits,
                         const char* name);
  // A contiguous buffer for output `t` (t itself, or a copy written back when the work ends).
  at::Tensor out_buffer(Pending& p, const at::Tensor& t, bool keep_values);
  void check_tensor(const at::Tensor& t, const std::string& op) const;
  meshrt_stream_t p2p_stream(bool send_side);
  // Where a collective on `t` runs: the CPU communicator and its default stream, or (CUDA
  // tensors) the NCCL communicator of t's device, on torch's current stream there.
  struct Target {
    meshrt_comm_t comm;
    meshrt_stream_t stream;
  };
  Target target(const at::Tensor& t, const char* name);
  meshrt_comm_t cuda_comm(int device, const char* name);

  meshrt_comm_t comm_;
  c10::intrusive_ptr<c10d::Store> store_;  // bootstraps the CUDA communicators, on first use
  std::mutex cuda_mu_;
  meshrt_comm_t cuda_comm_ = nullptr;              // made on the first CUDA collective
  int cuda_device_ = -1;                           // its device (one per rank and group)
  std::map<void*, meshrt_stream_t> cuda_streams_;  // torch's cudaStream_t, wrapped
  double timeout_s_;
  meshrt_stream_t send_stream_ = nullptr;
  meshrt_stream_t recv_stream_ = nullptr;
  std::shared_ptr<Completer> completer_;
  std::mutex destroy_mu_;
};

}  // namespace meshrt_torch
