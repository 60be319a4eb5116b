// MaxText import: base.yml, then the model config, then command-line overrides (later wins), as
// MaxText's pyconfig merges them. See importers/README.md for the key table.

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "models/scenario.h"
#include "scenarios/importers/import_common.h"

namespace offsim::scenarios::detail {
namespace {

using sim::ErrorCode;

// MaxText mesh axes, in MaxText's order, and whether offsim models them.
constexpr const char* kAxes[] = {"data",
                                 "fsdp",
                                 "fsdp_transpose",
                                 "sequence",
                                 "context",
                                 "tensor",
                                 "tensor_transpose",
                                 "tensor_sequence",
                                 "autoregressive",
                                 "pipeline",
                                 "expert"};

std::string ignore_reason(const std::string& key) {
  static const char* kPrefixes[] = {"learning_rate",
                                    "warmup",
                                    "cosine",
                                    "adam_b",
                                    "adam_eps",
                                    "adam_weight_decay",
                                    "gradient_clipping",
                                    "dataset",
                                    "tokenizer",
                                    "train_split",
                                    "eval",
                                    "run_name",
                                    "base_output_directory",
                                    "steps",
                                    "log_period",
                                    "enable_checkpointing",
                                    "async_checkpointing",
                                    "checkpoint",
                                    "load_",
                                    "save_",
                                    "enable_profiler",
                                    "profiler",
                                    "skip_first_n_steps",
                                    "metrics",
                                    "gcs_metrics",
                                    "jax_cache_dir",
                                    "init_weights_seed",
                                    "data_shuffle_seed",
                                    "normalization_layer_epsilon",
                                    "rope_",
                                    "use_iota_embed",
                                    "scan_layers",
                                    "enable_tensorboard",
                                    "upload_all_profiler_results",
                                    "max_corpus_chars",
                                    "add_bos",
                                    "add_eos"};
  for (const char* p : kPrefixes) {
    if (key.rfind(p, 0) == 0) return "no effect on step time or memory";
  }
  return {};
}

struct Names {
  std::vector<std::string> hbm;   // saved on HBM under full remat
  std::vector<std::string> host;  // saved on host
};

// MaxText remat_policy -> which checkpoint names are saved (layers.py policies). Projection
// matmul outputs are query_proj, key_proj, value_proj, out_proj, mlpwi, mlpwo.
std::optional<Names> policy_names(const std::string& p) {
  const std::vector<std::string> qkv = {"query_proj", "key_proj", "value_proj"};
  const std::vector<std::string> all = {"query_proj", "key_proj", "value_proj",
                                        "out_proj",   "mlpwi",    "mlpwo"};
  auto plus = [](std::vector<std::string> a, std::initializer_list<const char*> b) {
    for (const char* s : b) a.emplace_back(s);
    return a;
  };
  if (p == "full") return Names{};
  if (p == "minimal") return Names{.hbm = all};
  if (p == "minimal_with_context") return Names{.hbm = plus(all, {"context"})};
  if (p == "save_dot_with_context_except_mlp")
    return Names{.hbm = plus(qkv, {"out_proj", "context"})};
  if (p == "save_dot_except_mlpwi") return Names{.hbm = plus(qkv, {"out_proj", "mlpwo"})};
  if (p == "save_dot_except_mlp") return Names{.hbm = plus(qkv, {"out_proj"})};
  if (p == "save_qkv_proj") return Names{.hbm = qkv};
  if (p == "save_out_proj") return Names{.hbm = {"out_proj"}};
  if (p == "qkv_proj_offloaded") return Names{.host = qkv};
  if (p == "minimal_offloaded") return Names{.host = all};
  return std::nullopt;
}

Node rule(const std::string& tensor, const std::string& where, const std::string& origin) {
  Node r = make_map(origin);
  r.entries.emplace_back("tensor", make_scalar(tensor, origin));
  r.entries.emplace_back("where", make_scalar(where, origin));
  return r;
}

// base.yml, the model config, then the command-line overrides; a later value replaces an earlier.
sim::Result<Fields> read_fields(const std::vector<std::string>& files,
                                const ImportOptions& options) {
  Fields fields;
  for (const std::string& path : files) {
    OFFSIM_ASSIGN_OR_RETURN(Node doc, load_document_file(path));
    if (doc.kind != NodeKind::kMap) {
      return sim::fail(ErrorCode::kInvalidInput, "{}: expected a MaxText config (a map), got {}",
                       path, doc.describe());
    }
    for (auto& [key, value] : doc.entries) fields.put(key, std::move(value));
  }
  for (const std::string& o : options.framework_overrides) {
    const auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "MaxText override '{}': expected key=value (as on MaxText's command line)",
                       o);
    }
    OFFSIM_ASSIGN_OR_RETURN(Node v, parse_document(o.substr(eq + 1), "command line " + o));
    v.origin = "command line " + o;
    fields.put(o.substr(0, eq), std::move(v));
  }
  return fields;
}

