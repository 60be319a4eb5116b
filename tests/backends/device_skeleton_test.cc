#include "backends/device_skeleton.h"

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace offsim::backends {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::chrono::steady_clock::time_point in(std::chrono::milliseconds d) {
  return std::chrono::steady_clock::now() + d;
}

TEST(HandleTableTest, IndexesEntriesAndNamesUnknownHandles) {
  HandleTable<int> table("stream");
  EXPECT_EQ(table.add(std::make_unique<int>(7)), 0u);
  EXPECT_EQ(table.add(std::make_unique<int>(9)), 1u);
  ASSERT_TRUE(table.get(1));
  EXPECT_EQ(**table.get(1), 9);
  sim::Result<int*> missing = table.get(2);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, sim::ErrorCode::kInvalidInput);
  EXPECT_EQ(missing.error().message, "unknown stream 2");
  EXPECT_EQ(table.take().size(), 2u);
  EXPECT_EQ(table.size(), 0u);
}

TEST(CommMemberTest, PositionOrErrorNamingTheOp) {
  EXPECT_EQ(*comm_member({4, 2, 9}, 9, "ar"), 2);
  sim::Result<int> r = comm_member({4, 2}, 3, "ar");
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error().message, HasSubstr("op 'ar': rank 3 is not in the communicator"));
}

TEST(WorkQueuesTest, RunsEachQueueInOrderOnItsOwnThread) {
  WorkQueues work;
  std::atomic<bool> started{false};
  const std::size_t q = work.add_queue("rank0.compute", [&] { started = true; });
  std::vector<int> seen;  // touched by the queue's thread only until idle
  {
    std::lock_guard lock(work.mutex());
    for (int i = 0; i < 5; ++i) {
      work.push_locked(q, "step", [&seen, i] {
        seen.push_back(i);
        return sim::ok();
      });
    }
  }
  WorkQueues::Lock lock(work.mutex());
  ASSERT_TRUE(work.wait_idle(lock, in(10s), false));
  EXPECT_TRUE(started);
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(work.status_locked());
}

TEST(WorkQueuesTest, FirstErrorWinsIsNamedAndSkipsLaterWork) {
  WorkQueues work;
  const std::size_t a = work.add_queue("GPU 0");
  std::atomic<int> ran_after{0};
  {
    std::lock_guard lock(work.mutex());
    work.push_locked(a, "gemm", [] { return sim::fail(sim::ErrorCode::kDevice, "first"); });
    work.push_locked(a, "copy", [] { return sim::fail(sim::ErrorCode::kDevice, "second"); });
    work.push_locked(a, "record", [&] {
      ++ran_after;
      return sim::ok();
    });
  }
  WorkQueues::Lock lock(work.mutex());
  ASSERT_TRUE(work.wait_idle(lock, in(10s), false));
  sim::Status s = work.status_locked();
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, sim::ErrorCode::kDevice);
  EXPECT_EQ(s.error().message, "GPU 0: first");
  EXPECT_TRUE(work.aborted_locked());
  EXPECT_EQ(ran_after, 0);
}

TEST(WorkQueuesTest, ErrorOnOneQueueReleasesAWaiterOnAnother) {
  WorkQueues work;
  const std::size_t waiter = work.add_queue("rank0.comm");
  const std::size_t failer = work.add_queue("rank1.comm");
  {
    std::lock_guard lock(work.mutex());
    work.push_locked(waiter, "collective", [&] {
      WorkQueues::Lock l(work.mutex());
      return work.wait_locked(l, [] { return false; });  // a peer that never arrives
    });
    work.push_locked(failer, "allocate",
                     [] { return sim::fail(sim::ErrorCode::kLimitExceeded, "out of memory"); });
  }
  WorkQueues::Lock lock(work.mutex());
  ASSERT_TRUE(work.wait_idle(lock, in(10s), false));
  EXPECT_EQ(work.status_locked().error().message, "rank1.comm: out of memory");
}

TEST(WorkQueuesTest, WatchdogNamesPendingWorkAndAborts) {
  WorkQueues work;
  const std::size_t q = work.add_queue("rank0.compute");
  {
    std::lock_guard lock(work.mutex());
    work.push_locked(q, "attention (hang)", [&] {
      WorkQueues::Lock l(work.mutex());
      return work.wait_locked(l, [] { return false; });
    });
    work.push_locked(q, "record", [] { return sim::ok(); });
  }
  WorkQueues::Lock lock(work.mutex());
  ASSERT_FALSE(work.wait_idle(lock, in(50ms), false));
  work.fire_watchdog_locked(50ms, "communicators", "");
  work.wait_all_idle(lock);
  sim::Status s = work.status_locked();
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, sim::ErrorCode::kDevice);
  EXPECT_EQ(s.error().message,
            "watchdog: work did not finish within 50 ms; communicators aborted. Pending: "
            "rank0.compute: attention (hang) (1 more queued)");
}

TEST(WorkQueuesTest, StopUnblocksWaitersSkipsQueuedWorkAndJoins) {
  std::atomic<int> ran{0};
  WorkQueues work;
  const std::size_t q = work.add_queue("s");
  {
    std::lock_guard lock(work.mutex());
    work.push_locked(q, "wait", [&] {
      WorkQueues::Lock l(work.mutex());
      return work.wait_locked(l, [] { return false; });
    });
    work.push_locked(q, "count", [&] {
      ++ran;
      return sim::ok();
    });
  }
  work.stop();  // returns only once the thread is joined
  EXPECT_EQ(ran, 0);
  std::lock_guard lock(work.mutex());
  EXPECT_TRUE(work.aborted_locked());
  EXPECT_TRUE(work.idle_locked());
  EXPECT_EQ(work.pending_locked("nothing"), "nothing");
}

}  // namespace
}  // namespace offsim::backends
