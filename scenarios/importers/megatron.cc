// Megatron-LM / NeMo / Megatron-Bridge import: the training script's arguments (a launch script or
// an argument file: every `--flag [value]` token, with torchrun's --nproc_per_node and --nnodes
// giving the GPU count), or a Megatron-Bridge recipe YAML whose leaves carry the same names with
// underscores (model.tensor_model_parallel_size, train.micro_batch_size, ...).

#include <algorithm>
#include <cctype>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "models/scenario.h"
#include "scenarios/importers/import_common.h"

namespace offsim::scenarios::detail {
namespace {

using sim::ErrorCode;

bool ends_with(const std::string& s, const char* suffix) {
  const std::string x(suffix);
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

// Reads one token of `line` from `i` (up to whitespace outside quotes); quotes are removed.
std::string next_token(const std::string& line, std::size_t& i) {
  std::string tok;
  char quote = 0;
  while (i < line.size() && (quote != 0 || !std::isspace(static_cast<unsigned char>(line[i])))) {
    const char c = line[i++];
    if (quote == 0 && (c == '"' || c == '\'')) {
      quote = c;
    } else if (quote != 0 && c == quote) {
      quote = 0;
    } else {
      tok += c;
    }
  }
  return tok;
}

// Pairs the tokens into `--flag value`, `--flag=value` and bare `--flag` (true) fields.
class FlagPairs {
 public:
  explicit FlagPairs(Fields& out) : out_(out) {}

  void add(const std::string& tok, const std::string& origin) {
    if (tok.rfind("--", 0) == 0 && tok.size() > 2) {
      flush();
      const auto eq = tok.find('=');
      if (eq != std::string::npos) {
        out_.put(tok.substr(0, eq), make_scalar(tok.substr(eq + 1), origin));
      } else {
        pending_flag_ = tok;
        pending_origin_ = origin;
      }
    } else if (!pending_flag_.empty()) {
      out_.put(pending_flag_, make_scalar(tok, pending_origin_));
      if (is_list_flag(pending_flag_)) list_flag_ = pending_flag_;
      pending_flag_.clear();
    } else if (!list_flag_.empty()) {
      // A further value of a list argument (nargs="+"): the field becomes a sequence.
      Field* f = out_.get(list_flag_);
      f->used = false;
      if (f->value.kind == NodeKind::kScalar) {
        Node seq = make_sequence();
        seq.origin = f->value.origin;
        seq.items.push_back(f->value);
        f->value = std::move(seq);
      }
      f->value.items.push_back(make_scalar(tok, origin));
    }
  }

  // Shell punctuation ends a list argument's values.
  void end_list() { list_flag_.clear(); }

  // A flag still waiting for its value has none: it is a switch.
  void flush() {
    if (!pending_flag_.empty()) out_.put(pending_flag_, make_scalar("true", pending_origin_));
    pending_flag_.clear();
    list_flag_.clear();
  }

 private:
  // The list arguments the importer maps (Megatron's nargs="+"); other flags take one value.
  static bool is_list_flag(const std::string& flag) {
    return flag == "--recompute-modules" || flag == "--cp-comm-type" ||
           flag == "--cuda-graph-modules" || flag == "--cuda-graph-scope";
  }

  Fields& out_;
  std::string list_flag_;  // the list argument whose values are still being read
  std::string pending_flag_;
  std::string pending_origin_;
};

// The tokens of one script line, up to a comment; shell punctuation is skipped.
void read_line(const std::string& line, const std::string& path, int line_no, FlagPairs& pairs) {
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    if (i >= line.size() || line[i] == '#') break;
    const std::size_t col = i + 1;
    std::string tok = next_token(line, i);
    if (tok == "\\") continue;
    if (tok == "(" || tok == ")" || tok == "|" || tok == "&&") {
      pairs.end_list();
      continue;
    }
    // A ')' ends a bash array unless it was quoted ("([0]*3+[1]*45)" is one value).
    const bool quoted = line[col - 1] == '"' || line[col - 1] == '\'';
    const bool closes = !quoted && !tok.empty() && tok.back() == ')';
    if (closes) tok.pop_back();
    pairs.add(tok, fmt::format("{}:{}:{}", path, line_no, col));
    if (closes) pairs.end_list();
  }
}

// Splits a shell script into `--flag [value]` pairs. Quotes are removed; a value that still
// holds a `$` is a shell variable the importer cannot expand (an error when it is mapped).
sim::Status read_script(const std::string& path, const std::string& text, Fields& out) {
  FlagPairs pairs(out);
  int line_no = 0;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t end = std::min(text.find('\n', pos), text.size());
    ++line_no;
    read_line(text.substr(pos, end - pos), path, line_no, pairs);
    pos = end + 1;
    if (end == text.size()) break;
  }
  pairs.flush();
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
  // The router's scoring and balancing options: offsim prices one router GEMM, its softmax and
  // top-k either way, and the routed load from model.moe.load_imbalance or expert_loads.
  static const char* kRouter[] = {"--moe-router-load-balancing-type",
                                  "--moe-aux-loss-coeff",
                                  "--moe-z-loss-coeff",
                                  "--moe-router-score-function",
                                  "--moe-router-pre-softmax",
                                  "--moe-router-enable-expert-bias",
                                  "--moe-router-bias-update-rate",
                                  "--moe-router-topk-scaling-factor",
                                  "--moe-router-dtype",
                                  "--moe-token-drop-policy",
                                  "--moe-per-layer-logging",
                                  "--moe-input-jitter-eps"};
  for (const char* p : kRouter) {
    if (key == p) return "router arithmetic; no effect offsim distinguishes on step time or memory";
  }
  return {};
}

// A Megatron-Bridge recipe: its sections (model, train, optimizer, ddp, dataset, ...) hold
// Megatron's argument names with underscores; the leaf name is the argument.
sim::Status read_recipe(const std::string& path, Fields& fields) {
  OFFSIM_ASSIGN_OR_RETURN(Node doc, load_document_file(path));
  if (doc.kind != NodeKind::kMap) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "{}: expected a Megatron-Bridge recipe (a "
                     "map), got {}",
                     path, doc.describe());
  }
  Fields nested;
  flatten(doc, "", nested);
  for (Field& f : nested.all()) {
    const auto dot = f.key.rfind('.');
    const std::string leaf = dot == std::string::npos ? f.key : f.key.substr(dot + 1);
    if (f.value.kind == NodeKind::kScalar && leaf == "mixed_precision") {
      // Megatron-Bridge: mixed_precision: bf16_mixed | fp16_mixed | bf16_with_fp8_...
      fields.put("--mixed-precision", f.value);
      continue;
    }
    fields.put(dashes(leaf), f.value);
  }
  return {};
}

sim::Result<Fields> read_files(const std::vector<std::string>& files) {
  Fields fields;
  for (const std::string& path : files) {
    if (ends_with(path, ".yaml") || ends_with(path, ".yml")) {
      OFFSIM_RETURN_IF_ERROR(read_recipe(path, fields));
    } else {
      OFFSIM_ASSIGN_OR_RETURN(std::string text, read_file(path));
      OFFSIM_RETURN_IF_ERROR(read_script(path, text, fields));
    }
  }
  return fields;
}

// The arguments and the mapper, with Megatron's typed reads.
struct Args {
  Fields& fields;
  Mapper& m;

  Field* get(const char* key) { return fields.get(key); }

  // A number; a `$VAR` left in the script is refused with a hint.
  sim::Result<std::int64_t> int_arg(Field* f, std::int64_t min, std::int64_t max) const {
    if (f->value.scalar.find('$') != std::string::npos) {
      return m.error(
          *f, fmt::format("{} is a shell variable; expand it or give the number", f->value.scalar));
    }
    return m.int_in(*f, min, max);
  }

  // A switch; absent is false.
  sim::Result<bool> flag(Field* f) const {
    if (f == nullptr) return false;
    return m.boolean(*f);
  }
};

struct Layout {
  std::int64_t tp = 1, pp = 1, cp = 1;
  std::int64_t world = 0;  // the job's GPUs; 0: not known
};