// The ici_* and dcn_* degrees as given; one -1 per level takes the remaining devices.
struct Mesh {
  std::map<std::string, std::int64_t> ici, dcn;
  std::map<std::string, Field*> ici_f, dcn_f;
  Field* ici_fill = nullptr;
  Field* dcn_fill = nullptr;
  std::int64_t ici_known = 1, dcn_known = 1;  // product of the degrees other than -1
};

// The mesh's degrees per axis, and what offsim lays out of them.
struct Layout {
  std::map<std::string, std::int64_t> degree;
  std::int64_t product = 1;  // devices of the whole mesh
  std::int64_t dp = 1, tp = 1, pp = 1, cp = 1;
  std::vector<Field*> data_fields;          // ici_/dcn_data_parallelism, as given
  std::vector<const Field*> expert_fields;  // ici_/dcn_expert_parallelism, as given
};

sim::Status read_axis(Fields& fields, const Mapper& m, const char* axis, int level, Mesh& mesh) {
  const std::string key = fmt::format("{}_{}_parallelism", level == 0 ? "ici" : "dcn", axis);
  auto& degrees = level == 0 ? mesh.ici : mesh.dcn;
  auto& fs = level == 0 ? mesh.ici_f : mesh.dcn_f;
  Field* f = fields.get(key);
  degrees[axis] = 1;
  fs[axis] = f;
  if (f == nullptr) return {};
  OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, m.int_in(*f, -1, 1'000'000));
  if (v == 0) return m.error(*f, "expected -1 (the remaining devices) or a degree >= 1, got 0");
  Field*& fill = level == 0 ? mesh.ici_fill : mesh.dcn_fill;
  if (v == -1) {
    if (fill != nullptr) {
      return m.error(*f, fmt::format("only one {} axis may be -1; {} is -1 too",
                                     level == 0 ? "ici" : "dcn", fill->key));
    }
    fill = f;
  } else {
    (level == 0 ? mesh.ici_known : mesh.dcn_known) *= v;
  }
  degrees[axis] = v;
  return {};
}

// Resolves the -1 axes from the job's GPU count (--gpus) and the slice count.
sim::Status fill_mesh(const Mapper& m, std::int64_t world, std::int64_t slices, Mesh& mesh) {
  if (mesh.ici_fill == nullptr && mesh.dcn_fill == nullptr) return {};
  if (world <= 0) {
    Field* f = mesh.ici_fill != nullptr ? mesh.ici_fill : mesh.dcn_fill;
    return m.error(*f, "-1 takes the remaining devices; pass --gpus N (the job's GPU count)");
  }
  if (mesh.dcn_fill == nullptr) {
    slices = mesh.dcn_known;
  } else if (slices == 0) {
    if (mesh.ici_fill != nullptr) {
      return m.error(*mesh.dcn_fill, "with an ici and a dcn axis both -1, num_slices is needed");
    }
    slices = world / mesh.ici_known;
  }
  if (world % slices != 0) {
    return sim::fail(ErrorCode::kInvalidInput, "--gpus {}: not divisible into {} slices", world,
                     slices);
  }
  const std::int64_t per_slice = world / slices;
  if (mesh.ici_fill != nullptr) {
    if (per_slice % mesh.ici_known != 0) {
      return m.error(*mesh.ici_fill, fmt::format("the other ici degrees ({}) do not divide the {} "
                                                 "devices of a slice",
                                                 mesh.ici_known, per_slice));
    }
    const std::string& key = mesh.ici_fill->key;
    mesh.ici[key.substr(4, key.size() - 4 - 12)] = per_slice / mesh.ici_known;
  }
  if (mesh.dcn_fill != nullptr) {
    if (slices % mesh.dcn_known != 0) {
      return m.error(*mesh.dcn_fill,
                     fmt::format("the other dcn degrees ({}) do not divide {} slices",
                                 mesh.dcn_known, slices));
    }
    const std::string& key = mesh.dcn_fill->key;
    mesh.dcn[key.substr(4, key.size() - 4 - 12)] = slices / mesh.dcn_known;
  }
  return {};
}

// The axes offsim does not lay out: fine at degree 1, unmapped otherwise.
void note_unmodelled_axes(Mapper& m, Mesh& mesh, const Layout& layout) {
  for (const char* axis : {"sequence", "tensor_transpose", "tensor_sequence", "autoregressive"}) {
    for (Field* f : {mesh.ici_f[axis], mesh.dcn_f[axis]}) {
      if (f == nullptr) continue;
      if (layout.degree.at(axis) == 1) {
        m.mapped(*f, "(degree 1: nothing to model)");
      } else {
        m.unmapped(
            *f, fmt::format("{} parallelism is not modelled; offsim lays out only "
                            "dp x tp x pp x cp = {} of the {} devices",
                            axis, layout.dp * layout.tp * layout.pp * layout.cp, layout.product));
      }
    }
  }
}

