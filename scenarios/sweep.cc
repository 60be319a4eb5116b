#include "scenarios/sweep.h"

#include <set>

namespace offsim::scenarios {
namespace {

using sim::ErrorCode;

sim::Result<SweepAxis> parse_axis(const std::string& path, const Node& values) {
  OFFSIM_RETURN_IF_ERROR(split_path(path));
  if (path == "sweep" || path.rfind("sweep.", 0) == 0 || path == "name") {
    return sim::fail(ErrorCode::kInvalidInput, "{}: sweep.{}: '{}' cannot be swept", values.origin,
                     path, path);
  }
  if (values.kind != NodeKind::kSequence) {
    return sim::fail(ErrorCode::kInvalidInput, "{}: sweep.{}: expected a list of values, got {}",
                     values.origin, path, values.describe());
  }
  if (values.items.empty()) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: sweep.{}: expected at least one value, got an empty list", values.origin,
                     path);
  }
  return SweepAxis{path, values.items, values.origin};
}

}  // namespace

std::int64_t SweepSpec::size() const {
  std::int64_t n = 1;
  for (const SweepDimension& d : dimensions) n *= static_cast<std::int64_t>(d.size());
  return n;
}

std::vector<std::string> SweepSpec::axis_paths() const {
  std::vector<std::string> paths;
  for (const SweepDimension& d : dimensions)
    for (const SweepAxis& a : d.axes) paths.push_back(a.path);
  return paths;
}

std::vector<SweepAssignment> SweepSpec::point(std::int64_t index) const {
  OFFSIM_CHECK(index >= 0 && index < size());
  // Row-major: the last dimension varies fastest.
  std::vector<std::size_t> digit(dimensions.size());
  for (std::size_t d = dimensions.size(); d-- > 0;) {
    const auto n = static_cast<std::int64_t>(dimensions[d].size());
    digit[d] = static_cast<std::size_t>(index % n);
    index /= n;
  }
  std::vector<SweepAssignment> out;
  for (std::size_t d = 0; d < dimensions.size(); ++d)
    for (const SweepAxis& a : dimensions[d].axes) out.push_back({a.path, a.values[digit[d]]});
  return out;
}

sim::Result<SweepSpec> parse_sweep(const Node& sweep, std::int64_t max_points) {
  SweepSpec spec;
  spec.max_points = max_points;
  if (sweep.kind != NodeKind::kMap) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: sweep: expected a map of key paths to lists of values, got {}",
                     sweep.origin, sweep.describe());
  }
  std::set<std::string> seen;
  auto check_new = [&](const SweepAxis& axis) -> sim::Status {
    if (!seen.insert(axis.path).second) {
      return sim::fail(ErrorCode::kInvalidInput, "{}: sweep.{}: axis is listed twice", axis.origin,
                       axis.path);
    }
    for (const std::string& other : seen) {
      if (other != axis.path &&
          (other.rfind(axis.path + ".", 0) == 0 || axis.path.rfind(other + ".", 0) == 0)) {
        return sim::fail(ErrorCode::kInvalidInput, "{}: sweep.{}: overlaps axis '{}'", axis.origin,
                         axis.path, other);
      }
    }
    return sim::ok();
  };
  double total = 1.0;
  for (const auto& [key, value] : sweep.entries) {
    SweepDimension dim;
    if (key == "zip") {
      if (value.kind != NodeKind::kSequence) {
        return sim::fail(ErrorCode::kInvalidInput,
                         "{}: sweep.zip: expected a list of groups (maps of key path -> list), "
                         "got {}",
                         value.origin, value.describe());
      }
      for (std::size_t g = 0; g < value.items.size(); ++g) {
        const Node& group = value.items[g];
        if (group.kind != NodeKind::kMap || group.entries.empty()) {
          return sim::fail(ErrorCode::kInvalidInput,
                           "{}: sweep.zip.{}: expected a map of key path -> list, got {}",
                           group.origin, g, group.describe());
        }
        SweepDimension zipped;
        for (const auto& [path, values] : group.entries) {
          OFFSIM_ASSIGN_OR_RETURN(SweepAxis axis, parse_axis(path, values));
          OFFSIM_RETURN_IF_ERROR(check_new(axis));
          if (!zipped.axes.empty() && axis.values.size() != zipped.size()) {
            return sim::fail(ErrorCode::kInvalidInput,
                             "{}: sweep.zip.{}.{}: expected {} values like '{}', got {}",
                             axis.origin, g, path, zipped.size(), zipped.axes.front().path,
                             axis.values.size());
          }
          zipped.axes.push_back(std::move(axis));
        }
        total *= static_cast<double>(zipped.size());
        spec.dimensions.push_back(std::move(zipped));
      }
      continue;
    }
    OFFSIM_ASSIGN_OR_RETURN(SweepAxis axis, parse_axis(key, value));
    OFFSIM_RETURN_IF_ERROR(check_new(axis));
    total *= static_cast<double>(axis.values.size());
    dim.axes.push_back(std::move(axis));
    spec.dimensions.push_back(std::move(dim));
  }
  if (total > static_cast<double>(max_points)) {
    return sim::fail(ErrorCode::kLimitExceeded,
                     "{}: sweep: {:.0f} points, more than the limit of {}; split it or raise "
                     "--max-points",
                     sweep.origin, total, max_points);
  }
  return spec;
}

sim::Result<Node> apply_point(const Node& base, const std::vector<SweepAssignment>& point) {
  Node doc = base;
  if (doc.kind == NodeKind::kMap) {
    std::erase_if(doc.entries, [](const auto& e) { return e.first == "sweep"; });
  }
  for (const SweepAssignment& a : point) OFFSIM_RETURN_IF_ERROR(set_path(doc, a.path, a.value));
  return doc;
}

}  // namespace offsim::scenarios
