// The framework importers and the JAX memory_analysis() reader: each example config under
// scenarios/imports/ imports to a scenario whose every mapped field is checked here, with its
// framework key and file position; unmapped and ignored keys are listed exactly; values a framework
// refuses are errors naming the key; the `offsim import` output runs with `offsim run
// --print-effective`.
#include "scenarios/importers/importer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "scenarios/importers/jax_memory.h"
#include "scenarios/scenario_loader.h"
#include "tests/common/process.h"

namespace offsim::scenarios {
namespace {

namespace fs = std::filesystem;

const std::string kDir = "scenarios/imports/";

std::string value_at(const Node& doc, const std::string& path) {
  const Node* n = find_path(doc, path);
  if (n == nullptr) return "<missing>";
  return n->kind == NodeKind::kScalar ? n->scalar : emit_flow(*n);
}

// key -> "target" of every mapped framework key.
std::map<std::string, std::string> mapped(const ImportResult& r) {
  std::map<std::string, std::string> out;
  for (const ImportField& f : r.mapped) out[f.key] = f.target;
  return out;
}
std::vector<std::string> keys(const std::vector<ImportField>& fields) {
  std::vector<std::string> out;
  for (const ImportField& f : fields) out.push_back(f.key);
  return out;
}
const ImportField* find_field(const std::vector<ImportField>& fields, const std::string& key) {
  for (const ImportField& f : fields) {
    if (f.key == key) return &f;
  }
  return nullptr;
}

// A temporary folder for one test, removed with it.
class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(fs::temp_directory_path() / fmt::format("offsim_{}_{}", tag, ::getpid())) {
    fs::create_directories(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// The text of an example under scenarios/imports/.
std::string example_text(const std::string& name) {
  std::stringstream text;
  text << std::ifstream(kDir + name).rdbuf();
  return text.str();
}

// The import failed with a message that holds `part`.
void expect_error(const sim::Result<ImportResult>& r, const std::string& part) {
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find(part), std::string::npos) << r.error().message;
}

// The imported document maps onto the same Scenario after a trip through its YAML text.
void expect_round_trip(const ImportResult& r) {
  auto s = scenario_from_document(r.scenario, ".");
  ASSERT_TRUE(s) << s.error().message;
  auto again = parse_document(emit_yaml(r.scenario), "imported.yaml");
  ASSERT_TRUE(again) << again.error().message;
  auto s2 = scenario_from_document(*again, ".");
  ASSERT_TRUE(s2) << s2.error().message;
  EXPECT_EQ(emit_yaml(scenario_to_document(*s)), emit_yaml(scenario_to_document(*s2)));
}

TEST(MaxTextImport, EveryMappedFieldOfTheExample) {
  ImportOptions opt{.sets = {"hardware.system=dgx-h100"},
                    .framework_overrides = {"per_device_batch_size=2", "remat_policy=minimal"},
                    .gpus = 8};
  auto r = import_config(Framework::kMaxText,
                         {kDir + "maxtext-base.yml", kDir + "maxtext-llama3-8b.yml"}, opt);
  ASSERT_TRUE(r) << r.error().message;
  const Node& d = r->scenario;
  // ici_fsdp_parallelism: -1 takes all 8 GPUs: FSDP over 8.
  EXPECT_EQ(value_at(d, "parallelism.dp"), "8");
  EXPECT_EQ(value_at(d, "parallelism.fsdp"), "true");
  EXPECT_EQ(value_at(d, "parallelism.tp"), "1");
  EXPECT_EQ(value_at(d, "parallelism.pp"), "1");
  // per_device_batch_size 2 (command line) x 8 devices x 1 accumulation step.
  EXPECT_EQ(value_at(d, "training.micro_batch"), "2");
  EXPECT_EQ(value_at(d, "training.global_batch"), "16");
  EXPECT_EQ(value_at(d, "training.seq_len"), "2048");
  EXPECT_EQ(value_at(d, "training.precision"), "bf16");
  EXPECT_EQ(value_at(d, "training.fp32_master_weights"), "true");
  EXPECT_EQ(value_at(d, "training.optimizer"), "adamw");
  // The model config overrides base.yml's dimensions.
  EXPECT_EQ(value_at(d, "model.name"), "llama3-8b");
  EXPECT_EQ(value_at(d, "model.hidden"), "4096");
  EXPECT_EQ(value_at(d, "model.layers"), "32");
  EXPECT_EQ(value_at(d, "model.heads"), "32");
  EXPECT_EQ(value_at(d, "model.kv_heads"), "8");
  EXPECT_EQ(value_at(d, "model.head_dim"), "128");
  EXPECT_EQ(value_at(d, "model.ffn_hidden"), "14336");
  EXPECT_EQ(value_at(d, "model.vocab_size"), "128256");
  EXPECT_EQ(value_at(d, "model.activation"), "swiglu");
  EXPECT_EQ(value_at(d, "model.norm"), "rmsnorm");
  EXPECT_EQ(value_at(d, "model.linear_bias"), "false");
  EXPECT_EQ(value_at(d, "model.tied_embeddings"), "false");
  EXPECT_EQ(value_at(d, "model.dropout"), "false");
  EXPECT_EQ(value_at(d, "model.attention"), "flash");
  // remat_policy minimal: full remat with the six projection outputs saved on HBM.
  EXPECT_EQ(value_at(d, "recompute"), "full");
  EXPECT_EQ(value_at(d, "offload.rules.0.tensor"), "query_proj");
  EXPECT_EQ(value_at(d, "offload.rules.0.where"), "hbm");
  EXPECT_EQ(value_at(d, "offload.rules.5.tensor"), "mlpwo");
  EXPECT_EQ(value_at(d, "offload.optimizer"), "gpu");
  EXPECT_EQ(value_at(d, "hardware.nodes"), "1");

  const auto m = mapped(*r);
  EXPECT_EQ(m.at("ici_fsdp_parallelism"), "parallelism.dp, parallelism.fsdp");
  EXPECT_EQ(m.at("per_device_batch_size"), "training.global_batch, training.micro_batch");
  EXPECT_EQ(m.at("base_emb_dim"), "model.hidden");
  EXPECT_EQ(m.at("remat_policy"), "recompute, offload.rules");
  EXPECT_EQ(m.at("decoder_block"), "model.norm, model.linear_bias");
  // Positions: the model config's value, and the command line's.
  EXPECT_EQ(find_field(r->mapped, "base_emb_dim")->origin, kDir + "maxtext-llama3-8b.yml:4:15");
  EXPECT_EQ(find_field(r->mapped, "per_device_batch_size")->origin,
            "command line per_device_batch_size=2");
  EXPECT_TRUE(r->unmapped.empty()) << fmt::format("{}", fmt::join(keys(r->unmapped), ", "));
  EXPECT_EQ(keys(r->ignored),
            (std::vector<std::string>{"run_name", "base_output_directory", "steps", "learning_rate",
                                      "adam_b1", "adam_b2", "normalization_layer_epsilon",
                                      "rope_max_timescale"}));
  expect_round_trip(*r);
}

TEST(MaxTextImport, OffloadPoliciesAndUnmappedAxes) {
  ImportOptions opt{.sets = {"hardware.system=dgx-h100"},
                    .framework_overrides = {
                        "remat_policy=qkv_proj_offloaded", "optimizer_memory_host_offload=true",
                        "ici_fsdp_parallelism=4", "ici_sequence_parallelism=2", "some_new_flag=3"}};
  auto r = import_config(Framework::kMaxText,
                         {kDir + "maxtext-base.yml", kDir + "maxtext-llama3-8b.yml"}, opt);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "offload.rules.0.tensor"), "query_proj");
  EXPECT_EQ(value_at(r->scenario, "offload.rules.0.where"), "host");
  EXPECT_EQ(value_at(r->scenario, "offload.rules.3.tensor"), "optimizer_states");
  EXPECT_EQ(value_at(r->scenario, "offload.rules.4.tensor"), "master_weights");
  EXPECT_EQ(value_at(r->scenario, "parallelism.dp"), "4");
  EXPECT_EQ(keys(r->unmapped),
            (std::vector<std::string>{"ici_sequence_parallelism", "some_new_flag"}));
  EXPECT_EQ(r->unmapped[1].origin, "command line some_new_flag=3");
  EXPECT_EQ(r->unmapped[1].reason, "not a MaxText key this importer knows");

  opt.strict = true;
  auto strict = import_config(Framework::kMaxText,
                              {kDir + "maxtext-base.yml", kDir + "maxtext-llama3-8b.yml"}, opt);
  ASSERT_FALSE(strict);
  EXPECT_NE(strict.error().message.find("ici_sequence_parallelism: not mapped"), std::string::npos)
      << strict.error().message;
}

// The data axis beside fsdp: the weights sharded over the fsdp ranks and replicated over the data
// axis (hybrid sharding); an MoE model's in MaxTextImport.MixtureOfExpertsBlocks.
TEST(MaxTextImport, DataAxisBesideFsdpIsHybridSharding) {
  ImportOptions opt{.sets = {"hardware.system=dgx-h100"},
                    .framework_overrides = {"ici_data_parallelism=2"},
                    .gpus = 8};
  auto r = import_config(Framework::kMaxText,
                         {kDir + "maxtext-base.yml", kDir + "maxtext-llama3-8b.yml"}, opt);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "parallelism.dp"), "8");
  EXPECT_EQ(value_at(r->scenario, "parallelism.fsdp"), "true");
  EXPECT_EQ(value_at(r->scenario, "parallelism.fsdp_shard"), "4");
  EXPECT_TRUE(r->unmapped.empty()) << fmt::format("{}", fmt::join(keys(r->unmapped), ", "));
  expect_round_trip(*r);
}

