// torchtitan import: a job TOML ([model], [training], [parallelism], [activation_checkpoint],
// [float8]). Parsed with toml++, each value keeping its file:line:col.

#include <tuple>

#include <toml++/toml.h>

#include <fmt/format.h>

#include "models/scenario.h"
#include "scenarios/importers/import_common.h"

namespace offsim::scenarios::detail {
namespace {

using sim::ErrorCode;

std::string where(const std::string& path, const toml::source_region& r) {
  return fmt::format("{}:{}:{}", path, r.begin.line, r.begin.column);
}

Node to_node(const toml::node& n, const std::string& path) {
  const std::string origin = where(path, n.source());
  if (const auto* t = n.as_table()) {
    Node out = make_map(origin);
    for (const auto& [k, v] : *t) out.entries.emplace_back(std::string(k.str()), to_node(v, path));
    return out;
  }
  if (const auto* a = n.as_array()) {
    Node out = make_sequence(origin);
    for (const auto& v : *a) out.items.push_back(to_node(v, path));
    return out;
  }
  if (const auto* s = n.as_string()) return make_scalar(s->get(), origin, true);
  if (const auto* i = n.as_integer()) return make_scalar(std::to_string(i->get()), origin);
  if (const auto* d = n.as_floating_point())
    return make_scalar(fmt::format("{}", d->get()), origin);
  if (const auto* b = n.as_boolean()) return make_scalar(b->get() ? "true" : "false", origin);
  return make_scalar("", origin);  // dates and times: no torchtitan key uses them
}

std::string ignore_reason(const std::string& key) {
  static const char* kPrefixes[] = {"job.",
                                    "metrics.",
                                    "checkpoint.",
                                    "profiling.",
                                    "comm.",
                                    "lr_scheduler.",
                                    "optimizer.lr",
                                    "optimizer.eps",
                                    "optimizer.weight_decay",
                                    "optimizer.beta",
                                    "training.steps",
                                    "training.max_norm",
                                    "training.dataset",
                                    "training.seed",
                                    "training.warmup_steps",
                                    "model.tokenizer_path",
                                    "model.hf_assets_path",
                                    "experimental.",
                                    "validation.",
                                    "fault_tolerance.",
                                    "memory_estimation.",
                                    "compile."};
  for (const char* p : kPrefixes) {
    if (key.rfind(p, 0) == 0) return "no effect on step time or memory";
  }
  return {};
}

sim::Result<Fields> read_fields(const std::vector<std::string>& files) {
  Fields fields;
  for (const std::string& path : files) {
    OFFSIM_ASSIGN_OR_RETURN(std::string text, read_file(path));
    try {
      const toml::table table = toml::parse(text, path);
      flatten(to_node(table, path), "", fields);
    } catch (const toml::parse_error& e) {
      return sim::fail(ErrorCode::kInvalidInput, "{}: TOML: {}", where(path, e.source()),
                       e.description());
    }
  }
  return fields;
}

// A [parallelism] key; older torchtitan releases kept the parallel degrees under [training].
Field* parallel_field(Fields& fields, const char* key) {
  if (Field* f = fields.get(fmt::format("parallelism.{}", key))) return f;
  return fields.get(fmt::format("training.{}", key));
}

struct Layout {
  std::int64_t dp = 1, tp = 1, pp = 1, cp = 1;
  std::int64_t shard = 1;  // data_parallel_shard_degree, as resolved
  std::int64_t replicate = 1;
};

// --- parallel layout; data_parallel_shard_degree -1 takes the remaining GPUs
sim::Result<Layout> map_layout(Fields& fields, Mapper& m, const ImportOptions& options) {
  std::int64_t replicate = 1, shard = -1, tp = 1, pp = 1, cp = 1;
  Field* rep_f = parallel_field(fields, "data_parallel_replicate_degree");
  Field* shard_f = parallel_field(fields, "data_parallel_shard_degree");
  Field* tp_f = parallel_field(fields, "tensor_parallel_degree");
  Field* pp_f = parallel_field(fields, "pipeline_parallel_degree");
  Field* cp_f = parallel_field(fields, "context_parallel_degree");
  if (rep_f != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(replicate, m.int_in(*rep_f, 1, 1'000'000));
  }
  if (shard_f != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(shard, m.int_in(*shard_f, -1, 1'000'000));
    if (shard == 0) return m.error(*shard_f, "expected -1 or a degree >= 1, got 0");
  }
  if (tp_f != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(tp, m.int_in(*tp_f, 1, 1'000'000));
  }
  if (pp_f != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(pp, m.int_in(*pp_f, 1, 1'000'000));
  }
  if (cp_f != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(cp, m.int_in(*cp_f, 1, 1'000'000));
  }
  if (shard == -1) {
    if (options.gpus <= 0) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "{}data_parallel_shard_degree: -1 (torchtitan's default) takes the "
                       "remaining GPUs; pass --gpus N (the job's NGPU x nodes)",
                       shard_f != nullptr ? shard_f->value.origin + ": " : "");
    }
    const std::int64_t others = replicate * tp * pp * cp;
    if (options.gpus % others != 0) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "--gpus {}: not divisible by replicate x tensor x pipeline x context "
                       "degrees {}",
                       options.gpus, others);
    }
    shard = options.gpus / others;
  }
  const std::int64_t dp = replicate * shard;
  OFFSIM_RETURN_IF_ERROR(m.set_from({rep_f, shard_f}, "parallelism.dp", std::to_string(dp)));
  OFFSIM_RETURN_IF_ERROR(m.set_from({shard_f}, "parallelism.fsdp", shard > 1 ? "true" : "false"));
  if (tp_f != nullptr) {
    OFFSIM_RETURN_IF_ERROR(m.set(*tp_f, "parallelism.tp", std::to_string(tp)));
    // torchtitan's tensor parallel plan shards the norms and dropout along the sequence.
    if (tp > 1) OFFSIM_RETURN_IF_ERROR(m.set(*tp_f, "parallelism.sequence_parallel", "true"));
  }
  if (pp_f != nullptr) OFFSIM_RETURN_IF_ERROR(m.set(*pp_f, "parallelism.pp", std::to_string(pp)));
  // Context parallelism: each sequence over cp ranks; FSDP shards over dp_shard x cp (torchtitan's
  // dp_shard_cp mesh), as offsim's CP ranks join the data-parallel sharding.
  if (cp_f != nullptr) OFFSIM_RETURN_IF_ERROR(m.set(*cp_f, "parallelism.cp", std::to_string(cp)));
  return Layout{.dp = dp, .tp = tp, .pp = pp, .cp = cp, .shard = shard, .replicate = replicate};
}

