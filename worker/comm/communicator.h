// Communicator: the collective and point-to-point interface every gradient-exchange algorithm is
// written against. Backends live in their own folders (gloo/, nccl/).
//
// Contract: every collective is called by all members of the group in the same order. Each call has
// a deadline (the `timeout` argument, or the communicator's default when it is zero); a call that
// cannot complete by then throws CommError naming the operation, the group, this rank and the peer
// that did not answer. After a failure the communicator is broken: later calls throw at once.
// A Communicator is not thread-safe: one thread issues its operations. Byte counters are exact for
// backends that move the bytes themselves (Gloo) and follow the ring schedule for NCCL.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "worker/comm/store.h"

namespace tessera {

// kBFloat16: bf16 bit patterns (uint16_t, kernels::bf16_bits); a sum of two is rounded to bf16 again,
// as NCCL's ncclBfloat16 sums.
enum class DType : uint8_t { kFloat32, kFloat64, kInt32, kInt64, kUInt8, kBFloat16 };
enum class ReduceOp : uint8_t { kSum, kMax, kMin };

size_t dtype_size(DType t);
const char* dtype_name(DType t);

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kFloat32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::kFloat64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::kInt32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::kInt64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::kUInt8;
}

// out[i] = op(out[i], in[i]) for `count` elements of type t.
void reduce_into(void* out, const void* in, size_t count, DType t, ReduceOp op);

// Splits `total` elements into `parts` contiguous segments whose sizes differ by at most one (the
// first total % parts segments are one longer). The segment layout every reduce-scatter uses.
std::vector<size_t> even_split(size_t total, int parts);

// Announces `rank` of group `group` in `store` and waits until every member has, so a missing member
// is reported by number: throws CommError "rendezvous of group 'world' (4 ranks; this is rank 0,
// global 0): rank 3 (global 3) did not join within 1000 ms". Every backend joins through this.
void join_group(Store& store, const std::string& group, int rank, const std::vector<int>& global_ranks, Millis timeout);

class Communicator {
 public:
  // `global_ranks[i]` is the world rank of group member i; `group` names the group in errors.
  Communicator(std::string group, int rank, std::vector<int> global_ranks, Millis default_timeout);
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(global_ranks_.size()); }
  const std::string& group() const { return group_; }
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  Millis default_timeout() const { return default_timeout_; }
  virtual std::string backend() const = 0;

  // ---- collectives (byte-level; typed wrappers below) ----
  // data[count] := op over all members of data[count].
  virtual void allreduce(void* data, size_t count, DType t, ReduceOp op, Millis timeout) = 0;
  // `in` holds sum(counts) elements laid out as size() segments; `out` receives counts[rank()]
  // elements: this member's segment reduced over all members.
  virtual void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, DType t, ReduceOp op,
                              Millis timeout) = 0;
  // out[sum(counts)] := the members' inputs concatenated in rank order; `in` has counts[rank()].
  virtual void allgatherv(const void* in, void* out, const std::vector<size_t>& counts, DType t, Millis timeout) = 0;
  // data[count] := root's data[count].
  virtual void broadcast(void* data, size_t count, DType t, int root, Millis timeout) = 0;
  virtual void send(const void* data, size_t bytes, int peer, uint32_t tag, Millis timeout) = 0;
  virtual void recv(void* data, size_t bytes, int peer, uint32_t tag, Millis timeout) = 0;
  // Sends sbytes to `to` and receives rbytes from `from` at the same time (neighbour exchanges: both
  // sides call it, so neither blocks on the other's send). Either size may be zero.
  virtual void sendrecv(const void* sdata, size_t sbytes, int to, void* rdata, size_t rbytes, int from, uint32_t tag,
                        Millis timeout) = 0;
  virtual void barrier(Millis timeout) = 0;

  // out[count * size()] := every member's in[count], in rank order.
  void allgather(const void* in, void* out, size_t count, DType t, Millis timeout);

  // ---- typed wrappers; a zero timeout means default_timeout() ----
  template <typename T>
  void allreduce(std::span<T> data, ReduceOp op = ReduceOp::kSum, Millis timeout = Millis(0)) {
    allreduce(data.data(), data.size(), dtype_of<T>(), op, timeout);
  }
  template <typename T>
  void allgather(std::span<const T> in, std::span<T> out, Millis timeout = Millis(0)) {
    check_size("allgather", out.size(), in.size() * size());
    allgather(in.data(), out.data(), in.size(), dtype_of<T>(), timeout);
  }
  template <typename T>
  void broadcast(std::span<T> data, int root, Millis timeout = Millis(0)) {
    broadcast(data.data(), data.size(), dtype_of<T>(), root, timeout);
  }

  // Bytes this member has sent to each member (indexed by group rank) since it was connected.
  std::vector<uint64_t> bytes_sent() const;

 protected:
  Millis resolve(Millis timeout) const { return timeout.count() > 0 ? timeout : default_timeout_; }
  void count_sent(int peer, size_t bytes) { bytes_sent_[peer].fetch_add(bytes, std::memory_order_relaxed); }
  void clear_bytes_sent() {
    for (int p = 0; p < size(); ++p) bytes_sent_[p].store(0, std::memory_order_relaxed);
  }
  // "allreduce on group 'intra/node-a' (rank 1 of 4, global rank 5)"
  std::string where(const char* op) const;
  static void check_size(const char* op, size_t got, size_t want);

 private:
  std::string group_;
  int rank_;
  std::vector<int> global_ranks_;
  Millis default_timeout_;
  std::unique_ptr<std::atomic<uint64_t>[]> bytes_sent_;
};

}  // namespace tessera
