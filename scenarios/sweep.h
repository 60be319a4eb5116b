// Sweep expansion: a scenario's `sweep:` block turned into an ordered list of points.
//
//   sweep:
//     training.micro_batch: [1, 2, 4]          # an axis: key path -> list of values
//     zip:                                     # axes in one group vary together
//       - {parallelism.tp: [1, 2], parallelism.dp: [8, 4]}
//
// Dimensions are the axes and zip groups in file order; the cross product runs like nested loops
// with the first dimension outermost, so the order is deterministic.
//
//   auto spec = scenarios::parse_sweep(*root.find("sweep"));
//   for (std::int64_t i = 0; i < spec->size(); ++i) apply_point(base, spec->point(i));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scenarios/document.h"
#include "sim/core/result.h"

namespace offsim::scenarios {

struct SweepAxis {
  std::string path;  // "training.micro_batch"
  std::vector<Node> values;
  std::string origin;  // where the axis was declared
};

// Axes that vary together (a zip group, or a single axis): all have the same number of values.
struct SweepDimension {
  std::vector<SweepAxis> axes;
  std::size_t size() const { return axes.empty() ? 0 : axes.front().values.size(); }
};

struct SweepAssignment {
  std::string path;
  Node value;
};

struct SweepSpec {
  std::vector<SweepDimension> dimensions;
  std::int64_t max_points = 1'000'000;

  // Number of points (1 when there are no axes: the base scenario alone).
  std::int64_t size() const;
  // Axis paths in column order.
  std::vector<std::string> axis_paths() const;
  // The values of point `index` (0 <= index < size()), in axis_paths() order.
  std::vector<SweepAssignment> point(std::int64_t index) const;
};

// Parses a `sweep:` map. Errors name the file position of the offending axis.
sim::Result<SweepSpec> parse_sweep(const Node& sweep, std::int64_t max_points = 1'000'000);

// The base document (without its `sweep` key) with one point's values set.
sim::Result<Node> apply_point(const Node& base, const std::vector<SweepAssignment>& point);

}  // namespace offsim::scenarios