// --- parallel layout: tp, pp and, from torchrun's GPU count, dp.
sim::Result<Layout> map_layout(Args& a, const ImportOptions& options) {
  Layout l;
  if (Field* f = a.get("--tensor-model-parallel-size")) {
    OFFSIM_ASSIGN_OR_RETURN(l.tp, a.int_arg(f, 1, 1'000'000));
    OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "parallelism.tp", std::to_string(l.tp)));
  }
  if (Field* f = a.get("--pipeline-model-parallel-size")) {
    OFFSIM_ASSIGN_OR_RETURN(l.pp, a.int_arg(f, 1, 1'000'000));
    OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "parallelism.pp", std::to_string(l.pp)));
  }
  // Context parallelism: the ranks of a CP group split each sequence; the data-parallel size is
  // what tp x pp x cp leave (Megatron-Core's rank order tp, cp, dp, pp).
  Field* cp = a.get("--context-parallel-size");
  if (cp != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(l.cp, a.int_arg(cp, 1, 1'000'000));
    OFFSIM_RETURN_IF_ERROR(a.m.set(*cp, "parallelism.cp", std::to_string(l.cp)));
  }
  Field* nproc = a.get("--nproc_per_node");
  if (nproc == nullptr) nproc = a.get("--nproc-per-node");
  Field* nnodes = a.get("--nnodes");
  l.world = options.gpus;
  if (nproc != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t per_node, a.int_arg(nproc, 1, 1'000'000));
    std::int64_t n = 1;
    if (nnodes != nullptr) {
      OFFSIM_ASSIGN_OR_RETURN(n, a.int_arg(nnodes, 1, 1'000'000));
    }
    l.world = per_node * n;
  }
  if (l.world > 0) {
    const std::int64_t model = l.tp * l.pp * l.cp;
    if (l.world % model != 0) {
      return sim::fail(ErrorCode::kInvalidInput,
                       "{} GPUs are not divisible by tensor x pipeline x context parallel size {} "
                       "x {} x {}",
                       l.world, l.tp, l.pp, l.cp);
    }
    OFFSIM_RETURN_IF_ERROR(
        a.m.set_from({nproc, nnodes}, "parallelism.dp", std::to_string(l.world / model)));
  }
  return l;
}

// --cp-comm-type (Transformer Engine's, one value or one per layer): p2p (ring attention) and a2a
// (Ulysses) are modelled; a2a+p2p (hierarchical) and all_gather are not.
sim::Status map_cp_comm_type(Args& a) {
  Field* f = a.get("--cp-comm-type");
  if (f == nullptr) return {};
  std::vector<std::string> values;
  if (f->value.kind == NodeKind::kSequence) {
    for (const Node& item : f->value.items) values.push_back(item.scalar);
  } else if (f->value.kind == NodeKind::kScalar) {
    values.push_back(f->value.scalar);
  }
  if (values.empty()) return a.m.error(*f, "expected p2p, a2a, a2a+p2p or all_gather");
  for (const std::string& v : values) {
    if (v != values.front()) {
      a.m.unmapped(*f, "a different type per layer is not modelled (offsim runs one type)");
      return {};
    }
  }
  const std::string& v = values.front();
  if (v == "p2p" || v == "a2a") return a.m.set(*f, "parallelism.cp_comm_type", v);
  if (v == "a2a+p2p" || v == "all_gather") {
    a.m.unmapped(*f, fmt::format("{} is not modelled (offsim runs p2p or a2a)", v));
    return {};
  }
  return a.m.error(*f, fmt::format("expected p2p, a2a, a2a+p2p or all_gather, got {}", v));
}

// Context and sequence parallelism, the distributed optimizer and gradient-reduce overlap.
sim::Status map_parallel_flags(Args& a) {
  OFFSIM_RETURN_IF_ERROR(map_cp_comm_type(a));
  if (Field* f = a.get("--sequence-parallel")) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, a.flag(f));
    OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "parallelism.sequence_parallel", on ? "true" : "false"));
  }
  if (Field* f = a.get("--use-distributed-optimizer")) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, a.flag(f));
    OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "parallelism.zero_stage", on ? "1" : "0"));
  }
  // Megatron's default is no overlap; --overlap-grad-reduce turns it on.
  Field* f = a.get("--overlap-grad-reduce");
  bool on = false;
  if (f != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(on, a.flag(f));
  }
  return a.m.set_from({f}, "parallelism.overlap_grad_reduce", on ? "true" : "false");
}

// --pipeline-model-parallel-layout: the stages as listed, the virtual stage count from their
// number (Megatron's PipelineParallelLayerLayout: len(layout) / pp), unless given.
sim::Status map_pipeline_layout(Args& a, std::int64_t pp) {
  Field* f = a.get("--pipeline-model-parallel-layout");
  if (f == nullptr) return {};
  if (f->value.kind != NodeKind::kScalar) return a.m.error(*f, "expected a layout string");
  const auto stages = models::parse_pipeline_layout(f->value.scalar);
  if (!stages) return a.m.error(*f, "expected " + stages.error().message);
  const auto n = static_cast<std::int64_t>(stages->size());
  if (n % pp != 0) {
    return a.m.error(*f, fmt::format("{} stages do not divide over pipeline size {}", n, pp));
  }
  OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "parallelism.layout", f->value.scalar));
  if (!a.fields.has("--virtual-pipeline-model-parallel-size") && n / pp > 1) {
    OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "parallelism.virtual_stages", std::to_string(n / pp)));
    OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "parallelism.schedule", "interleaved_1f1b"));
  }
  return {};
}

// Interleaved 1F1B: layers per virtual stage, or the virtual stage count. The embedding and
// the loss may each take a layer's place in the split (--account-for-embedding-in-pipeline-split,
// --account-for-loss-in-pipeline-split); Megatron's arguments.py counts them in the layers a
// virtual stage holds.
sim::Status map_virtual_stages(Args& a, std::int64_t pp) {
  std::int64_t slots = 0;
  for (const auto& [flag, key] : {std::pair{"--account-for-embedding-in-pipeline-split",
                                            "parallelism.account_for_embedding_in_pipeline_split"},
                                  std::pair{"--account-for-loss-in-pipeline-split",
                                            "parallelism.account_for_loss_in_pipeline_split"}}) {
    if (Field* f = a.get(flag)) {
      OFFSIM_ASSIGN_OR_RETURN(bool on, a.flag(f));
      OFFSIM_RETURN_IF_ERROR(a.m.set(*f, key, on ? "true" : "false"));
      slots += on ? 1 : 0;
    }
  }
  if (Field* f = a.get("--num-layers-per-virtual-pipeline-stage")) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t per, a.int_arg(f, 1, 1'000'000));
    Field* layers_f = a.fields.get("--num-layers");
    if (layers_f == nullptr) {
      return a.m.error(*f, "needs --num-layers to derive the virtual stages");
    }
    layers_f->used = false;
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t layers, a.int_arg(layers_f, 1, 1'000'000));
    layers += slots;
    if (layers % (pp * per) != 0) {
      return a.m.error(*f, fmt::format("{} x pipeline size {} does not divide --num-layers {}{}",
                                       per, pp, layers - slots,
                                       slots > 0 ? fmt::format(" + {} (embedding and loss)", slots)
                                                 : std::string()));
    }
    OFFSIM_RETURN_IF_ERROR(
        a.m.set(*f, "parallelism.virtual_stages", std::to_string(layers / (pp * per))));
    OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "parallelism.schedule", "interleaved_1f1b"));
  }
  if (Field* f = a.get("--virtual-pipeline-model-parallel-size")) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, a.int_arg(f, 1, 1'000'000));
    OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "parallelism.virtual_stages", std::to_string(v)));
    if (v > 1) OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "parallelism.schedule", "interleaved_1f1b"));
  }
  return map_pipeline_layout(a, pp);
}

// Integer arguments copied to scenario keys, in the order given.
sim::Status map_ints(Args& a, std::span<const std::pair<const char*, const char*>> keys) {
  for (const auto& [key, path] : keys) {
    if (Field* f = a.get(key)) {
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, a.int_arg(f, 1, 100'000'000));
      OFFSIM_RETURN_IF_ERROR(a.m.set(*f, path, std::to_string(v)));
    }
  }
  return {};
}

