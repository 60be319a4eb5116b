// DeepSpeed import: a ds_config.json. DeepSpeed does not name the model, the sequence length or
// the hardware (the training script does): pass them with --set model=..., --set
// training.seq_len=..., --set hardware.system=....

#include <fmt/format.h>

#include "scenarios/importers/import_common.h"

namespace offsim::scenarios::detail {
namespace {

using sim::ErrorCode;

std::string ignore_reason(const std::string& key) {
  static const char* kPrefixes[] = {"optimizer.params",
                                    "scheduler",
                                    "gradient_clipping",
                                    "steps_per_print",
                                    "wall_clock_breakdown",
                                    "tensorboard",
                                    "wandb",
                                    "csv_monitor",
                                    "comms_logger",
                                    "flops_profiler",
                                    "prescale_gradients",
                                    "zero_allow_untested_optimizer",
                                    "fp16.loss_scale",
                                    "fp16.initial_scale_power",
                                    "fp16.loss_scale_window",
                                    "fp16.hysteresis",
                                    "fp16.min_loss_scale",
                                    "fp16.consecutive_hysteresis",
                                    "checkpoint",
                                    "dump_state",
                                    "seed"};
  for (const char* p : kPrefixes) {
    if (key.rfind(p, 0) == 0) return "no effect on step time or memory";
  }
  return {};
}

sim::Result<Fields> read_fields(const std::vector<std::string>& files) {
  Fields fields;
  for (const std::string& path : files) {
    OFFSIM_ASSIGN_OR_RETURN(Node doc, load_document_file(path));
    if (doc.kind != NodeKind::kMap) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "{}: expected a DeepSpeed config (a JSON "
                       "object), got {}",
                       path, doc.describe());
    }
    flatten(doc, "", fields);
  }
  return fields;
}