// MaxText's MoE decoder blocks (its configs/models/qwen3-30b-a3b.yml and deepseek3-671b.yml
// keys): experts of base_moe_mlp_dim, top-k, the expert axis as expert parallelism folded into
// the data-parallel ranks; deepseek's shared experts, dense first layers, MLA and MTP.
TEST(MaxTextImport, MixtureOfExpertsBlocks) {
  const TempDir dir("import_mx");
  const std::string model = dir.file("qwen3-30b-a3b.yml");
  std::ofstream(model) << "decoder_block: \"qwen3_moe\"\nbase_emb_dim: 2048\nbase_mlp_dim: 768\n"
                          "base_num_query_heads: 32\nbase_num_kv_heads: 4\n"
                          "base_num_decoder_layers: 48\nhead_dim: 128\n"
                          "mlp_activations: [\"silu\", \"linear\"]\nvocab_size: 151936\n"
                          "num_experts: 128\nnum_experts_per_tok: 8\nbase_moe_mlp_dim: 768\n"
                          "capacity_factor: -1.0\nsparse_matmul: true\nmegablox: false\n"
                          "enable_dropout: False\n";
  ImportOptions opt{.sets = {"hardware.system=dgx-h100"},
                    .framework_overrides = {"ici_expert_parallelism=8"},
                    .gpus = 8};
  auto r = import_config(Framework::kMaxText, {kDir + "maxtext-base.yml", model}, opt);
  ASSERT_TRUE(r) << r.error().message;
  const Node& d = r->scenario;
  EXPECT_EQ(value_at(d, "model.moe.experts"), "128");
  EXPECT_EQ(value_at(d, "model.moe.top_k"), "8");
  EXPECT_EQ(value_at(d, "model.moe.expert_ffn_hidden"), "768");
  EXPECT_EQ(value_at(d, "model.norm"), "rmsnorm");
  EXPECT_EQ(value_at(d, "parallelism.ep"), "8");
  EXPECT_EQ(value_at(d, "parallelism.dp"), "8");  // fsdp -1 takes 1: the expert axis is dp
  // The expert axis shards the other weights ('embed' over fsdp ... expert): FSDP.
  EXPECT_EQ(value_at(d, "parallelism.fsdp"), "true");
  EXPECT_EQ(find_path(d, "parallelism.fsdp_shard"), nullptr);
  EXPECT_EQ(find_path(d, "model.moe.capacity_factor"), nullptr);  // -1: dropless
  // sparse_matmul (megablox): one grouped kernel, not Transformer Engine's per-expert GEMMs.
  EXPECT_EQ(value_at(d, "training.moe_grouped_gemm"), "single_kernel");
  EXPECT_TRUE(r->unmapped.empty()) << fmt::format("{}", fmt::join(keys(r->unmapped), ", "));
  expect_round_trip(*r);
  // With the fsdp axis (-1: the 2 GPUs the expert axis leaves) the experts are FSDP-sharded too.
  ImportOptions sharded = opt;
  sharded.framework_overrides = {"ici_expert_parallelism=4"};
  auto f = import_config(Framework::kMaxText, {kDir + "maxtext-base.yml", model}, sharded);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(value_at(f->scenario, "parallelism.ep"), "4");
  EXPECT_EQ(value_at(f->scenario, "parallelism.dp"), "8");
  EXPECT_EQ(value_at(f->scenario, "parallelism.fsdp"), "true");
  expect_round_trip(*f);
  // The data axis beside expert x fsdp: hybrid sharding over the shard group of expert x fsdp
  // ranks (the routed experts over the fsdp ranks of their replica), replicated over data.
  ImportOptions hybrid = opt;
  hybrid.framework_overrides = {"ici_expert_parallelism=2", "ici_data_parallelism=2",
                                "ici_fsdp_parallelism=2"};
  auto h = import_config(Framework::kMaxText, {kDir + "maxtext-base.yml", model}, hybrid);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(value_at(h->scenario, "parallelism.ep"), "2");
  EXPECT_EQ(value_at(h->scenario, "parallelism.dp"), "8");
  EXPECT_EQ(value_at(h->scenario, "parallelism.fsdp"), "true");
  EXPECT_EQ(value_at(h->scenario, "parallelism.fsdp_shard"), "4");
  EXPECT_TRUE(h->unmapped.empty()) << fmt::format("{}", fmt::join(keys(h->unmapped), ", "));
  expect_round_trip(*h);
  // Expert axis as context parallelism: listed, the expert axis still taken as fsdp.
  hybrid.framework_overrides.push_back("expert_shard_attention_option=context");
  auto c = import_config(Framework::kMaxText, {kDir + "maxtext-base.yml", model}, hybrid);
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(keys(c->unmapped), (std::vector<std::string>{"expert_shard_attention_option"}));

  const std::string ds = dir.file("deepseek.yml");
  std::ofstream(ds) << "decoder_block: \"deepseek\"\nbase_emb_dim: 1024\nbase_num_query_heads: 16\n"
                       "base_num_kv_heads: 16\nbase_mlp_dim: 4096\nbase_moe_mlp_dim: 512\n"
                       "base_num_decoder_layers: 8\nfirst_num_dense_layers: 2\n"
                       "mlp_activations: [\"silu\",\"linear\"]\nvocab_size: 32000\n"
                       "num_experts: 16\nnum_experts_per_tok: 4\nshared_experts: 2\n"
                       "capacity_factor: 1.25\nattention_type: \"mla\"\nq_lora_rank: 256\n"
                       "kv_lora_rank: 128\nqk_nope_head_dim: 64\nqk_rope_head_dim: 32\n"
                       "v_head_dim: 64\nmtp_num_layers: 1\n";
  r = import_config(Framework::kMaxText, {kDir + "maxtext-base.yml", ds}, opt);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "model.moe.shared_experts"), "2");
  EXPECT_EQ(value_at(r->scenario, "model.moe.shared_ffn_hidden"), "512");
  EXPECT_EQ(value_at(r->scenario, "model.moe.first_k_dense"), "2");
  EXPECT_EQ(value_at(r->scenario, "model.moe.capacity_factor"), "1.25");
  EXPECT_EQ(value_at(r->scenario, "model.ffn_hidden"), "4096");
  EXPECT_EQ(value_at(r->scenario, "model.mla.kv_lora_rank"), "128");
  EXPECT_EQ(value_at(r->scenario, "model.mla.qk_rope_head_dim"), "32");
  EXPECT_EQ(value_at(r->scenario, "model.mtp_layers"), "1");
  EXPECT_TRUE(r->unmapped.empty()) << fmt::format("{}", fmt::join(keys(r->unmapped), ", "));
  expect_round_trip(*r);

  // Experts in a block offsim does not model are listed, and the model stays dense; an expert
  // axis without experts is the loader's error.
  std::ofstream(ds) << "decoder_block: \"gpt_oss\"\nbase_emb_dim: 1024\nbase_num_query_heads: 16\n"
                       "base_num_kv_heads: 16\nbase_mlp_dim: 4096\nbase_num_decoder_layers: 8\n"
                       "vocab_size: 32000\nnum_experts: 16\nnum_experts_per_tok: 4\n";
  opt.framework_overrides = {};
  r = import_config(Framework::kMaxText, {kDir + "maxtext-base.yml", ds}, opt);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(keys(r->unmapped), (std::vector<std::string>{"decoder_block", "num_experts"}));
  EXPECT_EQ(find_path(r->scenario, "model.moe"), nullptr);
  opt.framework_overrides = {"ici_expert_parallelism=8"};
  r = import_config(Framework::kMaxText, {kDir + "maxtext-base.yml", ds}, opt);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("parallelism.ep"), std::string::npos) << r.error().message;
}

// The context axis: context parallelism over ici_context_parallelism ranks (each sequence split,
// the batch over the data-parallel axes only); context_parallel_strategy ring / ulysses as
// offsim's ring (p2p) / all-to-all (a2a), MaxText's default all_gather listed.
TEST(MaxTextImport, ContextAxis) {
  ImportOptions opt{
      .sets = {"hardware.system=dgx-h100"},
      .framework_overrides = {"ici_context_parallelism=2", "context_parallel_strategy=ring"},
      .gpus = 8};
  auto r = import_config(Framework::kMaxText,
                         {kDir + "maxtext-base.yml", kDir + "maxtext-llama3-8b.yml"}, opt);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "parallelism.cp"), "2");
  EXPECT_EQ(value_at(r->scenario, "parallelism.cp_comm_type"), "p2p");
  EXPECT_EQ(value_at(r->scenario, "parallelism.dp"), "4");  // fsdp -1 takes 8 / 2
  // per_device_batch_size 1 x 8 devices = 8 sequences over 4 replicas.
  EXPECT_EQ(value_at(r->scenario, "training.global_batch"), "8");
  EXPECT_EQ(value_at(r->scenario, "training.micro_batch"), "2");
  EXPECT_TRUE(r->unmapped.empty()) << fmt::format("{}", fmt::join(keys(r->unmapped), ", "));
  expect_round_trip(*r);
  opt.framework_overrides = {"ici_context_parallelism=2", "context_parallel_strategy=ulysses"};
  r = import_config(Framework::kMaxText,
                    {kDir + "maxtext-base.yml", kDir + "maxtext-llama3-8b.yml"}, opt);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "parallelism.cp_comm_type"), "a2a");
  opt.framework_overrides = {"ici_context_parallelism=2"};
  r = import_config(Framework::kMaxText,
                    {kDir + "maxtext-base.yml", kDir + "maxtext-llama3-8b.yml"}, opt);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(keys(r->unmapped), (std::vector<std::string>{"context_parallel_strategy"}));
  EXPECT_EQ(r->unmapped.front().origin, "maxtext default");
  opt.framework_overrides = {"ici_context_parallelism=2", "context_parallel_strategy=stripes"};
  r = import_config(Framework::kMaxText,
                    {kDir + "maxtext-base.yml", kDir + "maxtext-llama3-8b.yml"}, opt);
  expect_error(r, "context_parallel_strategy: expected all_gather, ring or ulysses, got stripes");
}

