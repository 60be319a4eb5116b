// Shared machinery of the framework importers (importer.h): the framework's keys with their
// origins, and the mapper that writes scenario keys and records what became of each framework key.
//
//   detail::Fields fields;
//   detail::flatten(doc, "", fields);                 // "zero_optimization.stage" -> node
//   detail::Mapper m(Framework::kDeepSpeed);
//   if (const detail::Field* f = fields.get("zero_optimization.stage")) {
//     OFFSIM_ASSIGN_OR_RETURN(std::int64_t stage, m.int_in(*f, 0, 3));
//     OFFSIM_RETURN_IF_ERROR(m.set(*f, "parallelism.zero_stage", std::to_string(stage)));
//   }
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "scenarios/document.h"
#include "scenarios/importers/importer.h"
#include "sim/core/result.h"

namespace offsim::scenarios::detail {

struct Field {
  std::string key;
  Node value;
  bool used = false;
};

// The framework's keys in the order first seen; a later `put` of the same key replaces the value
// (a model config over base.yml, a command-line override over both).
class Fields {
 public:
  void put(std::string key, Node value);
  // The field, marked as consumed; nullptr when absent.
  Field* get(std::string_view key);
  bool has(std::string_view key) const;
  std::vector<Field>& all() { return fields_; }

 private:
  std::vector<Field> fields_;
};

// Nested maps become dotted keys ("zero_optimization.offload_optimizer.device"); scalars and
// lists are leaves. An empty map is a leaf too.
void flatten(const Node& node, const std::string& prefix, Fields& out);

class Mapper {
 public:
  explicit Mapper(Framework framework) : framework_(framework) {}

  Node doc = make_map();
  ImportResult result;

  // Sets scenario `path` to the scalar `text`, with `f`'s origin, and records `f` as mapped.
  sim::Status set(const Field& f, const std::string& path, const std::string& text);
  // Sets `path` to `value` (whose origin is replaced by f's) and records the mapping.
  sim::Status set_node(const Field& f, const std::string& path, Node value);
  // Sets `path` from several framework fields (all recorded as mapped); origin of the first.
  sim::Status set_from(const std::vector<const Field*>& fs, const std::string& path,
                       const std::string& text);
  void mapped(const Field& f, const std::string& target);
  void ignored(const Field& f, const std::string& reason);
  void unmapped(const Field& f, const std::string& reason);

  // Typed reads; errors name the origin and the framework key.
  sim::Result<std::int64_t> int_in(const Field& f, std::int64_t min, std::int64_t max) const;
  sim::Result<double> number_in(const Field& f, double min, double max) const;
  sim::Result<bool> boolean(const Field& f) const;
  sim::Result<std::string> one_of(const Field& f, const std::vector<std::string>& values) const;
  sim::Result<std::string> text(const Field& f) const;
  sim::Unexpected error(const Field& f, const std::string& message) const;

  const char* name() const;  // "MaxText", "Megatron", ...

 private:
  Framework framework_;
};

// Fields nobody consumed: ignored when `is_ignored(key)` says they cannot change step time or
// memory (with that reason), unmapped otherwise.
void settle_leftovers(Fields& fields, Mapper& m,
                      const std::function<std::string(const std::string&)>& ignore_reason);

struct Finish {
  int world_gpus = 0;  // the job's GPU count when known (hardware.nodes/gpus follow from it)
  std::string name;    // the scenario name
  // The framework's attention is PyTorch SDPA with the FLASH_ATTENTION backend (PyTorch's
  // FlashAttention-2 kernels) first below compute capability 10, cuDNN's from 10 (torchtitan):
  // model.attention becomes flash2 on the older GPUs unless the scenario sets it.
  std::string sdpa_flash_below_sm100;  // the origin to record; empty: not such a framework
};

// Applies the --set overrides, the hardware size, the name and the strict check, then maps the
// document onto a Scenario with check_loaded, so an import that returns is runnable.
sim::Result<ImportResult> finish(Mapper& m, const ImportOptions& options, const Finish& finish);

// "llama.yml" -> "llama"
std::string file_stem(const std::string& path);
// Reads a whole file; kNotFound names it.
sim::Result<std::string> read_file(const std::string& path);

sim::Result<ImportResult> import_maxtext(const std::vector<std::string>& files,
                                         const ImportOptions& options);
sim::Result<ImportResult> import_megatron(const std::vector<std::string>& files,
                                          const ImportOptions& options);
sim::Result<ImportResult> import_deepspeed(const std::vector<std::string>& files,
                                           const ImportOptions& options);
sim::Result<ImportResult> import_torchtitan(const std::vector<std::string>& files,
                                            const ImportOptions& options);

}  // namespace offsim::scenarios::detail
