// hardware.host and hardware.overrides in scenario files and --set: accepted, printed back,
// applied by the simulation, and every bad value an error naming the file, line and key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "models/evaluate.h"
#include "models/resolve.h"
#include "scenarios/scenario_loader.h"

namespace offsim::scenarios {
namespace {

namespace fs = std::filesystem;

constexpr const char* kBase =
    "name: t\n"                 // line 1
    "model: llama3-8b\n"        // line 2
    "hardware:\n"               // line 3
    "  system: dgx-h100\n"      // line 4
    "  nodes: 1\n"              // line 5
    "training:\n"               // line 6
    "  global_batch: 8\n"       // line 7
    "  micro_batch: 1\n"        // line 8
    "  seq_len: 2048\n"         // line 9
    "parallelism:\n"            // line 10
    "  dp: 8\n"                 // line 11
    "recompute: selective\n"    // line 12
    "offload: zero_offload\n";  // line 13

class HardwareKeysTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("offsim_hwkeys_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  sim::Result<models::Scenario> load(const std::string& text,
                                     const std::vector<std::string>& sets = {}) {
    const std::string path = (dir_ / "s.yaml").string();
    std::ofstream(path) << text;
    auto file = load_scenario_file(path, sets);
    if (!file) return sim::fail(file.error());
    auto s = scenario_from_document(file->base, file->base_dir);
    if (!s) return sim::fail(s.error());
    OFFSIM_RETURN_IF_ERROR(check_loaded(*s, file->base));
    return s;
  }
  std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
    auto s = load(text, sets);
    return s ? std::string() : s.error().message;
  }
  fs::path dir_;
};

std::string with_hardware(const std::string& extra) {
  std::string text = kBase;
  const std::string at = "  nodes: 1\n";
  return text.replace(text.find(at), at.size(), at + extra);
}

TEST_F(HardwareKeysTest, HostAndOverridesLoadAndPrintBack) {
  auto s =
      load(with_hardware("  host: xeon-6980p\n"
                         "  overrides:\n"
                         "    profile.host.cores_per_socket: 32\n"
                         "    profile:\n"
                         "      host_link: {h2d_bytes_per_s: 4.0e10}\n"));
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->hardware.host, "xeon-6980p");
  ASSERT_EQ(s->hardware.overrides.size(), 2u);
  EXPECT_EQ(s->hardware.overrides[0].first, "profile.host.cores_per_socket");
  EXPECT_EQ(s->hardware.overrides[1].first, "profile.host_link.h2d_bytes_per_s");
  EXPECT_EQ(s->hardware.overrides[1].second, 4e10);
  const std::string yaml = emit_yaml(scenario_to_document(*s));
  EXPECT_NE(yaml.find("host: \"xeon-6980p\""), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("profile.host.cores_per_socket: 32"), std::string::npos) << yaml;
}

TEST_F(HardwareKeysTest, SetReachesAnyFigure) {
  auto s = load(kBase, {"hardware.host=xeon-6960p",
                        "hardware.overrides.profile.host.adam_bytes_per_s_per_core=4e9"});
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->hardware.host, "xeon-6960p");
  ASSERT_EQ(s->hardware.overrides.size(), 1u);
  EXPECT_EQ(s->hardware.overrides[0].first, "profile.host.adam_bytes_per_s_per_core");
}

TEST_F(HardwareKeysTest, TheHostAndOverridesChangeTheSimulatedCpuUpdate) {
  // ZeRO-Offload on 8 GPUs: the CPU Adam of each GPU runs on its share of the socket's cores
  // (streaming at adam_bytes_per_s_per_core each). Fewer cores per socket: a slower CPU update.
  auto base = load(kBase);
  auto fewer = load(kBase, {"hardware.overrides.profile.host.cores_per_socket=16"});
  auto more = load(kBase, {"hardware.host=xeon-6980p"});
  ASSERT_TRUE(base && fewer && more);
  auto e_base = models::evaluate(*base);
  auto e_fewer = models::evaluate(*fewer);
  auto e_more = models::evaluate(*more);
  ASSERT_TRUE(e_base && e_fewer && e_more);
  EXPECT_GT(e_fewer->report.time.cpu_optimizer_s, e_base->report.time.cpu_optimizer_s);
  EXPECT_LT(e_more->report.time.cpu_optimizer_s, e_base->report.time.cpu_optimizer_s);
}