TEST(MaxTextImport, BadValuesNameTheKey) {
  const std::vector<std::string> files = {kDir + "maxtext-base.yml"};
  auto no_gpus = import_config(Framework::kMaxText, files, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_FALSE(no_gpus);
  EXPECT_EQ(no_gpus.error().message,
            kDir +
                "maxtext-base.yml:38:23: ici_fsdp_parallelism: -1 takes the remaining "
                "devices; pass --gpus N (the job's GPU count)");
  auto bad_remat = import_config(Framework::kMaxText, files,
                                 {.sets = {"hardware.system=dgx-h100"},
                                  .framework_overrides = {"remat_policy=most"},
                                  .gpus = 8});
  ASSERT_FALSE(bad_remat);
  EXPECT_NE(bad_remat.error().message.find("command line remat_policy=most: remat_policy: expected "
                                           "a MaxText remat_policy"),
            std::string::npos)
      << bad_remat.error().message;
  auto zero = import_config(Framework::kMaxText, files,
                            {.sets = {"hardware.system=dgx-h100"},
                             .framework_overrides = {"ici_tensor_parallelism=0"},
                             .gpus = 8});
  ASSERT_FALSE(zero);
  EXPECT_NE(zero.error().message.find("ici_tensor_parallelism: expected -1"), std::string::npos);
  auto no_hw = import_config(Framework::kMaxText, files, {.gpus = 8});
  ASSERT_FALSE(no_hw);
  EXPECT_EQ(no_hw.error().message,
            "hardware.system: a MaxText config does not name the hardware; pass --set "
            "hardware.system=NAME (one of `offsim list systems`)");
}

TEST(MegatronImport, EveryMappedFieldOfTheLaunchScript) {
  auto r = import_config(Framework::kMegatron, {kDir + "megatron-gpt-pretrain.sh"},
                         {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(r) << r.error().message;
  const Node& d = r->scenario;
  // torchrun --nproc_per_node 8 --nnodes 2: 16 GPUs = TP 4 x PP 2 x DP 2.
  EXPECT_EQ(value_at(d, "parallelism.tp"), "4");
  EXPECT_EQ(value_at(d, "parallelism.pp"), "2");
  EXPECT_EQ(value_at(d, "parallelism.dp"), "2");
  EXPECT_EQ(value_at(d, "hardware.nodes"), "2");
  EXPECT_EQ(value_at(d, "parallelism.sequence_parallel"), "true");
  EXPECT_EQ(value_at(d, "parallelism.zero_stage"), "1");
  EXPECT_EQ(value_at(d, "parallelism.overlap_grad_reduce"), "true");
  EXPECT_EQ(value_at(d, "training.micro_batch"), "1");
  EXPECT_EQ(value_at(d, "training.global_batch"), "64");
  EXPECT_EQ(value_at(d, "training.seq_len"), "4096");
  EXPECT_EQ(value_at(d, "training.precision"), "bf16");
  EXPECT_EQ(value_at(d, "model.layers"), "32");
  EXPECT_EQ(value_at(d, "model.hidden"), "4096");
  EXPECT_EQ(value_at(d, "model.ffn_hidden"), "14336");
  EXPECT_EQ(value_at(d, "model.heads"), "32");
  EXPECT_EQ(value_at(d, "model.kv_heads"), "8");
  EXPECT_EQ(value_at(d, "model.vocab_size"), "128256");
  EXPECT_EQ(value_at(d, "model.activation"), "swiglu");
  EXPECT_EQ(value_at(d, "model.norm"), "rmsnorm");
  EXPECT_EQ(value_at(d, "model.tied_embeddings"), "false");
  EXPECT_EQ(value_at(d, "model.linear_bias"), "false");
  EXPECT_EQ(value_at(d, "model.max_positions"), "0");
  EXPECT_EQ(value_at(d, "model.dropout"), "false");
  EXPECT_EQ(value_at(d, "recompute"), "selective");
  const auto m = mapped(*r);
  EXPECT_EQ(m.at("--nproc_per_node"), "parallelism.dp");
  EXPECT_EQ(m.at("--num-query-groups"), "model.kv_heads");
  EXPECT_EQ(m.at("--group-query-attention"), "model.kv_heads");
  EXPECT_EQ(find_field(r->mapped, "--tensor-model-parallel-size")->origin,
            kDir + "megatron-gpt-pretrain.sh:8:5");
  EXPECT_TRUE(r->unmapped.empty()) << fmt::format("{}", fmt::join(keys(r->unmapped), ", "));
  EXPECT_EQ(keys(r->ignored), (std::vector<std::string>{
                                  "--max-position-embeddings", "--lr", "--train-iters",
                                  "--tokenizer-type", "--data-path", "--save", "--log-interval"}));
  expect_round_trip(*r);
}

TEST(MegatronImport, BridgeRecipeWithOptimizerOffload) {
  auto r = import_config(Framework::kMegatron, {kDir + "megatron-bridge-recipe.yaml"},
                         {.sets = {"hardware.system=dgx-a100-80gb"}, .gpus = 8});
  ASSERT_TRUE(r) << r.error().message;
  const Node& d = r->scenario;
  EXPECT_EQ(value_at(d, "parallelism.tp"), "2");
  EXPECT_EQ(value_at(d, "parallelism.dp"), "4");
  EXPECT_EQ(value_at(d, "parallelism.overlap_grad_reduce"), "false");  // Megatron's default
  EXPECT_EQ(value_at(d, "model.activation"), "gelu");
  EXPECT_EQ(value_at(d, "model.tied_embeddings"), "true");
  EXPECT_EQ(value_at(d, "model.linear_bias"), "true");
  EXPECT_EQ(value_at(d, "model.max_positions"), "2048");
  EXPECT_EQ(value_at(d, "model.dropout"), "true");
  EXPECT_EQ(value_at(d, "recompute.mode"), "full");
  // Megatron-Core's full recompute re-runs the whole layer (tensor_parallel.checkpoint).
  EXPECT_EQ(value_at(d, "recompute.rerun"), "layer");
  EXPECT_EQ(value_at(d, "training.precision"), "bf16");
  // bf16_mixed reduces the gradients in fp32 (grad_reduce_in_fp32 True).
  EXPECT_EQ(value_at(d, "training.dtypes.grads"), "fp32");
  EXPECT_EQ(value_at(d, "offload.rules.0.tensor"), "optimizer_states");
  // A fraction of each rank's parameters: the first half of every stage's layers.
  EXPECT_EQ(value_at(d, "offload.rules.0.layers.stage_fraction"), "0.5");
  EXPECT_EQ(value_at(d, "offload.rules.1.tensor"), "master_weights");
  EXPECT_EQ(value_at(d, "offload.rules.1.where"), "hbm");
  EXPECT_EQ(value_at(d, "offload.optimizer"), "cpu");
  EXPECT_EQ(value_at(d, "offload.cpu.overlap_d2h_h2d"), "false");
  EXPECT_EQ(mapped(*r).at("--share-embeddings-and-output-weights"), "model.tied_embeddings");
  EXPECT_TRUE(r->unmapped.empty()) << fmt::format("{}", fmt::join(keys(r->unmapped), ", "));
  EXPECT_EQ(keys(r->ignored), (std::vector<std::string>{"--train-iters", "--lr"}));
  expect_round_trip(*r);
}

// The storage dtypes Megatron-LM gives the training state: fp32 main gradients with --bf16
// unless --grad-reduce-in-bf16, bf16 Adam moments, FP8 parameters, and Transformer Engine's
// master remainders under the precision-aware optimizer where TE holds the master.
TEST(MegatronImport, StorageDtypesOfTheTrainingState) {
  const TempDir dir("import");
  const std::string script = dir.file("train.sh");
  std::ifstream in(kDir + "megatron-gpt-pretrain.sh");
  const std::string launch((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto import = [&](const std::string& flags) {
    std::string text = launch;
    const std::size_t at = text.find("    --bf16\n");
    text.replace(at, 11, "    " + flags + "\n");
    std::ofstream(script) << text;
    return import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  };
  auto r = import("--bf16");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "training.dtypes.grads"), "fp32");
  r = import(
      "--bf16 --grad-reduce-in-bf16 --use-precision-aware-optimizer --exp-avg-dtype bf16 "
      "--exp-avg-sq-dtype bf16");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "training.dtypes.grads"), "bf16");
  EXPECT_EQ(value_at(r->scenario, "training.dtypes.first_moment"), "bf16");
  EXPECT_EQ(value_at(r->scenario, "training.dtypes.second_moment"), "bf16");
  EXPECT_EQ(value_at(r->scenario, "training.store_param_remainders"), "true");
  expect_round_trip(*r);
  // Current scaling: Megatron-Core keeps the fp32 master itself (no remainders); FP8 weights.
  r = import(
      "--bf16 --fp8-format hybrid --fp8-recipe tensorwise --fp8-param-gather "
      "--use-precision-aware-optimizer");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "training.fp8_recipe"), "current");
  EXPECT_EQ(value_at(r->scenario, "training.dtypes.params"), "fp8");
  EXPECT_EQ(value_at(r->scenario, "training.dtypes.grads"), "fp32");
  EXPECT_EQ(find_path(r->scenario, "training.store_param_remainders"), nullptr);
  EXPECT_EQ(keys(r->ignored).at(1), "--use-precision-aware-optimizer");
  expect_round_trip(*r);
  r = import("--bf16 --fp8-param-gather");
  expect_error(r, "--fp8-param-gather needs --fp8-format");
  r = import("--bf16 --exp-avg-dtype fp8");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(keys(r->unmapped), (std::vector<std::string>{"--exp-avg-dtype"}));
}

// Megatron-Bridge's named FP8 recipes: the recipe, FP8 parameters (fp8_param_gather) and fp32
// gradient reduction from bf16_mixed, unless the YAML's ddp section says otherwise.
TEST(MegatronImport, BridgePrecisionRecipes) {
  const TempDir dir("import");
  const std::string recipe = dir.file("recipe.yaml");
  std::ifstream in(kDir + "megatron-bridge-recipe.yaml");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Without the optimizer offload (the precision recipes are the subject here).
  const std::string offload = "  optimizer_cpu_offload: true\n  optimizer_offload_fraction: 0.5\n";
  const std::size_t at = text.find(offload);
  ASSERT_NE(at, std::string::npos);
  text.erase(at, offload.size());
  const auto import = [&](const std::string& precision, const std::string& extra) {
    std::string t = text;
    const std::string named = "mixed_precision: bf16_mixed";
    t.replace(t.find(named), named.size(), "mixed_precision: " + precision + "\n" + extra);
    std::ofstream(recipe) << t;
    return import_config(Framework::kMegatron, {recipe},
                         {.sets = {"hardware.system=dgx-b200"}, .gpus = 8});
  };
  auto r = import("bf16_with_mxfp8_mixed", "");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "training.precision"), "fp8");
  EXPECT_EQ(value_at(r->scenario, "training.fp8_recipe"), "mxfp8");
  EXPECT_EQ(value_at(r->scenario, "training.dtypes.params"), "fp8");
  EXPECT_EQ(value_at(r->scenario, "training.dtypes.grads"), "fp32");
  expect_round_trip(*r);
  r = import("bf16_mixed", "ddp:\n  grad_reduce_in_fp32: false\n");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "training.dtypes.grads"), "bf16");
  r = import("bf16_with_fp8_subchannel_scaling_mixed", "");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "training.fp8_recipe"), "blockwise");
  EXPECT_EQ(find_path(r->scenario, "training.dtypes.params"), nullptr);
}

TEST(MegatronImport, BadArguments) {
  const TempDir dir("import");
  const std::string script = dir.file("train.sh");
  std::ofstream(script) << "torchrun --nproc_per_node 8 pretrain_gpt.py \\\n"
                           "  --tensor-model-parallel-size $TP --fancy-new-flag 3\n";
  auto r = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message,
            script +
                ":2:3: --tensor-model-parallel-size: $TP is a shell variable; expand it or "
                "give the number");
  std::ofstream(script)
      << "torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 3"
         " --fancy-new-flag 3 --model=llama3-8b\n";
  r = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  expect_error(r,
               "8 GPUs are not divisible by tensor x pipeline x context parallel size 3 x 1 x 1");
}