// How the weights are sharded (MaxText's logical_axis_rules in configs/base.yml): the 'embed'
// dimension of every weight over the fsdp, fsdp_transpose, context and expert axes, replicated
// over the data axis; a routed expert's 'exp' dimension over the expert axis and its
// 'embed_no_exp' over fsdp, fsdp_transpose and context. So with an MoE model the expert axis
// shards the other weights as FSDP does (expert_shard_attention_option "fsdp", MaxText's
// default): parallelism.fsdp. With the data axis beside the sharding axes the weights are
// replicated over it (hybrid sharding): parallelism.fsdp_shard = the ranks of a shard group
// (fsdp x fsdp_transpose x context x expert), within which offsim shards the routed experts over
// the ranks of their own replica (tp x fsdp_shard / (ep x etp): fsdp x fsdp_transpose x context).
sim::Status map_hybrid_sharding(Fields& fields, Mapper& m, const Layout& layout) {
  const auto& degree = layout.degree;
  const bool moe = scenarios::find_path(m.doc, "model.moe.experts") != nullptr;
  std::int64_t expert = 1;
  if (!moe || degree.at("expert") <= 1) {
    if (Field* f = fields.get("expert_shard_attention_option")) {
      m.ignored(*f, "no expert axis");
    }
  } else {
    std::string option = "fsdp";
    if (Field* f = fields.get("expert_shard_attention_option")) {
      OFFSIM_ASSIGN_OR_RETURN(option, m.text(*f));
      if (option == "fsdp") {
        m.mapped(*f, "parallelism.fsdp (the expert axis shards the other weights)");
      } else {
        m.unmapped(*f, fmt::format("'{}': the expert axis is modelled as sharding the other "
                                   "weights and the batch (fsdp)",
                                   option));
      }
    }
    expert = degree.at("expert");
    OFFSIM_RETURN_IF_ERROR(m.set_from(layout.expert_fields, "parallelism.fsdp", "true"));
  }
  const std::int64_t shard = degree.at("fsdp") * degree.at("fsdp_transpose") * expert;
  if (shard <= 1 || degree.at("data") <= 1) return {};
  const std::vector<const Field*> data(layout.data_fields.begin(), layout.data_fields.end());
  return m.set_from(data, "parallelism.fsdp_shard", std::to_string(shard * layout.cp));
}

// --- mesh: ici_* x dcn_* degrees -> parallelism.dp/fsdp/tp/pp.
sim::Result<Layout> map_mesh(Fields& fields, Mapper& m, const ImportOptions& options) {
  Mesh mesh;
  for (const char* axis : kAxes) {
    for (int level = 0; level < 2; ++level) {
      OFFSIM_RETURN_IF_ERROR(read_axis(fields, m, axis, level, mesh));
    }
  }
  Field* slices_f = fields.get("num_slices");
  std::int64_t slices = 0;  // 0: not given
  if (slices_f != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(slices, m.int_in(*slices_f, -1, 100'000));
    if (slices < 1) slices = 0;
  }
  const std::int64_t world = options.gpus;
  OFFSIM_RETURN_IF_ERROR(fill_mesh(m, world, slices, mesh));
  Layout layout;
  auto& degree = layout.degree;
  for (const char* axis : kAxes) {
    degree[axis] = mesh.ici[axis] * mesh.dcn[axis];
    layout.product *= degree[axis];
  }
  if (world > 0 && layout.product != world) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "MaxText mesh: the ici_* x dcn_* degrees multiply to {} devices, not the {} "
                     "of --gpus",
                     layout.product, world);
  }
  // The expert axis shards the routed experts (expert parallelism) and, outside the MoE layers,
  // the batch like a data axis (MaxText's logical activation_batch axis spans data, fsdp,
  // fsdp_transpose and expert): offsim's ep folded into the data-parallel ranks.
  layout.dp = degree["data"] * degree["fsdp"] * degree["fsdp_transpose"] * degree["expert"];
  layout.tp = degree["tensor"];
  layout.pp = degree["pipeline"];
  layout.cp = degree["context"];
  auto axis_fields = [&](std::initializer_list<const char*> axes) {
    std::vector<const Field*> out;
    for (const char* a : axes) {
      out.push_back(mesh.ici_f[a]);
      out.push_back(mesh.dcn_f[a]);
    }
    return out;
  };
  OFFSIM_RETURN_IF_ERROR(m.set_from(axis_fields({"data", "fsdp", "fsdp_transpose", "expert"}),
                                    "parallelism.dp", std::to_string(layout.dp)));
  if (degree["expert"] > 1) {
    OFFSIM_RETURN_IF_ERROR(
        m.set_from(axis_fields({"expert"}), "parallelism.ep", std::to_string(degree["expert"])));
  }
  const bool fsdp = degree["fsdp"] * degree["fsdp_transpose"] > 1;
  OFFSIM_RETURN_IF_ERROR(m.set_from(axis_fields({"fsdp", "fsdp_transpose"}), "parallelism.fsdp",
                                    fsdp ? "true" : "false"));
  OFFSIM_RETURN_IF_ERROR(
      m.set_from(axis_fields({"tensor"}), "parallelism.tp", std::to_string(layout.tp)));
  OFFSIM_RETURN_IF_ERROR(
      m.set_from(axis_fields({"pipeline"}), "parallelism.pp", std::to_string(layout.pp)));
  // The context axis splits each sequence (context parallelism); its ranks share the weights'
  // sharding with the data-parallel ones, as offsim's CP ranks join the data-parallel sharding.
  if (layout.cp > 1) {
    OFFSIM_RETURN_IF_ERROR(
        m.set_from(axis_fields({"context"}), "parallelism.cp", std::to_string(layout.cp)));
  } else {
    for (const Field* f : axis_fields({"context"})) {
      if (f != nullptr) m.mapped(*f, "(degree 1: nothing to model)");
    }
  }
  if (slices_f != nullptr) m.mapped(*slices_f, "hardware.nodes");
  note_unmodelled_axes(m, mesh, layout);
  for (Field* f : {mesh.ici_f["data"], mesh.dcn_f["data"]}) {
    if (f != nullptr) layout.data_fields.push_back(f);
  }
  layout.expert_fields = axis_fields({"expert"});
  return layout;
}

