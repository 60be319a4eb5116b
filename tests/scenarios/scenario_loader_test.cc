#include "scenarios/scenario_loader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "models/evaluate.h"

namespace offsim::scenarios {
namespace {

namespace fs = std::filesystem;

constexpr const char* kBase =
    "name: t\n"                                // line 1
    "model: llama3-8b\n"                       // line 2
    "hardware:\n"                              // line 3
    "  system: h100-1gpu\n"                    // line 4
    "training:\n"                              // line 5
    "  global_batch: 8\n"                      // line 6
    "  micro_batch: 2\n"                       // line 7
    "  seq_len: 2048\n"                        // line 8
    "parallelism:\n"                           // line 9
    "  tp: 1\n"                                // line 10
    "recompute: selective\n"                   // line 11
    "offload: megatron_activation_offload\n";  // line 12

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("offsim_loader_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  // Loads, maps and checks; returns the first error message or "".
  std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
    const std::string path = write("s.yaml", text);
    auto file = load_scenario_file(path, sets);
    if (!file) return file.error().message;
    auto s = scenario_from_document(file->base, file->base_dir);
    if (!s) return s.error().message;
    auto st = check_loaded(*s, file->base);
    if (!st) return st.error().message;
    return "";
  }

  // Loads and maps; the scenario (a failure is a test failure).
  models::Scenario scenario_of(const std::string& text, const std::vector<std::string>& sets) {
    auto file = load_scenario_file(write("s.yaml", text), sets);
    EXPECT_TRUE(file) << file.error().message;
    if (!file) return {};
    auto s = scenario_from_document(file->base, file->base_dir);
    EXPECT_TRUE(s) << s.error().message;
    return s ? *s : models::Scenario{};
  }

  std::string replace(std::string text, const std::string& from, const std::string& to) {
    const auto pos = text.find(from);
    EXPECT_NE(pos, std::string::npos) << from;
    return text.replace(pos, from.size(), to);
  }

  std::string p(const std::string& suffix) { return (dir_ / "s.yaml").string() + suffix; }

  fs::path dir_;
};

TEST_F(LoaderTest, LoadsAValidScenario) {
  const std::string path = write("s.yaml", kBase);
  auto file = load_scenario_file(path);
  ASSERT_TRUE(file) << file.error().message;
  auto s = scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->name, "t");
  EXPECT_EQ(s->model.name, "llama3-8b");
  EXPECT_EQ(s->model.layers, 32);
  EXPECT_EQ(s->training.micro_batch, 2);
  EXPECT_EQ(s->recompute.mode, models::RecomputeConfig::Mode::kSelective);
  ASSERT_EQ(s->offload.rules.size(), 1u);
  EXPECT_EQ(s->offload.rules[0].cls, models::TensorClass::kActivations);
  EXPECT_TRUE(check_loaded(*s, file->base));
}

TEST_F(LoaderTest, UnknownKeyNamesFileLineColumnAndPath) {
  const std::string text =
      replace(kBase, "  seq_len: 2048\n", "  seq_len: 2048\n  micro_bach: 1\n");
  EXPECT_EQ(error_of(text),
            p(":9:15: training.micro_bach: unknown key; expected one of global_batch, "
              "micro_batch, seq_len, precision, fp8_recipe, fp32_master_weights, "
              "store_param_remainders, loss_chunks, "
              "gradient_accumulation_fusion, moe_grouped_gemm, cuda_graph_modules, dtype_preset, "
              "dtypes, optimizer"));
  EXPECT_EQ(error_of(std::string(kBase) + "colour: red\n"),
            p(":13:9: colour: unknown key; expected one of name, model, hardware, training, "
              "parallelism, recompute, offload, remat_policy, sweep"));
}

TEST_F(LoaderTest, WrongTypeSaysWhatWasExpectedAndGot) {
  EXPECT_EQ(error_of(replace(kBase, "micro_batch: 2", "micro_batch: two")),
            p(":7:16: training.micro_batch: expected an integer in 1..1073741824, got \"two\""));
  EXPECT_EQ(
      error_of(replace(kBase, "micro_batch: 2", "micro_batch: [2]")),
      p(":7:16: training.micro_batch: expected an integer in 1..1073741824, got a list of 1"));
  EXPECT_EQ(error_of(replace(kBase, "hardware:\n  system: h100-1gpu\n", "hardware: h100\n")),
            p(":3:11: hardware: expected a map, got \"h100\""));
  EXPECT_EQ(error_of(replace(kBase, "  tp: 1\n", "  sequence_parallel: yes\n")),
            p(":10:22: parallelism.sequence_parallel: expected true or false, got \"yes\""));
}

TEST_F(LoaderTest, BadValuesAreErrors) {
  EXPECT_EQ(error_of(replace(kBase, "micro_batch: 2", "micro_batch: 0")),
            p(":7:16: training.micro_batch: expected an integer in 1..1073741824, got 0"));
  EXPECT_EQ(error_of(replace(kBase, "recompute: selective", "recompute: partial")),
            p(":11:12: recompute: expected one of none, selective, full, got \"partial\""));
  const std::string model_error = error_of(replace(kBase, "model: llama3-8b", "model: llama9"));
  EXPECT_EQ(model_error.rfind(p(":2:8: model: expected a catalogue model ("), 0), 0u)
      << model_error;
  const std::string system_error = error_of(replace(kBase, "system: h100-1gpu", "system: tpu"));
  EXPECT_EQ(system_error.rfind(p(":4:11: hardware.system: expected one of "), 0), 0u)
      << system_error;
  const std::string preset_error =
      error_of(replace(kBase, "offload: megatron_activation_offload", "offload: everything"));
  EXPECT_EQ(preset_error.rfind(p(":12:10: offload: expected a preset ("), 0), 0u) << preset_error;
}