// A Megatron-Core MoE launch (Qwen3-30B-A3B's shape): experts, top-k, the expert FFN, expert
// parallelism with expert TP defaulting to TP, the layer pattern, and the options offsim does not
// model reported as such.
TEST(MegatronImport, MixtureOfExperts) {
  const TempDir dir("import_moe");
  const std::string script = dir.file("moe.sh");
  const std::string base =
      "torchrun --nproc_per_node 8 --nnodes 4 pretrain_gpt.py \\\n"
      "  --num-layers 48 --hidden-size 2048 --num-attention-heads 32 --group-query-attention \\\n"
      "  --num-query-groups 4 --kv-channels 128 --ffn-hidden-size 6144 --seq-length 4096 \\\n"
      "  --micro-batch-size 1 --global-batch-size 256 --bf16 --swiglu --normalization RMSNorm \\\n"
      "  --position-embedding-type rope --untie-embeddings-and-output-weights \\\n"
      "  --disable-bias-linear --vocab-size 151936 --use-distributed-optimizer \\\n"
      "  --tensor-model-parallel-size 2 --sequence-parallel \\\n"
      "  --num-experts 128 --moe-router-topk 8 --moe-ffn-hidden-size 768 \\\n"
      "  --expert-model-parallel-size 8 --moe-grouped-gemm --moe-token-dispatcher-type alltoall "
      "\\\n"
      "  --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-3 \\\n"
      "  --moe-shared-expert-intermediate-size 1536 --moe-shared-expert-overlap \\\n";
  std::ofstream(script) << base << "  --moe-layer-freq \"([0]*3+[1]*45)\"\n";
  auto r = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(r) << r.error().message;
  const Node& d = r->scenario;
  EXPECT_EQ(value_at(d, "model.moe.experts"), "128");
  EXPECT_EQ(value_at(d, "model.moe.top_k"), "8");
  EXPECT_EQ(value_at(d, "model.moe.expert_ffn_hidden"), "768");
  EXPECT_EQ(value_at(d, "model.ffn_hidden"), "6144");
  EXPECT_EQ(value_at(d, "model.moe.shared_experts"), "1");
  EXPECT_EQ(value_at(d, "model.moe.shared_ffn_hidden"), "1536");
  EXPECT_EQ(value_at(d, "model.moe.first_k_dense"), "3");
  EXPECT_EQ(value_at(d, "model.moe.layer_freq"), "1");
  EXPECT_EQ(value_at(d, "parallelism.ep"), "8");
  EXPECT_EQ(value_at(d, "parallelism.etp"), "2");  // Megatron: expert TP defaults to TP
  EXPECT_EQ(value_at(d, "parallelism.moe_shared_expert_overlap"), "true");
  EXPECT_EQ(value_at(d, "training.moe_grouped_gemm"), "multi_stream");  // TEGroupedMLP
  EXPECT_EQ(value_at(d, "parallelism.dp"), "16");
  EXPECT_TRUE(r->unmapped.empty());
  EXPECT_NE(find_field(r->ignored, "--moe-router-load-balancing-type"), nullptr);
  EXPECT_NE(find_field(r->ignored, "--moe-aux-loss-coeff"), nullptr);
  expect_round_trip(*r);

  // The all-to-all overlap with another micro-batch maps to its key; Megatron-Core refuses it
  // beside the shared-expert overlap, and so does the import, naming the key.
  std::ofstream(script) << base << "  --overlap-moe-expert-parallel-comm\n";
  auto both = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_FALSE(both);
  EXPECT_NE(both.error().message.find("parallelism.moe_a2a_overlap"), std::string::npos)
      << both.error().message;
  std::string alone = base;
  alone.replace(alone.find(" --moe-shared-expert-overlap"), 28, "");
  std::ofstream(script) << alone
                        << "  --overlap-moe-expert-parallel-comm\n  --delay-wgrad-compute\n";
  auto a2a = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(a2a) << a2a.error().message;
  EXPECT_EQ(value_at(a2a->scenario, "parallelism.moe_a2a_overlap"), "true");
  EXPECT_EQ(value_at(a2a->scenario, "parallelism.delay_wgrad_compute"), "true");
  EXPECT_TRUE(a2a->unmapped.empty());
  // Megatron-Core asks for the overlap with the delayed weight gradients; so does the import.
  std::ofstream(script) << alone << "  --delay-wgrad-compute\n";
  auto alone_delay =
      import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_FALSE(alone_delay);
  EXPECT_NE(alone_delay.error().message.find("parallelism.delay_wgrad_compute"), std::string::npos)
      << alone_delay.error().message;

  // The flex dispatcher with DeepEP (its default backend, or the older --moe-enable-deepep)
  // maps to parallelism.moe_dispatcher deepep, its HybridEP backend to hybridep; the NCCL-EP
  // backend is priced as the all-to-all.
  std::string flex = alone;
  flex.replace(flex.find("alltoall"), 8, "flex");
  flex += "  --expert-tensor-parallel-size 1 \\\n";
  std::ofstream(script) << flex << "  --moe-router-num-groups 8 --moe-router-group-topk 4 \\\n"
                        << "  --moe-enable-deepep\n";
  auto deepep =
      import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(deepep) << deepep.error().message;
  EXPECT_EQ(value_at(deepep->scenario, "parallelism.moe_dispatcher"), "deepep");
  EXPECT_EQ(value_at(deepep->scenario, "model.moe.router_groups"), "8");
  EXPECT_EQ(value_at(deepep->scenario, "model.moe.router_group_topk"), "4");
  EXPECT_TRUE(deepep->unmapped.empty());
  expect_round_trip(*deepep);
  std::ofstream(script) << flex << "  --moe-flex-dispatcher-backend hybridep\n";
  auto hybrid =
      import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(hybrid) << hybrid.error().message;
  EXPECT_EQ(value_at(hybrid->scenario, "parallelism.moe_dispatcher"), "hybridep");
  EXPECT_TRUE(hybrid->unmapped.empty());
  expect_round_trip(*hybrid);
  std::ofstream(script) << flex << "  --moe-flex-dispatcher-backend ncclep\n";
  auto nccl_ep =
      import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(nccl_ep) << nccl_ep.error().message;
  EXPECT_EQ(value_at(nccl_ep->scenario, "parallelism.moe_dispatcher"), "<missing>");
  EXPECT_NE(find_field(nccl_ep->unmapped, "--moe-token-dispatcher-type"), nullptr);

  // Per-layer CUDA graphs: Transformer Engine's with the listed modules; the local
  // implementation captures the router and the preprocess together; a full-iteration graph is
  // reported as not modelled.
  std::ofstream(script) << alone << "  --cuda-graph-impl transformer_engine \\\n"
                        << "  --cuda-graph-modules attn moe_router moe_preprocess\n";
  auto graphs =
      import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(graphs) << graphs.error().message;
  EXPECT_EQ(value_at(graphs->scenario, "training.cuda_graph_modules"),
            "[attn, moe_router, moe_preprocess]");
  EXPECT_TRUE(graphs->unmapped.empty());
  expect_round_trip(*graphs);
  std::ofstream(script) << alone << "  --cuda-graph-impl local --cuda-graph-scope moe_router\n";
  auto local =
      import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(local) << local.error().message;
  EXPECT_EQ(value_at(local->scenario, "training.cuda_graph_modules"),
            "[moe_router, moe_preprocess]");
  std::ofstream(script) << alone << "  --cuda-graph-impl full_iteration\n";
  auto full = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(full) << full.error().message;
  EXPECT_EQ(value_at(full->scenario, "training.cuda_graph_modules"), "<missing>");
  EXPECT_NE(find_field(full->unmapped, "--cuda-graph-impl"), nullptr);
  // A whole-layer graph (the deprecated --enable-cuda-graph with its default scope) of an MoE
  // layer needs the experts padded to capacity: module layer then, not modelled without.
  std::ofstream(script) << alone << "  --enable-cuda-graph\n";
  auto dropless =
      import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(dropless) << dropless.error().message;
  EXPECT_EQ(value_at(dropless->scenario, "training.cuda_graph_modules"), "<missing>");
  EXPECT_NE(find_field(dropless->unmapped, "--enable-cuda-graph"), nullptr);
  std::ofstream(script) << alone << "  --enable-cuda-graph --moe-expert-capacity-factor 1.0 \\\n"
                        << "  --moe-pad-expert-input-to-capacity\n";
  auto padded =
      import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(padded) << padded.error().message;
  EXPECT_EQ(value_at(padded->scenario, "training.cuda_graph_modules"), "[layer]");
  EXPECT_EQ(value_at(padded->scenario, "model.moe.pad_to_capacity"), "true");
  EXPECT_EQ(value_at(padded->scenario, "model.moe.capacity_factor"), "1");
  EXPECT_TRUE(padded->unmapped.empty())
      << fmt::format("{}", fmt::join(keys(padded->unmapped), ", "));
  expect_round_trip(*padded);

  // Megatron's defaults: top-2, the expert FFN of --ffn-hidden-size, every layer MoE; an
  // integer --moe-layer-freq N makes every N-th layer MoE from layer 0; expert TP given.
  std::ofstream(script)
      << "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 8 --hidden-size 1024 \\\n"
         "  --num-attention-heads 16 --ffn-hidden-size 2816 --seq-length 2048 \\\n"
         "  --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 16 \\\n"
         "  --vocab-size 32000 --num-experts 8 --moe-layer-freq 2 --expert-model-parallel-size 4 "
         "\\\n"
         "  --expert-tensor-parallel-size 1\n";
  r = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "model.moe.top_k"), "2");
  EXPECT_EQ(value_at(r->scenario, "model.moe.expert_ffn_hidden"), "2816");
  EXPECT_EQ(value_at(r->scenario, "model.moe.layer_freq"), "2");
  EXPECT_EQ(value_at(r->scenario, "parallelism.etp"), "1");
  EXPECT_TRUE(r->unmapped.empty()) << fmt::format("{}", fmt::join(keys(r->unmapped), ", "));
  expect_round_trip(*r);

  // A Megatron-Bridge recipe: TransformerConfig's names (num_moe_experts), None as null.
  const std::string recipe = dir.file("moe.yaml");
  std::stringstream bridge;
  bridge << std::ifstream(kDir + "megatron-bridge-recipe.yaml").rdbuf();
  std::string yaml = bridge.str();
  const std::string at = "  tensor_model_parallel_size: 2\n";
  ASSERT_NE(yaml.find(at), std::string::npos);
  std::ofstream(recipe) << yaml.replace(
      yaml.find(at), at.size(),
      at + "  num_moe_experts: 16\n  moe_router_topk: 4\n  moe_ffn_hidden_size: 1024\n"
           "  moe_shared_expert_intermediate_size: null\n  moe_expert_capacity_factor: 1.25\n"
           "  expert_model_parallel_size: 4\n  expert_tensor_parallel_size: null\n"
           "  moe_layer_freq: \"[0]+[1]*23\"\n  context_parallel_size: 1\n");
  r = import_config(Framework::kMegatron, {recipe},
                    {.sets = {"hardware.system=dgx-h100"}, .gpus = 8});
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "model.moe.experts"), "16");
  EXPECT_EQ(value_at(r->scenario, "model.moe.top_k"), "4");
  EXPECT_EQ(value_at(r->scenario, "model.moe.capacity_factor"), "1.25");
  EXPECT_EQ(value_at(r->scenario, "model.moe.first_k_dense"), "1");
  EXPECT_EQ(value_at(r->scenario, "parallelism.ep"), "4");
  EXPECT_EQ(value_at(r->scenario, "parallelism.etp"), "2");
  EXPECT_EQ(value_at(r->scenario, "parallelism.cp"), "1");
  EXPECT_EQ(find_path(r->scenario, "model.moe.shared_experts"), nullptr);
  // No moe_grouped_gemm: Megatron's default SequentialMLP, one expert after another.
  EXPECT_EQ(value_at(r->scenario, "training.moe_grouped_gemm"), "sequential");
  expect_round_trip(*r);

  // A pattern offsim's first_k_dense / layer_freq cannot express, or of the wrong length.
  std::ofstream(script) << base << "  --moe-layer-freq \"([1]*3+[0]*1)*12\"\n";
  r = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  expect_error(r,
               "--moe-layer-freq: layer 3 breaks the form offsim models: 0 "
               "dense layers, then every 1 layer(s) MoE");
  std::ofstream(script) << base << "  --moe-layer-freq \"([0]*3+[1]*44)\"\n";
  r = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("the pattern has 47 layers, --num-layers 48"), std::string::npos)
      << r.error().message;
  // Nesting deeper than 64 parentheses and expansions past a million layers are refused.
  for (const std::string& bad :
       {std::string(100, '(') + "[1]" + std::string(100, ')'), std::string("[1]*9999999")}) {
    std::ofstream(script) << base << "  --moe-layer-freq \"" << bad << "\"\n";
    r = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("expected a list expression of 0 and 1"), std::string::npos)
        << r.error().message;
  }
  std::ofstream(script) << base << "  --moe-layer-freq \"[0]*3+[2]*45\"\n";
  r = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("expected a list expression of 0 and 1"), std::string::npos)
      << r.error().message;
}