// --- batch: per_device_batch_size x devices x gradient_accumulation_steps, and the sequence.
sim::Status map_batch(Fields& fields, Mapper& m, const Layout& layout) {
  Field* pdbs_f = fields.get("per_device_batch_size");
  if (pdbs_f == nullptr) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "per_device_batch_size: not given (in base.yml, the model config or as a "
                     "command-line override)");
  }
  OFFSIM_ASSIGN_OR_RETURN(double pdbs, m.number_in(*pdbs_f, 1e-9, 1e9));
  std::int64_t gas = 1;
  Field* gas_f = fields.get("gradient_accumulation_steps");
  if (gas_f != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(gas, m.int_in(*gas_f, 1, 1'000'000));
  }
  // MaxText: global batch = per_device_batch_size x devices x gradient_accumulation_steps; each
  // data-parallel replica spans world/dp devices.
  const std::int64_t dp = layout.dp;
  const double per_replica = pdbs * static_cast<double>(layout.product / dp);
  if (per_replica != std::floor(per_replica) || per_replica < 1) {
    return m.error(*pdbs_f, fmt::format("x the {} devices of a data-parallel replica gives {} "
                                        "sequences; expected a whole number >= 1",
                                        layout.product / dp, per_replica));
  }
  std::int64_t micro = static_cast<std::int64_t>(per_replica);
  std::int64_t global = micro * dp * gas;
  if (layout.pp > 1) {
    std::int64_t nmb = layout.pp;
    Field* nmb_f = fields.get("num_pipeline_microbatches");
    if (nmb_f != nullptr) {
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, m.int_in(*nmb_f, -1, 1'000'000));
      if (v > 0) nmb = v;
    }
    if (micro % nmb != 0) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "num_pipeline_microbatches: {} does not divide the {} sequences of a "
                       "data-parallel replica",
                       nmb, micro);
    }
    micro /= nmb;
    if (nmb_f != nullptr) m.mapped(*nmb_f, "training.micro_batch");
  }
  OFFSIM_RETURN_IF_ERROR(
      m.set_from({pdbs_f, gas_f}, "training.global_batch", std::to_string(global)));
  OFFSIM_RETURN_IF_ERROR(m.set(*pdbs_f, "training.micro_batch", std::to_string(micro)));
  Field* seq_f = fields.get("max_target_length");
  if (seq_f == nullptr) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "max_target_length: not given (the sequence length)");
  }
  OFFSIM_ASSIGN_OR_RETURN(std::int64_t seq, m.int_in(*seq_f, 1, 100'000'000));
  return m.set(*seq_f, "training.seq_len", std::to_string(seq));
}

sim::Status map_mlp_activations(Mapper& m, Field& f) {
  std::vector<std::string> acts;
  for (const Node& n : f.value.items) acts.push_back(n.scalar);
  if (f.value.kind != NodeKind::kSequence || acts.empty()) {
    return m.error(f, fmt::format("expected a list such as [\"silu\", \"linear\"], got {}",
                                  f.value.describe()));
  }
  if (acts.size() == 2 && acts[1] == "linear" && (acts[0] == "silu" || acts[0] == "gelu")) {
    return m.set(f, "model.activation", "swiglu");  // gated MLP
  }
  if (acts.size() == 1 && acts[0] == "gelu") return m.set(f, "model.activation", "gelu");
  m.unmapped(f, "only gated [silu|gelu, linear] and plain [gelu] MLPs are modelled");
  return {};
}