TEST_F(LoaderTest, CpuOptimizerThreadOptions) {
  // offload.cpu.bind_cores / offload.cpu.threads reach the scenario, also through --set on a
  // preset written as a plain name; bad values name the key.
  const std::string path =
      write("s.yaml", replace(kBase, "offload: megatron_activation_offload",
                              "offload:\n  preset: zero_offload\n  cpu:\n    bind_cores: true\n"
                              "    threads: 32"));
  auto file = load_scenario_file(path);
  ASSERT_TRUE(file) << file.error().message;
  auto s = scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_TRUE(s->offload.cpu_bind_cores);
  EXPECT_EQ(s->offload.cpu_threads, 32);
  EXPECT_TRUE(check_loaded(*s, file->base));
  const std::string negative = error_of(kBase, {"offload.cpu.threads=-4"});
  EXPECT_NE(negative.find("offload.cpu.threads: expected an integer in 1..65536"),
            std::string::npos)
      << negative;
  const std::string unknown = error_of(kBase, {"offload.cpu.pin=1"});
  EXPECT_NE(unknown.find("offload.cpu"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("pin"), std::string::npos) << unknown;
}

TEST_F(LoaderTest, CpuStepIsTypedAndSetByTheZeroOffloadPreset) {
  // offload.cpu.step: the zero_offload preset runs DeepSpeed's flat-partition step; a written
  // policy chooses either; the resolved document keeps it; a bad value names the key.
  const auto load = [&](const std::string& offload) {
    const std::string path =
        write("s.yaml", replace(kBase, "offload: megatron_activation_offload", offload));
    auto file = load_scenario_file(path);
    EXPECT_TRUE(file) << file.error().message;
    auto s = scenario_from_document(file->base, file->base_dir);
    EXPECT_TRUE(s) << s.error().message;
    EXPECT_TRUE(check_loaded(*s, file->base));
    return s->offload.cpu_step;
  };
  using Step = models::OffloadPolicy::CpuStep;
  EXPECT_EQ(load("offload: zero_offload"), Step::kFlatPartition);
  EXPECT_EQ(load("offload: fsdp_cpu_offload"), Step::kPerGroup);
  EXPECT_EQ(load("offload:\n  rules:\n    - {tensor: optimizer_states, where: host}\n"
                 "  optimizer: cpu\n  cpu:\n    step: flat_partition"),
            Step::kFlatPartition);
  const std::string bad = error_of(kBase, {"offload.cpu.step=flat"});
  EXPECT_NE(bad.find("offload.cpu.step"), std::string::npos) << bad;
  EXPECT_NE(bad.find("per_group, flat_partition"), std::string::npos) << bad;
}

TEST_F(LoaderTest, HybridDeviceOptimizerOverlapKey) {
  // offload.cpu.overlap_d2h_h2d: the megatron_optimizer_offload preset runs Megatron's default
  // (false), --set turns it on for a preset written as a plain name, the effective scenario
  // keeps it through a reload, and a step whose copies it does not order refuses false.
  const std::string megatron =
      replace(kBase, "offload: megatron_activation_offload", "offload: megatron_optimizer_offload");
  const models::Scenario preset = scenario_of(megatron, {});
  EXPECT_FALSE(preset.offload.cpu_overlap_d2h_h2d);
  EXPECT_TRUE(
      scenario_of(megatron, {"offload.cpu.overlap_d2h_h2d=true"}).offload.cpu_overlap_d2h_h2d);
  EXPECT_TRUE(scenario_of(kBase, {}).offload.cpu_overlap_d2h_h2d);
  const std::string effective = emit_yaml(scenario_to_document(preset));
  EXPECT_NE(effective.find("overlap_d2h_h2d: false"), std::string::npos) << effective;
  EXPECT_FALSE(scenario_of(effective, {}).offload.cpu_overlap_d2h_h2d);
  const std::string flat =
      error_of(replace(kBase, "offload: megatron_activation_offload", "offload: zero_offload"),
               {"offload.cpu.overlap_d2h_h2d=false"});
  EXPECT_NE(flat.find("offload.cpu.overlap_d2h_h2d: false orders the copies of Megatron's "
                      "per-group host step"),
            std::string::npos)
      << flat;
  const std::string bad = error_of(megatron, {"offload.cpu.overlap_d2h_h2d=sometimes"});
  EXPECT_NE(bad.find("offload.cpu.overlap_d2h_h2d"), std::string::npos) << bad;
}

TEST_F(LoaderTest, CpuAdamKey) {
  // offload.cpu.adam: each preset's framework optimizer (FSDP: torch's default, Megatron: torch
  // fused, ZeRO-Offload: DeepSpeed's), --set on a preset name, the effective scenario through a
  // reload, and a refusal where the host step is DeepSpeed's own.
  using Adam = models::OffloadPolicy::CpuAdam;
  const auto with = [&](const std::string& preset) {
    return replace(kBase, "offload: megatron_activation_offload", "offload: " + preset);
  };
  EXPECT_EQ(scenario_of(with("fsdp_cpu_offload"), {}).offload.cpu_adam, Adam::kTorch);
  EXPECT_EQ(scenario_of(with("fsdp2_cpu_offload_policy"), {}).offload.cpu_adam, Adam::kTorch);
  EXPECT_EQ(scenario_of(with("megatron_optimizer_offload"), {}).offload.cpu_adam,
            Adam::kTorchFused);
  EXPECT_EQ(scenario_of(with("zero_offload"), {}).offload.cpu_adam, Adam::kDeepSpeed);
  const models::Scenario fused =
      scenario_of(with("fsdp_cpu_offload"), {"offload.cpu.adam=torch_fused"});
  EXPECT_EQ(fused.offload.cpu_adam, Adam::kTorchFused);
  const std::string effective = emit_yaml(scenario_to_document(fused));
  EXPECT_NE(effective.find("adam: torch_fused"), std::string::npos) << effective;
  EXPECT_EQ(scenario_of(effective, {}).offload.cpu_adam, Adam::kTorchFused);
  const std::string flat = error_of(with("zero_offload"), {"offload.cpu.adam=torch"});
  EXPECT_NE(flat.find("offload.cpu.adam: torch names the CPU Adam of a per-group host step"),
            std::string::npos)
      << flat;
  const std::string bad = error_of(with("fsdp_cpu_offload"), {"offload.cpu.adam=apex"});
  EXPECT_NE(bad.find("offload.cpu.adam"), std::string::npos) << bad;
  EXPECT_NE(bad.find("deepspeed, torch_fused, torch"), std::string::npos) << bad;
}

TEST_F(LoaderTest, ZenFlowKeys) {
  // offload.cpu.zenflow: DeepSpeed's defaults when a key is left out, the keys reach the scenario
  // and the resolved document; bad values, unknown keys and a step that is not DeepSpeed's
  // flat partition name the key.
  const auto load = [&](const std::string& zenflow) {
    const std::string path = write(
        "s.yaml", replace(kBase, "offload: megatron_activation_offload",
                          "offload:\n  preset: zero_offload\n  cpu:\n    zenflow:" + zenflow));
    auto file = load_scenario_file(path);
    EXPECT_TRUE(file) << file.error().message;
    auto s = scenario_from_document(file->base, file->base_dir);
    EXPECT_TRUE(s) << s.error().message;
    EXPECT_TRUE(check_loaded(*s, file->base));
    return s->offload.zenflow;
  };
  const models::OffloadPolicy::ZenFlow d = load(" {}");
  EXPECT_TRUE(d.enabled);
  EXPECT_DOUBLE_EQ(d.topk_ratio, 0.1);
  EXPECT_EQ(d.update_interval, 4);
  EXPECT_FALSE(d.overlap_step);
  EXPECT_DOUBLE_EQ(d.reserved_cores, 0.5);
  const models::OffloadPolicy::ZenFlow z = load(
      "\n      topk_ratio: 0.05\n      update_interval: 8\n      overlap_step: true\n"
      "      select_interval: 8");
  EXPECT_DOUBLE_EQ(z.topk_ratio, 0.05);
  EXPECT_EQ(z.update_interval, 8);
  EXPECT_TRUE(z.overlap_step);
  const std::string zf = "offload:\n  preset: zero_offload\n  cpu:\n    zenflow: {}";
  const std::string with = replace(kBase, "offload: megatron_activation_offload", zf);
  const std::string ratio = error_of(with, {"offload.cpu.zenflow.topk_ratio=1.5"});
  EXPECT_NE(ratio.find("offload.cpu.zenflow.topk_ratio: expected a number in [0, 1]"),
            std::string::npos)
      << ratio;
  const std::string interval = error_of(with, {"offload.cpu.zenflow.update_interval=auto"});
  EXPECT_NE(interval.find("offload.cpu.zenflow.update_interval: expected an integer"),
            std::string::npos)
      << interval;
  const std::string select = error_of(with, {"offload.cpu.zenflow.select_interval=2"});
  EXPECT_NE(select.find("offload.cpu.zenflow.select_interval: expected at least update_interval"),
            std::string::npos)
      << select;
  const std::string unknown = error_of(with, {"offload.cpu.zenflow.topk=0.2"});
  EXPECT_NE(unknown.find("offload.cpu.zenflow"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("topk"), std::string::npos) << unknown;
  const std::string step = error_of(
      replace(kBase, "offload: megatron_activation_offload",
              "offload:\n  preset: fsdp_cpu_offload\n  cpu:\n    zenflow: {overlap_step: true}"));
  EXPECT_NE(step.find("offload.cpu.zenflow: ZenFlow extends DeepSpeed's ZeRO-Offload step"),
            std::string::npos)
      << step;
}

TEST_F(LoaderTest, SuperOffloadKeys) {
  // offload.cpu.superoffload: DeepSpeed's defaults (ratio 1, cpuadam_cores_perc 0.8,
  // sub_group_size 1e9) when a key is left out, the keys reach the scenario; ZeRO-3 is required,
  // and bad values, unknown keys and ZenFlow alongside name the key.
  const std::string zero3 = replace(kBase, "  tp: 1\n", "  tp: 1\n  zero_stage: 3\n");
  const auto load = [&](const std::string& so) {
    const std::string path = write(
        "s.yaml", replace(zero3, "offload: megatron_activation_offload",
                          "offload:\n  preset: zero_offload\n  cpu:\n    superoffload:" + so));
    auto file = load_scenario_file(path);
    EXPECT_TRUE(file) << file.error().message;
    auto s = scenario_from_document(file->base, file->base_dir);
    EXPECT_TRUE(s) << s.error().message;
    EXPECT_TRUE(check_loaded(*s, file->base));
    return s->offload.superoffload;
  };
  const models::OffloadPolicy::SuperOffload d = load(" {}");
  EXPECT_TRUE(d.enabled);
  EXPECT_DOUBLE_EQ(d.ratio, 1.0);
  EXPECT_DOUBLE_EQ(d.cpuadam_cores_perc, 0.8);
  EXPECT_EQ(d.sub_group_size, 1'000'000'000);
  const models::OffloadPolicy::SuperOffload so =
      load("\n      ratio: 0.9\n      cpuadam_cores_perc: 0.9\n      sub_group_size: 400000000");
  EXPECT_DOUBLE_EQ(so.ratio, 0.9);
  EXPECT_DOUBLE_EQ(so.cpuadam_cores_perc, 0.9);
  EXPECT_EQ(so.sub_group_size, 400'000'000);
  const std::string with =
      replace(zero3, "offload: megatron_activation_offload",
              "offload:\n  preset: zero_offload\n  cpu:\n    superoffload: {}");
  const std::string ratio = error_of(with, {"offload.cpu.superoffload.ratio=1.5"});
  EXPECT_NE(ratio.find("offload.cpu.superoffload.ratio: expected a number in [0, 1]"),
            std::string::npos)
      << ratio;
  const std::string cores = error_of(with, {"offload.cpu.superoffload.cpuadam_cores_perc=1"});
  EXPECT_NE(cores.find("offload.cpu.superoffload.cpuadam_cores_perc"), std::string::npos) << cores;
  const std::string size = error_of(with, {"offload.cpu.superoffload.sub_group_size=0"});
  EXPECT_NE(size.find("offload.cpu.superoffload.sub_group_size: expected an integer"),
            std::string::npos)
      << size;
  const std::string unknown = error_of(with, {"offload.cpu.superoffload.super_offload=true"});
  EXPECT_NE(unknown.find("offload.cpu.superoffload"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("super_offload"), std::string::npos) << unknown;
  const std::string stage =
      error_of(replace(kBase, "offload: megatron_activation_offload",
                       "offload:\n  preset: zero_offload\n  cpu:\n    superoffload: {ratio: 0.9}"));
  EXPECT_NE(stage.find("offload.cpu.superoffload: SuperOffload runs on DeepSpeed ZeRO-3"),
            std::string::npos)
      << stage;
  const std::string both = error_of(
      replace(zero3, "offload: megatron_activation_offload",
              "offload:\n  preset: zero_offload\n  cpu:\n    superoffload: {}\n    zenflow: {}"));
  EXPECT_NE(both.find("expected at most one of them"), std::string::npos) << both;
}

TEST_F(LoaderTest, ImpossibleConfigurationsPointAtTheKey) {
  // Llama 3 8B has 32 heads; TP 3 does not divide them.
  EXPECT_EQ(error_of(replace(kBase, "  tp: 1\n", "  tp: 3\n")),
            p(":10:7: parallelism.tp: 3 does not divide model.heads 32"));
  // 8 sequences do not split into micro-batches of 3.
  EXPECT_EQ(error_of(replace(kBase, "micro_batch: 2", "micro_batch: 3")),
            p(":6:17: training.global_batch: 8 is not divisible by training.micro_batch × "
              "parallelism.dp = 3"));
  // Two GPUs on a one-GPU system; a map's position is that of its first key.
  const std::string gpus = error_of(replace(kBase, "  tp: 1\n", "  tp: 2\n"));
  EXPECT_EQ(gpus.rfind(p(":10:3: parallelism: dp × tp × pp = 2 does not equal the 1 GPUs"), 0), 0u)
      << gpus;
}

TEST_F(LoaderTest, Fp8RecipeKey) {
  // training.fp8_recipe reaches the scenario and the effective scenario; a bad value names the
  // key and the accepted spellings.
  const std::string path = write("s.yaml", kBase);
  auto file = load_scenario_file(path, {"training.precision=fp8", "training.fp8_recipe=current"});
  ASSERT_TRUE(file) << file.error().message;
  auto s = scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->training.fp8_recipe, models::TrainingConfig::Fp8Recipe::kCurrent);
  const std::string effective = emit_yaml(scenario_to_document(*s));
  EXPECT_NE(effective.find("  fp8_recipe: current\n"), std::string::npos) << effective;
  const std::string bad = error_of(kBase, {"training.fp8_recipe=tensorwise"});
  EXPECT_NE(bad.find("training.fp8_recipe: expected one of delayed, current, mxfp8, blockwise, "
                     "got \"tensorwise\""),
            std::string::npos)
      << bad;
}

TEST_F(LoaderTest, MoeGroupedGemmKey) {
  // training.moe_grouped_gemm: multi_stream (the default, in the effective scenario) or
  // single_kernel; a bad value names the key and the accepted spellings.
  const std::string path = write("s.yaml", kBase);
  auto file = load_scenario_file(path, {});
  ASSERT_TRUE(file) << file.error().message;
  auto s = scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->training.moe_grouped_gemm, models::TrainingConfig::MoeGroupedGemm::kMultiStream);
  EXPECT_NE(emit_yaml(scenario_to_document(*s)).find("  moe_grouped_gemm: multi_stream\n"),
            std::string::npos);
  file = load_scenario_file(path, {"training.moe_grouped_gemm=single_kernel"});
  ASSERT_TRUE(file) << file.error().message;
  s = scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->training.moe_grouped_gemm, models::TrainingConfig::MoeGroupedGemm::kSingleKernel);
  const std::string bad = error_of(kBase, {"training.moe_grouped_gemm=cutlass"});
  EXPECT_NE(bad.find("training.moe_grouped_gemm: expected one of multi_stream, single_kernel, "
                     "sequential, "
                     "got \"cutlass\""),
            std::string::npos)
      << bad;
}

TEST_F(LoaderTest, CudaGraphModulesKey) {
  // training.cuda_graph_modules reaches the scenario and the effective scenario, which loads
  // again to the same set; a bad name names its index and the choices, a scalar asks for a list,
  // and what Megatron-Core refuses beside per-layer graphs is refused naming the key.
  const std::string text = replace(
      replace(kBase, "  seq_len: 2048\n", "  seq_len: 2048\n  cuda_graph_modules: [attn, mlp]\n"),
      "offload: megatron_activation_offload\n", "offload: none\n");
  const models::Scenario s = scenario_of(text, {});
  EXPECT_TRUE(s.training.cuda_graph_modules.has(models::CudaGraphModule::kAttn));
  EXPECT_TRUE(s.training.cuda_graph_modules.has(models::CudaGraphModule::kMlp));
  EXPECT_FALSE(s.training.cuda_graph_modules.has(models::CudaGraphModule::kMoeRouter));
  const std::string effective = emit_yaml(scenario_to_document(s));
  EXPECT_EQ(scenario_of(effective, {}).training.cuda_graph_modules, s.training.cuda_graph_modules)
      << effective;
  const std::string bad = error_of(replace(text, "mlp]", "ffn]"));
  EXPECT_NE(bad.find("training.cuda_graph_modules.1: expected one of attn, mlp, moe_router, "
                     "moe_preprocess, moe, layer, got \"ffn\""),
            std::string::npos)
      << bad;
  const std::string whole = error_of(text, {"training.cuda_graph_modules=[layer, attn]"});
  EXPECT_NE(whole.find("list no other module with it"), std::string::npos) << whole;
  const std::string scalar = error_of(text, {"training.cuda_graph_modules=attn"});
  EXPECT_NE(scalar.find("training.cuda_graph_modules: expected a list of modules"),
            std::string::npos)
      << scalar;
  const std::string router = error_of(text, {"training.cuda_graph_modules=[moe_router]"});
  EXPECT_NE(router.find("need an MoE model"), std::string::npos) << router;
  const std::string offload =
      error_of(replace(text, "offload: none\n", "offload: megatron_activation_offload\n"));
  EXPECT_NE(offload.find("activation offload"), std::string::npos) << offload;
}

// DeepSeek-V3's 25.09 H100 recipe in small: a dense layer under MoE layers with its MLP
// recomputed, in combined steps (the all-to-all overlap) with delayed weight gradients. The MoE
// layer's delayed weight gradients run before the dense layer's recompute (the dense layer has no
// combine all-to-all to hide them behind): that recompute waits for the paired forward, whose
// next layer waits for them. Before, the step deadlocked.
TEST_F(LoaderTest, DenseLayerRecomputeInCombinedStepsCompletes) {
  const std::string text =
      "name: dense-under-moe\n"
      "model:\n  base: deepseek-v3\n  name: d\n  layers: 4\n  mtp_layers: 0\n"
      "  moe:\n    first_k_dense: 1\n"
      "hardware:\n  system: dgx-b200\n  nodes: 1\n"
      "training:\n  global_batch: 16\n  micro_batch: 1\n  seq_len: 4096\n  precision: bf16\n"
      "parallelism:\n  dp: 8\n  ep: 8\n  zero_stage: 1\n  moe_a2a_overlap: true\n"
      "  delay_wgrad_compute: true\n"
      "recompute:\n  mode: selective\n  modules: [mlp]\n";
  const auto e = models::evaluate(scenario_of(text, {}));
  ASSERT_TRUE(e.has_value()) << e.error().message;
  EXPECT_EQ(e->report.outcome, "completed");
  EXPECT_TRUE(e->report.fits);
  EXPECT_GT(e->report.step_time_s, 0.0);
}

TEST_F(LoaderTest, RecomputeModulesKey) {
  // recompute.modules (Megatron's recompute_modules) reaches the scenario and the effective
  // scenario, which loads again to the same set; a bad name names its index and the choices.
  const std::string text =
      replace(kBase, "recompute: selective\n",
              "recompute:\n  mode: selective\n  modules: [layernorm, moe_act]\n");
  const models::Scenario s = scenario_of(text, {});
  EXPECT_EQ(s.recompute.mode, models::RecomputeConfig::Mode::kSelective);
  EXPECT_TRUE(s.recompute.modules.has(models::RecomputeModule::kLayernorm));
  EXPECT_TRUE(s.recompute.modules.has(models::RecomputeModule::kMoeAct));
  EXPECT_FALSE(s.recompute.modules.has(models::RecomputeModule::kCoreAttn));
  const std::string effective = emit_yaml(scenario_to_document(s));
  const models::Scenario again = scenario_of(effective, {});
  EXPECT_EQ(again.recompute.modules, s.recompute.modules) << effective;
  // The scalar form keeps Megatron's default, core_attn.
  EXPECT_EQ(scenario_of(kBase, {}).recompute.modules, models::RecomputeModules{});
  const std::string bad = error_of(replace(text, "moe_act]", "shared]"));
  EXPECT_NE(bad.find("recompute.modules.1: expected one of core_attn, layernorm, moe_act, "
                     "mla_up_proj, mlp, moe, shared_experts, got \"shared\""),
            std::string::npos)
      << bad;
  // recompute.rerun: what full recompute re-runs.
  const models::Scenario whole = scenario_of(
      replace(kBase, "recompute: selective\n", "recompute: {mode: full, rerun: layer}\n"), {});
  EXPECT_EQ(whole.recompute.rerun, models::RecomputeConfig::Rerun::kLayer);
  EXPECT_EQ(scenario_of(emit_yaml(scenario_to_document(whole)), {}).recompute.rerun,
            models::RecomputeConfig::Rerun::kLayer);
  const std::string rerun = error_of(kBase, {"recompute.rerun=all"});
  EXPECT_NE(rerun.find("recompute.rerun: expected one of needed, layer, got \"all\""),
            std::string::npos)
      << rerun;
  const std::string mla = error_of(replace(text, "moe_act]", "mla_up_proj]"));
  EXPECT_NE(mla.find("recompute.modules: mla_up_proj needs multi-head latent attention"),
            std::string::npos)
      << mla;
}

TEST_F(LoaderTest, BackwardPrefetchKey) {
  // parallelism.backward_prefetch reaches the scenario; the effective scenario names it when it
  // is not the default (pre); a bad value names the key and the choices.
  const std::string path = write("s.yaml", kBase);
  auto file = load_scenario_file(path, {"parallelism.backward_prefetch=post"});
  ASSERT_TRUE(file) << file.error().message;
  auto s = scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->parallelism.backward_prefetch, models::ParallelConfig::BackwardPrefetch::kPost);
  const std::string effective = emit_yaml(scenario_to_document(*s));
  EXPECT_NE(effective.find("  backward_prefetch: post\n"), std::string::npos) << effective;
  s->parallelism.backward_prefetch = models::ParallelConfig::BackwardPrefetch::kPre;
  EXPECT_EQ(emit_yaml(scenario_to_document(*s)).find("backward_prefetch"), std::string::npos);
  // The pipeline split's embedding and loss slots are named when set.
  auto slots = load_scenario_file(path, {"parallelism.account_for_embedding_in_pipeline_split=true",
                                         "parallelism.account_for_loss_in_pipeline_split=true"});
  ASSERT_TRUE(slots) << slots.error().message;
  auto with_slots = scenario_from_document(slots->base, slots->base_dir);
  ASSERT_TRUE(with_slots) << with_slots.error().message;
  EXPECT_TRUE(with_slots->parallelism.account_for_embedding_in_pipeline_split);
  const std::string split = emit_yaml(scenario_to_document(*with_slots));
  EXPECT_NE(split.find("  account_for_embedding_in_pipeline_split: true\n  "
                       "account_for_loss_in_pipeline_split: true\n"),
            std::string::npos)
      << split;
  const std::string bad = error_of(kBase, {"parallelism.backward_prefetch=later"});
  EXPECT_NE(bad.find("parallelism.backward_prefetch: expected one of pre, post, none, got "
                     "\"later\""),
            std::string::npos)
      << bad;
}