// --context-parallel-size splits each sequence: the data-parallel size is what TP x PP x CP
// leave; --cp-comm-type (one value per layer allowed) picks ring (p2p) or Ulysses (a2a).
TEST(MegatronImport, ContextParallelism) {
  const TempDir dir("import_cp");
  const std::string script = dir.file("train.sh");
  const std::string text = example_text("megatron-gpt-pretrain.sh");
  const std::string from = "--recompute-granularity selective";
  ASSERT_NE(text.find(from), std::string::npos);
  const auto with = [&](const std::string& flags) {
    std::ofstream(script) << std::string(text).replace(text.find(from), from.size(),
                                                       from + " " + flags);
    return import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  };
  // 16 GPUs = TP 4 x PP 2 x CP 2 (x DP 1).
  auto r = with("--context-parallel-size 2 --cp-comm-type a2a a2a");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "parallelism.cp"), "2");
  EXPECT_EQ(value_at(r->scenario, "parallelism.cp_comm_type"), "a2a");
  EXPECT_EQ(value_at(r->scenario, "parallelism.dp"), "1");
  EXPECT_TRUE(r->unmapped.empty()) << fmt::format("{}", fmt::join(keys(r->unmapped), ", "));
  expect_round_trip(*r);
  r = with("--context-parallel-size 2 --cp-comm-type p2p a2a");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(keys(r->unmapped), (std::vector<std::string>{"--cp-comm-type"}));
  r = with("--context-parallel-size 2 --cp-comm-type a2a+p2p");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(keys(r->unmapped), (std::vector<std::string>{"--cp-comm-type"}));
  r = with("--context-parallel-size 4");
  expect_error(r,
               "16 GPUs are not divisible by tensor x pipeline x context "
               "parallel size 4 x 2 x 4");
  r = with("--context-parallel-size 2 --cp-comm-type ring");
  expect_error(r,
               "--cp-comm-type: expected p2p, a2a, a2a+p2p or all_gather, got "
               "ring");
}

// --recompute-method block --recompute-num-layers N: the first N layers of every model chunk are
// recomputed, the others not (recompute.per_layer), as Megatron-Core's TransformerBlock does.
TEST(MegatronImport, BlockRecomputePerChunk) {
  const TempDir dir("import_blk");
  const std::string script = dir.file("train.sh");
  const std::string text = example_text("megatron-gpt-pretrain.sh");
  const std::string from = "--recompute-granularity selective";
  ASSERT_NE(text.find(from), std::string::npos);
  const auto with = [&](const std::string& flags) {
    std::ofstream(script) << std::string(text).replace(text.find(from), from.size(), flags);
    return import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  };
  const auto none = [](const ImportResult& r) {
    std::vector<int> layers;
    const Node* per = find_path(r.scenario, "recompute.per_layer");
    if (per == nullptr) return layers;
    for (const auto& [key, mode] : per->entries) {
      EXPECT_EQ(mode.scalar, "none");
      layers.push_back(std::stoi(key));
    }
    return layers;
  };
  // 32 layers over PP 2: layers 0-15 and 16-31; the first 3 of each recomputed.
  auto r = with("--recompute-granularity full --recompute-method block --recompute-num-layers 3");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "recompute.mode"), "full");
  std::vector<int> expected;
  for (int l = 3; l < 16; ++l) expected.push_back(l);
  for (int l = 19; l < 32; ++l) expected.push_back(l);
  auto got = none(*r);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, expected);
  EXPECT_TRUE(r->unmapped.empty()) << fmt::format("{}", fmt::join(keys(r->unmapped), ", "));
  expect_round_trip(*r);
  // Interleaved: chunks of 4 layers (stage 0 holds 0-3, 8-11, ...); the first of each.
  r = with(
      "--recompute-granularity full --recompute-method block --recompute-num-layers 1 "
      "--num-layers-per-virtual-pipeline-stage 4");
  ASSERT_TRUE(r) << r.error().message;
  got = none(*r);
  EXPECT_EQ(got.size(), 24u);
  for (int l : got) EXPECT_NE(l % 4, 0) << l;
  expect_round_trip(*r);
  // Megatron applies a recompute method only with full granularity.
  r = with("--recompute-granularity selective --recompute-method block --recompute-num-layers 2");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(keys(r->unmapped),
            (std::vector<std::string>{"--recompute-method", "--recompute-num-layers"}));
}

TEST(MegatronImport, RecomputeModulesList) {
  // --recompute-modules takes a list (nargs="+"): the modules offsim models go to
  // recompute.modules, the others are reported unmapped; the next flag ends the list.
  const TempDir dir("import_rm");
  const std::string script = dir.file("train.sh");
  const std::string text = example_text("megatron-gpt-pretrain.sh");
  const std::string from = "--recompute-granularity selective";
  ASSERT_NE(text.find(from), std::string::npos);
  std::ofstream(script) << std::string(text).replace(
      text.find(from), from.size(), from + " --recompute-modules layernorm shared_experts mhc mlp");
  auto r = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "recompute.mode"), "selective");
  EXPECT_EQ(value_at(r->scenario, "recompute.modules"), "[layernorm, shared_experts, mlp]");
  EXPECT_EQ(value_at(r->scenario, "training.micro_batch"), "1");
  EXPECT_NE(find_field(r->ignored, "--lr"), nullptr);  // the next line's flag ends the list
  // A list that closes the argument array ends there.
  std::ofstream(script) << std::string(text).replace(
      text.find(from), from.size(), from + " --recompute-modules layernorm\n)\ntorchrun");
  const ImportField* left = find_field(r->unmapped, "--recompute-modules");
  ASSERT_NE(left, nullptr);
  EXPECT_NE(left->reason.find("mhc not modelled"), std::string::npos) << left->reason;
  expect_round_trip(*r);
  r = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "recompute.modules"), "[layernorm]");
  // Without selective granularity Megatron ignores the list.
  std::ofstream(script) << std::string(text).replace(
      text.find(from), from.size(), "--recompute-granularity full --recompute-modules layernorm");
  r = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "recompute.mode"), "full");
  // Megatron-Core's full recompute re-runs the whole layer (tensor_parallel.checkpoint).
  EXPECT_EQ(value_at(r->scenario, "recompute.rerun"), "layer");
  EXPECT_NE(find_field(r->unmapped, "--recompute-modules"), nullptr);
}

TEST(MegatronImport, NullRecomputeGranularityIsNoRecompute) {
  // Megatron-Bridge's performance configs write recompute_granularity: null (Python None) to turn
  // off the recipe's recompute; the method and layer count then do nothing.
  const TempDir dir("import_rg_null");
  const std::string recipe = dir.file("recipe.yaml");
  std::stringstream bridge;
  bridge << std::ifstream(kDir + "megatron-bridge-recipe.yaml").rdbuf();
  std::string yaml = bridge.str();
  const std::string from = "recompute_granularity: full";
  ASSERT_NE(yaml.find(from), std::string::npos);
  std::ofstream(recipe) << yaml.replace(yaml.find(from), from.size(),
                                        "recompute_granularity: null");
  auto r = import_config(Framework::kMegatron, {recipe},
                         {.sets = {"hardware.system=dgx-a100-80gb"}, .gpus = 8});
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "recompute.mode"), "<missing>");
  EXPECT_NE(find_field(r->ignored, "--recompute-method"), nullptr);
  expect_round_trip(*r);
}

TEST(MegatronImport, EmbeddingAndLossSlotsInThePipelineSplit) {
  // Meta's Llama 3 405B split: 126 layers + the embedding and loss slots, one slot per virtual
  // stage over 16 stages: 8 virtual stages.
  const TempDir dir("import_pl");
  const std::string script = dir.file("train.sh");
  std::ofstream(script)
      << "torchrun --nproc_per_node 8 --nnodes 16 pretrain_gpt.py --tensor-model-parallel-size 8"
         " --pipeline-model-parallel-size 16 --num-layers 126 --hidden-size 16384"
         " --num-attention-heads 128 --vocab-size 128256 --position-embedding-type rope "
         "--max-position-embeddings 8192"
         " --num-layers-per-virtual-pipeline-stage 1 --micro-batch-size 1 --global-batch-size 2048"
         " --seq-length 8192 --bf16"
         " --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split\n";
  auto r = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "parallelism.virtual_stages"), "8");
  EXPECT_EQ(value_at(r->scenario, "parallelism.account_for_embedding_in_pipeline_split"), "true");
  EXPECT_EQ(value_at(r->scenario, "parallelism.account_for_loss_in_pipeline_split"), "true");
  // Without the slots 126 layers do not split into runs of 1 over 16 stages x 8.
  std::ofstream(script)
      << "torchrun --nproc_per_node 8 --nnodes 16 pretrain_gpt.py --tensor-model-parallel-size 8"
         " --pipeline-model-parallel-size 16 --num-layers 126 --hidden-size 16384"
         " --num-attention-heads 128 --vocab-size 128256 --position-embedding-type rope "
         "--max-position-embeddings 8192"
         " --num-layers-per-virtual-pipeline-stage 4"
         " --account-for-embedding-in-pipeline-split\n";
  r = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  expect_error(r, "does not divide --num-layers 126 + 1 (embedding and loss)");
}

TEST(MegatronImport, PipelineLayoutAndMultiTokenPrediction) {
  // Megatron-Bridge's DeepSeek-V3 layout at PP8 x VP4 (deepseek_llm_pretrain.py): 32 stages, so
  // 4 virtual stages, derived from the layout as Megatron derives them.
  const TempDir dir("import_ly");
  const std::string script = dir.file("train.sh");
  const auto write = [&](const std::string& layout) {
    std::ofstream(script)
        << "torchrun --nproc_per_node 8 --nnodes 8 pretrain_gpt.py --tensor-model-parallel-size 1"
           " --pipeline-model-parallel-size 8 --num-layers 61 --hidden-size 7168"
           " --num-attention-heads 128 --vocab-size 129280 --position-embedding-type rope"
           " --micro-batch-size 1 --global-batch-size 64 --seq-length 4096 --bf16"
           " --mtp-num-layers 1 --pipeline-model-parallel-layout '"
        << layout << "'\n";
  };
  write("Et|(tt|)*30mL");
  auto r = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "parallelism.layout"), "Et|(tt|)*30mL");
  EXPECT_EQ(value_at(r->scenario, "parallelism.virtual_stages"), "4");
  EXPECT_EQ(value_at(r->scenario, "parallelism.schedule"), "interleaved_1f1b");
  EXPECT_EQ(value_at(r->scenario, "model.mtp_layers"), "1");
  write("Et|(tt|)*29mL");  // 31 stages over 8
  r = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  expect_error(r, "31 stages do not divide over pipeline size 8");
  write("Et|(tt|)*30qL");
  r = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("'q' is none"), std::string::npos) << r.error().message;
}

TEST(DeepSpeedImport, ZeroOffloadExample) {
  auto r = import_config(
      Framework::kDeepSpeed, {kDir + "deepspeed-zero-offload.json"},
      {.sets = {"model=llama3-8b", "training.seq_len=2048", "hardware.system=dgx-h100"}});
  ASSERT_TRUE(r) << r.error().message;
  const Node& d = r->scenario;
  // 64 = 4 (micro) x 2 (accumulation) x 8 (data parallel).
  EXPECT_EQ(value_at(d, "parallelism.dp"), "8");
  EXPECT_EQ(value_at(d, "training.global_batch"), "64");
  EXPECT_EQ(value_at(d, "training.micro_batch"), "4");
  EXPECT_EQ(value_at(d, "training.precision"), "bf16");
  EXPECT_EQ(value_at(d, "training.optimizer"), "adamw");
  EXPECT_EQ(value_at(d, "parallelism.zero_stage"), "2");
  EXPECT_EQ(value_at(d, "parallelism.overlap_grad_reduce"), "true");
  EXPECT_EQ(value_at(d, "offload.rules.0.tensor"), "optimizer_states");
  EXPECT_EQ(value_at(d, "offload.rules.1.tensor"), "master_weights");
  EXPECT_EQ(value_at(d, "offload.rules.2.tensor"), "grads");
  EXPECT_EQ(value_at(d, "offload.optimizer"), "cpu");
  EXPECT_EQ(mapped(*r).at("zero_optimization.offload_optimizer.device"), "offload.rules");
  EXPECT_EQ(find_field(r->mapped, "zero_optimization.stage")->origin,
            kDir + "deepspeed-zero-offload.json:10:14");
  EXPECT_EQ(keys(r->unmapped), (std::vector<std::string>{"zero_optimization.reduce_bucket_size"}));
  EXPECT_EQ(keys(r->ignored),
            (std::vector<std::string>{"zero_optimization.contiguous_gradients", "gradient_clipping",
                                      "steps_per_print", "optimizer.params.lr",
                                      "optimizer.params.weight_decay", "wall_clock_breakdown"}));
  expect_round_trip(*r);
}

