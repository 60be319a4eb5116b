// Tagged integer ids: OpId, LaneId, PoolId, ResourceId, TensorId.
//
// Ids, not pointers, cross module boundaries. Each id is a dense index into the table of the
// Plan that defines it; ids of different kinds do not convert into each other.
//
//   sim::OpId op{3};
//   plan.ops[op.index()].name;
//   if (!id.valid()) { ... }
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>

namespace offsim::sim {

template <class Tag>
class TaggedId {
 public:
  static constexpr std::uint32_t kInvalidValue = std::numeric_limits<std::uint32_t>::max();

  constexpr TaggedId() = default;
  constexpr explicit TaggedId(std::uint32_t value) : value_(value) {}
  constexpr explicit TaggedId(std::size_t value) : value_(static_cast<std::uint32_t>(value)) {}
  constexpr explicit TaggedId(int value) : value_(static_cast<std::uint32_t>(value)) {}

  constexpr std::uint32_t value() const { return value_; }
  constexpr std::size_t index() const { return value_; }
  constexpr bool valid() const { return value_ != kInvalidValue; }

  friend constexpr auto operator<=>(TaggedId, TaggedId) = default;

 private:
  std::uint32_t value_ = kInvalidValue;
};

using OpId = TaggedId<struct OpTag>;
using LaneId = TaggedId<struct LaneTag>;
using PoolId = TaggedId<struct PoolTag>;
using ResourceId = TaggedId<struct ResourceTag>;
using TensorId = TaggedId<struct TensorTag>;

}  // namespace offsim::sim

template <class Tag>
struct std::hash<offsim::sim::TaggedId<Tag>> {
  std::size_t operator()(offsim::sim::TaggedId<Tag> id) const noexcept {
    return std::hash<std::uint32_t>{}(id.value());
  }
};