// The MoE decoder blocks offsim models: RMSNorm, no biases, routed experts (MaxText's RoutedMoE).
bool is_moe_block(const std::string& block) {
  return block == "mixtral" || block == "qwen3_moe" || block == "deepseek";
}

// The MoE keys of a model without experts (num_experts 1, MaxText's default).
void note_dense_moe_keys(Fields& fields, Mapper& m) {
  for (const char* key : {"num_experts_per_tok", "base_moe_mlp_dim", "capacity_factor", "megablox",
                          "sparse_matmul", "shared_experts", "first_num_dense_layers"}) {
    if (Field* f = fields.get(key)) m.ignored(*f, "num_experts 1: a dense model");
  }
}

// deepseek's shared experts (one MLP of shared_experts x base_moe_mlp_dim, the FLOPs and
// parameters of that many experts) and its first first_num_dense_layers dense layers.
sim::Status map_deepseek_moe(Fields& fields, Mapper& m, std::int64_t expert_ffn) {
  Field* shared_f = fields.get("shared_experts");
  std::int64_t shared = 1;  // MaxText's default
  if (shared_f != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(shared, m.int_in(*shared_f, 1, 64));
  }
  OFFSIM_RETURN_IF_ERROR(
      m.set_from({shared_f}, "model.moe.shared_experts", std::to_string(shared)));
  OFFSIM_RETURN_IF_ERROR(
      m.set_from({shared_f}, "model.moe.shared_ffn_hidden", std::to_string(expert_ffn)));
  if (Field* f = fields.get("first_num_dense_layers")) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t k, m.int_in(*f, 0, 1'000'000));
    OFFSIM_RETURN_IF_ERROR(m.set(*f, "model.moe.first_k_dense", std::to_string(k)));
  }
  return {};
}

// --- mixture of experts: num_experts routed experts of base_moe_mlp_dim (MaxText's defaults:
// 1 expert, top-1, 7168), num_experts_per_tok per token, capacity_factor (-1: dropless).
sim::Status map_moe(Fields& fields, Mapper& m, const std::string& block) {
  Field* n_f = fields.get("num_experts");
  std::int64_t n = 1;
  if (n_f != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(n, m.int_in(*n_f, 1, 65536));
  }
  if (n <= 1) {
    if (n_f != nullptr) m.mapped(*n_f, "(1: a dense model)");
    note_dense_moe_keys(fields, m);
    return {};
  }
  if (!is_moe_block(block)) {
    m.unmapped(*n_f, fmt::format("the experts of decoder_block {} are not modelled (mixtral, "
                                 "qwen3_moe and deepseek are); a dense model is used",
                                 block.empty() ? "(none)" : block));
    note_dense_moe_keys(fields, m);
    return {};
  }
  OFFSIM_RETURN_IF_ERROR(m.set(*n_f, "model.moe.experts", std::to_string(n)));
  Field* k_f = fields.get("num_experts_per_tok");
  std::int64_t k = 1;
  if (k_f != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(k, m.int_in(*k_f, 1, 65536));
  }
  OFFSIM_RETURN_IF_ERROR(m.set_from({k_f}, "model.moe.top_k", std::to_string(k)));
  Field* ffn_f = fields.get("base_moe_mlp_dim");
  std::int64_t ffn = 7168;
  if (ffn_f != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(ffn, m.int_in(*ffn_f, 1, 100'000'000));
  }
  OFFSIM_RETURN_IF_ERROR(m.set_from({ffn_f}, "model.moe.expert_ffn_hidden", std::to_string(ffn)));
  if (Field* f = fields.get("capacity_factor")) {
    OFFSIM_ASSIGN_OR_RETURN(double cf, m.number_in(*f, -1.0, 1e6));
    if (cf > 0.0) {
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "model.moe.capacity_factor", fmt::format("{}", cf)));
    } else {
      m.mapped(*f, "(dropless)");
    }
  }
  if (block == "deepseek") {
    OFFSIM_RETURN_IF_ERROR(map_deepseek_moe(fields, m, ffn));
  } else {
    for (const char* key : {"shared_experts", "first_num_dense_layers"}) {
      if (Field* f = fields.get(key)) m.ignored(*f, "used by the deepseek decoder block only");
    }
  }
  // Either way one kernel runs every expert's GEMM (megablox's gmm or ragged_dot when sparse,
  // a batched einsum otherwise), not Transformer Engine's per-expert GEMMs.
  Field sparse_default{"sparse_matmul", make_scalar("true", "maxtext default"), true};
  Field* sparse_f = fields.get("sparse_matmul");
  if (sparse_f == nullptr) sparse_f = &sparse_default;
  OFFSIM_ASSIGN_OR_RETURN(bool sparse, m.boolean(*sparse_f));
  OFFSIM_RETURN_IF_ERROR(m.set(*sparse_f, "training.moe_grouped_gemm", "single_kernel"));
  if (!sparse) {
    m.unmapped(*sparse_f,
               "the dense einsum over capacity-padded experts is priced as grouped GEMMs");
  }
  if (Field* f = fields.get("megablox")) m.ignored(*f, "the grouped-GEMM kernel's implementation");
  return {};
}