TEST(DeepSpeedImport, ValuesDeepSpeedRefuses) {
  const TempDir dir("ds");
  const std::string cfg = dir.file("ds.json");
  const ImportOptions opt{
      .sets = {"model=llama3-8b", "training.seq_len=2048", "hardware.system=dgx-h100"}};
  std::ofstream(cfg) << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
 "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 4}})";
  auto r = import_config(Framework::kDeepSpeed, {cfg}, opt);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, cfg +
                                   ":2:67: zero_optimization.stage: expected an integer in "
                                   "0..3 (DeepSpeed accepts no other), got 4");
  std::ofstream(cfg) << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
 "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2,
 "offload_param": {"device": "cpu"}}})";
  r = import_config(Framework::kDeepSpeed, {cfg}, opt);
  expect_error(r, "offload_param.device: parameter offload needs ZeRO stage 3");
  std::ofstream(cfg) << R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4,
 "gradient_accumulation_steps": 1})";
  r = import_config(Framework::kDeepSpeed, {cfg}, opt);
  expect_error(r, cfg + ":1:22: train_batch_size: is not micro batch 4");
}

// context_parallel_degree: FSDP over what replicate x tp x pp x cp leave, cp ranks sharing a
// sequence; the K/V rotation: "alltoall" is offsim's ring, the default "allgather" is listed.
TEST(TorchtitanImport, ContextParallelism) {
  const TempDir dir("import_ttcp");
  const std::string job = dir.file("cp.toml");
  const std::string text = example_text("torchtitan-llama3-8b.toml");
  const std::string from = "context_parallel_degree = 1";
  ASSERT_NE(text.find(from), std::string::npos);
  const auto with = [&](const std::string& lines, int gpus) {
    std::ofstream(job) << std::string(text).replace(text.find(from), from.size(), lines);
    return import_config(Framework::kTorchtitan, {job},
                         {.sets = {"hardware.system=dgx-h100"}, .gpus = gpus});
  };
  auto r = with("context_parallel_degree = 2\ncontext_parallel_rotate_method = \"alltoall\"", 8);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "parallelism.cp"), "2");
  EXPECT_EQ(value_at(r->scenario, "parallelism.cp_comm_type"), "p2p");
  EXPECT_EQ(value_at(r->scenario, "parallelism.dp"), "4");
  EXPECT_EQ(value_at(r->scenario, "training.global_batch"), "4");
  EXPECT_TRUE(r->unmapped.empty()) << fmt::format("{}", fmt::join(keys(r->unmapped), ", "));
  expect_round_trip(*r);
  r = with("context_parallel_degree = 2", 8);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(keys(r->unmapped),
            (std::vector<std::string>{"parallelism.context_parallel_rotate_method"}));
  EXPECT_EQ(r->unmapped.front().origin, "torchtitan default");
  r = with("context_parallel_degree = 4", 6);
  expect_error(r,
               "--gpus 6: not divisible by replicate x tensor x pipeline x "
               "context degrees 4");
}

// HSDP: data_parallel_replicate_degree beside a shard degree is hybrid sharding over the shard x
// context ranks (torchtitan's dp_shard_cp mesh), replicated over the rest.
TEST(TorchtitanImport, HybridSharding) {
  const TempDir dir("import_tthsdp");
  const std::string job = dir.file("hsdp.toml");
  std::string text = example_text("torchtitan-llama3-8b.toml");
  const std::string shard = "data_parallel_replicate_degree = 1\ndata_parallel_shard_degree = -1";
  ASSERT_NE(text.find(shard), std::string::npos);
  std::ofstream(job) << text.replace(
      text.find(shard), shard.size(),
      "data_parallel_replicate_degree = 2\ndata_parallel_shard_degree = -1");
  auto r = import_config(Framework::kTorchtitan, {job},
                         {.sets = {"hardware.system=dgx-h100"}, .gpus = 16});
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "parallelism.dp"), "16");
  EXPECT_EQ(value_at(r->scenario, "parallelism.fsdp"), "true");
  EXPECT_EQ(value_at(r->scenario, "parallelism.fsdp_shard"), "8");
  EXPECT_TRUE(r->unmapped.empty()) << fmt::format("{}", fmt::join(keys(r->unmapped), ", "));
  expect_round_trip(*r);
  // With FSDP's CPU offload each host holds its shard group's share: still hybrid sharding.
  const std::string cpu_offload = "enable_cpu_offload = false";
  ASSERT_NE(text.find(cpu_offload), std::string::npos);
  std::ofstream(job) << text.replace(text.find(cpu_offload), cpu_offload.size(),
                                     "enable_cpu_offload = true");
  auto off = import_config(Framework::kTorchtitan, {job},
                           {.sets = {"hardware.system=dgx-h100"}, .gpus = 16});
  ASSERT_TRUE(off) << off.error().message;
  EXPECT_EQ(value_at(off->scenario, "parallelism.fsdp_shard"), "8");
  EXPECT_EQ(value_at(off->scenario, "offload.preset"), "fsdp_cpu_offload");
  EXPECT_TRUE(off->unmapped.empty()) << fmt::format("{}", fmt::join(keys(off->unmapped), ", "));
  expect_round_trip(*off);
}

// An MoE flavor and expert parallelism: with torchtitan's default sharded data parallelism the
// experts are sharded over what EP leaves of data_parallel_shard_degree; EP must borrow from the
// shard degree (torchtitan's ParallelDims check), so replicated data parallelism cannot host it.
TEST(TorchtitanImport, ExpertParallelism) {
  const TempDir dir("import_ttep");
  const std::string job = dir.file("moe.toml");
  std::string text = example_text("torchtitan-llama3-8b.toml");
  for (const auto& [from, to] :
       {std::pair<std::string, std::string>{"name = \"llama3\"", "name = \"qwen3\""},
        {"flavor = \"8B\"", "flavor = \"30B-A3B\""},
        {"context_parallel_degree = 1",
         "context_parallel_degree = 1\nexpert_parallel_degree = 4"}}) {
    ASSERT_NE(text.find(from), std::string::npos) << from;
    text.replace(text.find(from), from.size(), to);
  }
  std::ofstream(job) << text;
  auto r = import_config(Framework::kTorchtitan, {job},
                         {.sets = {"hardware.system=dgx-h100"}, .gpus = 8});
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "model.base"), "qwen3-30b-a3b");
  EXPECT_EQ(value_at(r->scenario, "training.moe_grouped_gemm"), "single_kernel");  // _grouped_mm
  EXPECT_EQ(value_at(r->scenario, "parallelism.ep"), "4");
  EXPECT_EQ(value_at(r->scenario, "parallelism.dp"), "8");
  EXPECT_EQ(value_at(r->scenario, "parallelism.fsdp"), "true");
  expect_round_trip(*r);
  const std::string shard = "data_parallel_replicate_degree = 1\ndata_parallel_shard_degree = -1";
  ASSERT_NE(text.find(shard), std::string::npos);
  std::ofstream(job) << text.replace(
      text.find(shard), shard.size(),
      "data_parallel_replicate_degree = 8\ndata_parallel_shard_degree = 1");
  r = import_config(Framework::kTorchtitan, {job},
                    {.sets = {"hardware.system=dgx-h100"}, .gpus = 8});
  expect_error(r, "expert_parallel_degree 4 with expert_tensor_parallel_degree 1: torchtitan");
  // HSDP: the experts sharded over what EP leaves of each shard group, replicated across them.
  const std::string replicated =
      "data_parallel_replicate_degree = 8\ndata_parallel_shard_degree = 1";
  std::ofstream(job) << text.replace(
      text.find(replicated), replicated.size(),
      "data_parallel_replicate_degree = 2\ndata_parallel_shard_degree = -1");
  r = import_config(Framework::kTorchtitan, {job},
                    {.sets = {"hardware.system=dgx-h100"}, .gpus = 16});
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(value_at(r->scenario, "parallelism.fsdp_shard"), "8");
  EXPECT_EQ(value_at(r->scenario, "parallelism.ep"), "4");
  EXPECT_TRUE(r->unmapped.empty()) << fmt::format("{}", fmt::join(keys(r->unmapped), ", "));
  expect_round_trip(*r);
}

TEST(TorchtitanImport, FsdpExample) {
  auto r = import_config(Framework::kTorchtitan, {kDir + "torchtitan-llama3-8b.toml"},
                         {.sets = {"hardware.system=dgx-h100"}, .gpus = 8});
  ASSERT_TRUE(r) << r.error().message;
  const Node& d = r->scenario;
  EXPECT_EQ(value_at(d, "model.base"), "llama3-8b");
  // torchtitan's SDPA runs PyTorch's FlashAttention-2 kernels below sm100.
  EXPECT_EQ(value_at(d, "model.attention"), "flash2");
  EXPECT_EQ(value_at(d, "parallelism.dp"), "8");
  EXPECT_EQ(value_at(d, "parallelism.fsdp"), "true");
  EXPECT_EQ(value_at(d, "parallelism.tp"), "1");
  EXPECT_EQ(value_at(d, "parallelism.pp"), "1");
  EXPECT_EQ(value_at(d, "training.micro_batch"), "1");
  EXPECT_EQ(value_at(d, "training.global_batch"), "8");
  EXPECT_EQ(value_at(d, "training.seq_len"), "8192");
  EXPECT_EQ(value_at(d, "training.precision"), "bf16");
  EXPECT_EQ(value_at(d, "training.optimizer"), "adamw");
  EXPECT_EQ(value_at(d, "recompute"), "selective");
  EXPECT_EQ(mapped(*r).at("model.flavor"), "model");
  EXPECT_EQ(find_field(r->mapped, "parallelism.data_parallel_shard_degree")->origin,
            kDir + "torchtitan-llama3-8b.toml:28:30");
  EXPECT_TRUE(r->unmapped.empty()) << fmt::format("{}", fmt::join(keys(r->unmapped), ", "));
  // mixed_precision_reduce is ignored by name; the rest in toml++'s order (sorted keys).
  EXPECT_EQ(keys(r->ignored),
            (std::vector<std::string>{"training.mixed_precision_reduce", "job.description",
                                      "job.dump_folder", "model.tokenizer_path", "optimizer.eps",
                                      "optimizer.lr", "training.max_norm", "training.steps"}));
  expect_round_trip(*r);

  auto cpu = import_config(Framework::kTorchtitan, {kDir + "torchtitan-llama3-8b.toml"},
                           {.sets = {"hardware.system=dgx-h100"}, .gpus = 6});
  ASSERT_TRUE(cpu) << cpu.error().message;
  EXPECT_EQ(value_at(cpu->scenario, "hardware.gpus"), "6");
  // From sm100 torchtitan asks for cuDNN's attention first: the default fused attention; and an
  // attention the scenario sets itself is kept.
  auto b200 = import_config(Framework::kTorchtitan, {kDir + "torchtitan-llama3-8b.toml"},
                            {.sets = {"hardware.system=dgx-b200"}, .gpus = 8});
  ASSERT_TRUE(b200) << b200.error().message;
  EXPECT_EQ(value_at(b200->scenario, "model"), "llama3-8b");
  auto own = import_config(
      Framework::kTorchtitan, {kDir + "torchtitan-llama3-8b.toml"},
      {.sets = {"hardware.system=dgx-h100", "model={base: llama3-8b, attention: classic}"},
       .gpus = 8});
  ASSERT_TRUE(own) << own.error().message;
  EXPECT_EQ(value_at(own->scenario, "model.attention"), "classic");
}

