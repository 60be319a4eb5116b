// Lookups shared by the device implementations: id → entry of a handle table, and a rank's
// position in a communicator, each with the error a bad id or rank gives.
//
//   OFFSIM_ASSIGN_OR_RETURN(Stream* s, backends::table_entry(streams_, id.index, "stream"));
//   OFFSIM_ASSIGN_OR_RETURN(int member, backends::comm_member(comm.ranks, rank, op.name));
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

#include "sim/core/result.h"

namespace offsim::backends {

template <class T>
sim::Result<T*> table_entry(const std::vector<std::unique_ptr<T>>& table, std::size_t index,
                            const char* what) {
  if (index >= table.size()) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "unknown {} {}", what, index);
  }
  return table[index].get();
}

inline sim::Result<int> comm_member(const std::vector<int>& ranks, int rank,
                                    std::string_view op_name) {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  if (it == ranks.end()) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "op '{}': rank {} is not in the communicator",
                     op_name, rank);
  }
  return static_cast<int>(it - ranks.begin());
}

}  // namespace offsim::backends
