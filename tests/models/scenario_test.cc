// Scenario checks, the catalogue, Hugging Face import and offload presets.
#include "models/scenario.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace offsim::models {
namespace {

Scenario llama70b_on_8() {
  Scenario s;
  s.name = "t";
  s.model = *find_model("llama3-70b");
  s.hardware.system = "dgx-h100";
  s.training = {.global_batch = 16, .micro_batch = 1, .seq_len = 4096};
  s.parallelism = {.dp = 1, .tp = 8};
  return s;
}

TEST(PipelineLayout, EmbeddingAndLossTakeALayersPlace) {
  // Llama 3 405B as Meta split it: 126 layers + embedding + loss = 128 slots over 16 stages x 8
  // chunks, one slot each (chunk c of stage s is run c·16 + s).
  const PipelineLayout meta{
      .layers = 126, .pp = 16, .virtual_stages = 8, .embedding_slots = 1, .loss_slots = 1};
  ASSERT_TRUE(meta.even());
  EXPECT_EQ(meta.span(0, 0).count, 0);  // the embedding alone
  EXPECT_EQ(meta.span(1, 0).first, 0);
  EXPECT_EQ(meta.span(1, 0).count, 1);
  EXPECT_EQ(meta.span(0, 1).first, 15);
  EXPECT_EQ(meta.span(14, 7).first, 125);
  EXPECT_EQ(meta.span(15, 7).count, 0);  // the loss alone
  EXPECT_EQ(meta.stage_layers(0), 7);
  EXPECT_EQ(meta.stage_layers(7), 8);
  EXPECT_EQ(meta.stage_layers(15), 7);
  EXPECT_EQ(meta.place(0), std::make_pair(1, 0));
  EXPECT_EQ(meta.place(125), std::make_pair(14, 7));
  // Every layer is built once, by the chunk place() names.
  std::vector<int> built(126, 0);
  for (int st = 0; st < 16; ++st) {
    for (int c = 0; c < 8; ++c) {
      const PipelineLayout::Span sp = meta.span(st, c);
      for (int l = sp.first; l < sp.first + sp.count; ++l) {
        ++built[static_cast<std::size_t>(l)];
        EXPECT_EQ(meta.place(l), std::make_pair(st, c)) << l;
      }
    }
  }
  EXPECT_EQ(std::count(built.begin(), built.end(), 1), 126);
  // Without slots: equal runs; the embedding slot alone shortens only the first chunk.
  const PipelineLayout plain{.layers = 32, .pp = 4, .virtual_stages = 2};
  EXPECT_EQ(plain.span(1, 1).first, 20);
  EXPECT_EQ(plain.span(1, 1).count, 4);
  const PipelineLayout embed{.layers = 7, .pp = 2, .embedding_slots = 1};
  EXPECT_EQ(embed.span(0, 0).count, 3);
  EXPECT_EQ(embed.span(1, 0).first, 3);
  EXPECT_EQ(embed.span(1, 0).count, 4);
  EXPECT_FALSE((PipelineLayout{.layers = 126, .pp = 16, .virtual_stages = 8}).even());
  // A stage fraction counts the stage's own layers: half of stage 0's 7 (round(3.5) = 4).
  LayerSelection half{.kind = LayerSelection::Kind::kStageFraction, .fraction = 0.5};
  int picked = 0;
  for (int l = 0; l < 126; ++l) picked += half.contains(l, meta) && meta.place(l).first == 0;
  EXPECT_EQ(picked, 4);
}

TEST(PipelineLayout, ScenarioCheckNamesTheSlots) {
  Scenario s;
  s.model = *find_model("llama3-8b");
  s.model.layers = 30;
  s.hardware.system = "dgx-h100";
  s.hardware.gpus = 4;
  s.training = {.global_batch = 8, .micro_batch = 1, .seq_len = 2048};
  s.parallelism = {.pp = 4, .account_for_embedding_in_pipeline_split = true};
  auto bad = check_scenario(s);  // 30 + 1 = 31 slots over 4 stages
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("model.layers 30 + 1 (the embedding and loss slots"),
            std::string::npos)
      << bad.error().message;
  s.parallelism.account_for_loss_in_pipeline_split = true;  // 30 + 2 = 32
  EXPECT_TRUE(check_scenario(s)) << check_scenario(s).error().message;
}

