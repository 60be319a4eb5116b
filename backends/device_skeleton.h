// The skeleton both replay devices are built on (cpu_device.cc, cuda/cuda_device.cc): the
// handle tables behind StreamId / EventId / Buffer / CommId, the worker queues that run the work
// enqueued on a stream in order, the first-error latch, the abort flag and the watchdog. A device
// supplies only the work itself (kernels, copies, collectives); the skeleton decides when it
// runs, what an error does to the rest, and in which order everything stops.
//
//   WorkQueues work;                                   // one per device
//   std::size_t q = work.add_queue("GPU 0", [] { cudaSetDevice(0); });
//   {
//     std::lock_guard lock(work.mutex());
//     work.push_locked(q, "gemm", [] { return launch_gemm(); });
//   }
//   std::unique_lock lock(work.mutex());
//   if (!work.wait_idle(lock, deadline, /*stop_on_error=*/false)) {
//     work.fire_watchdog_locked(timeout, "communicators", "");  // latches the error, aborts
//   }
//   return work.status_locked();                       // the first error any work hit
//
// Rules every device follows:
//  * A queue's work runs on that queue's thread, in push order. After the first failure (or an
//    abort) queued work is skipped, not run: like a sticky CUDA error, nothing after it counts.
//  * The error a work item returns is latched with the queue's name in front ("GPU 0: ...",
//    "rank0.compute: ..."); only the first is kept; it also aborts the device, so work blocked
//    on a peer (wait_locked) gives up with kCancelled.
//  * mutex() guards the queues, the latch and whatever the device keeps next to them (its
//    tables, event counters); work that blocks waits through wait_locked, never on its own.
//  * Teardown order: stop() first (no more work runs and every thread is joined), then the
//    device releases communicators, then memory, then its tables (HandleTable owns each entry;
//    an entry's destructor releases its handle).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "sim/core/result.h"

namespace offsim::backends {

// The entries behind one kind of handle; the handle is the entry's index. Entries are owned
// (unique_ptr) so that their addresses stay valid while the table grows.
template <class T>
class HandleTable {
 public:
  explicit HandleTable(const char* what) : what_(what) {}

  std::uint32_t add(std::unique_ptr<T> entry) {
    entries_.push_back(std::move(entry));
    return static_cast<std::uint32_t>(entries_.size() - 1);
  }
  // The entry of `index`, or kInvalidInput "unknown <what> <index>".
  sim::Result<T*> get(std::uint32_t index) const {
    if (index >= entries_.size()) {
      return sim::fail(sim::ErrorCode::kInvalidInput, "unknown {} {}", what_, index);
    }
    return entries_[index].get();
  }
  std::size_t size() const { return entries_.size(); }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }
  // Hands every entry over (teardown outside the device's lock) and leaves the table empty.
  std::vector<std::unique_ptr<T>> take() { return std::exchange(entries_, {}); }
  void clear() { entries_.clear(); }

 private:
  const char* what_;
  std::vector<std::unique_ptr<T>> entries_;
};

// A rank's position in a communicator's member list, or an error naming the op.
sim::Result<int> comm_member(const std::vector<int>& ranks, int rank, std::string_view op_name);

class WorkQueues {
 public:
  using Work = std::function<sim::Status()>;
  using Lock = std::unique_lock<std::mutex>;

  WorkQueues() = default;
  WorkQueues(const WorkQueues&) = delete;
  WorkQueues& operator=(const WorkQueues&) = delete;
  ~WorkQueues() { stop(); }

  std::mutex& mutex() { return mu_; }

  // A new queue served by its own thread; `on_start` runs first on that thread. `name` prefixes
  // the queue's errors and names it in the watchdog's report. Takes mutex().
  std::size_t add_queue(std::string name, std::function<void()> on_start = {});
  // Appends work to `queue`; the caller holds mutex().
  void push_locked(std::size_t queue, std::string label, Work run);

  // Wakes every waiter (after a change that a wait_locked predicate reads).
  void notify_all() { cv_.notify_all(); }
  // Blocks until `done()` holds or the device aborts (kCancelled, "aborted after an earlier
  // error"); the caller holds `lock` on mutex().
  sim::Status wait_locked(Lock& lock, const std::function<bool()>& done);
  bool aborted_locked() const { return aborted_; }
  bool aborted();  // takes mutex()

  // The first-error latch: the first error wins; status_locked() returns it, or ok.
  void fail_locked(sim::Error error);
  bool failed_locked() const { return first_error_.has_value(); }
  sim::Status status_locked() const;
  // Sets the abort flag and wakes every waiter: blocked work gives up, queued work is skipped.
  void abort_locked();

  // Waits until no queue has work (or, with `stop_on_error`, an error is latched) or until
  // `deadline`; false when the deadline came first. `lock` holds mutex().
  bool wait_idle(Lock& lock, std::chrono::steady_clock::time_point deadline, bool stop_on_error);
  // Waits, without a deadline, until no queue has work (after an abort: skipped or given up).
  void wait_all_idle(Lock& lock);
  bool idle_locked() const;
  // What every queue with work is doing: "name: label (n more queued); ...", or `none`.
  std::string pending_locked(std::string_view none) const;
  // The watchdog: latches "watchdog: work did not finish within <timeout> ms; <what> aborted.
  // Pending: ..." and aborts the device.
  void fire_watchdog_locked(std::chrono::milliseconds timeout, std::string_view what,
                            std::string_view none);

  // Stops every queue: the abort flag is set, queued work is skipped, each thread is joined.
  // Idempotent; the device calls it first in its destructor.
  void stop();

  static sim::Status aborted_error();

 private:
  struct Task {
    std::string label;
    Work run;
  };
  struct Queue {
    std::string name;
    std::deque<Task> tasks;
    bool busy = false;
    std::string current;  // label of the running task
    std::thread thread;
  };

  void serve(Queue& q, const std::function<void()>& on_start);

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool aborted_ = false;
  std::optional<sim::Error> first_error_;
  std::vector<std::unique_ptr<Queue>> queues_;
};

}  // namespace offsim::backends
