// Shared machinery of the framework importers (see import_common.h).

#include "scenarios/importers/import_common.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "models/scenario.h"
#include "scenarios/scenario_loader.h"
#include "sim/core/file_io.h"
#include "sim/platform/profile.h"
#include "sim/platform/system.h"

namespace offsim::scenarios::detail {

using sim::ErrorCode;

void Fields::put(std::string key, Node value) {
  for (Field& f : fields_) {
    if (f.key == key) {
      f.value = std::move(value);
      return;
    }
  }
  fields_.push_back({std::move(key), std::move(value), false});
}

Field* Fields::get(std::string_view key) {
  for (Field& f : fields_) {
    if (f.key == key) {
      f.used = true;
      return &f;
    }
  }
  return nullptr;
}

bool Fields::has(std::string_view key) const {
  return std::any_of(fields_.begin(), fields_.end(), [&](const Field& f) { return f.key == key; });
}

void flatten(const Node& node, const std::string& prefix, Fields& out) {
  if (node.kind == NodeKind::kMap && !node.entries.empty()) {
    for (const auto& [key, child] : node.entries) {
      flatten(child, prefix.empty() ? key : prefix + "." + key, out);
    }
    return;
  }
  out.put(prefix, node);
}

const char* Mapper::name() const {
  switch (framework_) {
    case Framework::kMaxText:
      return "MaxText";
    case Framework::kMegatron:
      return "Megatron";
    case Framework::kDeepSpeed:
      return "DeepSpeed";
    case Framework::kTorchtitan:
      return "torchtitan";
  }
  return "?";
}

namespace {

std::string value_text(const Node& n) {
  return n.kind == NodeKind::kScalar ? n.scalar : emit_flow(n);
}

ImportField record(const Field& f) {
  return ImportField{.key = f.key, .origin = f.value.origin, .value = value_text(f.value)};
}

}  // namespace

void Mapper::mapped(const Field& f, const std::string& target) {
  for (ImportField& m : result.mapped) {
    if (m.key == f.key && m.origin == f.value.origin) {
      if (m.target.find(target) == std::string::npos) m.target += ", " + target;
      return;
    }
  }
  ImportField r = record(f);
  r.target = target;
  result.mapped.push_back(std::move(r));
}

void Mapper::ignored(const Field& f, const std::string& reason) {
  ImportField r = record(f);
  r.reason = reason;
  result.ignored.push_back(std::move(r));
}

void Mapper::unmapped(const Field& f, const std::string& reason) {
  ImportField r = record(f);
  r.reason = reason;
  result.unmapped.push_back(std::move(r));
}

sim::Status Mapper::set(const Field& f, const std::string& path, const std::string& text) {
  return set_node(f, path, make_scalar(text));
}

sim::Status Mapper::set_node(const Field& f, const std::string& path, Node value) {
  value.origin = f.value.origin;
  OFFSIM_RETURN_IF_ERROR(set_path(doc, path, std::move(value)));
  mapped(f, path);
  return sim::ok();
}

sim::Status Mapper::set_from(const std::vector<const Field*>& fs, const std::string& path,
                             const std::string& text) {
  std::string origin;
  for (const Field* f : fs) {
    if (f == nullptr) continue;
    if (origin.empty()) origin = f->value.origin;
    mapped(*f, path);
  }
  if (origin.empty()) origin = fmt::format("{} default", name());
  return set_path(doc, path, make_scalar(text, origin));
}

sim::Unexpected Mapper::error(const Field& f, const std::string& message) const {
  return sim::fail(ErrorCode::kInvalidInput, "{}: {}: {}", f.value.origin, f.key, message);
}

sim::Result<std::int64_t> Mapper::int_in(const Field& f, std::int64_t min, std::int64_t max) const {
  const auto v = scalar_int(f.value);
  if (!v || *v < min || *v > max) {
    return error(f, fmt::format("expected an integer in {}..{} ({} accepts no other), got {}", min,
                                max, name(), f.value.describe()));
  }
  return *v;
}

sim::Result<double> Mapper::number_in(const Field& f, double min, double max) const {
  const auto v = scalar_double(f.value);
  if (!v || !std::isfinite(*v) || *v < min || *v > max) {
    return error(
        f, fmt::format("expected a number in [{}, {}], got {}", min, max, f.value.describe()));
  }
  return *v;
}

sim::Result<bool> Mapper::boolean(const Field& f) const {
  if (f.value.kind == NodeKind::kScalar) {
    std::string s = f.value.scalar;
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    if (s == "true" || s == "1") return true;
    if (s == "false" || s == "0") return false;
  }
  return error(f, fmt::format("expected true or false, got {}", f.value.describe()));
}

sim::Result<std::string> Mapper::text(const Field& f) const {
  if (f.value.kind != NodeKind::kScalar) {
    return error(f, fmt::format("expected a string, got {}", f.value.describe()));
  }
  return f.value.scalar;
}

sim::Result<std::string> Mapper::one_of(const Field& f,
                                        const std::vector<std::string>& values) const {
  if (f.value.kind == NodeKind::kScalar &&
      std::find(values.begin(), values.end(), f.value.scalar) != values.end()) {
    return f.value.scalar;
  }
  return error(
      f, fmt::format("expected one of {}, got {}", fmt::join(values, ", "), f.value.describe()));
}

void settle_leftovers(Fields& fields, Mapper& m,
                      const std::function<std::string(const std::string&)>& ignore_reason) {
  for (Field& f : fields.all()) {
    if (f.used) continue;
    f.used = true;
    const std::string reason = ignore_reason(f.key);
    if (!reason.empty()) {
      m.ignored(f, reason);
    } else {
      m.unmapped(f, fmt::format("not a {} key this importer knows", m.name()));
    }
  }
}

namespace {

// model.attention flash2 on a GPU below compute capability 10 (see Finish), unless the scenario
// gives the attention itself; a catalogue model named by a plain string becomes {base: name}.
sim::Status set_sdpa_attention(Node& doc, const std::string& system_name,
                               const std::string& origin) {
  const auto sys = sim::platform::find_system(system_name);
  if (!sys) return sim::ok();  // check_loaded names the unknown system
  const auto profile = sim::platform::builtin_profile(sys->gpu);
  if (!profile || profile->gpu.compute_capability.value >= 10.0) return sim::ok();
  Node* model = doc.find("model");
  if (model == nullptr) return sim::ok();
  if (model->kind == NodeKind::kScalar) {
    Node base = *model;
    Node map = make_map();
    map.origin = base.origin;
    map.entries.emplace_back("base", std::move(base));
    *model = std::move(map);
  }
  if (model->kind != NodeKind::kMap || model->find("attention") != nullptr) return sim::ok();
  return set_path(doc, "model.attention", make_scalar("flash2", origin));
}

}  // namespace

sim::Result<ImportResult> finish(Mapper& m, const ImportOptions& options, const Finish& fin) {
  if (options.strict && !m.result.unmapped.empty()) {
    const ImportField& u = m.result.unmapped.front();
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: {}: not mapped ({}); {} unmapped key(s) in all, --strict refuses them",
                     u.origin, u.key, u.reason, m.result.unmapped.size());
  }
  for (const std::string& s : options.sets) OFFSIM_RETURN_IF_ERROR(apply_override(m.doc, s));
  const Node* system = find_path(m.doc, "hardware.system");
  if (system == nullptr) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "hardware.system: a {} config does not name the hardware; pass --set "
                     "hardware.system=NAME (one of `offsim list systems`)",
                     m.name());
  }
  // A copy: setting hardware.nodes below may move the node `system` points to.
  const std::string system_name = system->kind == NodeKind::kScalar ? system->scalar : "";
  if (fin.world_gpus > 0 && find_path(m.doc, "hardware.nodes") == nullptr &&
      find_path(m.doc, "hardware.gpus") == nullptr && system->kind == NodeKind::kScalar) {
    if (auto sys = sim::platform::find_system(system->scalar)) {
      const int per_node = std::max(1, sys->gpus_per_node);
      const int nodes = (fin.world_gpus + per_node - 1) / per_node;
      const std::string origin = fmt::format("{} GPUs of the job", fin.world_gpus);
      OFFSIM_RETURN_IF_ERROR(
          set_path(m.doc, "hardware.nodes", make_scalar(std::to_string(nodes), origin)));
      if (nodes * per_node != fin.world_gpus) {
        OFFSIM_RETURN_IF_ERROR(
            set_path(m.doc, "hardware.gpus", make_scalar(std::to_string(fin.world_gpus), origin)));
      }
    }
  }
  if (!fin.sdpa_flash_below_sm100.empty() && !system_name.empty()) {
    OFFSIM_RETURN_IF_ERROR(set_sdpa_attention(m.doc, system_name, fin.sdpa_flash_below_sm100));
  }
  if (find_path(m.doc, "name") == nullptr) {
    OFFSIM_RETURN_IF_ERROR(set_path(m.doc, "name", make_scalar(fin.name, "", true)));
  }
  // Scenario keys first, in the order the loader documents them.
  Node ordered = make_map();
  for (const char* key :
       {"name", "model", "hardware", "training", "parallelism", "recompute", "offload"}) {
    if (const Node* n = m.doc.find(key)) ordered.entries.emplace_back(key, *n);
  }
  for (const auto& [key, n] : m.doc.entries) {
    if (ordered.find(key) == nullptr) ordered.entries.emplace_back(key, n);
  }
  m.doc = std::move(ordered);
  OFFSIM_ASSIGN_OR_RETURN(models::Scenario s, scenario_from_document(m.doc, "."));
  OFFSIM_RETURN_IF_ERROR(check_loaded(s, m.doc));
  m.result.scenario = m.doc;
  return std::move(m.result);
}

std::string file_stem(const std::string& path) {
  return std::filesystem::path(path).stem().string();
}

sim::Result<std::string> read_file(const std::string& path) { return sim::read_text_file(path); }

}  // namespace offsim::scenarios::detail