TEST_F(LoaderTest, ParamGatherKey) {
  // parallelism.param_gather reaches the scenario and the effective scenario when it is not the
  // default (per_layer); a bad value names the key and the choices; per_tensor_synchronized
  // needs sharded parameters.
  const std::string path = write("s.yaml", kBase);
  auto file = load_scenario_file(path, {"parallelism.param_gather=per_tensor_synchronized",
                                        "parallelism.zero_stage=3", "offload=none"});
  ASSERT_TRUE(file) << file.error().message;
  auto s = scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->parallelism.param_gather,
            models::ParallelConfig::ParamGather::kPerTensorSynchronized);
  EXPECT_TRUE(models::check_scenario(*s).has_value());
  const std::string effective = emit_yaml(scenario_to_document(*s));
  EXPECT_NE(effective.find("  param_gather: per_tensor_synchronized\n"), std::string::npos)
      << effective;
  s->parallelism.param_gather = models::ParallelConfig::ParamGather::kPerLayer;
  EXPECT_EQ(emit_yaml(scenario_to_document(*s)).find("param_gather"), std::string::npos);
  s->parallelism.param_gather = models::ParallelConfig::ParamGather::kPerTensorSynchronized;
  s->parallelism.zero_stage = 1;
  const sim::Status unsharded = models::check_scenario(*s);
  ASSERT_FALSE(unsharded.has_value());
  EXPECT_NE(unsharded.error().message.find("parallelism.param_gather: per_tensor_synchronized "
                                           "gathers sharded parameters; expected "
                                           "parallelism.zero_stage 3 or fsdp true"),
            std::string::npos)
      << unsharded.error().message;
  const std::string bad = error_of(kBase, {"parallelism.param_gather=per_param"});
  EXPECT_NE(bad.find("parallelism.param_gather: expected one of per_layer, "
                     "per_tensor_synchronized, got \"per_param\""),
            std::string::npos)
      << bad;
}

