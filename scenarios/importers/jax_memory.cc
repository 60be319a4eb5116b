// JAX memory_analysis() beside offsim's forecast (see jax_memory.h).

#include "scenarios/importers/jax_memory.h"

#include <fmt/format.h>

#include "scenarios/document.h"
#include "scenarios/report_format.h"

namespace offsim::scenarios {

using sim::ErrorCode;

std::int64_t JaxMemory::device_total_bytes() const {
  return argument_bytes + output_bytes - alias_bytes + temp_bytes + generated_code_bytes;
}

std::int64_t JaxMemory::host_total_bytes() const {
  return host_argument_bytes + host_output_bytes - host_alias_bytes + host_temp_bytes +
         host_generated_code_bytes;
}

sim::Result<JaxMemory> read_jax_memory(const std::string& path) {
  OFFSIM_ASSIGN_OR_RETURN(Node doc, load_document_file(path));
  if (doc.kind != NodeKind::kMap) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: expected a JSON object of JAX memory_analysis() sizes, got {}",
                     doc.origin, doc.describe());
  }
  JaxMemory m;
  m.source = path;
  struct Key {
    const char* name;
    std::int64_t* out;
    bool required;
  };
  const Key keys[] = {{"argument_size_in_bytes", &m.argument_bytes, true},
                      {"output_size_in_bytes", &m.output_bytes, true},
                      {"temp_size_in_bytes", &m.temp_bytes, true},
                      {"alias_size_in_bytes", &m.alias_bytes, false},
                      {"generated_code_size_in_bytes", &m.generated_code_bytes, false},
                      {"host_argument_size_in_bytes", &m.host_argument_bytes, false},
                      {"host_output_size_in_bytes", &m.host_output_bytes, false},
                      {"host_alias_size_in_bytes", &m.host_alias_bytes, false},
                      {"host_temp_size_in_bytes", &m.host_temp_bytes, false},
                      {"host_generated_code_size_in_bytes", &m.host_generated_code_bytes, false},
                      {"peak_memory_in_bytes", &m.peak_bytes, false}};
  for (const auto& [key, value] : doc.entries) {
    if (key == "device") {
      if (value.kind != NodeKind::kScalar) {
        return sim::fail(ErrorCode::kInvalidInput, "{}: device: expected a string, got {}",
                         value.origin, value.describe());
      }
      m.device = value.scalar;
      continue;
    }
    const Key* k = nullptr;
    for (const Key& c : keys) {
      if (key == c.name) k = &c;
    }
    if (k == nullptr) {
      std::vector<std::string> names = {"device"};
      for (const Key& c : keys) names.emplace_back(c.name);
      return sim::fail(ErrorCode::kInvalidInput,
                       "{}: {}: not a memory_analysis() field; expected "
                       "one of {}",
                       value.origin, key, fmt::join(names, ", "));
    }
    const auto v = scalar_int(value);
    if (!v || *v < 0) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "{}: {}: expected an integer number of bytes "
                       ">= 0, got {}",
                       value.origin, key, value.describe());
    }
    *k->out = *v;
  }
  for (const Key& k : keys) {
    if (k.required && doc.find(k.name) == nullptr) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "{}: {}: missing (required from "
                       "memory_analysis())",
                       doc.origin, k.name);
    }
  }
  if (m.alias_bytes > m.argument_bytes || m.alias_bytes > m.output_bytes) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: alias_size_in_bytes: {} exceeds the arguments or outputs it aliases",
                     path, m.alias_bytes);
  }
  return m;
}

namespace {

// What stays on the device between steps (JAX: arguments) and what a step makes and frees
// (JAX: temporaries). Gradients exist only inside a jitted step, so they are transient.
std::int64_t persistent(const models::MemoryBreakdown& b) {
  return b.params_bytes + b.optimizer_bytes;
}
std::int64_t transient(const models::MemoryBreakdown& b) {
  return b.grads_bytes + b.activations_bytes + b.buffers_bytes + b.workspace_bytes;
}

}  // namespace

nlohmann::json jax_memory_comparison(const JaxMemory& jax, const models::Report& r) {
  nlohmann::json j;
  j["jax"] = {{"source", jax.source},
              {"device", jax.device},
              {"argument_size_in_bytes", jax.argument_bytes},
              {"output_size_in_bytes", jax.output_bytes},
              {"alias_size_in_bytes", jax.alias_bytes},
              {"temp_size_in_bytes", jax.temp_bytes},
              {"generated_code_size_in_bytes", jax.generated_code_bytes},
              {"host_total_bytes", jax.host_total_bytes()},
              {"device_total_bytes", jax.device_total_bytes()}};
  if (jax.peak_bytes >= 0) j["jax"]["peak_memory_in_bytes"] = jax.peak_bytes;
  j["offsim"] = {{"rank", r.worst_rank},
                 {"hbm_peak_bytes", r.hbm_peak_bytes},
                 {"persistent_bytes", persistent(r.memory)},
                 {"transient_bytes", transient(r.memory)},
                 {"host_peak_bytes", r.host_peak_bytes}};
  const std::int64_t reference = jax.peak_bytes >= 0 ? jax.peak_bytes : jax.device_total_bytes();
  j["hbm_ratio"] =
      reference > 0 ? static_cast<double>(r.hbm_peak_bytes) / static_cast<double>(reference) : 0.0;
  return j;
}

std::string format_jax_memory(const JaxMemory& jax, const models::Report& r) {
  std::string out = fmt::format("\nJAX memory_analysis() ({}{}) beside offsim ({}):\n", jax.source,
                                jax.device.empty() ? "" : ", " + jax.device, r.worst_rank);
  const auto row = [&](const std::string& what, const std::string& j, const std::string& o) {
    std::string line = fmt::format("  {:<34} {:>12}  {:>12}", what, j, o);
    line.erase(line.find_last_not_of(' ') + 1);
    out += line + "\n";
  };
  row("", "JAX", "offsim");
  row("persistent (arguments | params+opt)", format_bytes(jax.argument_bytes),
      format_bytes(persistent(r.memory)));
  row("outputs, less donated aliases", format_bytes(jax.output_bytes - jax.alias_bytes), "");
  row("transient (temp | grads+act+buf+ws)", format_bytes(jax.temp_bytes),
      format_bytes(transient(r.memory)));
  row("generated code", format_bytes(jax.generated_code_bytes), "");
  row("device total | HBM peak", format_bytes(jax.device_total_bytes()),
      format_bytes(r.hbm_peak_bytes));
  if (jax.peak_bytes >= 0) row("XLA peak", format_bytes(jax.peak_bytes), "");
  row("pinned host (per device | per host)", format_bytes(jax.host_total_bytes()),
      format_bytes(r.host_peak_bytes));
  const std::int64_t reference = jax.peak_bytes >= 0 ? jax.peak_bytes : jax.device_total_bytes();
  if (reference > 0) {
    out +=
        fmt::format("  offsim HBM peak / JAX {}: {:.3f}\n", jax.peak_bytes >= 0 ? "peak" : "total",
                    static_cast<double>(r.hbm_peak_bytes) / static_cast<double>(reference));
  }
  return out;
}

}  // namespace offsim::scenarios