// context_parallel_strategy (MaxText's default all_gather): ring is offsim's ring attention
// (cp_comm_type p2p), ulysses its all-to-all (a2a); all_gather is listed as priced as the ring.
sim::Status map_context_strategy(Fields& fields, Mapper& m, std::int64_t cp) {
  Field* f = fields.get("context_parallel_strategy");
  Field by_default{"context_parallel_strategy", make_scalar("all_gather", "maxtext default"), true};
  if (f == nullptr && cp > 1) f = &by_default;
  if (f == nullptr || cp <= 1) {
    if (f != nullptr) m.ignored(*f, "no context axis");
    if (Field* lb = fields.get("context_parallel_load_balance")) m.ignored(*lb, "no context axis");
    return {};
  }
  OFFSIM_ASSIGN_OR_RETURN(std::string v, m.text(*f));
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "ring") return m.set(*f, "parallelism.cp_comm_type", "p2p");
  if (v == "ulysses") return m.set(*f, "parallelism.cp_comm_type", "a2a");
  if (v == "all_gather") {
    m.unmapped(*f,
               "the all-gather of K and V is priced as the ring exchange overlapped block by "
               "block (cp_comm_type p2p)");
    return {};
  }
  return m.error(*f, fmt::format("expected all_gather, ring or ulysses, got {}", v));
}

// attention_type: global (nothing to map) or mla (DeepSeek's multi-head latent attention, its
// ranks and head dimensions); mtp_num_layers: the multi-token-prediction modules.
sim::Status map_attention_type(Fields& fields, Mapper& m) {
  if (Field* f = fields.get("attention_type")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string t, m.text(*f));
    if (t == "mla") {
      m.mapped(*f, "model.mla");
      for (const char* key :
           {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"}) {
        if (Field* d = fields.get(key)) {
          OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, m.int_in(*d, 0, 100'000'000));
          OFFSIM_RETURN_IF_ERROR(m.set(*d, fmt::format("model.mla.{}", key), std::to_string(v)));
        }
      }
    } else if (t == "global") {
      m.mapped(*f, "(global attention)");
    } else {
      m.unmapped(*f,
                 fmt::format("attention_type {} is not modelled (global attention is used)", t));
    }
  }
  if (Field* f = fields.get("mtp_num_layers")) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, m.int_in(*f, 0, 64));
    OFFSIM_RETURN_IF_ERROR(m.set(*f, "model.mtp_layers", std::to_string(v)));
  }
  return {};
}

sim::Status map_decoder_block(Mapper& m, Field& f) {
  OFFSIM_ASSIGN_OR_RETURN(std::string block, m.text(f));
  if (block == "llama2" || block == "mistral" || block == "gemma" || block == "gemma2" ||
      block == "llama3" || block == "qwen3" || is_moe_block(block)) {
    OFFSIM_RETURN_IF_ERROR(m.set(f, "model.norm", "rmsnorm"));
    return m.set(f, "model.linear_bias", "false");
  }
  if (block == "gpt3") {
    OFFSIM_RETURN_IF_ERROR(m.set(f, "model.norm", "layernorm"));
    return m.set(f, "model.linear_bias", "true");
  }
  m.unmapped(f, fmt::format("decoder_block {} is not modelled; the dense decoder is used", block));
  return {};
}

// enable_dropout and dropout_rate -> model.dropout (on when enabled with a rate above 0).
sim::Status map_dropout(Fields& fields, Mapper& m) {
  Field* drop_f = fields.get("enable_dropout");
  Field* rate_f = fields.get("dropout_rate");
  if (drop_f == nullptr && rate_f == nullptr) return {};
  bool on = true;
  if (drop_f != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(on, m.boolean(*drop_f));
  }
  double rate = 0.0;
  if (rate_f != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(rate, m.number_in(*rate_f, 0.0, 1.0));
  }
  return m.set_from({drop_f, rate_f}, "model.dropout", on && rate > 0.0 ? "true" : "false");
}

sim::Status map_attention(Mapper& m, Field& f) {
  OFFSIM_ASSIGN_OR_RETURN(std::string a,
                          m.one_of(f, {"autoselected", "dot_product", "flash", "cudnn_flash_te",
                                       "cudnn_flash_jax", "paged"}));
  if (a == "paged") {
    m.unmapped(f, "paged attention (inference) is not modelled");
    return {};
  }
  return m.set(f, "model.attention", a == "dot_product" ? "classic" : "flash");
}