// --swiglu (or Megatron-Core's --gated-linear-unit) and --normalization.
sim::Status map_activation_and_norm(Args& a) {
  Field* swiglu = a.get("--swiglu");
  if (swiglu == nullptr) swiglu = a.get("--gated-linear-unit");  // Megatron-Core config name
  OFFSIM_ASSIGN_OR_RETURN(bool gated, a.flag(swiglu));
  OFFSIM_RETURN_IF_ERROR(a.m.set_from({swiglu}, "model.activation", gated ? "swiglu" : "gelu"));
  Field* norm = a.get("--normalization");
  std::string norm_v = "LayerNorm";
  if (norm != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(norm_v, a.m.one_of(*norm, {"LayerNorm", "RMSNorm"}));
  }
  return a.m.set_from({norm}, "model.norm", norm_v == "RMSNorm" ? "rmsnorm" : "layernorm");
}

// Tied embeddings and linear biases, by the Megatron-LM or the Megatron-Core argument.
sim::Status map_ties_and_biases(Args& a) {
  Field* untie = a.get("--untie-embeddings-and-output-weights");
  OFFSIM_ASSIGN_OR_RETURN(bool untied, a.flag(untie));
  if (Field* share = a.get("--share-embeddings-and-output-weights")) {  // Megatron-Core name
    OFFSIM_ASSIGN_OR_RETURN(bool shared, a.flag(share));
    untied = !shared;
    untie = share;
  }
  OFFSIM_RETURN_IF_ERROR(a.m.set_from({untie}, "model.tied_embeddings", untied ? "false" : "true"));
  Field* nobias = a.get("--disable-bias-linear");
  OFFSIM_ASSIGN_OR_RETURN(bool no_bias, a.flag(nobias));
  if (Field* add = a.get("--add-bias-linear")) {  // Megatron-Core name
    OFFSIM_ASSIGN_OR_RETURN(bool bias, a.flag(add));
    no_bias = !bias;
    nobias = add;
  }
  return a.m.set_from({nobias}, "model.linear_bias", no_bias ? "false" : "true");
}

// Learned absolute positions need --max-position-embeddings; RoPE or none have no table.
sim::Status map_positions(Args& a) {
  Field* pos = a.get("--position-embedding-type");
  std::string pos_v = "learned_absolute";
  if (pos != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(pos_v, a.m.one_of(*pos, {"learned_absolute", "rope", "none"}));
  }
  Field* maxpos = a.get("--max-position-embeddings");
  if (pos_v != "learned_absolute") {
    OFFSIM_RETURN_IF_ERROR(a.m.set_from({pos}, "model.max_positions", "0"));
    if (maxpos != nullptr) a.m.ignored(*maxpos, "only the RoPE range; no position table");
    return {};
  }
  if (maxpos == nullptr) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "--max-position-embeddings: needed with learned absolute positions "
                     "(Megatron's default --position-embedding-type)");
  }
  OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, a.int_arg(maxpos, 1, 100'000'000));
  return a.m.set_from({maxpos, pos}, "model.max_positions", std::to_string(v));
}

// Dropout (Megatron's defaults 0.1) and flash attention.
sim::Status map_dropout_and_attention(Args& a) {
  Field* hd = a.get("--hidden-dropout");
  Field* ad = a.get("--attention-dropout");
  double hd_v = 0.1, ad_v = 0.1;
  if (hd != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(hd_v, a.m.number_in(*hd, 0.0, 1.0));
  }
  if (ad != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(ad_v, a.m.number_in(*ad, 0.0, 1.0));
  }
  OFFSIM_RETURN_IF_ERROR(
      a.m.set_from({hd, ad}, "model.dropout", hd_v > 0 || ad_v > 0 ? "true" : "false"));
  if (Field* f = a.get("--use-flash-attn")) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, a.flag(f));
    OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "model.attention", on ? "flash" : "classic"));
  }
  return {};
}

// --- model (Megatron's GPT defaults: learned positions, biases, LayerNorm, GeLU, tied
// embeddings, dropout 0.1), when the script gives one.
sim::Status map_model(Args& a, const std::vector<std::string>& files) {
  if (!a.fields.has("--num-layers") && !a.fields.has("--hidden-size")) return {};
  std::string name = file_stem(files.front());
  OFFSIM_RETURN_IF_ERROR(set_path(a.m.doc, "model.name", make_scalar(name, files.front(), true)));
  static constexpr std::pair<const char*, const char*> kDims[] = {
      {"--num-layers", "model.layers"},          {"--hidden-size", "model.hidden"},
      {"--ffn-hidden-size", "model.ffn_hidden"}, {"--num-attention-heads", "model.heads"},
      {"--num-query-groups", "model.kv_heads"},  {"--kv-channels", "model.head_dim"},
      {"--vocab-size", "model.vocab_size"},      {"--padded-vocab-size", "model.vocab_size"},
      {"--mtp-num-layers", "model.mtp_layers"}};
  OFFSIM_RETURN_IF_ERROR(map_ints(a, kDims));
  if (Field* f = a.get("--group-query-attention")) a.m.mapped(*f, "model.kv_heads");
  OFFSIM_RETURN_IF_ERROR(map_activation_and_norm(a));
  OFFSIM_RETURN_IF_ERROR(map_ties_and_biases(a));
  OFFSIM_RETURN_IF_ERROR(map_positions(a));
  OFFSIM_RETURN_IF_ERROR(map_dropout_and_attention(a));
  if (!a.fields.has("--vocab-size") && !a.fields.has("--padded-vocab-size")) {
    return sim::fail(ErrorCode::kInvalidInput,
                     "model.vocab_size: Megatron takes the vocabulary from the tokenizer; give "
                     "--vocab-size in the script or --set model.vocab_size=N");
  }
  return {};
}

// A Megatron-Bridge recipe writes Python's None as null.
bool is_none(const Field& f) {
  const std::string& v = f.value.scalar;
  return f.value.kind == NodeKind::kNull ||
         (f.value.kind == NodeKind::kScalar && (v == "null" || v == "None" || v.empty()));
}

// --moe-layer-freq as a pattern: Megatron evaluates a Python list expression of 0 (dense) and 1
// (MoE) per layer, built from lists, `*` repetitions, `+` concatenations and parentheses
// ("([0]*3+[1]*58)"). This parser reads that grammar and nothing else.
class LayerPattern {
 public:
  explicit LayerPattern(const std::string& text) : s_(text) {}

  std::optional<std::vector<int>> parse() {
    auto v = expr();
    skip();
    if (!v || pos_ != s_.size()) return std::nullopt;
    return v;
  }

 private:
  void skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    skip();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  std::optional<std::int64_t> number() {
    skip();
    const std::size_t start = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_])) &&
           pos_ - start < 7) {
      ++pos_;
    }
    if (pos_ == start) return std::nullopt;
    return std::stoll(s_.substr(start, pos_ - start));
  }
  std::optional<std::vector<int>> atom() {
    if (eat('(')) {
      if (++depth_ > kMaxDepth) return std::nullopt;
      auto v = expr();
      --depth_;
      if (!v || !eat(')')) return std::nullopt;
      return v;
    }
    if (!eat('[')) return std::nullopt;
    std::vector<int> v;
    do {
      const auto n = number();
      if (!n || *n > 1) return std::nullopt;
      v.push_back(static_cast<int>(*n));
    } while (eat(','));
    if (!eat(']')) return std::nullopt;
    return v;
  }
  std::optional<std::vector<int>> term() {
    auto v = atom();
    while (v && eat('*')) {
      const auto n = number();
      if (!n || static_cast<double>(*n) * static_cast<double>(v->size()) > kMaxLayers) {
        return std::nullopt;
      }
      std::vector<int> r;
      for (std::int64_t i = 0; i < *n; ++i) r.insert(r.end(), v->begin(), v->end());
      v = std::move(r);
    }
    return v;
  }
  std::optional<std::vector<int>> expr() {
    auto v = term();
    while (v && eat('+')) {
      auto t = term();
      if (!t || v->size() + t->size() > kMaxLayers) return std::nullopt;
      v->insert(v->end(), t->begin(), t->end());
    }
    return v;
  }

  static constexpr std::size_t kMaxLayers = 1'000'000;  // far above any model's layer count
  static constexpr int kMaxDepth = 64;                  // nested parentheses

  const std::string& s_;
  std::size_t pos_ = 0;
  int depth_ = 0;
};