TEST_F(LoaderTest, ContextParallelKeys) {
  // parallelism.cp and cp_comm_type reach the scenario and the effective scenario.
  const std::string path = write("s.yaml", kBase);
  auto file = load_scenario_file(path, {"hardware.system=dgx-h100", "parallelism.tp=4",
                                        "parallelism.cp=2", "parallelism.cp_comm_type=a2a"});
  ASSERT_TRUE(file) << file.error().message;
  auto s = scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->parallelism.cp, 2);
  EXPECT_EQ(s->parallelism.cp_comm_type, models::ParallelConfig::CpCommType::kA2A);
  EXPECT_TRUE(check_loaded(*s, file->base));
  const std::string effective = emit_yaml(scenario_to_document(*s));
  EXPECT_NE(effective.find("  cp: 2\n  cp_comm_type: a2a\n"), std::string::npos) << effective;
  // Bad values and impossible layouts name the key.
  const std::string comm = error_of(kBase, {"parallelism.cp_comm_type=ring"});
  EXPECT_NE(comm.find("parallelism.cp_comm_type: expected one of p2p, a2a, got \"ring\""),
            std::string::npos)
      << comm;
  const std::string gpus = error_of(kBase, {"parallelism.cp=2"});
  EXPECT_NE(gpus.find("parallelism: dp × tp × pp × cp = 2 does not equal the 1 GPUs"),
            std::string::npos)
      << gpus;
  const std::string chunks = error_of(kBase, {"hardware.system=dgx-h100", "parallelism.tp=4",
                                              "parallelism.cp=2", "training.seq_len=2050"});
  EXPECT_NE(chunks.find("parallelism.cp: 2 needs training.seq_len 2050 to split into 2 × cp = 4"),
            std::string::npos)
      << chunks;
}

