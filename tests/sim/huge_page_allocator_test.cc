// sim::HugePageAllocator: blocks of 2 MiB and more come back 2 MiB-aligned, smaller ones from
// operator new; a vector that grows across the threshold keeps its elements; copies and moves
// between vectors with this allocator behave as with std::allocator.
#include "sim/core/huge_page_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace offsim::sim {
namespace {

using Vec = std::vector<std::uint64_t, HugePageAllocator<std::uint64_t>>;

TEST(HugePageAllocator, LargeBlocksAreHugePageAligned) {
  HugePageAllocator<std::uint64_t> alloc;
  const std::size_t n = (kHugePageBytes / sizeof(std::uint64_t)) * 3 + 7;  // not a multiple
  std::uint64_t* p = alloc.allocate(n);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % kHugePageBytes, 0u);
  for (std::size_t i = 0; i < n; ++i) p[i] = i;  // every element writable, to the last
  EXPECT_EQ(p[n - 1], n - 1);
  alloc.deallocate(p, n);
}

TEST(HugePageAllocator, SmallBlocksWork) {
  HugePageAllocator<std::uint64_t> alloc;
  std::uint64_t* p = alloc.allocate(5);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % alignof(std::uint64_t), 0u);
  p[4] = 42;
  EXPECT_EQ(p[4], 42u);
  alloc.deallocate(p, 5);
}

TEST(HugePageAllocator, VectorGrowsAcrossTheThresholdAndCopies) {
  Vec v;
  const std::size_t n = kHugePageBytes / sizeof(std::uint64_t) * 2;
  for (std::size_t i = 0; i < n; ++i) v.push_back(i * 3);
  ASSERT_EQ(v.size(), n);
  for (std::size_t i = 0; i < n; i += 4099) EXPECT_EQ(v[i], i * 3);
  Vec copy = v;
  EXPECT_EQ(copy, v);
  Vec moved = std::move(copy);
  EXPECT_EQ(moved, v);
  moved.resize(3);
  moved.shrink_to_fit();
  EXPECT_EQ(moved, (Vec{0, 3, 6}));
  EXPECT_TRUE(HugePageAllocator<int>{} == HugePageAllocator<int>{});
}

TEST(HugePageAllocator, RefusesAnImpossibleSize) {
  HugePageAllocator<std::uint64_t> alloc;
  EXPECT_THROW((void)alloc.allocate(static_cast<std::size_t>(-1) / 4), std::bad_array_new_length);
}

}  // namespace
}  // namespace offsim::sim
