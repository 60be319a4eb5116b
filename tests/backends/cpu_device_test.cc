#include "backends/cpu_device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace offsim::backends {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(CpuDeviceTest, EventsInOneStreamAreOrderedAndTimed) {
  auto dev = make_cpu_device({});
  StreamId s = *dev->create_stream(0, "rank0.compute");
  EventId a = *dev->create_event(0);
  EventId b = *dev->create_event(0);
  Buffer x = *dev->scratch(0, MemoryKind::kDevice, 64 * 64 * 4);
  Buffer y = *dev->scratch(0, MemoryKind::kDevice, 64 * 64 * 4);
  Buffer z = *dev->scratch(0, MemoryKind::kDevice, 64 * 64 * 4);
  ASSERT_TRUE(dev->record(s, a));
  ASSERT_TRUE(dev->gemm(s, sim::GemmShape{.m = 64, .n = 64, .k = 64}, x, y, z));
  ASSERT_TRUE(dev->record(s, b));
  ASSERT_TRUE(dev->synchronize(10s));
  sim::Result<sim::Duration> d = dev->elapsed(a, b);
  ASSERT_TRUE(d);
  EXPECT_GE(d->count(), 0);
}

TEST(CpuDeviceTest, ElapsedBeforeRecordIsAnError) {
  auto dev = make_cpu_device({});
  EventId a = *dev->create_event(0);
  EventId b = *dev->create_event(0);
  EXPECT_FALSE(dev->elapsed(a, b));
}

TEST(CpuDeviceTest, WaitOrdersAcrossStreams) {
  auto dev = make_cpu_device({});
  StreamId producer = *dev->create_stream(0, "rank0.compute");
  StreamId consumer = *dev->create_stream(0, "rank0.d2h");
  EventId done = *dev->create_event(0);
  EventId after = *dev->create_event(0);
  Buffer a = *dev->scratch(0, MemoryKind::kDevice, 1 << 20);
  Buffer b = *dev->scratch(0, MemoryKind::kDevice, 1 << 20);
  Buffer c = *dev->scratch(0, MemoryKind::kDevice, 1 << 20);
  // The consumer's wait is enqueued after the record, so it must see the producer's GEMMs.
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(dev->gemm(producer, sim::GemmShape{.m = 64, .n = 64, .k = 64}, a, b, c));
  }
  ASSERT_TRUE(dev->record(producer, done));
  ASSERT_TRUE(dev->wait(consumer, done));
  ASSERT_TRUE(dev->record(consumer, after));
  ASSERT_TRUE(dev->synchronize(10s));
  EXPECT_GE(dev->elapsed(done, after)->count(), 0);
}

TEST(CpuDeviceTest, WaitOnNeverRecordedEventDoesNotBlock) {
  auto dev = make_cpu_device({});
  StreamId s = *dev->create_stream(0, "rank0.compute");
  EventId e = *dev->create_event(0);
  ASSERT_TRUE(dev->wait(s, e));
  EXPECT_TRUE(dev->synchronize(10s));
}

TEST(CpuDeviceTest, PoolTracksHighWaterAndRefusesOverCapacity) {
  CpuDeviceOptions o;
  o.pool_capacity_bytes = 1000;
  auto dev = make_cpu_device(o);
  StreamId s = *dev->create_stream(0, "rank0.compute");
  ASSERT_TRUE(dev->allocate(s, 1, 600, "a"));
  ASSERT_TRUE(dev->release(s, 1));
  ASSERT_TRUE(dev->allocate(s, 2, 300, "b"));
  ASSERT_TRUE(dev->synchronize(10s));
  PoolUsage u = *dev->pool_usage(0);
  EXPECT_EQ(u.in_use_bytes, 300);
  EXPECT_EQ(u.used_high_bytes, 600);
  // 300 in use + 701 requested = 1001 > 1000.
  ASSERT_TRUE(dev->allocate(s, 3, 701, "fwd.l0.mlp"));
  sim::Status st = dev->synchronize(10s);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, sim::ErrorCode::kLimitExceeded);
  EXPECT_THAT(st.error().message, HasSubstr("op 'fwd.l0.mlp' requested 701 bytes"));
  EXPECT_THAT(st.error().message, HasSubstr("300 bytes in use of 1000 bytes"));
}