// --moe-layer-freq as offsim's model.moe.first_k_dense and layer_freq: k dense layers, then
// every f-th layer MoE. An integer N is Megatron's every N-th layer from layer 0.
sim::Status map_moe_layer_freq(Args& a) {
  Field* f = a.get("--moe-layer-freq");
  if (f == nullptr) return {};
  if (f->value.kind != NodeKind::kScalar) return a.m.error(*f, "expected an integer or a pattern");
  const std::string& text = f->value.scalar;
  if (text.find('[') == std::string::npos) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t n, a.int_arg(f, 1, 1'000'000));
    return a.m.set(*f, "model.moe.layer_freq", std::to_string(n));
  }
  const auto pattern = LayerPattern(text).parse();
  if (!pattern) {
    return a.m.error(*f, "expected a list expression of 0 and 1 such as ([0]*3+[1]*58)");
  }
  const auto n = static_cast<std::int64_t>(pattern->size());
  if (Field* layers_f = a.fields.get("--num-layers")) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t layers, a.int_arg(layers_f, 1, 1'000'000));
    if (layers != n) {
      return a.m.error(*f, fmt::format("the pattern has {} layers, --num-layers {}", n, layers));
    }
  }
  const auto first = std::find(pattern->begin(), pattern->end(), 1);
  if (first == pattern->end()) return a.m.error(*f, "the pattern has no MoE layer (no 1)");
  const std::int64_t k = first - pattern->begin();
  const auto second = std::find(first + 1, pattern->end(), 1);
  const std::int64_t freq = second == pattern->end() ? n - k : second - first;
  for (std::int64_t i = k; i < n; ++i) {
    if ((*pattern)[static_cast<std::size_t>(i)] != ((i - k) % freq == 0 ? 1 : 0)) {
      return a.m.error(*f, fmt::format("layer {} breaks the form offsim models: {} dense layers, "
                                       "then every {} layer(s) MoE (model.moe.first_k_dense, "
                                       "layer_freq)",
                                       i, k, freq));
    }
  }
  OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "model.moe.first_k_dense", std::to_string(k)));
  return a.m.set(*f, "model.moe.layer_freq", std::to_string(freq));
}

// The token dispatcher: offsim prices Megatron-Core's all-to-all dispatcher (MoEAlltoAllToken
// Dispatcher) and its flex dispatcher with DeepEP or HybridEP (parallelism.moe_dispatcher);
// Megatron's default is the all-gather one, priced as the all-to-all. The flex dispatcher's
// backend: --moe-flex-dispatcher-backend (default deepep), or the older --moe-enable-deepep.
sim::Status map_moe_dispatcher(Args& a) {
  Field* backend = a.get("--moe-flex-dispatcher-backend");
  Field* enable_deepep = a.get("--moe-enable-deepep");
  if (Field* f = a.get("--moe-token-dispatcher-type")) {
    const std::string v = f->value.scalar;
    if (v == "alltoall") {
      a.m.mapped(*f, "(the all-to-all dispatcher offsim prices)");
    } else if (v == "flex") {
      const std::string b = backend != nullptr ? backend->value.scalar : "deepep";
      if (b == "deepep" || b == "hybridep") {
        OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "parallelism.moe_dispatcher", b));
      } else {
        a.m.unmapped(*f, fmt::format("the flex dispatcher's {} backend is priced as the "
                                     "all-to-all dispatcher",
                                     b));
      }
    } else {
      a.m.unmapped(*f, fmt::format("the {} dispatcher is priced as the all-to-all one", v));
    }
  }
  if (backend != nullptr) a.m.mapped(*backend, "(with --moe-token-dispatcher-type)");
  if (enable_deepep != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, a.flag(enable_deepep));
    (void)on;
    a.m.mapped(*enable_deepep, "(the flex dispatcher's DeepEP backend, its default)");
  }
  if (Field* f = a.get("--overlap-moe-expert-parallel-comm")) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, a.flag(f));
    OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "parallelism.moe_a2a_overlap", on ? "true" : "false"));
  }
  if (Field* f = a.get("--delay-wgrad-compute")) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, a.flag(f));
    OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "parallelism.delay_wgrad_compute", on ? "true" : "false"));
  }
  if (Field* f = a.get("--moe-pad-expert-input-to-capacity")) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, a.flag(f));
    OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "model.moe.pad_to_capacity", on ? "true" : "false"));
  }
  return {};
}

// The experts' sizes: top-k (Megatron's default 2), the expert FFN (default --ffn-hidden-size,
// arguments.py), one shared expert of --moe-shared-expert-intermediate-size.
sim::Status map_moe_sizes(Args& a, Field& experts) {
  OFFSIM_ASSIGN_OR_RETURN(std::int64_t n, a.int_arg(&experts, 1, 65536));
  OFFSIM_RETURN_IF_ERROR(a.m.set(experts, "model.moe.experts", std::to_string(n)));
  Field* topk = a.get("--moe-router-topk");
  std::int64_t k = 2;
  if (topk != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(k, a.int_arg(topk, 1, 65536));
  }
  OFFSIM_RETURN_IF_ERROR(a.m.set_from({topk}, "model.moe.top_k", std::to_string(k)));
  // Group-limited routing (DeepSeek-V3's node-limited routing).
  if (Field* f = a.get("--moe-router-num-groups"); f != nullptr && !is_none(*f)) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, a.int_arg(f, 1, 65536));
    OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "model.moe.router_groups", std::to_string(v)));
  }
  if (Field* f = a.get("--moe-router-group-topk"); f != nullptr && !is_none(*f)) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, a.int_arg(f, 1, 65536));
    OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "model.moe.router_group_topk", std::to_string(v)));
  }
  if (Field* f = a.get("--moe-ffn-hidden-size"); f != nullptr && !is_none(*f)) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, a.int_arg(f, 1, 100'000'000));
    OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "model.moe.expert_ffn_hidden", std::to_string(v)));
  } else if (Field* dense = a.fields.get("--ffn-hidden-size")) {
    // --ffn-hidden-size is already mapped to model.ffn_hidden (the dense layers').
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, a.int_arg(dense, 1, 100'000'000));
    OFFSIM_RETURN_IF_ERROR(set_path(a.m.doc, "model.moe.expert_ffn_hidden",
                                    make_scalar(std::to_string(v), dense->value.origin)));
  } else {
    return a.m.error(experts, "needs --moe-ffn-hidden-size (or --ffn-hidden-size)");
  }
  if (Field* f = a.get("--moe-shared-expert-intermediate-size")) {
    if (!is_none(*f)) {
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t shared, a.int_arg(f, 1, 100'000'000));
      OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "model.moe.shared_experts", "1"));
      OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "model.moe.shared_ffn_hidden", std::to_string(shared)));
    } else {
      a.m.mapped(*f, "(none)");
    }
  }
  return {};
}

// Which layers are MoE, the capacity (none: dropless) and the routed load.
sim::Status map_moe_routing(Args& a) {
  OFFSIM_RETURN_IF_ERROR(map_moe_layer_freq(a));
  if (Field* f = a.get("--moe-expert-capacity-factor")) {
    if (!is_none(*f)) {
      OFFSIM_ASSIGN_OR_RETURN(double cf, a.m.number_in(*f, 1e-6, 1e6));
      OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "model.moe.capacity_factor", fmt::format("{}", cf)));
    } else {
      a.m.mapped(*f, "(dropless)");
    }
  }
  if (Field* f = a.get("--moe-router-force-load-balancing")) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, a.flag(f));
    if (on) {
      OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "model.moe.load_imbalance", "1"));
    } else {
      a.m.unmapped(*f,
                   "learned routing's imbalance is not known from the config; offsim assumes "
                   "balanced routing unless model.moe.load_imbalance or expert_loads is set");
    }
  }
  return {};
}