TEST_F(LoaderTest, AttentionKernelKey) {
  // model.attention: flash2 (FlashAttention-2's kernels) reaches the scenario and the effective
  // scenario; on Hopper it runs at its own, slower rates than the default fused attention.
  const std::string flash2 =
      replace(kBase, "model: llama3-8b\n", "model:\n  base: llama3-8b\n  attention: flash2\n");
  const models::Scenario s = scenario_of(flash2, {});
  EXPECT_EQ(s.model.attention, models::ModelArch::AttentionImpl::kFlash2);
  const std::string effective = emit_yaml(scenario_to_document(s));
  EXPECT_NE(effective.find("  attention: flash2\n"), std::string::npos) << effective;
  const models::Scenario base = scenario_of(kBase, {});
  EXPECT_EQ(base.model.attention, models::ModelArch::AttentionImpl::kFlash);
  const auto fast = models::evaluate(base);
  const auto slow = models::evaluate(s);
  ASSERT_TRUE(fast && slow);
  EXPECT_GT(slow->report.step_time_s, fast->report.step_time_s);
  // Same work: the FLOP counts and the memory do not depend on the kernel.
  EXPECT_EQ(slow->report.hbm_peak_bytes, fast->report.hbm_peak_bytes);
  // On an A100 the profile's flash figures are FlashAttention-2's already: the same step.
  const auto a100 = models::evaluate(scenario_of(flash2, {"hardware.system=a100-80gb-1gpu"}));
  const auto a100_base = models::evaluate(scenario_of(kBase, {"hardware.system=a100-80gb-1gpu"}));
  ASSERT_TRUE(a100 && a100_base);
  EXPECT_EQ(a100->report.step_time_s, a100_base->report.step_time_s);
  // A bad value lists the kernels; context parallelism runs either fused kernel.
  const std::string bad = error_of(replace(flash2, "attention: flash2", "attention: flash3"));
  EXPECT_NE(bad.find("model.attention: expected one of flash, classic, flash2, got \"flash3\""),
            std::string::npos)
      << bad;
  const std::string cp =
      error_of(flash2, {"hardware.system=dgx-h100", "parallelism.tp=4", "parallelism.cp=2"});
  EXPECT_EQ(cp, "");
}