// The pipeline schedule, context parallelism and the parallel switches offsim does not model.
sim::Status map_parallel_options(Fields& fields, Mapper& m, const Layout& layout) {
  const std::int64_t cp = layout.cp;
  if (Field* f = parallel_field(fields, "pipeline_parallel_schedule")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string s, m.text(*f));
    if (s == "1F1B") {
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "parallelism.schedule", "1f1b"));
    } else if (s == "Interleaved1F1B") {
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "parallelism.schedule", "interleaved_1f1b"));
    } else {
      m.unmapped(*f, fmt::format("pipeline schedule {} is not modelled (1F1B, Interleaved1F1B "
                                 "are)",
                                 s));
    }
  }
  // Expert parallelism (MoE models): the routed experts over expert_parallel_degree ranks, each
  // expert's FFN over expert_tensor_parallel_degree (torchtitan's default 1); both fold into the
  // data- and tensor-parallel ranks, as offsim's ep x etp into tp x dp.
  std::int64_t ep = 1;
  std::int64_t etp = 1;
  Field* ep_field = nullptr;
  for (auto [key, path, degree] :
       {std::tuple{"expert_parallel_degree", "parallelism.ep", &ep},
        std::tuple{"expert_tensor_parallel_degree", "parallelism.etp", &etp}}) {
    if (Field* f = parallel_field(fields, key)) {
      OFFSIM_ASSIGN_OR_RETURN(*degree, m.int_in(*f, 1, 1'000'000));
      if (degree == &ep) ep_field = f;
      if (*degree > 1) {
        OFFSIM_RETURN_IF_ERROR(m.set(*f, path, std::to_string(*degree)));
      } else {
        m.mapped(*f, "(1: nothing to model)");
      }
    }
  }
  // torchtitan's ParallelDims._validate: EP borrows all of CP and part of data_parallel_shard
  // (and all of TP when expert_tensor_parallel_degree is 1); ETP is 1 or TP.
  if (ep > 1) {
    const std::int64_t borrowed = etp == 1 ? cp * layout.tp : cp;
    if ((etp != 1 && etp != layout.tp) || ep % borrowed != 0 ||
        (layout.shard * borrowed) % ep != 0) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "{}: expert_parallel_degree {} with expert_tensor_parallel_degree {}: "
                       "torchtitan needs ETP 1 or the tensor degree {}, and EP a multiple of "
                       "{} (context{}) dividing data_parallel_shard_degree {} x {}",
                       ep_field->value.origin, ep, etp, layout.tp, borrowed,
                       etp == 1 ? " x tensor" : "", layout.shard, borrowed);
    }
  }
  // PyTorch's context-parallel SDPA passes K and V shards around the CP group ("alltoall": shard
  // for shard, the ring offsim runs as cp_comm_type p2p; "allgather", the default: all shards
  // gathered after the first block).
  Field* rotate = parallel_field(fields, "context_parallel_rotate_method");
  Field by_default{"parallelism.context_parallel_rotate_method",
                   make_scalar("allgather", "torchtitan default"), true};
  if (rotate == nullptr && cp > 1) rotate = &by_default;
  if (Field* f = rotate) {
    OFFSIM_ASSIGN_OR_RETURN(std::string r, m.one_of(*f, {"allgather", "alltoall"}));
    if (r == "alltoall") {
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "parallelism.cp_comm_type", "p2p"));
    } else {
      m.unmapped(*f,
                 "the all-gather of the K/V shards after the first block is priced as the ring "
                 "exchange overlapped block by block (cp_comm_type p2p)");
    }
  }
  for (const char* key : {"enable_async_tensor_parallel", "fsdp_reshard_after_forward",
                          "enable_compiled_autograd", "disable_loss_parallel"}) {
    if (Field* f = parallel_field(fields, key)) m.unmapped(*f, "not modelled");
  }
  return {};
}