// Expert parallelism (expert TP defaults to TP, arguments.py) and the shared experts' stream.
sim::Status map_moe_parallel(Args& a, std::int64_t tp) {
  Field* ep = a.get("--expert-model-parallel-size");
  std::int64_t ep_v = 1;
  if (ep != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(ep_v, a.int_arg(ep, 1, 1'000'000));
  }
  OFFSIM_RETURN_IF_ERROR(a.m.set_from({ep}, "parallelism.ep", std::to_string(ep_v)));
  Field* etp = a.get("--expert-tensor-parallel-size");
  std::int64_t etp_v = tp;
  if (etp != nullptr && !is_none(*etp)) {
    OFFSIM_ASSIGN_OR_RETURN(etp_v, a.int_arg(etp, 1, 1'000'000));
  }
  OFFSIM_RETURN_IF_ERROR(a.m.set_from({etp}, "parallelism.etp", std::to_string(etp_v)));
  if (Field* f = a.get("--moe-shared-expert-overlap")) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, a.flag(f));
    OFFSIM_RETURN_IF_ERROR(
        a.m.set(*f, "parallelism.moe_shared_expert_overlap", on ? "true" : "false"));
  }
  return {};
}

// The kernels: --moe-grouped-gemm runs Transformer Engine's GroupedLinear (TEGroupedMLP:
// per-expert GEMMs on four streams, training.moe_grouped_gemm multi_stream); without it
// (Megatron's default) SequentialMLP loops over the experts on the compute stream, as the legacy
// GroupedMLP's grouped_gemm package does with its default cuBLAS backend (sequential). offsim
// prices the fused permutation and router (models/README.md); the unfused alternatives run
// more, smaller kernels that it does not charge.
sim::Status map_moe_kernels(Args& a) {
  Field* f = a.get("--moe-grouped-gemm");
  OFFSIM_ASSIGN_OR_RETURN(bool grouped, a.flag(f));
  Field* legacy = a.get("--moe-use-legacy-grouped-gemm");
  OFFSIM_ASSIGN_OR_RETURN(bool use_legacy, a.flag(legacy));
  if (legacy != nullptr && !grouped) a.m.ignored(*legacy, "no --moe-grouped-gemm");
  const bool multi_stream = grouped && !use_legacy;
  std::vector<const Field*> from{f};
  if (grouped && legacy != nullptr) from.push_back(legacy);
  OFFSIM_RETURN_IF_ERROR(a.m.set_from(from, "training.moe_grouped_gemm",
                                      multi_stream ? "multi_stream" : "sequential"));
  for (const char* key : {"--moe-permute-fusion", "--moe-router-fusion"}) {
    if (Field* f = a.get(key)) {
      OFFSIM_ASSIGN_OR_RETURN(bool on, a.flag(f));
      if (on) {
        a.m.mapped(*f, "(fused, as offsim prices it)");
      } else {
        a.m.unmapped(*f, "the unfused kernels are priced as the fused one");
      }
    }
  }
  return map_moe_dispatcher(a);
}

// --- mixture of experts (Megatron-Core's MoE arguments, or the TransformerConfig names of a
// Megatron-Bridge recipe: num_moe_experts, ...).
sim::Status map_moe(Args& a, std::int64_t tp) {
  Field* experts = a.get("--num-experts");
  if (experts == nullptr) experts = a.get("--num-moe-experts");
  if (experts == nullptr || is_none(*experts)) {
    for (const char* key : {"--expert-model-parallel-size", "--moe-router-topk"}) {
      if (Field* f = a.get(key)) a.m.ignored(*f, "no --num-experts: a dense model");
    }
    return {};
  }
  OFFSIM_RETURN_IF_ERROR(map_moe_sizes(a, *experts));
  OFFSIM_RETURN_IF_ERROR(map_moe_routing(a));
  OFFSIM_RETURN_IF_ERROR(map_moe_parallel(a, tp));
  return map_moe_kernels(a);
}

// --- precision: --bf16, --fp16, a Megatron-Bridge mixed_precision recipe, --fp8-format.
sim::Status map_precision(Args& a) {
  bool bf16_on = false;
  if (Field* f = a.get("--bf16")) {
    OFFSIM_ASSIGN_OR_RETURN(bf16_on, a.flag(f));
    if (bf16_on) OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "training.precision", "bf16"));
  }
  if (Field* f = a.get("--fp16")) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, a.flag(f));
    if (on && bf16_on)
      return a.m.error(*f, "--fp16 and --bf16 are exclusive (Megatron refuses both)");
    if (on) OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "training.precision", "fp16"));
  }
  if (Field* f = a.get("--mixed-precision")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string mp, a.m.text(*f));
    if (mp.rfind("bf16", 0) == 0 && mp.find("fp8") == std::string::npos) {
      OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "training.precision", "bf16"));
    } else if (mp.rfind("fp16", 0) == 0) {
      OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "training.precision", "fp16"));
    } else if (mp.find("fp8") != std::string::npos) {
      OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "training.precision", "fp8"));
    } else {
      a.m.unmapped(*f, fmt::format("mixed precision recipe {} is not modelled", mp));
    }
  }
  if (Field* f = a.get("--fp8-format")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string v, a.m.one_of(*f, {"e4m3", "hybrid"}));
    OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "training.precision", "fp8"));
  }
  return {};
}

// --- FP8 recipe and the storage dtypes of Megatron-LM's training state (megatron/training/
// arguments.py, megatron/core/optimizer/optimizer_config.py).
sim::Status map_fp8_recipe(Args& a) {
  if (Field* f = a.get("--fp8-recipe")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string v,
                            a.m.one_of(*f, {"delayed", "tensorwise", "mxfp8", "blockwise"}));
    return a.m.set(*f, "training.fp8_recipe", v == "tensorwise" ? "current" : v);
  }
  // Megatron-Bridge's named precision recipes (src/megatron/bridge/training/mixed_precision.py).
  Field* mp = a.get("--mixed-precision");
  if (mp == nullptr) return {};
  static constexpr std::pair<const char*, const char*> kRecipes[] = {
      {"fp8_delayed_scaling", "delayed"},
      {"fp8_current_scaling", "current"},
      {"mxfp8", "mxfp8"},
      {"fp8_subchannel_scaling", "blockwise"}};
  for (const auto& [part, recipe] : kRecipes) {
    if (mp->value.scalar.find(part) != std::string::npos) {
      return a.m.set(*mp, "training.fp8_recipe", recipe);
    }
  }
  return {};
}

// Adam moments (--exp-avg-dtype, --exp-avg-sq-dtype: fp32, fp16, bf16, fp8; offsim stores fp32
// and bf16 moments).
sim::Status map_moment_dtypes(Args& a) {
  for (const auto& [flag, key] :
       {std::pair{"--exp-avg-dtype", "training.dtypes.first_moment"},
        std::pair{"--exp-avg-sq-dtype", "training.dtypes.second_moment"}}) {
    Field* f = a.get(flag);
    if (f == nullptr) continue;
    OFFSIM_ASSIGN_OR_RETURN(std::string v, a.m.one_of(*f, {"fp32", "fp16", "bf16", "fp8"}));
    if (v == "fp32" || v == "bf16") {
      OFFSIM_RETURN_IF_ERROR(a.m.set(*f, key, v));
    } else {
      a.m.unmapped(*f, fmt::format("{} Adam moments are not modelled (fp32 or bf16)", v));
    }
  }
  return {};
}

// --use-precision-aware-optimizer, then the Adam moments' dtypes.
sim::Status map_precision_aware_optimizer(Args& a, bool half, bool fp8, bool fp8_params) {
  if (Field* f = a.get("--use-precision-aware-optimizer")) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, a.flag(f));
    const Node* recipe = find_path(a.m.doc, "training.fp8_recipe");
    const bool te_master = !fp8 || recipe == nullptr || recipe->scalar == "delayed";
    const Node* offload = find_path(a.m.doc, "offload.optimizer");
    const bool on_host = offload != nullptr && offload->scalar == "cpu";
    if (on && half && te_master && !fp8_params && !on_host) {
      OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "training.store_param_remainders", "true"));
    } else {
      a.m.ignored(*f, "the master stays a whole fp32 copy here (no remainders)");
    }
  }
  return map_moment_dtypes(a);
}