// A model given by its dimensions (base_emb_dim etc.), named by model_name or the last file.
sim::Status map_inline_model(Fields& fields, Mapper& m, const std::vector<std::string>& files) {
  Field* name_f = fields.get("model_name");
  const std::string mname = name_f != nullptr ? name_f->value.scalar : file_stem(files.back());
  if (name_f != nullptr) {
    OFFSIM_RETURN_IF_ERROR(m.set(*name_f, "model.name", mname));
  } else {
    OFFSIM_RETURN_IF_ERROR(set_path(m.doc, "model.name", make_scalar(mname, files.back())));
  }
  const std::pair<const char*, const char*> dims[] = {
      {"vocab_size", "model.vocab_size"},          {"base_emb_dim", "model.hidden"},
      {"base_num_decoder_layers", "model.layers"}, {"base_num_query_heads", "model.heads"},
      {"base_num_kv_heads", "model.kv_heads"},     {"head_dim", "model.head_dim"},
      {"base_mlp_dim", "model.ffn_hidden"}};
  for (const auto& [key, path] : dims) {
    if (Field* f = fields.get(key)) {
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, m.int_in(*f, 1, 100'000'000));
      OFFSIM_RETURN_IF_ERROR(m.set(*f, path, std::to_string(v)));
    }
  }
  if (Field* f = fields.get("mlp_activations")) {
    OFFSIM_RETURN_IF_ERROR(map_mlp_activations(m, *f));
  }
  std::string block;
  if (Field* f = fields.get("decoder_block")) {
    OFFSIM_RETURN_IF_ERROR(map_decoder_block(m, *f));
    block = f->value.scalar;
  }
  OFFSIM_RETURN_IF_ERROR(map_moe(fields, m, block));
  OFFSIM_RETURN_IF_ERROR(map_attention_type(fields, m));
  if (Field* f = fields.get("logits_via_embedding")) {
    OFFSIM_ASSIGN_OR_RETURN(bool tied, m.boolean(*f));
    OFFSIM_RETURN_IF_ERROR(m.set(*f, "model.tied_embeddings", tied ? "true" : "false"));
  }
  OFFSIM_RETURN_IF_ERROR(map_dropout(fields, m));
  if (Field* f = fields.get("attention")) {
    OFFSIM_RETURN_IF_ERROR(map_attention(m, *f));
  }
  return {};
}

// --- model: inline dimensions, or a catalogue model by model_name.
sim::Status map_model(Fields& fields, Mapper& m, const std::vector<std::string>& files) {
  if (fields.has("base_emb_dim")) return map_inline_model(fields, m, files);
  Field* name_f = fields.get("model_name");
  if (name_f == nullptr) return {};
  OFFSIM_ASSIGN_OR_RETURN(std::string mname, m.text(*name_f));
  if (!models::find_model(mname)) {
    return m.error(*name_f, fmt::format("'{}' is neither in offsim's catalogue (`offsim list "
                                        "models`) nor given by base_emb_dim etc.; pass the "
                                        "model config file",
                                        mname));
  }
  return m.set(*name_f, "model", mname);
}

// --- precision: dtype, quantization, weight_dtype.
sim::Status map_precision(Fields& fields, Mapper& m) {
  if (Field* f = fields.get("dtype")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string d, m.one_of(*f, {"bfloat16", "float16", "float32"}));
    if (d == "float32") {
      m.unmapped(*f, "float32 compute is not modelled (bf16 GEMM rates are used)");
    } else {
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "training.precision", d == "bfloat16" ? "bf16" : "fp16"));
    }
  }
  if (Field* f = fields.get("quantization")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string q, m.text(*f));
    if (q == "fp8" || q == "nanoo_fp8") {
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "training.precision", "fp8"));
    } else if (q.empty()) {
      m.mapped(*f, "(no quantization)");
    } else {
      m.unmapped(*f, fmt::format("quantization {} is not modelled", q));
    }
  }
  if (Field* f = fields.get("weight_dtype")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string d, m.one_of(*f, {"float32", "bfloat16", "float16"}));
    OFFSIM_RETURN_IF_ERROR(
        m.set(*f, "training.fp32_master_weights", d == "float32" ? "true" : "false"));
  }
  return {};
}

// --- optimizer, loss tiling and the hardware kind.
sim::Status map_optimizer_and_hardware(Fields& fields, Mapper& m) {
  if (Field* f = fields.get("opt_type")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string o, m.text(*f));
    if (o == "adamw" || o == "adam_pax") {
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "training.optimizer", "adamw"));
    } else {
      m.unmapped(*f, fmt::format("optimizer {} is not modelled (AdamW state sizes are used)", o));
    }
  }
  if (Field* f = fields.get("num_vocab_tiling")) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, m.int_in(*f, 1, 1'000'000));
    OFFSIM_RETURN_IF_ERROR(m.set(*f, "training.loss_chunks", std::to_string(v)));
  }
  if (Field* f = fields.get("hardware")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string h, m.one_of(*f, {"gpu", "gpu_multiprocess", "tpu", "cpu"}));
    if (h.rfind("gpu", 0) == 0) {
      m.mapped(*f, "(GPU; the system comes from --set hardware.system)");
    } else {
      m.unmapped(*f, fmt::format("hardware {}: offsim models NVIDIA GPU systems", h));
    }
  }
  return {};
}