// --- batch: local batch x dp, or the global batch as a multiple of it; the sequence length.
sim::Status map_batch(Fields& fields, Mapper& m, std::int64_t dp) {
  Field* local = fields.get("training.local_batch_size");
  if (local == nullptr) local = fields.get("training.batch_size");
  if (local == nullptr) {
    return sim::fail(ErrorCode::kInvalidInput, "training.local_batch_size: not given");
  }
  OFFSIM_ASSIGN_OR_RETURN(std::int64_t mb, m.int_in(*local, 1, 1'000'000));
  std::int64_t global = mb * dp;
  Field* gbs = fields.get("training.global_batch_size");
  if (gbs != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t g, m.int_in(*gbs, -1, 1'000'000'000));
    if (g > 0) {
      if (g % (mb * dp) != 0) {
        return m.error(*gbs, fmt::format("is not a multiple of local_batch_size {} x dp {} "
                                         "(torchtitan accumulates whole local batches)",
                                         mb, dp));
      }
      global = g;
    }
  }
  OFFSIM_RETURN_IF_ERROR(m.set(*local, "training.micro_batch", std::to_string(mb)));
  OFFSIM_RETURN_IF_ERROR(m.set_from({local, gbs}, "training.global_batch", std::to_string(global)));
  if (Field* f = fields.get("training.seq_len")) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t s, m.int_in(*f, 1, 100'000'000));
    OFFSIM_RETURN_IF_ERROR(m.set(*f, "training.seq_len", std::to_string(s)));
  }
  return {};
}