TEST_F(HardwareKeysTest, BadHostsAndOverridesAreErrorsNamingTheKey) {
  const std::string unknown = error_of(with_hardware("  host: pentium\n"));
  EXPECT_NE(unknown.find("s.yaml:6:9: hardware.host: expected one of xeon-8480c"),
            std::string::npos)
      << unknown;
  const std::string grace = error_of(with_hardware("  host: grace\n"));
  EXPECT_NE(grace.find("hardware.host: host 'grace' attaches GPUs over nvlink-c2c"),
            std::string::npos)
      << grace;
  EXPECT_NE(grace.find("s.yaml:6:"), std::string::npos) << grace;
  const std::string figure = error_of(with_hardware("  overrides:\n    profile.host.cores: 8\n"));
  EXPECT_NE(figure.find("hardware.overrides.profile.host.cores: unknown figure"), std::string::npos)
      << figure;
  EXPECT_NE(figure.find("expected one of: profile."), std::string::npos) << figure;
  const std::string text =
      error_of(with_hardware("  overrides:\n    profile.host.cores_per_socket: many\n"));
  EXPECT_NE(text.find("s.yaml:7:36: hardware.overrides.profile.host.cores_per_socket: expected "
                      "a number, got \"many\""),
            std::string::npos)
      << text;
  const std::string set = error_of(kBase, {"hardware.overrides.system.nodes=2"});
  EXPECT_NE(set.find("hardware.overrides.system.nodes: unknown figure"), std::string::npos) << set;
  EXPECT_NE(error_of(with_hardware("  overrides: 3\n")).find("hardware.overrides: expected a map"),
            std::string::npos);
}

// hardware.host as a host file: a path relative to the scenario file, whose figures (here one
// over a catalogue base) replace the profile's host figures as a catalogue host's do.
TEST_F(HardwareKeysTest, AHostFileRelativeToTheScenarioOverridesOneFigureOfItsBase) {
  std::ofstream(dir_ / "lab.json")
      << R"({"format": "offsim-host", "base": "xeon-8480c", "name": "lab",
             "cores_per_socket": {"value": 16, "origin": "measured", "source": "lscpu"}})";
  auto file = load(with_hardware("  host: lab.json\n"));
  auto base = load(with_hardware("  host: xeon-8480c\n"));
  auto same = load(
      kBase, {"hardware.host=xeon-8480c", "hardware.overrides.profile.host.cores_per_socket=16"});
  ASSERT_TRUE(file && base && same) << (file ? "" : file.error().message);
  EXPECT_EQ(file->hardware.host, (dir_ / "lab.json").string());
  auto r = models::resolve(*file);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->profile().host.cores_per_socket.value, 16);
  EXPECT_EQ(r->profile().host.cores_per_socket.source, "lscpu");
  auto e_file = models::evaluate(*file);
  auto e_base = models::evaluate(*base);
  auto e_same = models::evaluate(*same);
  ASSERT_TRUE(e_file && e_base && e_same);
  EXPECT_GT(e_file->report.time.cpu_optimizer_s, e_base->report.time.cpu_optimizer_s);
  EXPECT_EQ(e_file->report.time.cpu_optimizer_s, e_same->report.time.cpu_optimizer_s);
  EXPECT_EQ(e_file->report.step_time_s, e_same->report.step_time_s);
}

TEST_F(HardwareKeysTest, BadHostFilesAreErrorsNamingTheScenarioTheFileAndTheKey) {
  const std::string missing = error_of(with_hardware("  host: none.json\n"));
  EXPECT_NE(missing.find("s.yaml:6:9: hardware.host: "), std::string::npos) << missing;
  EXPECT_NE(missing.find((dir_ / "none.json").string()), std::string::npos) << missing;
  std::ofstream(dir_ / "bad.json") << R"({"format": "offsim-host", "base": "xeon-8480c",
             "numa_nodes_per_socket": {"value": 0, "origin": "measured", "source": "x"}})";
  const std::string bad = error_of(with_hardware("  host: bad.json\n"));
  EXPECT_NE(bad.find("s.yaml:6:9: hardware.host: " + (dir_ / "bad.json").string() +
                     ": $.numa_nodes_per_socket.value: expected a whole number in [1, 64]"),
            std::string::npos)
      << bad;
  std::ofstream(dir_ / "grace.json") << R"({"format": "offsim-host", "base": "grace"})";
  const std::string grace = error_of(with_hardware("  host: grace.json\n"));
  EXPECT_NE(grace.find("attaches GPUs over nvlink-c2c"), std::string::npos) << grace;
}

// The host file quoted in scenarios/examples/README.md reads and runs.
TEST_F(HardwareKeysTest, TheReadmesHostFileExampleReads) {
  std::ifstream in(fs::path(OFFSIM_SOURCE_DIR) / "scenarios" / "examples" / "README.md");
  const std::string readme((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t begin = readme.find("`{\"format\": \"offsim-host\"");
  const std::size_t end = readme.find("}}`", begin);
  ASSERT_NE(begin, std::string::npos);
  ASSERT_NE(end, std::string::npos);
  std::ofstream(dir_ / "lab.json") << readme.substr(begin + 1, end + 2 - begin - 1);
  auto s = load(with_hardware("  host: lab.json\n"));
  ASSERT_TRUE(s) << s.error().message;
  auto r = models::resolve(*s);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->profile().host.cores_per_socket.value, 32);
  EXPECT_EQ(r->profile().host.cores_per_socket.origin, sim::platform::Origin::kMeasured);
}

}  // namespace
}  // namespace offsim::scenarios