TEST(CpuDeviceTest, InjectedAllocationFailureNamesTheOp) {
  CpuDeviceOptions o;
  o.fail_alloc_at = 1;
  auto dev = make_cpu_device(o);
  StreamId s = *dev->create_stream(0, "rank0.compute");
  ASSERT_TRUE(dev->allocate(s, 1, 100, "first"));
  ASSERT_TRUE(dev->allocate(s, 2, 200, "second"));
  sim::Status st = dev->synchronize(10s);
  ASSERT_FALSE(st);
  EXPECT_THAT(st.error().message, HasSubstr("op 'second' requested 200 bytes with 100 bytes"));
  EXPECT_THAT(st.error().message, HasSubstr("injected"));
}

TEST(CpuDeviceTest, CollectivesAndP2PCompleteBetweenRanks) {
  CpuDeviceOptions o;
  o.ranks = 3;
  auto dev = make_cpu_device(o);
  std::vector<StreamId> s;
  std::vector<Buffer> b;
  for (int r = 0; r < 3; ++r) {
    s.push_back(*dev->create_stream(r, "comm"));
    b.push_back(*dev->scratch(r, MemoryKind::kDevice, 4096));
  }
  CommId all = *dev->create_communicator({0, 1, 2});
  CommId pair = *dev->create_communicator({0, 1});
  for (auto kind : {sim::CollectiveKind::kAllReduce, sim::CollectiveKind::kAllGather,
                    sim::CollectiveKind::kReduceScatter, sim::CollectiveKind::kBroadcast,
                    sim::CollectiveKind::kAllToAll}) {
    for (int r = 0; r < 3; ++r) ASSERT_TRUE(dev->collective(s[r], all, kind, b[r], 4096, "c"));
  }
  ASSERT_TRUE(dev->p2p(s[0], pair, 1, true, b[0], 4096, "send"));
  ASSERT_TRUE(dev->p2p(s[1], pair, 0, false, b[1], 4096, "recv"));
  EXPECT_TRUE(dev->synchronize(10s));
}

TEST(CpuDeviceTest, StalledCollectiveEndsInWatchdogErrorNotAHang) {
  CpuDeviceOptions o;
  o.ranks = 2;
  o.stall_collective_at = 1;  // rank 1's call of the first all-reduce never arrives
  auto dev = make_cpu_device(o);
  StreamId s0 = *dev->create_stream(0, "rank0.comm");
  StreamId s1 = *dev->create_stream(1, "rank1.comm");
  Buffer b0 = *dev->scratch(0, MemoryKind::kDevice, 4096);
  Buffer b1 = *dev->scratch(1, MemoryKind::kDevice, 4096);
  CommId c = *dev->create_communicator({0, 1});
  ASSERT_TRUE(dev->collective(s0, c, sim::CollectiveKind::kAllReduce, b0, 4096, "ar.grads"));
  ASSERT_TRUE(dev->collective(s1, c, sim::CollectiveKind::kAllReduce, b1, 4096, "ar.grads"));
  sim::Status st = dev->synchronize(100ms);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, sim::ErrorCode::kDevice);
  EXPECT_THAT(st.error().message, HasSubstr("watchdog"));
  EXPECT_THAT(st.error().message, HasSubstr("collective 'ar.grads'"));
}

TEST(CpuDeviceTest, RejectsBadArguments) {
  auto dev = make_cpu_device({});
  EXPECT_FALSE(dev->create_stream(1, "rank1.compute"));
  EXPECT_FALSE(dev->record(StreamId{7}, EventId{0}));
  EXPECT_FALSE(dev->scratch(0, MemoryKind::kDevice, -1));
  EXPECT_FALSE(dev->create_communicator({}));
  StreamId s = *dev->create_stream(0, "rank0.compute");
  Buffer b = *dev->scratch(0, MemoryKind::kDevice, 64);
  EXPECT_FALSE(dev->gemm(s, sim::GemmShape{.m = 0, .n = 1, .k = 1}, b, b, b));
}

// replay --mpi relies on ids that differ unless broadcast: two ids made independently differ,
// and a member index outside the group, or an unknown local rank, is refused.
TEST(CpuDeviceTest, CommunicatorIdsAreRandomAndJoiningChecksTheMember) {
  auto dev = make_cpu_device({});
  auto a = dev->new_comm_unique_id();
  auto b = dev->new_comm_unique_id();
  ASSERT_TRUE(a && b);
  EXPECT_NE(*a, *b);
  EXPECT_TRUE(dev->join_communicator(0, 2, 1, *a));
  auto outside = dev->join_communicator(0, 2, 2, *a);
  ASSERT_FALSE(outside);
  EXPECT_EQ(outside.error().code, sim::ErrorCode::kInvalidInput);
  EXPECT_THAT(outside.error().message, HasSubstr("member 2 of 2"));
  EXPECT_FALSE(dev->join_communicator(3, 2, 0, *a));
}

}  // namespace
}  // namespace offsim::backends