// Mixed precision and FSDP CPU offload.
sim::Status map_precision_and_offload(Fields& fields, Mapper& m) {
  if (Field* f = fields.get("training.mixed_precision_param")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string p, m.one_of(*f, {"bfloat16", "float32"}));
    if (p == "bfloat16")
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "training.precision", "bf16"));
    else
      m.unmapped(*f, "float32 compute is not modelled (bf16 rates are used)");
  }
  if (Field* f = fields.get("training.mixed_precision_reduce")) {
    m.ignored(*f, "gradient reduction dtype: offsim reduces in the parameter dtype");
  }
  Field* impl = fields.get("optimizer.implementation");
  std::string implementation = "fused";  // torchtitan's OptimizersContainer default
  if (impl != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(
        implementation, m.one_of(*impl, {"for-loop", "foreach", "fused", "fused_opt_states_bf16"}));
  }
  bool offload = false;
  if (Field* f = fields.get("training.enable_cpu_offload")) {
    OFFSIM_ASSIGN_OR_RETURN(offload, m.boolean(*f));
    if (offload) {
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "offload.preset", "fsdp_cpu_offload"));
      // The CPU step runs the optimizer torchtitan builds: fused=True for "fused" (its default),
      // torch's multi-pass kernels for "foreach" and "for-loop".
      const bool fused = implementation == "fused" || implementation == "fused_opt_states_bf16";
      OFFSIM_RETURN_IF_ERROR(m.set_from(
          impl != nullptr ? std::vector<const Field*>{impl, f} : std::vector<const Field*>{f},
          "offload.cpu.adam", fused ? "torch_fused" : "torch"));
    } else {
      m.mapped(*f, "(off)");
    }
  }
  if (impl != nullptr && !offload) {
    m.ignored(*impl,
              "the GPU optimizer's kernels are not distinguished; with "
              "training.enable_cpu_offload it picks the CPU Adam");
  }
  return {};
}

// --- model: name + flavor name a catalogue model ("llama3" + "8B" -> llama3-8b, "qwen3" +
// "30B-A3B" -> qwen3-30b-a3b, "deepseek_v3" + "671B" -> deepseek-v3); float8
// converters; the optimizer.
sim::Status map_model(Fields& fields, Mapper& m) {
  Field* name_f = fields.get("model.name");
  Field* flavor_f = fields.get("model.flavor");
  if (name_f != nullptr && flavor_f != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(std::string n, m.text(*name_f));
    OFFSIM_ASSIGN_OR_RETURN(std::string fl, m.text(*flavor_f));
    std::string model = n + "-" + fl;
    for (char& c : model) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (model == "deepseek_v3-671b") model = "deepseek-v3";  // torchtitan's name for it
    if (!models::find_model(model)) {
      return m.error(*flavor_f, fmt::format("{} {} is not in offsim's catalogue (`offsim list "
                                            "models`); give the model with --set model=...",
                                            n, fl));
    }
    OFFSIM_RETURN_IF_ERROR(m.set_from({name_f, flavor_f}, "model", model));
    // torchtitan's MoE runs its experts as one torch._grouped_mm kernel (MoEArgs.use_grouped_mm,
    // true by default in torchtitan/models/moe), not Transformer Engine's per-expert GEMMs.
    if (models::find_model(model)->moe.experts > 0) {
      OFFSIM_RETURN_IF_ERROR(
          m.set_from({name_f, flavor_f}, "training.moe_grouped_gemm", "single_kernel"));
    }
  }
  if (Field* f = fields.get("model.converters")) {
    bool fp8 = false;
    for (const Node& c : f->value.items) fp8 = fp8 || c.scalar == "float8";
    if (fp8)
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "training.precision", "fp8"));
    else
      m.unmapped(*f, "model converters other than float8 are not modelled");
  }
  if (Field* f = fields.get("optimizer.name")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string o, m.text(*f));
    if (o == "AdamW" || o == "Adam")
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "training.optimizer", "adamw"));
    else
      m.unmapped(*f, fmt::format("optimizer {} is not modelled", o));
  }
  return {};
}