TEST(Catalogue, ParameterCountsMatchPublishedModels) {
  // Hugging Face model cards / safetensors totals.
  EXPECT_EQ(parameter_count(*find_model("llama2-7b")), 6'738'415'616);
  EXPECT_EQ(parameter_count(*find_model("llama3-8b")), 8'030'261'248);
  EXPECT_EQ(parameter_count(*find_model("llama2-70b")), 68'976'648'192);
  EXPECT_EQ(parameter_count(*find_model("llama3-70b")), 70'553'706'496);
}

TEST(Catalogue, MegatronSizesFollowTheirFormula) {
  // P = 12·l·h² + 13·l·h + (V + s)·h + 2h (final LayerNorm); 174.6B and 1.7B rows of the paper.
  for (const auto& [name, billions] :
       std::vector<std::pair<std::string, double>>{{"megatron-174.6b", 174.6},
                                                   {"megatron-1.7b", 1.7},
                                                   {"megatron-145.6b", 145.6},
                                                   {"megatron-1008b", 1008.0}}) {
    const ModelArch m = *find_model(name);
    const std::int64_t l = m.layers, h = m.hidden, v = m.vocab_size, s = m.max_positions;
    EXPECT_EQ(parameter_count(m), 12 * l * h * h + 13 * l * h + (v + s) * h + 2 * h) << name;
    // The paper rounds (its 1.7B row is 1.65B by its own formula).
    EXPECT_NEAR(static_cast<double>(parameter_count(m)) / 1e9, billions, billions * 0.04) << name;
  }
}

TEST(Catalogue, UnknownModelListsKnownOnes) {
  auto r = find_model("gpt-5");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, sim::ErrorCode::kNotFound);
  EXPECT_NE(r.error().message.find("llama3-70b"), std::string::npos);
  EXPECT_TRUE(find_model("Llama3.1-405B"));
  EXPECT_TRUE(find_model("gemma-2b"));
  EXPECT_GE(list_models().size(), 20u);
}

TEST(HfConfig, ImportsLlama) {
  const std::string json = R"({"model_type": "llama", "hidden_size": 4096,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": false})";
  auto m = model_from_hf_config(json, "config.json");
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(parameter_count(*m), parameter_count(*find_model("llama3-8b")));
  EXPECT_EQ(m->head_dim, 128);
}

TEST(HfConfig, ErrorsNameTheKey) {
  auto missing = model_from_hf_config(R"({"model_type": "llama", "hidden_size": 10})", "c.json");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("c.json: missing key 'num_hidden_layers'"),
            std::string::npos);
  auto type = model_from_hf_config(R"({"model_type": "bert"})", "c.json");
  ASSERT_FALSE(type);
  EXPECT_EQ(type.error().code, sim::ErrorCode::kUnsupported);
  EXPECT_FALSE(model_from_hf_config("[1,", "c.json"));
}

TEST(CheckScenario, AcceptsAValidScenario) { EXPECT_TRUE(check_scenario(llama70b_on_8(), 8)); }

TEST(CheckScenario, NamesTheKeyPath) {
  Scenario s = llama70b_on_8();
  s.parallelism.tp = 3;
  auto st = check_scenario(s);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().message, "parallelism.tp: 3 does not divide model.heads 64");

  s = llama70b_on_8();
  s.training.global_batch = 7;
  s.parallelism = {.dp = 2, .tp = 4};
  st = check_scenario(s);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("training.global_batch: 7"), std::string::npos);

  s = llama70b_on_8();
  s.parallelism = {.dp = 1, .tp = 1, .pp = 3};
  st = check_scenario(s);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("model.layers 80 is not divisible"), std::string::npos);

  s = llama70b_on_8();
  s.parallelism = {.dp = 2, .tp = 8};
  st = check_scenario(s, 8);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("16 does not equal the 8 GPUs"), std::string::npos);

  s = llama70b_on_8();
  s.hardware.gpus = 16;
  s.parallelism = {.dp = 2, .tp = 8};
  st = check_scenario(s, 8);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("hardware.gpus: 16 is more than"), std::string::npos);

  s = llama70b_on_8();
  s.offload.rules.push_back({.cls = TensorClass::kNamedActivation, .name = "mlp"});
  st = check_scenario(s);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("offload.rules[0].name: 'mlp'"), std::string::npos);

  s = llama70b_on_8();
  s.offload.optimizer_on_cpu = true;
  EXPECT_FALSE(check_scenario(s));
}

TEST(Presets, EveryListedPresetResolves) {
  PresetOptions o;
  o.names = {"decoder_layer_input"};
  for (const PresetInfo& p : list_presets()) {
    auto r = offload_preset(p.name, o);
    ASSERT_TRUE(r) << p.name << ": " << r.error().message;
    EXPECT_EQ(r->preset, p.name);
    Scenario s = llama70b_on_8();
    s.offload = *r;
    EXPECT_TRUE(check_scenario(s)) << p.name;
  }
  EXPECT_FALSE(offload_preset("nope", o));
  EXPECT_FALSE(offload_preset("jax_save_and_offload_only_these_names", {}));
}

TEST(Presets, MegatronNumLayersSelectsTheFirstLayers) {
  auto p = offload_preset("megatron_activation_offload", {.num_layers = 10});
  ASSERT_TRUE(p);
  ASSERT_EQ(p->rules.size(), 1u);
  EXPECT_TRUE(p->rules[0].layers.contains(9, 80));
  EXPECT_FALSE(p->rules[0].layers.contains(10, 80));
}

TEST(Presets, ZeroOffloadRunsAdamOnTheCpu) {
  auto p = offload_preset("zero_offload", {});
  ASSERT_TRUE(p);
  EXPECT_TRUE(p->optimizer_on_cpu);
}

}  // namespace
}  // namespace offsim::models