// --- batch: train_batch_size = micro x gradient_accumulation_steps x data-parallel size.
// Returns the data-parallel size.
sim::Result<std::int64_t> map_batch(Fields& fields, Mapper& m, const ImportOptions& options) {
  Field* tbs = fields.get("train_batch_size");
  Field* mbs = fields.get("train_micro_batch_size_per_gpu");
  Field* gas = fields.get("gradient_accumulation_steps");
  std::int64_t tbs_v = 0, mbs_v = 0, gas_v = 0;
  if (tbs != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(tbs_v, m.int_in(*tbs, 1, 1'000'000'000));
  }
  if (mbs != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(mbs_v, m.int_in(*mbs, 1, 1'000'000'000));
  }
  if (gas != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(gas_v, m.int_in(*gas, 1, 1'000'000'000));
  }
  std::int64_t dp = options.gpus;
  if (tbs_v > 0 && mbs_v > 0 && gas_v > 0) {
    if (tbs_v % (mbs_v * gas_v) != 0) {
      return m.error(*tbs, fmt::format("is not micro batch {} x gradient_accumulation_steps {} x "
                                       "the data-parallel size (DeepSpeed refuses it)",
                                       mbs_v, gas_v));
    }
    const std::int64_t derived = tbs_v / (mbs_v * gas_v);
    if (dp > 0 && dp != derived) {
      return m.error(*tbs, fmt::format("= {} x {} x dp needs dp {}, but --gpus is {}", mbs_v, gas_v,
                                       derived, dp));
    }
    dp = derived;
  } else if (dp > 0 && mbs_v > 0) {
    if (gas_v == 0 && tbs_v > 0) {
      if (tbs_v % (mbs_v * dp) != 0) {
        return m.error(*tbs,
                       fmt::format("is not a multiple of micro batch {} x {} GPUs", mbs_v, dp));
      }
      gas_v = tbs_v / (mbs_v * dp);
    }
    if (gas_v == 0) gas_v = 1;  // DeepSpeed's default
    tbs_v = mbs_v * gas_v * dp;
  } else {
    return sim::fail(ErrorCode::kInvalidInput,
                     "train_batch_size, train_micro_batch_size_per_gpu, "
                     "gradient_accumulation_steps: give all three, or the micro batch and "
                     "--gpus N (DeepSpeed derives the rest from the GPU count)");
  }
  OFFSIM_RETURN_IF_ERROR(
      m.set_from({tbs, mbs, gas}, "training.global_batch", std::to_string(tbs_v)));
  OFFSIM_RETURN_IF_ERROR(m.set_from({mbs}, "training.micro_batch", std::to_string(mbs_v)));
  OFFSIM_RETURN_IF_ERROR(m.set_from({tbs, mbs, gas}, "parallelism.dp", std::to_string(dp)));
  return dp;
}

// --- precision: bf16.enabled (or bfloat16.enabled), fp16.enabled; neither is fp32.
sim::Status map_precision(Fields& fields, Mapper& m, const std::vector<std::string>& files) {
  bool bf16 = false, fp16 = false;
  for (const char* key : {"bf16.enabled", "bfloat16.enabled"}) {
    if (Field* f = fields.get(key)) {
      OFFSIM_ASSIGN_OR_RETURN(bf16, m.boolean(*f));
      if (bf16)
        OFFSIM_RETURN_IF_ERROR(m.set(*f, "training.precision", "bf16"));
      else
        m.mapped(*f, "(off)");
    }
  }
  if (Field* f = fields.get("fp16.enabled")) {
    OFFSIM_ASSIGN_OR_RETURN(fp16, m.boolean(*f));
    if (fp16 && bf16)
      return m.error(*f, "fp16 and bf16 cannot both be enabled (DeepSpeed refuses it)");
    if (fp16)
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "training.precision", "fp16"));
    else
      m.mapped(*f, "(off)");
  }
  if (!bf16 && !fp16) {
    // fp32 training: no 16-bit GEMMs; offsim has no fp32 compute model.
    m.result.unmapped.push_back({.key = "bf16.enabled/fp16.enabled",
                                 .origin = files.front(),
                                 .value = "(neither)",
                                 .reason = "fp32 training is not modelled; bf16 rates are used"});
  }
  return {};
}

// The offload rules of the ZeRO config and where the optimizer update runs.
struct Offload {
  Node rules = make_sequence();
  bool optimizer_cpu = false;

  void add_rule(const char* tensor, const Field& f) {
    Node r = make_map(f.value.origin);
    r.entries.emplace_back("tensor", make_scalar(tensor, f.value.origin));
    r.entries.emplace_back("where", make_scalar("host", f.value.origin));
    rules.items.push_back(std::move(r));
  }
};

// zero_optimization.offload_optimizer or .offload_param: device (cpu, nvme, none), pin_memory.
sim::Status map_offload_device(Fields& fields, Mapper& m, const char* what, std::int64_t stage,
                               Offload& offload) {
  const std::string base = fmt::format("zero_optimization.{}", what);
  Field* dev = fields.get(base + ".device");
  Field* pin = fields.get(base + ".pin_memory");
  if (dev == nullptr) {
    if (pin != nullptr) m.ignored(*pin, "no device given: no offload");
    return {};
  }
  OFFSIM_ASSIGN_OR_RETURN(std::string d, m.one_of(*dev, {"cpu", "nvme", "none"}));
  if (d == "none") {
    m.mapped(*dev, "(no offload)");
    if (pin != nullptr) m.ignored(*pin, "no offload");
    return {};
  }
  if (d == "nvme") {
    m.unmapped(*dev, "NVMe offload (ZeRO-Infinity) is not modelled; host memory is used");
  }
  const bool param = std::string(what) == "offload_param";
  if (param && stage != 3) {
    return m.error(*dev, fmt::format("parameter offload needs ZeRO stage 3 (DeepSpeed "
                                     "refuses it at stage {})",
                                     stage));
  }
  if (!param && stage == 0) {
    return m.error(*dev,
                   "optimizer offload needs ZeRO stage 1, 2 or 3 (DeepSpeed refuses it "
                   "at stage 0)");
  }
  if (param) {
    offload.add_rule("params", *dev);
  } else {
    // ZeRO-Offload: fp32 master weights, moments and gradients on the host, Adam on the CPU.
    offload.add_rule("optimizer_states", *dev);
    offload.add_rule("master_weights", *dev);
    offload.add_rule("grads", *dev);
    offload.optimizer_cpu = true;
  }
  if (d == "cpu") m.mapped(*dev, "offload.rules");
  if (pin != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(bool pinned, m.boolean(*pin));
    if (pinned) {
      m.mapped(*pin, "(pinned host memory: offsim's host pool)");
    } else {
      m.unmapped(*pin, "pageable host copies are not modelled; pinned bandwidth is used");
    }
  }
  return {};
}

// zero_optimization.zenflow (DeepSpeed's ZenFlow, deepspeed/runtime/zenflow/zenflow_config.py)
// on ZeRO-Offload's flat-partition step: offload.cpu.zenflow.
sim::Status map_zenflow_value(Field& f, Mapper& m, const std::string& key) {
  const std::string to = "offload.cpu.zenflow." + key;
  if (key == "topk_ratio") {
    OFFSIM_ASSIGN_OR_RETURN(double v, m.number_in(f, 0.0, 1.0));
    return m.set(f, to, fmt::format("{}", v));
  }
  if (key == "pt_reserved_cores_perc") {
    OFFSIM_ASSIGN_OR_RETURN(double v, m.number_in(f, 0.0, 0.99));
    return m.set(f, to, fmt::format("{}", v));
  }
  if (key == "overlap_step") {
    OFFSIM_ASSIGN_OR_RETURN(bool v, m.boolean(f));
    return m.set(f, to, v ? "true" : "false");
  }
  if (key == "update_interval" || key == "select_interval") {
    if (f.value.kind == NodeKind::kScalar && f.value.scalar == "auto") {
      if (key == "update_interval") {
        m.unmapped(f, "\"auto\" adapts the interval at run time; offsim takes 4");
      } else {
        m.ignored(f, "\"auto\" reselects once per epoch, not charged per step");
      }
      return sim::ok();
    }
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, m.int_in(f, 1, 1 << 30));
    return m.set(f, to, std::to_string(v));
  }
  m.ignored(f,
            "a ZenFlow setting that does not change the steady-state step (selection, "
            "warm-up rounds, the selective optimizer's state placement)");
  return sim::ok();
}

sim::Status map_zenflow(Fields& fields, Mapper& m, bool optimizer_cpu) {
  static const char* const kKeys[] = {
      "topk_ratio",      "update_interval", "overlap_step",        "pt_reserved_cores_perc",
      "select_strategy", "select_interval", "full_warm_up_rounds", "auto_ratio",
      "offload",         "steps_per_epoch"};
  bool opened = false;
  for (const char* key : kKeys) {
    Field* f = fields.get(fmt::format("zero_optimization.zenflow.{}", key));
    if (f == nullptr) continue;
    if (!optimizer_cpu) {
      return m.error(*f,
                     "ZenFlow needs zero_optimization.offload_optimizer.device cpu "
                     "(DeepSpeed refuses it without CPU offload)");
    }
    if (!opened) {
      OFFSIM_RETURN_IF_ERROR(set_path(m.doc, "offload.cpu.step", make_scalar("flat_partition")));
      OFFSIM_RETURN_IF_ERROR(set_path(m.doc, "offload.cpu.zenflow", make_map()));
      opened = true;
    }
    OFFSIM_RETURN_IF_ERROR(map_zenflow_value(*f, m, key));
  }
  return sim::ok();
}

// zero_optimization.offload_optimizer.super_offload (DeepSpeed SuperOffload,
// deepspeed/runtime/superoffload/, offload_config.py) with its ratio and cpuadam_cores_perc, and
// the ZeRO-3 sub_group_size that cuts the partition into its sub-groups: offload.cpu.superoffload.
// Without super_offload, ratio is ZeRO-3's partial offload (Twin-Flow), not modelled.
sim::Status map_superoffload(Fields& fields, Mapper& m, std::int64_t stage, bool optimizer_cpu) {
  const std::string base = "zero_optimization.offload_optimizer.";
  bool on = false;
  if (Field* f = fields.get(base + "super_offload")) {
    OFFSIM_ASSIGN_OR_RETURN(on, m.boolean(*f));
    if (on && (stage != 3 || !optimizer_cpu)) {
      return m.error(*f,
                     "SuperOffload needs ZeRO stage 3 and offload_optimizer.device cpu "
                     "(DeepSpeed accepts it only there)");
    }
    if (on) {
      OFFSIM_RETURN_IF_ERROR(set_path(m.doc, "offload.cpu.superoffload", make_map()));
      m.mapped(*f, "offload.cpu.superoffload");
    } else {
      m.mapped(*f, "(ZeRO-Offload without SuperOffload)");
    }
  }
  for (const char* key : {"ratio", "cpuadam_cores_perc"}) {
    Field* f = fields.get(base + key);
    if (f == nullptr) continue;
    if (!on) {
      m.unmapped(*f,
                 "used by DeepSpeed only with super_offload (or, ratio, ZeRO-3 partial "
                 "offload, which is not modelled)");
      continue;
    }
    OFFSIM_ASSIGN_OR_RETURN(double v, m.number_in(*f, 0.0, 1.0));
    OFFSIM_RETURN_IF_ERROR(
        m.set(*f, fmt::format("offload.cpu.superoffload.{}", key), fmt::format("{}", v)));
  }
  if (on) {
    if (Field* f = fields.get("zero_optimization.sub_group_size")) {
      OFFSIM_ASSIGN_OR_RETURN(double v, m.number_in(*f, 1.0, 1e15));
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "offload.cpu.superoffload.sub_group_size",
                                   std::to_string(static_cast<std::int64_t>(v))));
    }
  }
  return sim::ok();
}

// --- ZeRO: stage, overlap and the offload devices.
sim::Status map_zero(Fields& fields, Mapper& m) {
  std::int64_t stage = 0;
  if (Field* f = fields.get("zero_optimization.stage")) {
    OFFSIM_ASSIGN_OR_RETURN(stage, m.int_in(*f, 0, 3));
    OFFSIM_RETURN_IF_ERROR(m.set(*f, "parallelism.zero_stage", std::to_string(stage)));
  }
  if (Field* f = fields.get("zero_optimization.overlap_comm")) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, m.boolean(*f));
    OFFSIM_RETURN_IF_ERROR(m.set(*f, "parallelism.overlap_grad_reduce", on ? "true" : "false"));
  }
  Offload offload;
  for (const char* what : {"offload_optimizer", "offload_param"}) {
    OFFSIM_RETURN_IF_ERROR(map_offload_device(fields, m, what, stage, offload));
  }
  if (offload.rules.items.empty()) {
    OFFSIM_RETURN_IF_ERROR(map_superoffload(fields, m, stage, false));
    return map_zenflow(fields, m, false);
  }
  Node off = make_map();
  off.entries.emplace_back("rules", std::move(offload.rules));
  off.entries.emplace_back("optimizer", make_scalar(offload.optimizer_cpu ? "cpu" : "gpu"));
  OFFSIM_RETURN_IF_ERROR(set_path(m.doc, "offload", std::move(off)));
  OFFSIM_RETURN_IF_ERROR(map_superoffload(fields, m, stage, offload.optimizer_cpu));
  return map_zenflow(fields, m, offload.optimizer_cpu);
}

