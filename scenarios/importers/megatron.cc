// Megatron-LM / NeMo / Megatron-Bridge import: the training script's arguments (a launch script or
// an argument file: every `--flag [value]` token, with torchrun's --nproc_per_node and --nnodes
// giving the GPU count), or a Megatron-Bridge recipe YAML whose leaves carry the same names with
// underscores (model.tensor_model_parallel_size, train.micro_batch_size, ...).

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "scenarios/importers/import_common.h"

namespace offsim::scenarios::detail {
namespace {

using sim::ErrorCode;

bool ends_with(const std::string& s, const char* suffix) {
  const std::string x(suffix);
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

// Splits a shell script into `--flag [value]` pairs. Quotes are removed; a value that still
// holds a `$` is a shell variable the importer cannot expand (an error when it is mapped).
sim::Status read_script(const std::string& path, const std::string& text, Fields& out) {
  int line_no = 0;
  std::size_t pos = 0;
  std::string pending_flag;
  std::string pending_origin;
  const auto flush_flag = [&]() {
    if (!pending_flag.empty()) out.put(pending_flag, make_scalar("true", pending_origin));
    pending_flag.clear();
  };
  while (pos <= text.size()) {
    const std::size_t end = std::min(text.find('\n', pos), text.size());
    std::string line = text.substr(pos, end - pos);
    ++line_no;
    pos = end + 1;
    std::size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
      if (i >= line.size() || line[i] == '#') break;
      const std::size_t col = i + 1;
      std::string tok;
      char quote = 0;
      while (i < line.size() &&
             (quote != 0 || !std::isspace(static_cast<unsigned char>(line[i])))) {
        const char c = line[i++];
        if (quote == 0 && (c == '"' || c == '\'')) {
          quote = c;
        } else if (quote != 0 && c == quote) {
          quote = 0;
        } else {
          tok += c;
        }
      }
      if (tok == "\\" || tok == "(" || tok == ")" || tok == "|" || tok == "&&") continue;
      if (!tok.empty() && tok.back() == ')') tok.pop_back();
      const std::string origin = fmt::format("{}:{}:{}", path, line_no, col);
      if (tok.rfind("--", 0) == 0 && tok.size() > 2) {
        flush_flag();
        const auto eq = tok.find('=');
        if (eq != std::string::npos) {
          out.put(tok.substr(0, eq), make_scalar(tok.substr(eq + 1), origin));
        } else {
          pending_flag = tok;
          pending_origin = origin;
        }
      } else if (!pending_flag.empty()) {
        out.put(pending_flag, make_scalar(tok, pending_origin));
        pending_flag.clear();
      }
    }
    if (end == text.size()) break;
  }
  flush_flag();
  return sim::ok();
}

std::string dashes(std::string key) {
  std::replace(key.begin(), key.end(), '_', '-');
  return "--" + key;
}

std::string ignore_reason(const std::string& key) {
  static const char* kPrefixes[] = {"--lr",
                                    "--min-lr",
                                    "--train-iters",
                                    "--train-samples",
                                    "--weight-decay",
                                    "--clip-grad",
                                    "--adam-",
                                    "--init-method",
                                    "--data-path",
                                    "--split",
                                    "--vocab-file",
                                    "--merge-file",
                                    "--tokenizer",
                                    "--save",
                                    "--load",
                                    "--log",
                                    "--eval",
                                    "--tensorboard",
                                    "--wandb",
                                    "--seed",
                                    "--distributed-backend",
                                    "--exit-",
                                    "--no-load",
                                    "--finetune",
                                    "--use-mcore-models",
                                    "--transformer-impl",
                                    "--master_addr",
                                    "--master_port",
                                    "--master-addr",
                                    "--master-port",
                                    "--node_rank",
                                    "--node-rank",
                                    "--rdzv",
                                    "--mock-data",
                                    "--timing-log",
                                    "--ckpt",
                                    "--dist-ckpt",
                                    "--num-workers",
                                    "--dataloader",
                                    "--norm-epsilon",
                                    "--rotary-base",
                                    "--rotary-percent",
                                    "--use-rotary-position-embeddings",
                                    "--no-masked-softmax-fusion",
                                    "--no-bias-gelu-fusion",
                                    "--no-bias-dropout-fusion",
                                    "--attention-softmax-in-fp32",
                                    "--accumulate-allreduce-grads-in-fp32",
                                    "--no-async-tensor-model-parallel-allreduce",
                                    "--initial-loss-scale",
                                    "--loss-scale",
                                    "--hysteresis",
                                    "--bf16-"};
  for (const char* p : kPrefixes) {
    if (key.rfind(p, 0) == 0) return "no effect on step time or memory";
  }
  return {};
}

}  // namespace

sim::Result<ImportResult> import_megatron(const std::vector<std::string>& files,
                                          const ImportOptions& options) {
  Fields fields;
  for (const std::string& path : files) {
    if (ends_with(path, ".yaml") || ends_with(path, ".yml")) {
      OFFSIM_ASSIGN_OR_RETURN(Node doc, load_document_file(path));
      if (doc.kind != NodeKind::kMap) {
        return sim::fail(ErrorCode::kInvalidInput,
                         "{}: expected a Megatron-Bridge recipe (a "
                         "map), got {}",
                         path, doc.describe());
      }
      Fields nested;
      flatten(doc, "", nested);
      // A recipe's sections (model, train, optimizer, ddp, dataset, ...) hold Megatron's argument
      // names with underscores; the leaf name is the argument.
      for (Field& f : nested.all()) {
        const auto dot = f.key.rfind('.');
        const std::string leaf = dot == std::string::npos ? f.key : f.key.substr(dot + 1);
        std::string value = f.value.scalar;
        if (f.value.kind == NodeKind::kScalar && leaf == "mixed_precision") {
          // Megatron-Bridge: mixed_precision: bf16_mixed | fp16_mixed | bf16_with_fp8_...
          fields.put("--mixed-precision", f.value);
          continue;
        }
        fields.put(dashes(leaf), f.value);
      }
    } else {
      OFFSIM_ASSIGN_OR_RETURN(std::string text, read_file(path));
      OFFSIM_RETURN_IF_ERROR(read_script(path, text, fields));
    }
  }
  Mapper m(Framework::kMegatron);
  const auto get = [&](const char* key) { return fields.get(key); };

  const auto int_arg = [&](Field* f, std::int64_t min,
                           std::int64_t max) -> sim::Result<std::int64_t> {
    if (f->value.scalar.find('$') != std::string::npos) {
      return m.error(
          *f, fmt::format("{} is a shell variable; expand it or give the number", f->value.scalar));
    }
    return m.int_in(*f, min, max);
  };
  const auto flag = [&](Field* f) -> sim::Result<bool> {
    if (f == nullptr) return false;
    return m.boolean(*f);
  };

  // --- parallel layout
  std::int64_t tp = 1, pp = 1;
  if (Field* f = get("--tensor-model-parallel-size")) {
    OFFSIM_ASSIGN_OR_RETURN(tp, int_arg(f, 1, 1'000'000));
    OFFSIM_RETURN_IF_ERROR(m.set(*f, "parallelism.tp", std::to_string(tp)));
  }
  if (Field* f = get("--pipeline-model-parallel-size")) {
    OFFSIM_ASSIGN_OR_RETURN(pp, int_arg(f, 1, 1'000'000));
    OFFSIM_RETURN_IF_ERROR(m.set(*f, "parallelism.pp", std::to_string(pp)));
  }
  Field* nproc = get("--nproc_per_node");
  if (nproc == nullptr) nproc = get("--nproc-per-node");
  Field* nnodes = get("--nnodes");
  std::int64_t world = options.gpus;
  if (nproc != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t per_node, int_arg(nproc, 1, 1'000'000));
    std::int64_t n = 1;
    if (nnodes != nullptr) {
      OFFSIM_ASSIGN_OR_RETURN(n, int_arg(nnodes, 1, 1'000'000));
    }
    world = per_node * n;
  }
  if (world > 0) {
    if (world % (tp * pp) != 0) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "{} GPUs are not divisible by tensor x pipeline parallel size {} x {}",
                       world, tp, pp);
    }
    OFFSIM_RETURN_IF_ERROR(
        m.set_from({nproc, nnodes}, "parallelism.dp", std::to_string(world / (tp * pp))));
  }
  if (Field* f = get("--context-parallel-size")) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t cp, int_arg(f, 1, 1'000'000));
    if (cp == 1) {
      m.mapped(*f, "(1: nothing to model)");
    } else {
      m.unmapped(*f, "context parallelism is not modelled");
    }
  }
  if (Field* f = get("--sequence-parallel")) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, flag(f));
    OFFSIM_RETURN_IF_ERROR(m.set(*f, "parallelism.sequence_parallel", on ? "true" : "false"));
  }
  if (Field* f = get("--use-distributed-optimizer")) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, flag(f));
    OFFSIM_RETURN_IF_ERROR(m.set(*f, "parallelism.zero_stage", on ? "1" : "0"));
  }
  // Megatron's default is no overlap; --overlap-grad-reduce turns it on.
  {
    Field* f = get("--overlap-grad-reduce");
    bool on = false;
    if (f != nullptr) {
      OFFSIM_ASSIGN_OR_RETURN(on, flag(f));
    }
    OFFSIM_RETURN_IF_ERROR(
        m.set_from({f}, "parallelism.overlap_grad_reduce", on ? "true" : "false"));
  }
  if (Field* f = get("--num-layers-per-virtual-pipeline-stage")) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t per, int_arg(f, 1, 1'000'000));
    Field* layers_f = fields.get("--num-layers");
    if (layers_f == nullptr) return m.error(*f, "needs --num-layers to derive the virtual stages");
    layers_f->used = false;
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t layers, int_arg(layers_f, 1, 1'000'000));
    if (layers % (pp * per) != 0) {
      return m.error(*f, fmt::format("{} x pipeline size {} does not divide --num-layers {}", per,
                                     pp, layers));
    }
    OFFSIM_RETURN_IF_ERROR(
        m.set(*f, "parallelism.virtual_stages", std::to_string(layers / (pp * per))));
    OFFSIM_RETURN_IF_ERROR(m.set(*f, "parallelism.schedule", "interleaved_1f1b"));
  }
  if (Field* f = get("--virtual-pipeline-model-parallel-size")) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, int_arg(f, 1, 1'000'000));
    OFFSIM_RETURN_IF_ERROR(m.set(*f, "parallelism.virtual_stages", std::to_string(v)));
    if (v > 1) OFFSIM_RETURN_IF_ERROR(m.set(*f, "parallelism.schedule", "interleaved_1f1b"));
  }

  // --- batch and sequence
  const std::pair<const char*, const char*> ints[] = {
      {"--micro-batch-size", "training.micro_batch"},
      {"--global-batch-size", "training.global_batch"},
      {"--seq-length", "training.seq_len"}};
  for (const auto& [key, path] : ints) {
    if (Field* f = get(key)) {
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, int_arg(f, 1, 100'000'000));
      OFFSIM_RETURN_IF_ERROR(m.set(*f, path, std::to_string(v)));
    }
  }

  // --- model (Megatron's GPT defaults: learned positions, biases, LayerNorm, GeLU, tied
  // embeddings, dropout 0.1)
  if (fields.has("--num-layers") || fields.has("--hidden-size")) {
    std::string name = file_stem(files.front());
    OFFSIM_RETURN_IF_ERROR(set_path(m.doc, "model.name", make_scalar(name, files.front(), true)));
    const std::pair<const char*, const char*> dims[] = {
        {"--num-layers", "model.layers"},          {"--hidden-size", "model.hidden"},
        {"--ffn-hidden-size", "model.ffn_hidden"}, {"--num-attention-heads", "model.heads"},
        {"--num-query-groups", "model.kv_heads"},  {"--kv-channels", "model.head_dim"},
        {"--vocab-size", "model.vocab_size"},      {"--padded-vocab-size", "model.vocab_size"}};
    for (const auto& [key, path] : dims) {
      if (Field* f = get(key)) {
        OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, int_arg(f, 1, 100'000'000));
        OFFSIM_RETURN_IF_ERROR(m.set(*f, path, std::to_string(v)));
      }
    }
    if (Field* f = get("--group-query-attention")) m.mapped(*f, "model.kv_heads");
    Field* swiglu = get("--swiglu");
    if (swiglu == nullptr) swiglu = get("--gated-linear-unit");  // Megatron-Core config name
    OFFSIM_ASSIGN_OR_RETURN(bool gated, flag(swiglu));
    OFFSIM_RETURN_IF_ERROR(m.set_from({swiglu}, "model.activation", gated ? "swiglu" : "gelu"));
    Field* norm = get("--normalization");
    std::string norm_v = "LayerNorm";
    if (norm != nullptr) {
      OFFSIM_ASSIGN_OR_RETURN(norm_v, m.one_of(*norm, {"LayerNorm", "RMSNorm"}));
    }
    OFFSIM_RETURN_IF_ERROR(
        m.set_from({norm}, "model.norm", norm_v == "RMSNorm" ? "rmsnorm" : "layernorm"));
    Field* untie = get("--untie-embeddings-and-output-weights");
    OFFSIM_ASSIGN_OR_RETURN(bool untied, flag(untie));
    if (Field* share = get("--share-embeddings-and-output-weights")) {  // Megatron-Core name
      OFFSIM_ASSIGN_OR_RETURN(bool shared, flag(share));
      untied = !shared;
      untie = share;
    }
    OFFSIM_RETURN_IF_ERROR(m.set_from({untie}, "model.tied_embeddings", untied ? "false" : "true"));
    Field* nobias = get("--disable-bias-linear");
    OFFSIM_ASSIGN_OR_RETURN(bool no_bias, flag(nobias));
    if (Field* add = get("--add-bias-linear")) {  // Megatron-Core name
      OFFSIM_ASSIGN_OR_RETURN(bool bias, flag(add));
      no_bias = !bias;
      nobias = add;
    }
    OFFSIM_RETURN_IF_ERROR(m.set_from({nobias}, "model.linear_bias", no_bias ? "false" : "true"));
    Field* pos = get("--position-embedding-type");
    std::string pos_v = "learned_absolute";
    if (pos != nullptr) {
      OFFSIM_ASSIGN_OR_RETURN(pos_v, m.one_of(*pos, {"learned_absolute", "rope", "none"}));
    }
    Field* maxpos = get("--max-position-embeddings");
    if (pos_v == "learned_absolute") {
      if (maxpos == nullptr) {
        return sim::fail(ErrorCode::kInvalidInput,
                         "--max-position-embeddings: needed with learned absolute positions "
                         "(Megatron's default --position-embedding-type)");
      }
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, int_arg(maxpos, 1, 100'000'000));
      OFFSIM_RETURN_IF_ERROR(m.set_from({maxpos, pos}, "model.max_positions", std::to_string(v)));
    } else {
      OFFSIM_RETURN_IF_ERROR(m.set_from({pos}, "model.max_positions", "0"));
      if (maxpos != nullptr) m.ignored(*maxpos, "only the RoPE range; no position table");
    }
    Field* hd = get("--hidden-dropout");
    Field* ad = get("--attention-dropout");
    double hd_v = 0.1, ad_v = 0.1;
    if (hd != nullptr) {
      OFFSIM_ASSIGN_OR_RETURN(hd_v, m.number_in(*hd, 0.0, 1.0));
    }
    if (ad != nullptr) {
      OFFSIM_ASSIGN_OR_RETURN(ad_v, m.number_in(*ad, 0.0, 1.0));
    }
    OFFSIM_RETURN_IF_ERROR(
        m.set_from({hd, ad}, "model.dropout", hd_v > 0 || ad_v > 0 ? "true" : "false"));
    if (Field* f = get("--use-flash-attn")) {
      OFFSIM_ASSIGN_OR_RETURN(bool on, flag(f));
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "model.attention", on ? "flash" : "classic"));
    }
    if (!fields.has("--vocab-size") && !fields.has("--padded-vocab-size")) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "model.vocab_size: Megatron takes the vocabulary from the tokenizer; give "
                       "--vocab-size in the script or --set model.vocab_size=N");
    }
  }

  // --- precision
  bool bf16_on = false;
  if (Field* f = get("--bf16")) {
    OFFSIM_ASSIGN_OR_RETURN(bf16_on, flag(f));
    if (bf16_on) OFFSIM_RETURN_IF_ERROR(m.set(*f, "training.precision", "bf16"));
  }
  if (Field* f = get("--fp16")) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, flag(f));
    if (on && bf16_on)
      return m.error(*f, "--fp16 and --bf16 are exclusive (Megatron refuses both)");
    if (on) OFFSIM_RETURN_IF_ERROR(m.set(*f, "training.precision", "fp16"));
  }
  if (Field* f = get("--mixed-precision")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string mp, m.text(*f));
    if (mp.rfind("bf16", 0) == 0 && mp.find("fp8") == std::string::npos) {
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "training.precision", "bf16"));
    } else if (mp.rfind("fp16", 0) == 0) {
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "training.precision", "fp16"));
    } else if (mp.find("fp8") != std::string::npos) {
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "training.precision", "fp8"));
    } else {
      m.unmapped(*f, fmt::format("mixed precision recipe {} is not modelled", mp));
    }
  }
  if (Field* f = get("--fp8-format")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string v, m.one_of(*f, {"e4m3", "hybrid"}));
    OFFSIM_RETURN_IF_ERROR(m.set(*f, "training.precision", "fp8"));
  }
  if (Field* f = get("--optimizer")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string o, m.one_of(*f, {"adam", "sgd"}));
    if (o == "adam") {
      OFFSIM_RETURN_IF_ERROR(m.set(*f, "training.optimizer", "adamw"));
    } else {
      m.unmapped(*f, "SGD is not modelled (AdamW state sizes are used)");
    }
  }
  if (Field* f = get("--no-gradient-accumulation-fusion")) {
    OFFSIM_ASSIGN_OR_RETURN(bool off, flag(f));
    OFFSIM_RETURN_IF_ERROR(
        m.set(*f, "training.gradient_accumulation_fusion", off ? "false" : "true"));
  }

  // --- recompute
  if (Field* f = get("--recompute-granularity")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string g, m.one_of(*f, {"full", "selective"}));
    OFFSIM_RETURN_IF_ERROR(m.set(*f, "recompute", g));
  } else if (Field* f2 = get("--recompute-activations")) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, flag(f2));
    if (on) OFFSIM_RETURN_IF_ERROR(m.set(*f2, "recompute", "selective"));
  }
  Field* method = get("--recompute-method");
  Field* rnum = get("--recompute-num-layers");
  if (method != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(std::string mv, m.one_of(*method, {"uniform", "block"}));
    std::int64_t n = 1;
    if (rnum != nullptr) {
      OFFSIM_ASSIGN_OR_RETURN(n, int_arg(rnum, 1, 1'000'000));
    }
    if (mv == "uniform") {
      m.mapped(*method, "recompute (every layer)");
      if (rnum != nullptr && n == 1) {
        m.mapped(*rnum, "recompute (every layer its own checkpoint)");
      } else if (rnum != nullptr) {
        m.unmapped(*rnum,
                   "uniform recompute of groups of N layers is modelled as every layer "
                   "recomputed on its own (same FLOPs, checkpoints of every layer)");
      }
    } else {
      m.unmapped(*method,
                 "block recompute of the first N layers per stage is modelled as all "
                 "layers");
      if (rnum != nullptr) m.unmapped(*rnum, "see --recompute-method block");
    }
  } else if (rnum != nullptr) {
    m.unmapped(*rnum, "without --recompute-method Megatron ignores it");
  }

  // --- offload
  Field* act = get("--cpu-offloading");
  Field* act_n = get("--cpu-offloading-num-layers");
  Field* opt = get("--optimizer-cpu-offload");
  Field* frac = get("--optimizer-offload-fraction");
  OFFSIM_ASSIGN_OR_RETURN(bool act_on, flag(act));
  OFFSIM_ASSIGN_OR_RETURN(bool opt_on, flag(opt));
  Node rules = make_sequence();
  if (act_on) {
    Node r = make_map(act->value.origin);
    r.entries.emplace_back("tensor", make_scalar("activations", act->value.origin));
    r.entries.emplace_back("where", make_scalar("host", act->value.origin));
    if (act_n != nullptr) {
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t n, int_arg(act_n, 0, 1'000'000));
      Node first = make_map(act_n->value.origin);
      first.entries.emplace_back("first", make_scalar(std::to_string(n), act_n->value.origin));
      r.entries.emplace_back("layers", std::move(first));
      m.mapped(*act_n, "offload.rules");
    }
    rules.items.push_back(std::move(r));
    m.mapped(*act, "offload.rules");
  } else {
    if (act != nullptr) m.mapped(*act, "(off)");
    if (act_n != nullptr) m.ignored(*act_n, "used only with --cpu-offloading");
  }
  for (const char* key : {"--cpu-offloading-activations", "--cpu-offloading-weights"}) {
    if (Field* f = get(key)) {
      OFFSIM_ASSIGN_OR_RETURN(bool on, flag(f));
      if (std::string(key) == "--cpu-offloading-weights" && on) {
        m.unmapped(*f, "Transformer Engine weight offload is not modelled");
      } else {
        m.mapped(*f, "offload.rules");
      }
    }
  }
  if (opt_on) {
    double fraction = 1.0;
    if (frac != nullptr) {
      OFFSIM_ASSIGN_OR_RETURN(fraction, m.number_in(*frac, 0.0, 1.0));
    }
    for (const char* tensor : {"optimizer_states", "master_weights"}) {
      Node r = make_map(opt->value.origin);
      r.entries.emplace_back("tensor", make_scalar(tensor, opt->value.origin));
      r.entries.emplace_back("where", make_scalar("host", opt->value.origin));
      if (fraction < 1.0) {
        Node sel = make_map(frac->value.origin);
        sel.entries.emplace_back("fraction", make_scalar(fmt::format("{}", fraction)));
        r.entries.emplace_back("layers", std::move(sel));
      }
      rules.items.push_back(std::move(r));
    }
    m.mapped(*opt, "offload.rules, offload.optimizer");
    if (frac != nullptr) m.mapped(*frac, "offload.rules");
  } else {
    if (opt != nullptr) m.mapped(*opt, "(off)");
    if (frac != nullptr) m.ignored(*frac, "used only with --optimizer-cpu-offload");
  }
  if (!rules.items.empty()) {
    Node off = make_map();
    off.entries.emplace_back("rules", std::move(rules));
    off.entries.emplace_back("optimizer", make_scalar(opt_on ? "cpu" : "gpu"));
    OFFSIM_RETURN_IF_ERROR(set_path(m.doc, "offload", std::move(off)));
  }

  settle_leftovers(fields, m, ignore_reason);
  return finish(m, options,
                {.world_gpus = static_cast<int>(world), .name = file_stem(files.front())});
}

}  // namespace offsim::scenarios::detail