TEST_F(LoaderTest, MissingRequiredSectionsAreErrors) {
  EXPECT_EQ(error_of("model: llama3-8b\nhardware: {system: h100-1gpu}\n"),
            p(":1:1: training: missing; a scenario needs model, hardware and training"));
  EXPECT_EQ(error_of(replace(kBase, "  seq_len: 2048\n", "")),
            p(":6:3: training.seq_len: missing; expected an integer"));
  EXPECT_EQ(error_of("- 1\n- 2\n"),
            p(":1:1: expected a map with model, hardware, training, ... at the top, got a list "
              "of 2"));
}

TEST_F(LoaderTest, OverridesApplyAndNameThemselvesInErrors) {
  const std::string path = write("s.yaml", kBase);
  auto file = load_scenario_file(path, {"training.micro_batch=4", "parallelism={tp: 1, dp: 1}"});
  ASSERT_TRUE(file) << file.error().message;
  auto s = scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->training.micro_batch, 4);

  EXPECT_EQ(error_of(kBase, {"training.micro_bach=4"}),
            "--set training.micro_bach=4: training.micro_bach: unknown key; expected one of "
            "global_batch, micro_batch, seq_len, precision, fp8_recipe, fp32_master_weights, "
            "store_param_remainders, loss_chunks, "
            "gradient_accumulation_fusion, moe_grouped_gemm, cuda_graph_modules, dtype_preset, "
            "dtypes, optimizer");
  EXPECT_EQ(error_of(kBase, {"training.micro_batch=-1"}),
            "--set training.micro_batch=-1: training.micro_batch: expected an integer in "
            "1..1073741824, got -1");
  EXPECT_EQ(error_of(kBase, {"parallelism.tp=3"}),
            "--set parallelism.tp=3: parallelism.tp: 3 does not divide model.heads 32");
}

