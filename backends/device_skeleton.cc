#include "backends/device_skeleton.h"

#include <algorithm>

#include <fmt/format.h>

namespace offsim::backends {

sim::Result<int> comm_member(const std::vector<int>& ranks, int rank, std::string_view op_name) {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  if (it == ranks.end()) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "op '{}': rank {} is not in the communicator",
                     op_name, rank);
  }
  return static_cast<int>(it - ranks.begin());
}

std::size_t WorkQueues::add_queue(std::string name, std::function<void()> on_start) {
  std::lock_guard lock(mu_);
  auto q = std::make_unique<Queue>();
  q->name = std::move(name);
  Queue* raw = q.get();
  queues_.push_back(std::move(q));
  raw->thread = std::thread([this, raw, start = std::move(on_start)] { serve(*raw, start); });
  return queues_.size() - 1;
}

void WorkQueues::push_locked(std::size_t queue, std::string label, Work run) {
  queues_[queue]->tasks.push_back(Task{std::move(label), std::move(run)});
  cv_.notify_all();
}

sim::Status WorkQueues::wait_locked(Lock& lock, const std::function<bool()>& done) {
  cv_.wait(lock, [&] { return aborted_ || done(); });
  if (!done()) return aborted_error();
  return sim::ok();
}

bool WorkQueues::aborted() {
  std::lock_guard lock(mu_);
  return aborted_;
}

void WorkQueues::fail_locked(sim::Error error) {
  if (!first_error_) first_error_ = std::move(error);
}

sim::Status WorkQueues::status_locked() const {
  if (first_error_) return sim::fail(*first_error_);
  return sim::ok();
}

void WorkQueues::abort_locked() {
  aborted_ = true;
  cv_.notify_all();
}

bool WorkQueues::wait_idle(Lock& lock, std::chrono::steady_clock::time_point deadline,
                           bool stop_on_error) {
  return cv_.wait_until(lock, deadline,
                        [&] { return idle_locked() || (stop_on_error && first_error_); });
}

void WorkQueues::wait_all_idle(Lock& lock) {
  cv_.wait(lock, [&] { return idle_locked(); });
}

bool WorkQueues::idle_locked() const {
  return std::all_of(queues_.begin(), queues_.end(),
                     [](const auto& q) { return !q->busy && q->tasks.empty(); });
}

std::string WorkQueues::pending_locked(std::string_view none) const {
  std::string pending;
  for (const auto& q : queues_) {
    if (!q->busy && q->tasks.empty()) continue;
    pending += fmt::format("{}{}: {} ({} more queued)", pending.empty() ? "" : "; ", q->name,
                           q->busy ? q->current : "not started", q->tasks.size());
  }
  return pending.empty() ? std::string(none) : pending;
}

void WorkQueues::fire_watchdog_locked(std::chrono::milliseconds timeout, std::string_view what,
                                      std::string_view none) {
  fail_locked(sim::Error{sim::ErrorCode::kDevice,
                         fmt::format("watchdog: work did not finish within {} ms; {} aborted. "
                                     "Pending: {}",
                                     timeout.count(), what, pending_locked(none))});
  abort_locked();
}

void WorkQueues::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    aborted_ = true;  // unblocks waits and collectives that can never finish
  }
  cv_.notify_all();
  for (auto& q : queues_) {
    if (q->thread.joinable()) q->thread.join();
  }
}

sim::Status WorkQueues::aborted_error() {
  return sim::fail(sim::ErrorCode::kCancelled, "aborted after an earlier error");
}

void WorkQueues::serve(Queue& q, const std::function<void()>& on_start) {
  if (on_start) on_start();
  Lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !q.tasks.empty(); });
    if (q.tasks.empty()) return;  // stopped and nothing left
    Task task = std::move(q.tasks.front());
    q.tasks.pop_front();
    q.busy = true;
    q.current = task.label;
    const bool skip = aborted_ || first_error_.has_value();
    lock.unlock();
    sim::Status status = skip ? sim::ok() : task.run();
    lock.lock();
    if (!status) {
      fail_locked(
          sim::Error{status.error().code, fmt::format("{}: {}", q.name, status.error().message)});
      aborted_ = true;  // like a sticky CUDA error: blocked peers give up
    }
    q.busy = false;
    q.current.clear();
    cv_.notify_all();
  }
}

}  // namespace offsim::backends