// HSDP (data_parallel_replicate_degree beside data_parallel_shard_degree): FSDP over the
// dp_shard_cp mesh, replicated over dp_replicate, as parallelism.fsdp_shard (with FSDP CPU
// offload too: each rank's host holds its shard group's share; an MoE model's experts sharded
// over what EP leaves of the shard group and replicated likewise).
sim::Status map_hybrid_sharding(Fields& fields, Mapper& m, const Layout& layout) {
  if (layout.shard <= 1 || layout.replicate <= 1) return {};
  Field* rep = parallel_field(fields, "data_parallel_replicate_degree");
  if (rep == nullptr) return {};
  return m.set(*rep, "parallelism.fsdp_shard", std::to_string(layout.shard * layout.cp));
}

// --- activation checkpointing; the float8 section's details.
sim::Status map_checkpointing(Fields& fields, Mapper& m) {
  if (Field* f = fields.get("activation_checkpoint.mode")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string mode, m.one_of(*f, {"none", "selective", "full"}));
    OFFSIM_RETURN_IF_ERROR(m.set(*f, "recompute", mode));
    if (Field* opt = fields.get("activation_checkpoint.selective_ac_option")) {
      OFFSIM_ASSIGN_OR_RETURN(std::string o, m.text(*opt));
      if (mode != "selective") {
        m.ignored(*opt, "used only with mode selective");
      } else if (o == "op") {
        m.mapped(*opt, "recompute (selective: attention recomputed, matmuls saved)");
      } else {
        m.unmapped(*opt, fmt::format("layer-wise selective AC (every {} layers) is modelled as "
                                     "op-level selective recompute",
                                     o));
      }
    }
  }
  for (Field& f : fields.all()) {
    if (!f.used && f.key.rfind("float8.", 0) == 0) {
      f.used = true;
      m.unmapped(f, "float8 details are not modelled (model.converters = [\"float8\"] is)");
    }
  }
  return {};
}

}  // namespace

sim::Result<ImportResult> import_torchtitan(const std::vector<std::string>& files,
                                            const ImportOptions& options) {
  OFFSIM_ASSIGN_OR_RETURN(Fields fields, read_fields(files));
  Mapper m(Framework::kTorchtitan);
  OFFSIM_ASSIGN_OR_RETURN(const Layout layout, map_layout(fields, m, options));
  OFFSIM_RETURN_IF_ERROR(map_parallel_options(fields, m, layout));
  OFFSIM_RETURN_IF_ERROR(map_batch(fields, m, layout.dp));
  OFFSIM_RETURN_IF_ERROR(map_precision_and_offload(fields, m));
  OFFSIM_RETURN_IF_ERROR(map_model(fields, m));
  OFFSIM_RETURN_IF_ERROR(map_hybrid_sharding(fields, m, layout));
  OFFSIM_RETURN_IF_ERROR(map_checkpointing(fields, m));
  settle_leftovers(fields, m, ignore_reason);
  return finish(m, options,
                {.world_gpus = static_cast<int>(layout.dp * layout.tp * layout.pp * layout.cp),
                 .name = file_stem(files.front()),
                 .sdpa_flash_below_sm100 =
                     "torchtitan's SDPA: FLASH_ATTENTION first below sm100, cuDNN from sm100 "
                     "(torchtitan/models/attention.py, pytorch/torchtitan PR 1196)"});
}

}  // namespace offsim::scenarios::detail