TEST_F(LoaderTest, InlineAndBaseModels) {
  const std::string inline_model =
      replace(kBase, "model: llama3-8b\n",
              "model:\n  name: tiny\n  vocab_size: 1000\n  hidden: 256\n  layers: 2\n  heads: 4\n"
              "  activation: swiglu\n  norm: rmsnorm\n");
  const std::string path = write("s.yaml", inline_model);
  auto file = load_scenario_file(path);
  ASSERT_TRUE(file);
  auto s = scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  // Derived defaults: kv_heads = heads, head_dim = hidden / heads = 64, ffn_hidden = 4 × 256.
  EXPECT_EQ(s->model.kv_heads, 4);
  EXPECT_EQ(s->model.head_dim, 64);
  EXPECT_EQ(s->model.ffn_hidden, 1024);

  auto based = load_scenario_file(path, {"model={base: llama3-8b, layers: 4}"});
  ASSERT_TRUE(based);
  auto b = scenario_from_document(based->base, based->base_dir);
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_EQ(b->model.layers, 4);
  EXPECT_EQ(b->model.hidden, 4096);

  EXPECT_NE(error_of(replace(kBase, "model: llama3-8b\n", "model:\n  hidden: 256\n"))
                .find("model.name: missing"),
            std::string::npos);
}

TEST_F(LoaderTest, HfConfigResolvesRelativeToTheScenario) {
  fs::create_directories(dir_ / "cfg");
  std::ofstream(dir_ / "cfg" / "config.json")
      << R"({"model_type": "llama", "vocab_size": 32000, "hidden_size": 1024,
             "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
             "intermediate_size": 2816, "max_position_embeddings": 4096})";
  const std::string path = write(
      "s.yaml", replace(kBase, "model: llama3-8b\n", "model: {hf_config: cfg/config.json}\n"));
  auto file = load_scenario_file(path);
  ASSERT_TRUE(file);
  auto s = scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->model.layers, 4);
  EXPECT_EQ(s->model.kv_heads, 4);

  const std::string missing =
      error_of(replace(kBase, "model: llama3-8b\n", "model: {hf_config: nope.json}\n"));
  EXPECT_EQ(missing.rfind(p(":2:20: model.hf_config: "), 0), 0u) << missing;
}

