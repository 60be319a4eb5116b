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

TEST(PipelineLayout, ListedLayoutBuildsEachStagesLayers) {
  // DeepSeek-V3's recipe layout for PP16 (Megatron-Bridge deepseek_v3.py, layout_map[(16, 1)]).
  const auto stages = parse_pipeline_layout("Et*4|(t*4|)*14,tmL");
  ASSERT_TRUE(stages) << stages.error().message;
  ASSERT_EQ(stages->size(), 16U);
  EXPECT_TRUE(stages->front().embedding);
  EXPECT_EQ(stages->front().decoders, 4);
  EXPECT_EQ((*stages)[7].decoders, 4);
  EXPECT_FALSE((*stages)[7].embedding || (*stages)[7].loss || (*stages)[7].mtp > 0);
  EXPECT_EQ(stages->back().decoders, 1);
  EXPECT_EQ(stages->back().mtp, 1);
  EXPECT_TRUE(stages->back().loss);
  ParallelConfig p{.pp = 16};
  p.layout = *stages;
  // Written back in Megatron's string form, which parses to the same stages.
  const std::string text = layout_string(p);
  EXPECT_EQ(text.substr(0, 10), "Et*4|t*4|t");
  EXPECT_EQ(text.substr(text.size() - 4), "|tmL");
  const auto again = parse_pipeline_layout(text);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->size(), 16U);
  const PipelineLayout dsv3 = pipeline_layout(61, p);
  EXPECT_TRUE(dsv3.even());
  EXPECT_TRUE(dsv3.unequal());
  EXPECT_EQ(dsv3.span(15, 0).first, 60);
  EXPECT_EQ(dsv3.span(15, 0).count, 1);
  EXPECT_EQ(dsv3.place(3), std::make_pair(0, 0));
  EXPECT_EQ(dsv3.place(4), std::make_pair(1, 0));
  EXPECT_EQ(dsv3.place(60), std::make_pair(15, 0));
  EXPECT_FALSE(pipeline_layout(64, p).even());  // the layout lists 61 layers
  // Megatron-Bridge's PP8 x VP4 layout (deepseek_llm_pretrain.py, H100): entry i is chunk i / 8
  // of stage i % 8, so chunk 1 of stage 0 is entry 8.
  ParallelConfig h100{.pp = 8, .virtual_stages = 4};
  const auto h = parse_pipeline_layout("Et|(tt|)*30mL");
  ASSERT_TRUE(h) << h.error().message;
  h100.layout = *h;
  const PipelineLayout l = pipeline_layout(61, h100);
  ASSERT_TRUE(l.even());
  EXPECT_EQ(l.span(0, 1).first, 15);
  EXPECT_EQ(l.span(0, 1).count, 2);
  EXPECT_EQ(l.span(7, 3).count, 0);  // the MTP module and the loss alone
  EXPECT_EQ(l.stage_layers(0), 7);
  EXPECT_EQ(l.stage_layers(7), 6);
  // What Megatron's parser refuses, and expansions that would not fit in memory.
  const auto message = [](const std::string& text) {
    const auto r = parse_pipeline_layout(text);
    return r ? std::string("parsed") : r.error().message;
  };
  EXPECT_NE(message("Etx|tL").find("'x' is none"), std::string::npos) << message("Etx|tL");
  EXPECT_NE(message("(t|)*999999999L").find("at most"), std::string::npos);
  EXPECT_NE(message("E(tt|L").find("closes"), std::string::npos);
  EXPECT_NE(message("EEt|tL").find("at most once"), std::string::npos);
  EXPECT_NE(message("Et*|tL").find("count"), std::string::npos);
  // Scaled to fewer layers (offsim replay --layers): in proportion, a stage of decoder layers
  // alone keeping one; the embedding, the MTP module and the loss where they were.
  ParallelConfig scaled{.pp = 16};
  scaled.layout = scale_layout(*stages, 32);
  std::string middle;
  for (int i = 0; i < 13; ++i) middle += "t*2|";
  EXPECT_EQ(layout_string(scaled), "Et*2|t*3|" + middle + "tmL");
  EXPECT_TRUE(pipeline_layout(32, scaled).even());
  scaled.layout = scale_layout(*stages, 16);
  middle.clear();
  for (int i = 0; i < 13; ++i) middle += "t|";
  EXPECT_EQ(layout_string(scaled), "Et|t*2|" + middle + "mL");
  EXPECT_TRUE(pipeline_layout(16, scaled).even());
  EXPECT_FALSE(pipeline_layout(14, scaled).even());
}

TEST(PipelineLayout, ScenarioCheckRefusesWhatMegatronRefuses) {
  Scenario s;
  s.name = "t";
  s.model = *find_model("llama3-8b");
  s.model.layers = 8;
  s.hardware.system = "dgx-h100";
  s.hardware.gpus = 2;
  s.training = {.global_batch = 8, .micro_batch = 1, .seq_len = 2048};
  s.parallelism.pp = 2;
  const auto check = [&](const std::string& layout) {
    s.parallelism.layout = *parse_pipeline_layout(layout);
    const auto st = check_scenario(s);
    return st ? std::string() : st.error().message;
  };
  EXPECT_EQ(check("Ettt|tttttL"), "");  // uneven stages are the point of a layout
  EXPECT_NE(check("Ett|tt|ttttL").find("3 stages; expected parallelism.pp"), std::string::npos);
  EXPECT_NE(check("Ettt|ttttL").find("7 decoder layers (t); expected model.layers = 8"),
            std::string::npos);
  EXPECT_NE(check("EttttL|tttt").find("holds the loss"), std::string::npos);
  EXPECT_NE(check("tttt|EttttL").find("holds the embedding"), std::string::npos);
  EXPECT_NE(check("Etttt|tttt").find("0 loss(es)"), std::string::npos);
  EXPECT_NE(check("Etttt|ttttmL").find("1 MTP modules (m); expected model.mtp_layers = 0"),
            std::string::npos);
  s.model.mtp_layers = 1;
  EXPECT_EQ(check("Etttt|ttttmL"), "");
  EXPECT_NE(check("Ettttm|ttttL").find("MTP modules"), std::string::npos);
  s.parallelism.pp = 4;
  EXPECT_NE(check("Etttt||ttttmL|").find("stage 1 builds nothing"), std::string::npos);
  s.parallelism.pp = 2;
  s.parallelism.account_for_loss_in_pipeline_split = true;
  EXPECT_NE(check("Etttt|ttttmL").find("account_for_loss_in_pipeline_split false"),
            std::string::npos);
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
