// sim::SmallVector against std::vector: the same elements after every operation the project
// uses, inline up to N and on the heap beyond, with copies and moves independent of the source.
#include "sim/core/small_vector.h"

#include <gtest/gtest.h>

#include <vector>

namespace offsim::sim {
namespace {

using Small = SmallVector<int, 3>;

std::vector<int> as_vector(const Small& s) { return s.to_vector(); }

TEST(SmallVector, StaysInlineUpToItsCapacityAndGrowsOnTheHeap) {
  Small s;
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(s.capacity(), 3u);
  for (int i = 0; i < 3; ++i) s.push_back(i);
  EXPECT_EQ(s.capacity(), 3u);
  s.push_back(3);
  EXPECT_GE(s.capacity(), 4u);
  for (int i = 4; i < 40; ++i) s.emplace_back(i);
  ASSERT_EQ(s.size(), 40u);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(s[static_cast<std::size_t>(i)], i);
  EXPECT_EQ(s.front(), 0);
  EXPECT_EQ(s.back(), 39);
  s.pop_back();
  EXPECT_EQ(s.back(), 38);
  s.clear();
  EXPECT_TRUE(s.empty());
}

TEST(SmallVector, PushBackOfItsOwnElementWhileGrowing) {
  Small s = {7, 8, 9};
  s.push_back(s[0]);  // the element's storage moves to the heap during the call
  EXPECT_EQ(as_vector(s), (std::vector<int>{7, 8, 9, 7}));
}

TEST(SmallVector, CopiesAndMovesAreIndependent) {
  for (const std::vector<int>& v : {std::vector<int>{1, 2}, std::vector<int>{1, 2, 3, 4, 5}}) {
    Small a = v;
    Small b = a;
    b.push_back(6);
    EXPECT_EQ(as_vector(a), v);
    Small c = std::move(b);
    EXPECT_TRUE(b.empty());  // NOLINT(bugprone-use-after-move): a moved-from vector is empty
    std::vector<int> with6 = v;
    with6.push_back(6);
    EXPECT_EQ(as_vector(c), with6);
    Small d = {9};
    d = c;
    EXPECT_TRUE(d == c);
    d = std::move(c);
    EXPECT_EQ(as_vector(d), with6);
    d = v;
    EXPECT_EQ(as_vector(d), v);
  }
}

TEST(SmallVector, InsertEraseResizeAsStdVector) {
  for (const int n : {0, 2, 3, 6}) {
    std::vector<int> ref;
    for (int i = 0; i < n; ++i) ref.push_back(i);
    Small s(ref.begin(), ref.end());
    const std::vector<int> more = {100, 101};
    ref.insert(ref.begin() + n / 2, more.begin(), more.end());
    s.insert(s.begin() + n / 2, more.begin(), more.end());
    EXPECT_EQ(as_vector(s), ref) << n;
    ref.insert(ref.begin(), 55);
    s.insert(s.begin(), 55);
    EXPECT_EQ(as_vector(s), ref) << n;
    ref.erase(ref.begin() + 1, ref.begin() + 2);
    s.erase(s.begin() + 1, s.begin() + 2);
    EXPECT_EQ(as_vector(s), ref) << n;
    ref.erase(ref.end() - 1);
    s.erase(s.end() - 1);
    EXPECT_EQ(as_vector(s), ref) << n;
    ref.resize(ref.size() + 4, 3);
    s.resize(s.size() + 4, 3);
    EXPECT_EQ(as_vector(s), ref) << n;
    ref.resize(1);
    s.resize(1);
    EXPECT_EQ(as_vector(s), ref) << n;
  }
}

TEST(SmallVector, EqualityComparesElements) {
  EXPECT_TRUE((Small{1, 2} == Small{1, 2}));
  EXPECT_FALSE((Small{1, 2} == Small{1, 2, 3}));
  EXPECT_FALSE((Small{1, 2, 3, 4} == Small{1, 2, 3, 5}));
  Small grown = {1, 2, 3, 4};
  grown.pop_back();
  EXPECT_TRUE((grown == Small{1, 2, 3}));  // heap against inline storage
}

}  // namespace
}  // namespace offsim::sim
