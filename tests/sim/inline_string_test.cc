// sim::InlineString against std::string: the same characters after every operation the project
// uses, inline up to its capacity and on the heap beyond, with copies and moves independent of
// the source, and the comparisons and conversions that op and tensor names go through.
#include "sim/core/inline_string.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace offsim::sim {
namespace {

// Strings of every length around the inline capacity.
std::vector<std::string> samples() {
  std::vector<std::string> out;
  for (std::size_t n = 0; n <= InlineString::kInlineCapacity + 3; ++n) {
    std::string s;
    for (std::size_t i = 0; i < n; ++i) s.push_back(static_cast<char>('a' + i % 26));
    out.push_back(s);
  }
  out.emplace_back(1000, 'z');
  return out;
}

TEST(InlineString, HoldsEveryLengthAsStdStringDoes) {
  for (const std::string& s : samples()) {
    const InlineString x = s;
    EXPECT_EQ(x.size(), s.size());
    EXPECT_EQ(x.empty(), s.empty());
    EXPECT_EQ(x.view(), s);
    EXPECT_EQ(std::string(x.c_str()), s) << "c_str is NUL-terminated";
    EXPECT_EQ(x.str(), s);
    EXPECT_EQ(std::string(x.begin(), x.end()), s);
  }
}

TEST(InlineString, CopiesAndMovesAreIndependentOfTheirSource) {
  const std::vector<std::string> all = samples();
  for (const std::string& a : all) {
    for (const std::string& b : {all.front(), all[20], all.back()}) {
      InlineString x = a;
      InlineString y = b;
      InlineString copy = x;
      x = y;  // copy assignment over either kind
      EXPECT_EQ(copy, a);
      EXPECT_EQ(x, b);
      InlineString moved = std::move(copy);
      EXPECT_EQ(moved, a);
      EXPECT_TRUE(copy.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
      moved = std::move(y);
      EXPECT_EQ(moved, b);
      const std::size_t cut = b.empty() ? 0 : 1;
      moved = moved.view().substr(cut);  // assignment from a view into itself
      EXPECT_EQ(moved, b.substr(cut));
    }
  }
}

TEST(InlineString, ComparesWithEveryKindOfString) {
  const InlineString x = "mb124.l20.out_proj.bwd.tp_allgather";
  const std::string s = "mb124.l20.out_proj.bwd.tp_allgather";
  EXPECT_TRUE(x == s);
  EXPECT_TRUE(s == x);
  EXPECT_TRUE(x == std::string_view(s));
  EXPECT_TRUE(x == "mb124.l20.out_proj.bwd.tp_allgather");
  EXPECT_TRUE("mb124.l20.out_proj.bwd.tp_allgather" == x);
  EXPECT_TRUE(x == InlineString(s));
  EXPECT_FALSE(x != s);
  EXPECT_TRUE(x < InlineString("mb2"));
  EXPECT_TRUE(x > "mb1");
  EXPECT_TRUE(InlineString("a") < std::string("b"));
}

TEST(InlineString, SearchesAndSlicesAsStdString) {
  const std::string s = "mb3.l17.attn.recompute";
  const InlineString x = s;
  EXPECT_EQ(x.find('.'), s.find('.'));
  EXPECT_EQ(x.find('.', 4), s.find('.', 4));
  EXPECT_EQ(x.find("attn"), s.find("attn"));
  EXPECT_EQ(x.rfind('.'), s.rfind('.'));
  EXPECT_EQ(x.find("nothing"), std::string::npos);
  EXPECT_EQ(x.substr(4, 3), s.substr(4, 3));
  EXPECT_EQ(x.substr(8), s.substr(8));
  EXPECT_TRUE(x.starts_with("mb3."));
  EXPECT_TRUE(x.ends_with(".recompute"));
  EXPECT_FALSE(x.ends_with(".fwd"));
  EXPECT_EQ(x.front(), 'm');
  EXPECT_EQ(x.back(), 'e');
  EXPECT_EQ(x[4], 'l');
  EXPECT_EQ(x + ".x", s + ".x");
  EXPECT_EQ("y." + x, "y." + s);
}

TEST(InlineString, ConvertsAndFormats) {
  const InlineString x = "rank0.compute";
  const std::string s = x;
  const std::string_view v = x;
  EXPECT_EQ(s, "rank0.compute");
  EXPECT_EQ(v, "rank0.compute");
  std::map<std::string, int> by_name;
  by_name[x] = 3;
  EXPECT_EQ(by_name.at(x), 3);
  EXPECT_EQ(fmt::format("'{}' [{:>15}]", x, x), "'rank0.compute' [  rank0.compute]");
  std::ostringstream os;
  os << x;
  EXPECT_EQ(os.str(), "rank0.compute");
}

}  // namespace
}  // namespace offsim::sim
