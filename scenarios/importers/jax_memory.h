// JAX's own memory view of a compiled training step, read from JSON, shown beside offsim's
// forecast (`offsim run --jax-memory FILE`).
//
// The file holds the fields of the `CompiledMemoryStats` that `compiled.memory_analysis()`
// returns for one device, under JAX's own names (sizes in bytes, integers >= 0):
//
//   {"argument_size_in_bytes": 17179869184,        required
//    "output_size_in_bytes": 17179869184,          required
//    "temp_size_in_bytes": 21474836480,            required
//    "alias_size_in_bytes": 17179869184,           optional (donated arguments), default 0
//    "generated_code_size_in_bytes": 1048576,      optional, default 0
//    "host_argument_size_in_bytes": 0, "host_output_size_in_bytes": 0,
//    "host_alias_size_in_bytes": 0, "host_temp_size_in_bytes": 0,   optional (pinned_host)
//    "host_generated_code_size_in_bytes": 0,       optional
//    "peak_memory_in_bytes": 38654705664,          optional (newer jaxlib)
//    "device": "cuda:0"}                           optional, a label
//
// Written in JAX with:
//   m = jax.jit(train_step).lower(*args).compile().memory_analysis()
//   json.dump({k: getattr(m, k) for k in dir(m) if k.endswith("_in_bytes")}, f)
//
//   OFFSIM_ASSIGN_OR_RETURN(scenarios::JaxMemory jax, scenarios::read_jax_memory("mem.json"));
//   fmt::print("{}", scenarios::format_jax_memory(jax, report));
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "models/report.h"
#include "sim/core/result.h"

namespace offsim::scenarios {

struct JaxMemory {
  std::string source;  // the file
  std::string device;
  std::int64_t argument_bytes = 0;
  std::int64_t output_bytes = 0;
  std::int64_t alias_bytes = 0;
  std::int64_t temp_bytes = 0;
  std::int64_t generated_code_bytes = 0;
  std::int64_t host_argument_bytes = 0;
  std::int64_t host_output_bytes = 0;
  std::int64_t host_alias_bytes = 0;
  std::int64_t host_temp_bytes = 0;
  std::int64_t host_generated_code_bytes = 0;
  std::int64_t peak_bytes = -1;  // -1: not in the file

  // XLA's footprint of the executable on the device: arguments and outputs (donated arguments
  // counted once), temporaries and code.
  std::int64_t device_total_bytes() const;
  // The same on pinned host memory.
  std::int64_t host_total_bytes() const;
};

// Reads the JSON above; unknown keys, missing required keys and values that are not integers
// >= 0 are kInvalidInput errors naming file:line:col and the key.
sim::Result<JaxMemory> read_jax_memory(const std::string& path);

// {"jax": {...the fields, device_total_bytes, host_total_bytes}, "offsim": {hbm_peak_bytes,
// persistent_bytes, transient_bytes, host_peak_bytes}, "hbm_ratio": offsim / jax}
nlohmann::json jax_memory_comparison(const JaxMemory& jax, const models::Report& report);

// A table: JAX's sizes beside offsim's forecast for the worst rank.
std::string format_jax_memory(const JaxMemory& jax, const models::Report& report);

}  // namespace offsim::scenarios