TEST_F(LoaderTest, OffloadRulesAndOptimizer) {
  const std::string text = replace(
      kBase, "offload: megatron_activation_offload\n",
      "offload:\n  rules:\n    - {tensor: mlpwi, layers: {fraction: 0.5}, prefetch_layers: 2}\n"
      "    - {tensor: optimizer_states, layers: [0, 1, 2]}\n  optimizer: cpu\n");
  const std::string path = write("s.yaml", text);
  auto file = load_scenario_file(path);
  ASSERT_TRUE(file);
  auto s = scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s) << s.error().message;
  ASSERT_EQ(s->offload.rules.size(), 2u);
  EXPECT_EQ(s->offload.rules[0].cls, models::TensorClass::kNamedActivation);
  EXPECT_EQ(s->offload.rules[0].name, "mlpwi");
  EXPECT_EQ(s->offload.rules[0].layers.kind, models::LayerSelection::Kind::kFraction);
  EXPECT_EQ(s->offload.rules[0].prefetch_layers, 2);
  EXPECT_EQ(s->offload.rules[1].layers.list, (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(s->offload.optimizer_on_cpu);
  EXPECT_TRUE(check_loaded(*s, file->base));

  EXPECT_EQ(error_of(replace(text, "layers: [0, 1, 2]", "layers: [0, 99]")),
            p(":15:42: offload.rules[1].layers: layer 99 is outside 0..31 (model.layers 32)"));
  // "    - {tensor: weights, ...": the value starts at column 16.
  const std::string tensor_error = error_of(replace(text, "tensor: mlpwi", "tensor: weights"));
  EXPECT_EQ(tensor_error.rfind(p(":14:16: offload.rules.0.tensor: expected params, grads, "), 0),
            0u)
      << tensor_error;
}

TEST_F(LoaderTest, EffectiveScenarioRoundTrips) {
  const std::string path = write("s.yaml", kBase);
  auto file = load_scenario_file(path, {"training.micro_batch=4"});
  ASSERT_TRUE(file);
  auto s = scenario_from_document(file->base, file->base_dir);
  ASSERT_TRUE(s);
  const std::string effective = emit_yaml(scenario_to_document(*s));
  EXPECT_NE(effective.find("  micro_batch: 4\n"), std::string::npos) << effective;
  EXPECT_NE(effective.find("  kv_heads: 8\n"), std::string::npos) << effective;
  EXPECT_NE(effective.find("  zero_stage: 0\n"), std::string::npos) << effective;
  // Loading the effective scenario gives the same effective scenario.
  const std::string again_path = write("effective.yaml", effective);
  auto again = load_scenario_file(again_path);
  ASSERT_TRUE(again) << again.error().message;
  auto s2 = scenario_from_document(again->base, again->base_dir);
  ASSERT_TRUE(s2) << s2.error().message << "\n" << effective;
  EXPECT_EQ(emit_yaml(scenario_to_document(*s2)), effective);
}

TEST_F(LoaderTest, PipelineLayoutAsMegatronWritesItInEitherForm) {
  const std::string base =
      replace(replace(kBase, "system: h100-1gpu", "system: dgx-h100\n  gpus: 2"), "  tp: 1\n",
              "  tp: 1\n  pp: 2\n  layout: \"Ettt|t*4,tL\"\n");
  const models::Scenario s = scenario_of(base, {"model.layers=8"});
  ASSERT_EQ(s.parallelism.layout.size(), 2U);
  EXPECT_EQ(s.parallelism.layout[0].decoders, 3);
  EXPECT_TRUE(s.parallelism.layout[0].embedding);
  EXPECT_EQ(s.parallelism.layout[1].decoders, 5);
  EXPECT_TRUE(s.parallelism.layout[1].loss);
  EXPECT_EQ(error_of(base, {"model.layers=8"}), "");
  // Megatron's list of lists of layer names, or one string of letters per stage.
  const std::string lists = replace(base, "  layout: \"Ettt|t*4,tL\"\n",
                                    "  layout:\n    - [embedding, decoder, decoder, decoder]\n"
                                    "    - [decoder, decoder, decoder, decoder, decoder, loss]\n");
  const models::Scenario l = scenario_of(lists, {"model.layers=8"});
  ASSERT_EQ(l.parallelism.layout.size(), 2U);
  EXPECT_EQ(l.parallelism.layout[1].decoders, 5);
  const models::Scenario strings = scenario_of(
      replace(base, "  layout: \"Ettt|t*4,tL\"\n", "  layout: [Ettt, t*5L]\n"), {"model.layers=8"});
  EXPECT_EQ(strings.parallelism.layout[1].decoders, 5);
  // The effective scenario writes it back in the string form.
  const std::string effective = emit_yaml(scenario_to_document(s));
  EXPECT_NE(effective.find("layout: \"Et*3|t*5L\""), std::string::npos) << effective;
  // Errors name the key (and the stage) and what was expected.
  EXPECT_NE(error_of(replace(base, "t*4,", "t*4x,"), {"model.layers=8"})
                .find("parallelism.layout: expected layers E, t, m, L"),
            std::string::npos);
  EXPECT_NE(error_of(replace(lists, "decoder, loss]", "decoder, head]"), {"model.layers=8"})
                .find("parallelism.layout[1]: expected a layer name"),
            std::string::npos);
  EXPECT_NE(
      error_of(base).find("parallelism.layout: 8 decoder layers (t); expected model.layers = 32"),
      std::string::npos)
      << error_of(base);
}

TEST_F(LoaderTest, SweepIsSplitOffAndOverridesMayNotFightIt) {
  const std::string text = std::string(kBase) + "sweep:\n  training.micro_batch: [1, 2]\n";
  const std::string path = write("s.yaml", text);
  auto file = load_scenario_file(path);
  ASSERT_TRUE(file);
  ASSERT_TRUE(file->sweep);
  EXPECT_EQ(file->sweep->size(), 2);
  EXPECT_EQ(file->base.find("sweep"), nullptr);
  auto conflict = load_scenario_file(path, {"training.micro_batch=4"});
  ASSERT_FALSE(conflict);
  EXPECT_NE(conflict.error().message.find("the sweep also varies 'training.micro_batch'"),
            std::string::npos);
}

TEST_F(LoaderTest, JsonScenariosGiveJsonErrors) {
  const std::string good = write("s.json",
                                 R"({"model": "llama3-8b", "hardware": {"system": "h100-1gpu"},
          "training": {"global_batch": 8, "micro_batch": 1, "seq_len": 2048}})");
  auto file = load_scenario_file(good);
  ASSERT_TRUE(file) << file.error().message;
  ASSERT_TRUE(scenario_from_document(file->base, file->base_dir));
  const std::string bad = write("b.json", "{\"model\": \"llama3-8b\",\n \"hardware\": }\n");
  auto e = load_scenario_file(bad);
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("JSON syntax error"), std::string::npos) << e.error().message;
  EXPECT_NE(e.error().message.find("line 2"), std::string::npos) << e.error().message;
}

TEST(Examples, EveryExampleScenarioLoadsAndChecks) {
  int count = 0;
  for (const auto& entry :
       fs::directory_iterator(fs::path(OFFSIM_SOURCE_DIR) / "scenarios" / "examples")) {
    if (entry.path().extension() != ".yaml") continue;
    ++count;
    auto file = load_scenario_file(entry.path().string());
    ASSERT_TRUE(file) << file.error().message;
    auto s = scenario_from_document(file->base, file->base_dir);
    ASSERT_TRUE(s) << s.error().message;
    EXPECT_TRUE(check_loaded(*s, file->base)) << entry.path();
  }
  EXPECT_GE(count, 8);
}

}  // namespace
}  // namespace offsim::scenarios