// ZeRO's bucket sizes and communication details, the optimizer type and activation
// checkpointing settings (which the model code, not the config, switches on).
sim::Status map_details(Fields& fields, Mapper& m) {
  // ZeRO-3 prefetches the parameters of the modules ahead in its trace up to this many elements
  // (PartitionedParameterCoordinator); 0 turns prefetching off: each module's all-gather is
  // issued when the module is reached.
  if (Field* f = fields.get("zero_optimization.stage3_prefetch_bucket_size");
      f != nullptr && f->value.kind == NodeKind::kScalar && f->value.scalar == "auto") {
    m.mapped(*f, "(\"auto\": Accelerate sets a non-zero size, prefetching on)");
  } else if (f != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t elements, m.int_in(*f, 0, std::int64_t{1} << 50));
    OFFSIM_RETURN_IF_ERROR(
        m.set(*f, "parallelism.backward_prefetch", elements == 0 ? "none" : "pre"));
  }
  for (const char* key :
       {"zero_optimization.reduce_bucket_size", "zero_optimization.allgather_bucket_size",
        "zero_optimization.stage3_max_live_parameters",
        "zero_optimization.stage3_param_persistence_threshold",
        "zero_optimization.stage3_max_reuse_distance", "zero_optimization.sub_group_size"}) {
    // SuperOffload's sub-groups use sub_group_size (map_superoffload has read it then).
    if (find_path(m.doc, "offload.cpu.superoffload.sub_group_size") != nullptr &&
        std::string_view(key) == "zero_optimization.sub_group_size") {
      continue;
    }
    if (Field* f = fields.get(key)) {
      m.unmapped(*f, "bucket and prefetch sizes are not modelled (offsim reduces per layer)");
    }
  }
  for (const char* key :
       {"zero_optimization.contiguous_gradients", "zero_optimization.reduce_scatter",
        "zero_optimization.allgather_partitions", "zero_optimization.round_robin_gradients"}) {
    if (Field* f = fields.get(key)) {
      m.ignored(*f, "a communication detail offsim's per-layer collectives already assume");
    }
  }
  if (Field* f = fields.get("optimizer.type")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string t, m.text(*f));
    if (t == "Adam" || t == "AdamW" || t == "adam" || t == "adamw" || t == "CPUAdam" ||
        t == "FusedAdam") {
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "training.optimizer", "adamw"));
    } else {
      m.unmapped(*f, fmt::format("optimizer {} is not modelled (AdamW state sizes are used)", t));
    }
  }
  for (const char* key : {"activation_checkpointing.partition_activations",
                          "activation_checkpointing.cpu_checkpointing",
                          "activation_checkpointing.contiguous_memory_optimization",
                          "activation_checkpointing.number_checkpoints",
                          "activation_checkpointing.synchronize_checkpoint_boundary",
                          "activation_checkpointing.profile"}) {
    if (Field* f = fields.get(key)) {
      m.unmapped(*f,
                 "activation checkpointing is switched on by the model code, not the "
                 "config; give it with --set recompute=full (and an offload rule)");
    }
  }
  return {};
}

}  // namespace

sim::Result<ImportResult> import_deepspeed(const std::vector<std::string>& files,
                                           const ImportOptions& options) {
  OFFSIM_ASSIGN_OR_RETURN(Fields fields, read_fields(files));
  Mapper m(Framework::kDeepSpeed);
  OFFSIM_ASSIGN_OR_RETURN(const std::int64_t dp, map_batch(fields, m, options));
  OFFSIM_RETURN_IF_ERROR(map_precision(fields, m, files));
  OFFSIM_RETURN_IF_ERROR(map_zero(fields, m));
  OFFSIM_RETURN_IF_ERROR(map_details(fields, m));
  settle_leftovers(fields, m, ignore_reason);
  return finish(m, options, {.world_gpus = static_cast<int>(dp), .name = file_stem(files.front())});
}

}  // namespace offsim::scenarios::detail