TEST(TorchtitanImport, TomlErrorsAndBadValues) {
  const TempDir dir("tt");
  const std::string cfg = dir.file("job.toml");
  std::ofstream(cfg) << "[training]\nlocal_batch_size = = 2\n";
  auto r = import_config(Framework::kTorchtitan, {cfg}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message.rfind(cfg + ":2:", 0), 0u) << r.error().message;
  std::ofstream(cfg) << "[activation_checkpoint]\nmode = \"sometimes\"\n[training]\n"
                        "local_batch_size = 1\n[parallelism]\ndata_parallel_shard_degree = 2\n";
  r = import_config(Framework::kTorchtitan, {cfg}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, cfg +
                                   ":2:8: activation_checkpoint.mode: expected one of none, "
                                   "selective, full, got \"sometimes\"");
}

// The command: --out writes the scenario, `offsim run --print-effective` accepts it, --strict
// turns an unmapped key into exit status 2.
TEST(ImportCommand, OutputRunsAndStrictFails) {
  const TempDir dir("impcli");
  const std::string out = dir.file("ds.yaml");
  const std::vector<std::string> args = {"import",    "--from",
                                         "deepspeed", kDir + "deepspeed-zero-offload.json",
                                         "--set",     "model=llama3-8b",
                                         "--set",     "training.seq_len=2048",
                                         "--set",     "hardware.system=dgx-h100"};
  std::vector<std::string> a = args;
  a.insert(a.end(), {"--out", out});
  const std::string so = dir.file("so.txt"), se = dir.file("se.txt");
  EXPECT_EQ(testing::wait_exit(testing::spawn_process(OFFSIM_CLI_PATH, a, so, se)), 0);
  EXPECT_NE(testing::read_file(se).find(
                "zero_optimization.reduce_bucket_size: not mapped: bucket and prefetch sizes"),
            std::string::npos);
  EXPECT_EQ(testing::wait_exit(
                testing::spawn_process(OFFSIM_CLI_PATH, {"run", out, "--print-effective"}, so, se)),
            0)
      << testing::read_file(se);
  EXPECT_NE(testing::read_file(so).find("zero_stage: 2"), std::string::npos);
  a = args;
  a.push_back("--strict");
  EXPECT_EQ(testing::wait_exit(testing::spawn_process(OFFSIM_CLI_PATH, a, so, se)), 2);
  EXPECT_NE(testing::read_file(se).find("--strict refuses them"), std::string::npos);
  // --out is checked like every output: never an input (the recipe would be overwritten), never
  // a format the command does not write; nothing is written then.
  const std::string recipe = dir.file("recipe.yaml");
  fs::copy_file(kDir + "megatron-bridge-recipe.yaml", recipe);
  const std::string before = testing::read_file(recipe);
  EXPECT_EQ(testing::wait_exit(
                testing::spawn_process(OFFSIM_CLI_PATH,
                                       {"import", "--from", "megatron", recipe, "--gpus", "8",
                                        "--set", "hardware.system=dgx-a100-80gb", "--out", recipe},
                                       so, se)),
            2);
  EXPECT_NE(testing::read_file(se).find("--out"), std::string::npos) << testing::read_file(se);
  EXPECT_EQ(testing::read_file(recipe), before);
  a = args;
  a.insert(a.end(), {"--out", dir.file("ds.parquet")});
  EXPECT_EQ(testing::wait_exit(testing::spawn_process(OFFSIM_CLI_PATH, a, so, se)), 2);
  EXPECT_FALSE(fs::exists(dir.file("ds.parquet")));
}

}  // namespace
}  // namespace offsim::scenarios

namespace offsim::scenarios {
namespace {

// JAX memory_analysis() JSON: the sums, the strict reading, and `offsim run --jax-memory`.
TEST(JaxMemory, ReadsSumsAndComparesWithTheForecast) {
  const TempDir dir("jax");
  const std::string file = dir.file("mem.json");
  // 16 GiB of donated arguments (params + optimizer state) aliased by the outputs, 20 GiB of
  // temporaries, 1 MiB of code: XLA's total is 16 + 16 - 16 + 20 GiB + 1 MiB.
  std::ofstream(file) << R"({"argument_size_in_bytes": 17179869184,
 "output_size_in_bytes": 17179869184, "alias_size_in_bytes": 17179869184,
 "temp_size_in_bytes": 21474836480, "generated_code_size_in_bytes": 1048576,
 "host_temp_size_in_bytes": 4096, "device": "cuda:0"})";
  auto jax = read_jax_memory(file);
  ASSERT_TRUE(jax) << jax.error().message;
  EXPECT_EQ(jax->device_total_bytes(), 17179869184 + 21474836480 + 1048576);
  EXPECT_EQ(jax->host_total_bytes(), 4096);
  models::Report r;
  r.hbm_peak_bytes = 38654705664 + 1048576;  // the same 36 GiB + 1 MiB
  r.memory.params_bytes = std::int64_t{1} << 30;
  r.memory.optimizer_bytes = std::int64_t{3} << 30;
  r.memory.grads_bytes = std::int64_t{1} << 30;
  const nlohmann::json j = jax_memory_comparison(*jax, r);
  EXPECT_EQ(j["hbm_ratio"].get<double>(), 1.0);
  EXPECT_EQ(j["offsim"]["persistent_bytes"].get<std::int64_t>(), 4LL << 30);
  EXPECT_EQ(j["offsim"]["transient_bytes"].get<std::int64_t>(), 1LL << 30);
  EXPECT_NE(format_jax_memory(*jax, r).find("offsim HBM peak / JAX total: 1.000"),
            std::string::npos);

  std::ofstream(file) << R"({"argument_size_in_bytes": 1, "output_size_in_bytes": 1,
 "temp_size_in_bytes": -5})";
  auto bad = read_jax_memory(file);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, file +
                                     ":2:24: temp_size_in_bytes: expected an integer number "
                                     "of bytes >= 0, got -5");
  std::ofstream(file) << R"({"argument_size_in_bytes": 1, "output_size_in_bytes": 1,
 "temp_size_in_bytes": 5, "tmp_size_in_bytes": 3})";
  bad = read_jax_memory(file);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find(":2:48: tmp_size_in_bytes: not a memory_analysis() field"),
            std::string::npos)
      << bad.error().message;
  std::ofstream(file) << R"({"argument_size_in_bytes": 1, "temp_size_in_bytes": 5})";
  bad = read_jax_memory(file);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("output_size_in_bytes: missing"), std::string::npos);

  // The CLI shows both views; the JSON record carries them as jax_memory.* columns.
  std::ofstream(file) << R"({"argument_size_in_bytes": 17179869184,
 "output_size_in_bytes": 17179869184, "alias_size_in_bytes": 17179869184,
 "temp_size_in_bytes": 21474836480})";
  const std::string so = dir.file("so.txt"), se = dir.file("se.txt");
  const std::string scenario = "scenarios/examples/zero-offload-1gpu.yaml";
  EXPECT_EQ(
      testing::wait_exit(testing::spawn_process(
          OFFSIM_CLI_PATH, {"run", scenario, "--jax-memory", file, "--format", "json"}, so, se)),
      0)
      << testing::read_file(se);
  const nlohmann::json out = nlohmann::json::parse(testing::read_file(so));
  ASSERT_TRUE(out.is_array());
  const double ratio = out[0]["jax_memory.hbm_ratio"].get<double>();
  EXPECT_EQ(ratio, out[0]["hbm_peak_bytes"].get<double>() / 38654705664.0);
  EXPECT_EQ(testing::wait_exit(testing::spawn_process(
                OFFSIM_CLI_PATH, {"run", scenario, "--jax-memory", file}, so, se)),
            0);
  EXPECT_NE(testing::read_file(so).find("JAX memory_analysis()"), std::string::npos);
  EXPECT_EQ(testing::wait_exit(testing::spawn_process(
                OFFSIM_CLI_PATH, {"run", scenario, scenario, "--jax-memory", file}, so, se)),
            2);
}

}  // namespace
}  // namespace offsim::scenarios

namespace offsim::scenarios {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("offsim_imp_more_{}", ::getpid());
  fs::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

TEST(MaxTextImport, CustomRematAndPipelineMicrobatches) {
  ImportOptions opt{.sets = {"hardware.system=dgx-h100"},
                    .framework_overrides = {
                        "remat_policy=custom", "decoder_layer_input=offload", "context=device",
                        "mlpwi=remat", "ici_fsdp_parallelism=2", "ici_pipeline_parallelism=4",
                        "per_device_batch_size=2", "num_pipeline_microbatches=8"}};
  auto r = import_config(Framework::kMaxText,
                         {kDir + "maxtext-base.yml", kDir + "maxtext-llama3-8b.yml"}, opt);
  ASSERT_TRUE(r) << r.error().message;
  const Node& d = r->scenario;
  EXPECT_EQ(value_at(d, "recompute"), "full");
  EXPECT_EQ(value_at(d, "offload.rules.0.tensor"), "decoder_layer_input");
  EXPECT_EQ(value_at(d, "offload.rules.0.where"), "host");
  EXPECT_EQ(value_at(d, "offload.rules.1.tensor"), "context");
  EXPECT_EQ(value_at(d, "offload.rules.1.where"), "hbm");
  EXPECT_EQ(find_path(d, "offload.rules.2"), nullptr);
  EXPECT_EQ(mapped(*r).at("mlpwi"), "recompute (full)");
  // 8 devices = fsdp 2 x pipeline 4; a replica's 4 devices x 2 sequences = 8 sequences in 8
  // pipeline micro-batches of 1.
  EXPECT_EQ(value_at(d, "parallelism.dp"), "2");
  EXPECT_EQ(value_at(d, "parallelism.pp"), "4");
  EXPECT_EQ(value_at(d, "training.micro_batch"), "1");
  EXPECT_EQ(value_at(d, "training.global_batch"), "16");
}

TEST(MegatronImport, ActivationAndOptimizerOffloadTogether) {
  const std::string script = write_temp(
      "offload.sh",
      "torchrun --nproc_per_node=8 pretrain_gpt.py --tensor-model-parallel-size 8 \\\n"
      "  --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --vocab-size 32000 \\\n"
      "  --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 \\\n"
      "  --global-batch-size 8 --bf16 --cpu-offloading --cpu-offloading-num-layers 16 \\\n"
      "  --optimizer-cpu-offload --optimizer-offload-fraction 1.0 --fp16\n");
  auto r = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("--fp16: --fp16 and --bf16 are exclusive"), std::string::npos)
      << r.error().message;
  std::ofstream(script) << "torchrun --nproc_per_node=8 pretrain_gpt.py "
                           "--tensor-model-parallel-size 8 --num-layers 32 --hidden-size 4096 "
                           "--num-attention-heads 32 --vocab-size 32000 --seq-length 2048 "
                           "--max-position-embeddings 2048 --micro-batch-size 1 "
                           "--global-batch-size 8 --bf16 --cpu-offloading "
                           "--cpu-offloading-num-layers 16 --optimizer-cpu-offload\n";
  r = import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(r) << r.error().message;
  const Node& d = r->scenario;
  EXPECT_EQ(value_at(d, "parallelism.dp"), "1");
  EXPECT_EQ(value_at(d, "offload.rules.0.tensor"), "activations");
  EXPECT_EQ(value_at(d, "offload.rules.0.layers.first"), "16");
  EXPECT_EQ(value_at(d, "offload.rules.1.tensor"), "optimizer_states");
  EXPECT_EQ(value_at(d, "offload.rules.1.where"), "host");
  // HybridDeviceOptimizer keeps the fp32 master on the GPU and, by default, does not overlap
  // its copies with the CPU update.
  EXPECT_EQ(value_at(d, "offload.rules.2.tensor"), "master_weights");
  EXPECT_EQ(value_at(d, "offload.rules.2.where"), "hbm");
  EXPECT_EQ(value_at(d, "offload.optimizer"), "cpu");
  EXPECT_EQ(value_at(d, "offload.cpu.overlap_d2h_h2d"), "false");
  std::ofstream(script, std::ios::app) << "  --overlap-cpu-optimizer-d2h-h2d\n";
  auto overlapped =
      import_config(Framework::kMegatron, {script}, {.sets = {"hardware.system=dgx-h100"}});
  ASSERT_TRUE(overlapped) << overlapped.error().message;
  EXPECT_EQ(value_at(overlapped->scenario, "offload.cpu.overlap_d2h_h2d"), "true");
  // Megatron's GPT defaults where the script is silent.
  EXPECT_EQ(value_at(d, "model.activation"), "gelu");
  EXPECT_EQ(value_at(d, "model.linear_bias"), "true");
  EXPECT_EQ(value_at(d, "model.dropout"), "true");
  EXPECT_EQ(value_at(d, "model.max_positions"), "2048");
}