// With --bf16 Megatron-LM accumulates and reduces the gradients in fp32 unless
// --grad-reduce-in-bf16 is given or --main-grads-dtype bf16 leaves the accumulation off
// (arguments.py: accumulate_allreduce_grads_in_fp32). --fp8-param-gather keeps the linear
// weights as FP8 parameters. --use-precision-aware-optimizer hands the master to Transformer
// Engine's FusedAdam, which stores it as 16-bit remainders of the bf16 weights
// (store_param_remainders, True by default with TE 2.1 or later) when TE holds the master:
// without FP8 or with delayed scaling, --fp8-recipe's default (optimizer_config.py,
// use_precision_aware_optimizer_no_fp8_or_ds_fp8), with bf16 weights, and not with the
// optimizer offloaded to the host.
// Megatron-Bridge's named recipes derive from bf16_mixed (grad_reduce_in_fp32 True) and set
// fp8_param_gather for every FP8 recipe but the sub-channel (blockwise) one; its YAML may set
// either key itself (ddp.grad_reduce_in_fp32, mixed_precision.fp8_param_gather).
sim::Status map_storage_dtypes(Args& a) {
  const Node* precision = find_path(a.m.doc, "training.precision");
  const bool bf16 = precision != nullptr && precision->scalar == "bf16";
  const bool fp8 = precision != nullptr && precision->scalar == "fp8";
  Field* mp = a.get("--mixed-precision");
  const std::string recipe_name = mp != nullptr ? mp->value.scalar : "";
  const bool bridge_bf16 = recipe_name.rfind("bf16", 0) == 0;
  Field* gather = a.get("--fp8-param-gather");
  bool fp8_params = false;
  if (gather != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(fp8_params, a.flag(gather));
    if (fp8_params && !fp8) return a.m.error(*gather, "--fp8-param-gather needs --fp8-format");
    if (fp8_params) OFFSIM_RETURN_IF_ERROR(a.m.set(*gather, "training.dtypes.params", "fp8"));
  } else if (fp8 && bridge_bf16 && recipe_name.find("subchannel") == std::string::npos) {
    fp8_params = true;
    OFFSIM_RETURN_IF_ERROR(a.m.set(*mp, "training.dtypes.params", "fp8"));
  }
  if (Field* f = a.get("--grad-reduce-in-fp32")) {
    OFFSIM_ASSIGN_OR_RETURN(bool in_fp32, a.flag(f));
    OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "training.dtypes.grads", in_fp32 ? "fp32" : "bf16"));
    return map_precision_aware_optimizer(a, bf16 || fp8, fp8, fp8_params);
  }
  if (bridge_bf16) {
    OFFSIM_RETURN_IF_ERROR(a.m.set(*mp, "training.dtypes.grads", "fp32"));
    return map_precision_aware_optimizer(a, true, fp8, fp8_params);
  }
  Field* reduce_bf16 = a.get("--grad-reduce-in-bf16");
  Field* accumulate = a.get("--accumulate-allreduce-grads-in-fp32");
  Field* main_grads = a.get("--main-grads-dtype");
  bool in_bf16 = false;
  if (reduce_bf16 != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(in_bf16, a.flag(reduce_bf16));
  }
  bool in_fp32 = false;
  if (accumulate != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(in_fp32, a.flag(accumulate));
  }
  std::string main_grads_dtype = "fp32";
  if (main_grads != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(main_grads_dtype, a.m.one_of(*main_grads, {"fp32", "bf16"}));
  }
  if ((bf16 || fp8) && !in_bf16 && (in_fp32 || main_grads_dtype == "fp32")) {
    std::vector<const Field*> from;
    for (const Field* f : {a.get("--bf16"), accumulate, main_grads}) {
      if (f != nullptr) from.push_back(f);
    }
    if (!from.empty()) OFFSIM_RETURN_IF_ERROR(a.m.set_from(from, "training.dtypes.grads", "fp32"));
  } else {
    for (Field* f : {reduce_bf16, accumulate, main_grads}) {
      if (f != nullptr) OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "training.dtypes.grads", "bf16"));
    }
  }
  return map_precision_aware_optimizer(a, bf16 || fp8, fp8, fp8_params);
}

// --- optimizer and gradient-accumulation fusion.
sim::Status map_optimizer(Args& a) {
  if (Field* f = a.get("--optimizer")) {
    OFFSIM_ASSIGN_OR_RETURN(std::string o, a.m.one_of(*f, {"adam", "sgd"}));
    if (o == "adam") {
      OFFSIM_RETURN_IF_ERROR(a.m.set(*f, "training.optimizer", "adamw"));
    } else {
      a.m.unmapped(*f, "SGD is not modelled (AdamW state sizes are used)");
    }
  }
  if (Field* f = a.get("--no-gradient-accumulation-fusion")) {
    OFFSIM_ASSIGN_OR_RETURN(bool off, a.flag(f));
    OFFSIM_RETURN_IF_ERROR(
        a.m.set(*f, "training.gradient_accumulation_fusion", off ? "false" : "true"));
  }
  return {};
}

// The pipeline split as the import has set it (model.layers, pp, virtual stages, the embedding
// and loss slots, a listed layout); nullopt without a layer count.
std::optional<models::PipelineLayout> imported_layout(const Node& doc) {
  const auto number = [&](const char* path, std::int64_t otherwise) {
    const Node* n = find_path(doc, path);
    const auto v = n != nullptr ? scalar_int(*n) : std::nullopt;
    return v ? *v : otherwise;
  };
  const auto on = [&](const char* path) {
    const Node* n = find_path(doc, path);
    return n != nullptr && n->scalar == "true";
  };
  const std::int64_t layers = number("model.layers", 0);
  if (layers <= 0) return std::nullopt;
  models::ParallelConfig p;
  p.pp = static_cast<int>(number("parallelism.pp", 1));
  p.virtual_stages = static_cast<int>(number("parallelism.virtual_stages", 1));
  p.account_for_embedding_in_pipeline_split =
      on("parallelism.account_for_embedding_in_pipeline_split");
  p.account_for_loss_in_pipeline_split = on("parallelism.account_for_loss_in_pipeline_split");
  if (const Node* l = find_path(doc, "parallelism.layout")) {
    auto parsed = models::parse_pipeline_layout(l->scalar);
    if (parsed) p.layout = *parsed;
  }
  return models::pipeline_layout(layers, p);
}

// --recompute-method block --recompute-num-layers N: Megatron-Core checkpoints the first N layers
// of each model chunk (TransformerBlock._checkpointed_forward) and runs the others without
// recompute, so those get recompute.per_layer: none.
sim::Status map_block_recompute(Args& a, Field& method, Field* rnum, std::int64_t n) {
  const Node* mode = find_path(a.m.doc, "recompute.mode");
  if (mode == nullptr || mode->scalar != "full") {
    a.m.unmapped(method, "applies only with --recompute-granularity full");
    if (rnum != nullptr) a.m.unmapped(*rnum, "see --recompute-method");
    return {};
  }
  const auto layout = imported_layout(a.m.doc);
  if (!layout) return a.m.error(method, "needs --num-layers to place the recomputed layers");
  a.m.mapped(method, "recompute.per_layer");
  if (rnum != nullptr) a.m.mapped(*rnum, "recompute.per_layer");
  for (int stage = 0; stage < layout->pp; ++stage) {
    for (int chunk = 0; chunk < layout->virtual_stages; ++chunk) {
      const models::PipelineLayout::Span span = layout->span(stage, chunk);
      for (int l = span.first + static_cast<int>(std::min<std::int64_t>(n, span.count));
           l < span.first + span.count; ++l) {
        OFFSIM_RETURN_IF_ERROR(set_path(a.m.doc, fmt::format("recompute.per_layer.{}", l),
                                        make_scalar("none", method.value.origin)));
      }
    }
  }
  return {};
}