// remat_policy: custom (each named activation remat, device or offload) or a named policy.
sim::Status map_remat(Fields& fields, Mapper& m, Node& rules) {
  Field* remat_f = fields.get("remat_policy");
  if (remat_f == nullptr) return {};
  OFFSIM_ASSIGN_OR_RETURN(std::string policy, m.text(*remat_f));
  if (policy == "custom") {
    OFFSIM_RETURN_IF_ERROR(m.set(*remat_f, "recompute", "full"));
    for (const std::string& n : models::activation_names()) {
      Field* f = fields.get(n);
      if (f == nullptr) continue;
      OFFSIM_ASSIGN_OR_RETURN(std::string where, m.one_of(*f, {"remat", "device", "offload"}));
      if (where == "remat") {
        m.mapped(*f, "recompute (full)");
        continue;
      }
      rules.items.push_back(rule(n, where == "device" ? "hbm" : "host", f->value.origin));
      m.mapped(*f, "offload.rules");
    }
    return {};
  }
  const auto names = policy_names(policy);
  if (!names) {
    return m.error(*remat_f,
                   "expected a MaxText remat_policy (full, minimal, "
                   "minimal_with_context, save_dot_with_context_except_mlp, "
                   "save_dot_except_mlpwi, save_dot_except_mlp, save_qkv_proj, "
                   "save_out_proj, qkv_proj_offloaded, minimal_offloaded, custom), "
                   "got " +
                       remat_f->value.describe());
  }
  OFFSIM_RETURN_IF_ERROR(m.set(*remat_f, "recompute", "full"));
  for (const std::string& n : names->hbm)
    rules.items.push_back(rule(n, "hbm", remat_f->value.origin));
  for (const std::string& n : names->host)
    rules.items.push_back(rule(n, "host", remat_f->value.origin));
  if (!names->hbm.empty() || !names->host.empty()) m.mapped(*remat_f, "offload.rules");
  return {};
}

// --- remat policy and the optimizer/parameter host offload -> offload.rules.
sim::Status map_offload(Fields& fields, Mapper& m) {
  Node rules = make_sequence();
  OFFSIM_RETURN_IF_ERROR(map_remat(fields, m, rules));
  if (Field* f = fields.get("optimizer_memory_host_offload")) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, m.boolean(*f));
    if (on) {
      rules.items.push_back(rule("optimizer_states", "host", f->value.origin));
      rules.items.push_back(rule("master_weights", "host", f->value.origin));
    }
    m.mapped(*f, on ? "offload.rules" : "(off)");
  }
  if (Field* f = fields.get("parameter_memory_host_offload")) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, m.boolean(*f));
    if (on) rules.items.push_back(rule("params", "host", f->value.origin));
    m.mapped(*f, on ? "offload.rules" : "(off)");
  }
  if (!rules.items.empty()) {
    Node off = make_map();
    off.entries.emplace_back("rules", std::move(rules));
    // MaxText's optimizer update runs on the device even with host-resident optimizer state.
    off.entries.emplace_back("optimizer", make_scalar("gpu"));
    OFFSIM_RETURN_IF_ERROR(set_path(m.doc, "offload", std::move(off)));
  }
  // The named activations when the policy is not custom: MaxText ignores them.
  for (const std::string& n : models::activation_names()) {
    if (Field* f = fields.get(n)) m.ignored(*f, "used only with remat_policy: custom");
  }
  return {};
}

}  // namespace

sim::Result<ImportResult> import_maxtext(const std::vector<std::string>& files,
                                         const ImportOptions& options) {
  OFFSIM_ASSIGN_OR_RETURN(Fields fields, read_fields(files, options));
  Mapper m(Framework::kMaxText);
  OFFSIM_ASSIGN_OR_RETURN(const Layout layout, map_mesh(fields, m, options));
  OFFSIM_RETURN_IF_ERROR(map_context_strategy(fields, m, layout.cp));
  OFFSIM_RETURN_IF_ERROR(map_batch(fields, m, layout));
  OFFSIM_RETURN_IF_ERROR(map_model(fields, m, files));
  OFFSIM_RETURN_IF_ERROR(map_hybrid_sharding(fields, m, layout));
  OFFSIM_RETURN_IF_ERROR(map_precision(fields, m));
  OFFSIM_RETURN_IF_ERROR(map_optimizer_and_hardware(fields, m));
  OFFSIM_RETURN_IF_ERROR(map_offload(fields, m));
  settle_leftovers(fields, m, ignore_reason);
  return finish(m, options,
                {.world_gpus = static_cast<int>(layout.dp * layout.tp * layout.pp * layout.cp),
                 .name = file_stem(files.back())});
}

}  // namespace offsim::scenarios::detail