TEST(DeepSpeedImport, SuperOffloadBlock) {
  // DeepSpeedExamples' SuperOffload config (finetune_qwen3-14b_1gpu.sh): super_offload, ratio,
  // cpuadam_cores_perc and sub_group_size reach offload.cpu.superoffload; without ZeRO-3 it is
  // refused, and without super_offload ratio is reported as not modelled.
  const std::string cfg = write_temp("so.json", R"({"train_batch_size": 4,
 "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 3, "overlap_comm": false, "reduce_bucket_size": 4e8,
 "sub_group_size": 4e8, "offload_optimizer": {"device": "cpu", "pin_memory": true,
 "ratio": 0.90, "super_offload": true, "cpuadam_cores_perc": 0.90}}})");
  const ImportOptions opts{.sets = {"model=llama3-8b", "training.seq_len=4096",
                                    "hardware.system=gh200", "training.micro_batch=4"},
                           .gpus = 1};
  auto r = import_config(Framework::kDeepSpeed, {cfg}, opts);
  ASSERT_TRUE(r) << r.error().message;
  const Node& d = r->scenario;
  EXPECT_EQ(value_at(d, "offload.cpu.superoffload.ratio"), "0.9");
  EXPECT_EQ(value_at(d, "offload.cpu.superoffload.cpuadam_cores_perc"), "0.9");
  EXPECT_EQ(value_at(d, "offload.cpu.superoffload.sub_group_size"), "400000000");
  EXPECT_EQ(find_field(r->unmapped, "zero_optimization.sub_group_size"), nullptr);
  expect_round_trip(*r);
  const std::string stage2 = write_temp("so2.json", R"({"train_micro_batch_size_per_gpu": 4,
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "super_offload": true}}})");
  auto bad = import_config(Framework::kDeepSpeed, {stage2}, opts);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("SuperOffload needs ZeRO stage 3"), std::string::npos)
      << bad.error().message;
  const std::string plain = write_temp("so3.json", R"({"train_micro_batch_size_per_gpu": 4,
 "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})");
  auto p = import_config(Framework::kDeepSpeed, {plain}, opts);
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_NE(find_field(p->unmapped, "zero_optimization.offload_optimizer.ratio"), nullptr);
}

TEST(DeepSpeedImport, ZenFlowBlock) {
  // The core-binding blog's zf_config.json: ZenFlow's keys reach offload.cpu.zenflow on the
  // flat-partition step; "auto" intervals are reported; ZenFlow without CPU offload is refused.
  const std::string cfg =
      write_temp("zf.json", R"({"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true},
 "zenflow": {"topk_ratio": 0.1, "update_interval": 4, "full_warm_up_rounds": 0,
 "overlap_step": true, "pt_reserved_cores_perc": 0.5}}})");
  const ImportOptions opts{.sets = {"model=qwen2.5-3b", "training.seq_len=1024",
                                    "hardware.system=dgx-a100-40gb", "training.micro_batch=4"},
                           .gpus = 2};
  auto r = import_config(Framework::kDeepSpeed, {cfg}, opts);
  ASSERT_TRUE(r) << r.error().message;
  const Node& d = r->scenario;
  EXPECT_EQ(value_at(d, "offload.cpu.step"), "flat_partition");
  EXPECT_EQ(value_at(d, "offload.cpu.zenflow.topk_ratio"), "0.1");
  EXPECT_EQ(value_at(d, "offload.cpu.zenflow.update_interval"), "4");
  EXPECT_EQ(value_at(d, "offload.cpu.zenflow.overlap_step"), "true");
  EXPECT_EQ(value_at(d, "offload.cpu.zenflow.pt_reserved_cores_perc"), "0.5");
  EXPECT_NE(find_field(r->ignored, "zero_optimization.zenflow.full_warm_up_rounds"), nullptr);
  expect_round_trip(*r);
  const std::string autos = write_temp("zf_auto.json", R"({"train_micro_batch_size_per_gpu": 4,
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
 "zenflow": {"update_interval": "auto", "select_interval": "auto"}}})");
  auto a = import_config(Framework::kDeepSpeed, {autos}, opts);
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_NE(find_field(a->unmapped, "zero_optimization.zenflow.update_interval"), nullptr);
  const std::string no_offload = write_temp("zf_gpu.json", R"({"train_micro_batch_size_per_gpu": 4,
 "zero_optimization": {"stage": 2, "zenflow": {"topk_ratio": 0.1}}})");
  auto bad = import_config(Framework::kDeepSpeed, {no_offload}, opts);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("zero_optimization.zenflow.topk_ratio"), std::string::npos)
      << bad.error().message;
  EXPECT_NE(bad.error().message.find("ZenFlow needs"), std::string::npos) << bad.error().message;
}

TEST(DeepSpeedImport, Stage3ParameterOffloadAndNvme) {
  const std::string cfg =
      write_temp("z3.json",
                 R"({"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": true},
 "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": false},
 "offload_optimizer": {"device": "nvme"}}})");
  auto r = import_config(
      Framework::kDeepSpeed, {cfg},
      {.sets = {"model=llama3-8b", "training.seq_len=2048", "hardware.system=dgx-h100"},
       .gpus = 8});
  ASSERT_TRUE(r) << r.error().message;
  const Node& d = r->scenario;
  EXPECT_EQ(value_at(d, "parallelism.dp"), "8");
  EXPECT_EQ(value_at(d, "training.global_batch"), "16");  // 2 x 1 (DeepSpeed's default) x 8
  EXPECT_EQ(value_at(d, "training.precision"), "fp16");
  EXPECT_EQ(value_at(d, "parallelism.zero_stage"), "3");
  EXPECT_EQ(value_at(d, "offload.rules.0.tensor"), "optimizer_states");
  EXPECT_EQ(value_at(d, "offload.rules.3.tensor"), "params");
  EXPECT_EQ(keys(r->unmapped),
            (std::vector<std::string>{"zero_optimization.offload_optimizer.device",
                                      "zero_optimization.offload_param.pin_memory"}));
}

TEST(DeepSpeedImport, Stage3PrefetchBucketSizeSetsTheBackwardPrefetch) {
  // 0 turns ZeRO-3's parameter prefetch off; a size (or Accelerate's "auto") keeps it on.
  const ImportOptions opts{
      .sets = {"model=llama3-8b", "training.seq_len=2048", "hardware.system=dgx-h100"}, .gpus = 8};
  const auto prefetch_of = [&](const std::string& value) {
    const std::string cfg = write_temp("pf.json", R"({"train_micro_batch_size_per_gpu": 2,
 "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": )" +
                                                      value + "}}");
    auto r = import_config(Framework::kDeepSpeed, {cfg}, opts);
    EXPECT_TRUE(r) << r.error().message;
    if (!r) return std::string("(error)");
    EXPECT_EQ(find_field(r->unmapped, "zero_optimization.stage3_prefetch_bucket_size"), nullptr);
    expect_round_trip(*r);
    return std::string(value_at(r->scenario, "parallelism.backward_prefetch"));
  };
  EXPECT_EQ(prefetch_of("0"), "none");
  EXPECT_EQ(prefetch_of("5e7"), "pre");
  EXPECT_EQ(prefetch_of("\"auto\""), "<missing>");  // the default, pre
  const std::string bad = write_temp("pf2.json", R"({"train_micro_batch_size_per_gpu": 2,
 "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": -1}})");
  auto r = import_config(Framework::kDeepSpeed, {bad}, opts);
  expect_error(r, "zero_optimization.stage3_prefetch_bucket_size");
}

TEST(TorchtitanImport, TensorParallelAndCpuOffload) {
  const std::string cfg = write_temp("tp.toml",
                                     "[model]\nname = \"llama3\"\nflavor = \"70B\"\n"
                                     "[training]\nlocal_batch_size = 2\nseq_len = 4096\n"
                                     "global_batch_size = 32\nenable_cpu_offload = true\n"
                                     "[parallelism]\ndata_parallel_shard_degree = -1\n"
                                     "tensor_parallel_degree = 4\npipeline_parallel_degree = 2\n"
                                     "pipeline_parallel_schedule = \"ZBVZeroBubble\"\n");
  auto r = import_config(Framework::kTorchtitan, {cfg},
                         {.sets = {"hardware.system=dgx-h100"}, .gpus = 16});
  ASSERT_TRUE(r) << r.error().message;
  const Node& d = r->scenario;
  EXPECT_EQ(value_at(d, "model.base"), "llama3-70b");
  EXPECT_EQ(value_at(d, "parallelism.dp"), "2");
  EXPECT_EQ(value_at(d, "parallelism.tp"), "4");
  EXPECT_EQ(value_at(d, "parallelism.sequence_parallel"), "true");
  EXPECT_EQ(value_at(d, "parallelism.pp"), "2");
  EXPECT_EQ(value_at(d, "training.global_batch"), "32");
  EXPECT_EQ(value_at(d, "offload.preset"), "fsdp_cpu_offload");
  // torchtitan builds a fused AdamW unless optimizer.implementation says otherwise.
  EXPECT_EQ(value_at(d, "offload.cpu.adam"), "torch_fused");
  EXPECT_EQ(value_at(d, "hardware.nodes"), "2");
  EXPECT_EQ(keys(r->unmapped),
            (std::vector<std::string>{"parallelism.pipeline_parallel_schedule"}));
  std::ofstream(cfg, std::ios::app) << "[optimizer]\nimplementation = \"foreach\"\n";
  auto foreach = import_config(Framework::kTorchtitan, {cfg},
                               {.sets = {"hardware.system=dgx-h100"}, .gpus = 16});
  ASSERT_TRUE(foreach) << foreach.error().message;
  EXPECT_EQ(value_at(foreach->scenario, "offload.cpu.adam"), "torch");
}

}  // namespace
}  // namespace offsim::scenarios