// --recompute-method and --recompute-num-layers: offsim recomputes every layer on its own.
sim::Status map_recompute_method(Args& a) {
  Field* method = a.get("--recompute-method");
  Field* rnum = a.get("--recompute-num-layers");
  if (method != nullptr && is_none(*method)) {
    a.m.mapped(*method, "(none)");
    method = nullptr;
  }
  if (method == nullptr) {
    if (rnum != nullptr && is_none(*rnum)) {
      a.m.mapped(*rnum, "(none)");
    } else if (rnum != nullptr) {
      a.m.unmapped(*rnum, "without --recompute-method Megatron ignores it");
    }
    return {};
  }
  OFFSIM_ASSIGN_OR_RETURN(std::string mv, a.m.one_of(*method, {"uniform", "block"}));
  std::int64_t n = 1;
  if (rnum != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(n, a.int_arg(rnum, 1, 1'000'000));
  }
  if (mv == "block") return map_block_recompute(a, *method, rnum, n);
  a.m.mapped(*method, "recompute (every layer)");
  if (rnum != nullptr && n == 1) {
    a.m.mapped(*rnum, "recompute (every layer its own checkpoint)");
  } else if (rnum != nullptr) {
    a.m.unmapped(*rnum,
                 "uniform recompute of groups of N layers is modelled as every layer "
                 "recomputed on its own (same FLOPs, checkpoints of every layer)");
  }
  return {};
}

// --recompute-modules (a list; a recipe's recompute_modules): the modules offsim models, under
// selective granularity (Megatron ignores them otherwise).
sim::Status map_recompute_modules(Args& a, Field* granularity, const std::string& g) {
  Field* f = a.get("--recompute-modules");
  if (g == "full") {
    // Megatron-Core's full recompute re-runs the checkpointed layers' whole forward
    // (tensor_parallel.checkpoint, or Transformer Engine's checkpoint; megatron/core/recompute.py).
    if (f != nullptr) a.m.unmapped(*f, "applies only with --recompute-granularity selective");
    OFFSIM_RETURN_IF_ERROR(a.m.set(*granularity, "recompute.mode", g));
    return a.m.set(*granularity, "recompute.rerun", "layer");
  }
  if (f == nullptr) return a.m.set(*granularity, "recompute", g);
  std::vector<Node> names =
      f->value.kind == NodeKind::kSequence ? f->value.items : std::vector<Node>{f->value};
  Node modules = make_sequence();
  std::vector<std::string> left_out;
  for (const Node& n : names) {
    if (n.kind != NodeKind::kScalar) return a.m.error(*f, "expected a list of module names");
    if (models::recompute_module_from_string(n.scalar)) {
      modules.items.push_back(make_scalar(n.scalar));
    } else {
      left_out.push_back(n.scalar);
    }
  }
  if (!left_out.empty()) {
    a.m.unmapped(*f, fmt::format("module(s) {} not modelled (offsim models core_attn, layernorm, "
                                 "moe_act, mla_up_proj, mlp, moe, shared_experts)",
                                 fmt::join(left_out, ", ")));
  }
  OFFSIM_RETURN_IF_ERROR(a.m.set(*granularity, "recompute.mode", g));
  return a.m.set_node(*f, "recompute.modules", std::move(modules));
}

// --- recompute
sim::Status map_recompute(Args& a) {
  Field* granularity = a.get("--recompute-granularity");
  // A recipe's recompute_granularity: null (None) is no recompute, as the option's absence.
  if (granularity != nullptr && is_none(*granularity)) {
    a.m.mapped(*granularity, "(no recompute)");
    granularity = nullptr;
  }
  if (Field* f = granularity) {
    OFFSIM_ASSIGN_OR_RETURN(std::string g, a.m.one_of(*f, {"full", "selective"}));
    OFFSIM_RETURN_IF_ERROR(map_recompute_modules(a, f, g));
  } else if (Field* modules = a.get("--recompute-modules")) {
    a.m.unmapped(*modules, "applies only with --recompute-granularity selective");
  } else if (Field* f2 = a.get("--recompute-activations")) {
    OFFSIM_ASSIGN_OR_RETURN(bool on, a.flag(f2));
    if (on) OFFSIM_RETURN_IF_ERROR(a.m.set(*f2, "recompute", "selective"));
  }
  if (granularity == nullptr) {
    // Megatron reads --recompute-method and --recompute-num-layers only with a granularity.
    for (const char* flag : {"--recompute-method", "--recompute-num-layers"}) {
      if (Field* f = a.get(flag)) a.m.ignored(*f, "used only with --recompute-granularity");
    }
    return {};
  }
  return map_recompute_method(a);
}

// --cpu-offloading [--cpu-offloading-num-layers N] -> an activations rule (first N layers).
sim::Status map_activation_offload(Args& a, Field* act, bool act_on, Node& rules) {
  Field* act_n = a.get("--cpu-offloading-num-layers");
  if (!act_on) {
    if (act != nullptr) a.m.mapped(*act, "(off)");
    if (act_n != nullptr) a.m.ignored(*act_n, "used only with --cpu-offloading");
    return {};
  }
  Node r = make_map(act->value.origin);
  r.entries.emplace_back("tensor", make_scalar("activations", act->value.origin));
  r.entries.emplace_back("where", make_scalar("host", act->value.origin));
  if (act_n != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t n, a.int_arg(act_n, 0, 1'000'000));
    Node first = make_map(act_n->value.origin);
    first.entries.emplace_back("first", make_scalar(std::to_string(n), act_n->value.origin));
    r.entries.emplace_back("layers", std::move(first));
    a.m.mapped(*act_n, "offload.rules");
  }
  rules.items.push_back(std::move(r));
  a.m.mapped(*act, "offload.rules");
  return {};
}

// --optimizer-cpu-offload [--optimizer-offload-fraction F] [--overlap-cpu-optimizer-d2h-h2d] ->
// Megatron-Core's HybridDeviceOptimizer as the megatron_optimizer_offload preset describes it:
// the Adam moments of the first F of each stage's layers on the host (offload_threshold is a
// fraction of each rank's parameters), the fp32 master on the GPU, and the copies ordered as the
// overlap flag says (its default: off).
sim::Status map_optimizer_offload(Args& a, Field* opt, bool opt_on, Node& rules, Node& cpu) {
  Field* frac = a.get("--optimizer-offload-fraction");
  Field* overlap = a.get("--overlap-cpu-optimizer-d2h-h2d");
  if (!opt_on) {
    if (opt != nullptr) a.m.mapped(*opt, "(off)");
    if (frac != nullptr) a.m.ignored(*frac, "used only with --optimizer-cpu-offload");
    if (overlap != nullptr) a.m.ignored(*overlap, "used only with --optimizer-cpu-offload");
    return {};
  }
  double fraction = 1.0;
  if (frac != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(fraction, a.m.number_in(*frac, 0.0, 1.0));
  }
  Node states = make_map(opt->value.origin);
  states.entries.emplace_back("tensor", make_scalar("optimizer_states", opt->value.origin));
  states.entries.emplace_back("where", make_scalar("host", opt->value.origin));
  if (fraction < 1.0) {
    Node sel = make_map(frac->value.origin);
    sel.entries.emplace_back("stage_fraction", make_scalar(fmt::format("{}", fraction)));
    states.entries.emplace_back("layers", std::move(sel));
  }
  rules.items.push_back(std::move(states));
  Node master = make_map(opt->value.origin);
  master.entries.emplace_back("tensor", make_scalar("master_weights", opt->value.origin));
  master.entries.emplace_back("where", make_scalar("hbm", opt->value.origin));
  rules.items.push_back(std::move(master));
  bool overlapped = false;
  if (overlap != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(overlapped, a.flag(overlap));
    a.m.mapped(*overlap, "offload.cpu.overlap_d2h_h2d");
  }
  cpu.entries.emplace_back("overlap_d2h_h2d", make_scalar(overlapped ? "true" : "false"));
  a.m.mapped(*opt, "offload.rules, offload.optimizer");
  if (frac != nullptr) a.m.mapped(*frac, "offload.rules");
  return {};
}

// --- offload
// --- per-layer CUDA graphs: --cuda-graph-impl local or transformer_engine with
// --cuda-graph-modules (or the deprecated --cuda-graph-scope, --enable-cuda-graph,
// --external-cuda-graph) as training.cuda_graph_modules. An empty module list (or the deprecated
// scope "full") captures the whole layer as one graph: module `layer`, on an MoE model only with
// --moe-pad-expert-input-to-capacity (Megatron-Core refuses it otherwise); full-iteration graphs
// are not modelled. The local implementation captures moe_router and moe_preprocess together
// (Megatron-Core's TransformerConfig adds the missing one).
// The graph implementation: --cuda-graph-impl, or a deprecated switch that names one (then
// `impl_f` becomes that switch).
sim::Result<std::string> cuda_graph_impl(Args& a, Field*& impl_f) {
  std::string impl = "none";
  if (impl_f != nullptr) {
    OFFSIM_ASSIGN_OR_RETURN(
        impl, a.m.one_of(*impl_f, {"none", "local", "transformer_engine", "full_iteration"}));
  }
  for (const auto& [flag, as] : {std::pair{"--enable-cuda-graph", "local"},
                                 std::pair{"--external-cuda-graph", "transformer_engine"}}) {
    if (Field* f = a.get(flag)) {
      OFFSIM_ASSIGN_OR_RETURN(bool on, a.flag(f));
      if (on) {
        impl = as;
        if (impl_f == nullptr) impl_f = f;
      }
      a.m.mapped(*f, fmt::format("(--cuda-graph-impl {})", as));
    }
  }
  return impl;
}

// The captured modules as listed ("full", the deprecated whole layer, drops out), with the
// local implementation's router and preprocess pair completed.
sim::Result<std::vector<std::string>> cuda_graph_names(Args& a, Field* modules,
                                                       const std::string& impl) {
  std::vector<std::string> names;
  if (modules == nullptr) return names;
  const std::vector<Node> items = modules->value.kind == NodeKind::kSequence
                                      ? modules->value.items
                                      : std::vector<Node>{modules->value};
  for (const Node& n : items) {
    if (n.kind != NodeKind::kScalar) return a.m.error(*modules, "expected a list of modules");
    if (n.scalar != "full") names.push_back(n.scalar);
  }
  const auto has = [&](const char* m) {
    return std::find(names.begin(), names.end(), m) != names.end();
  };
  if (impl == "local" && has("moe_router") != has("moe_preprocess")) {
    names.emplace_back(has("moe_router") ? "moe_preprocess" : "moe_router");
  }
  return names;
}

sim::Status map_cuda_graphs(Args& a) {
  Field* impl_f = a.get("--cuda-graph-impl");
  OFFSIM_ASSIGN_OR_RETURN(const std::string impl, cuda_graph_impl(a, impl_f));
  Field* modules = a.get("--cuda-graph-modules");
  if (modules == nullptr) modules = a.get("--cuda-graph-scope");
  Field* anchor = modules != nullptr ? modules : impl_f;
  if (impl == "none" || anchor == nullptr) {
    if (modules != nullptr) a.m.ignored(*modules, "used only with --cuda-graph-impl");
    if (impl_f != nullptr) a.m.mapped(*impl_f, "(no CUDA graphs)");
    return sim::ok();
  }
  if (impl == "full_iteration") {
    a.m.unmapped(*anchor, "a full-iteration CUDA graph is not modelled (the step runs eager)");
    return sim::ok();
  }
  OFFSIM_ASSIGN_OR_RETURN(std::vector<std::string> names, cuda_graph_names(a, modules, impl));
  const bool whole = names.empty();
  if (whole) {
    OFFSIM_ASSIGN_OR_RETURN(const bool padded, a.flag(a.get("--moe-pad-expert-input-to-capacity")));
    if (a.get("--num-experts") != nullptr && !padded) {
      a.m.unmapped(*anchor,
                   "a whole MoE layer's CUDA graph needs --moe-pad-expert-input-to-capacity "
                   "(Megatron-Core refuses it on dropless routing; the step runs eager)");
      return sim::ok();
    }
    names = {"layer"};
  }
  Node seq = make_sequence();
  std::vector<std::string> left_out;
  for (const std::string& n : names) {
    // "layer" is offsim's name for Megatron-Core's empty list, not a Megatron module.
    if (models::cuda_graph_module_from_string(n) && (whole || n != "layer")) {
      seq.items.push_back(make_scalar(n));
    } else {
      left_out.push_back(n);
    }
  }
  if (!left_out.empty()) {
    a.m.unmapped(*anchor, fmt::format("CUDA graph module(s) {} not modelled (offsim models attn, "
                                      "mlp, moe_router, moe_preprocess, moe)",
                                      fmt::join(left_out, ", ")));
  }
  if (impl_f != nullptr && impl_f != anchor) a.m.mapped(*impl_f, "(with --cuda-graph-modules)");
  if (seq.items.empty()) return sim::ok();
  return a.m.set_node(*anchor, "training.cuda_graph_modules", std::move(seq));
}

sim::Status map_offload(Args& a) {
  Field* act = a.get("--cpu-offloading");
  Field* opt = a.get("--optimizer-cpu-offload");
  OFFSIM_ASSIGN_OR_RETURN(bool act_on, a.flag(act));
  OFFSIM_ASSIGN_OR_RETURN(bool opt_on, a.flag(opt));
  Node rules = make_sequence();
  OFFSIM_RETURN_IF_ERROR(map_activation_offload(a, act, act_on, rules));
  for (const char* key : {"--cpu-offloading-activations", "--cpu-offloading-weights"}) {
    if (Field* f = a.get(key)) {
      OFFSIM_ASSIGN_OR_RETURN(bool on, a.flag(f));
      if (std::string(key) == "--cpu-offloading-weights" && on) {
        a.m.unmapped(*f, "Transformer Engine weight offload is not modelled");
      } else {
        a.m.mapped(*f, "offload.rules");
      }
    }
  }
  Node cpu = make_map();
  OFFSIM_RETURN_IF_ERROR(map_optimizer_offload(a, opt, opt_on, rules, cpu));
  if (rules.items.empty()) return {};
  Node off = make_map();
  off.entries.emplace_back("rules", std::move(rules));
  off.entries.emplace_back("optimizer", make_scalar(opt_on ? "cpu" : "gpu"));
  if (!cpu.entries.empty()) off.entries.emplace_back("cpu", std::move(cpu));
  return set_path(a.m.doc, "offload", std::move(off));
}

}  // namespace

sim::Result<ImportResult> import_megatron(const std::vector<std::string>& files,
                                          const ImportOptions& options) {
  OFFSIM_ASSIGN_OR_RETURN(Fields fields, read_files(files));
  Mapper m(Framework::kMegatron);
  Args a{.fields = fields, .m = m};
  OFFSIM_ASSIGN_OR_RETURN(const Layout layout, map_layout(a, options));
  OFFSIM_RETURN_IF_ERROR(map_parallel_flags(a));
  OFFSIM_RETURN_IF_ERROR(map_virtual_stages(a, layout.pp));
  // --- batch and sequence
  static constexpr std::pair<const char*, const char*> kBatch[] = {
      {"--micro-batch-size", "training.micro_batch"},
      {"--global-batch-size", "training.global_batch"},
      {"--seq-length", "training.seq_len"}};
  OFFSIM_RETURN_IF_ERROR(map_ints(a, kBatch));
  OFFSIM_RETURN_IF_ERROR(map_model(a, files));
  OFFSIM_RETURN_IF_ERROR(map_moe(a, layout.tp));
  OFFSIM_RETURN_IF_ERROR(map_precision(a));
  OFFSIM_RETURN_IF_ERROR(map_optimizer(a));
  OFFSIM_RETURN_IF_ERROR(map_recompute(a));
  OFFSIM_RETURN_IF_ERROR(map_offload(a));
  OFFSIM_RETURN_IF_ERROR(map_fp8_recipe(a));
  OFFSIM_RETURN_IF_ERROR(map_storage_dtypes(a));
  OFFSIM_RETURN_IF_ERROR(map_cuda_graphs(a));
  settle_leftovers(fields, m, ignore_reason);
  return finish(m, options,
                {.world_gpus = static_cast<int>(layout.world), .name = file_stem(files.front())});
}

}  // namespace offsim::scenarios::detail
