// Bounded input reading, strict JSON and message escaping (sim/core).
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "sim/core/escape.h"
#include "sim/core/file_io.h"
#include "sim/core/json_reader.h"

namespace offsim::sim {
namespace {

namespace fs = std::filesystem;

class ReadInputFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("offsim-core-io-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  fs::path dir_;
};

TEST_F(ReadInputFile, ReadsARegularFileWhole) {
  const std::string path = write("a.json", std::string(100000, 'x'));
  auto text = read_input_file(path, kProfileInput);
  ASSERT_TRUE(text) << text.error().message;
  EXPECT_EQ(text->size(), 100000u);
}

TEST_F(ReadInputFile, RefusesAFileOverTheLimitOfItsKind) {
  const std::string path = write("big.json", std::string(2000, 'x'));
  auto text = read_input_file(path, InputKind{"a test file", 1000});
  ASSERT_FALSE(text);
  EXPECT_EQ(text.error().code, ErrorCode::kLimitExceeded);
  EXPECT_NE(text.error().message.find("big.json: file is 2000 bytes"), std::string::npos)
      << text.error().message;
  EXPECT_NE(text.error().message.find("a test file"), std::string::npos);
  // Exactly at the limit is fine.
  EXPECT_TRUE(read_input_file(path, InputKind{"a test file", 2000}));
}

// The read stops at the limit whatever the file's size said: /proc files report size 0 (as a file
// growing while it is read would be larger than its size at open).
TEST_F(ReadInputFile, TheReadItselfIsBounded) {
  auto text = read_input_file("/proc/self/maps", InputKind{"a test file", 64});
  ASSERT_FALSE(text);
  EXPECT_EQ(text.error().code, ErrorCode::kLimitExceeded);
  EXPECT_NE(text.error().message.find("file is at least 65 bytes"), std::string::npos)
      << text.error().message;
  EXPECT_TRUE(read_input_file("/proc/self/maps", InputKind{"a test file", 1 << 24}));
}

TEST_F(ReadInputFile, RefusesDevicesPipesAndDirectoriesBeforeReading) {
  for (const char* device : {"/dev/zero", "/dev/urandom", "/dev/null"}) {
    auto text = read_input_file(device, kScenarioInput);
    ASSERT_FALSE(text) << device;
    EXPECT_EQ(text.error().code, ErrorCode::kInvalidInput);
    EXPECT_NE(text.error().message.find("is a character device, expected a scenario file"),
              std::string::npos)
        << text.error().message;
  }
  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Opening a FIFO without a writer would block: the refusal must come first.
  auto from_fifo = read_input_file(fifo.string(), kTimelineInput);
  ASSERT_FALSE(from_fifo);
  EXPECT_NE(from_fifo.error().message.find("is a pipe (FIFO), expected a Timeline JSON"),
            std::string::npos)
      << from_fifo.error().message;
  auto from_dir = read_input_file(dir_.string(), kHfConfigInput);
  ASSERT_FALSE(from_dir);
  EXPECT_NE(from_dir.error().message.find("is a directory"), std::string::npos);
  auto missing = read_input_file((dir_ / "none.json").string(), kPlanInput);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
}

TEST(ParseJsonText, RefusesDuplicateKeysWithLineAndPath) {
  auto j =
      parse_json_text("{\n  \"a\": 1,\n  \"b\": {\"x\": [1, {\"k\": 1,\n \"k\": 2}]}\n}", "f.json");
  ASSERT_FALSE(j);
  EXPECT_EQ(j.error().message,
            "f.json: line 4: $.b.x[1]: duplicate key 'k' (first on line 3); each key may appear "
            "only once");
  // The same key spelt with an escape is the same key.
  auto escaped = parse_json_text(R"({"ab": 1, "a\u0062": 2})", "e.json");
  ASSERT_FALSE(escaped);
  EXPECT_NE(escaped.error().message.find("duplicate key 'ab'"), std::string::npos);
  // Equal keys in different objects, and keys inside strings, are fine.
  EXPECT_TRUE(
      parse_json_text(R"({"a": {"k": 1}, "b": {"k": 2}, "c": "\"k\": 1, \"k\": 2"})", "ok.json"));
  EXPECT_TRUE(parse_json_text(R"([{"k": 1}, {"k": 2}])", "ok.json"));
  // Invalid JSON is still reported as such, not as a duplicate.
  auto bad = parse_json_text(R"({"k": 1, "k": )", "bad.json");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("not valid JSON"), std::string::npos);
}

// Objects with many keys switch from a linear search to a hash map: duplicates are still found,
// and a large object costs linear time.
TEST(ParseJsonText, FindsDuplicatesInLargeObjects) {
  std::string text = "{";
  for (int i = 0; i < 100000; ++i) text += fmt::format("\"k{}\": {},", i, i);
  auto ok_text = text.substr(0, text.size() - 1) + "}";
  EXPECT_TRUE(parse_json_text(ok_text, "big.json"));
  for (int repeat : {3, 15, 16, 99999}) {
    auto dup = parse_json_text(text + fmt::format("\"k{}\": 0}}", repeat), "big.json");
    ASSERT_FALSE(dup) << repeat;
    EXPECT_NE(dup.error().message.find(fmt::format("duplicate key 'k{}'", repeat)),
              std::string::npos)
        << dup.error().message;
  }
}

TEST(ParseJsonText, RefusesDeepNesting) {
  auto j = parse_json_text(std::string(10000, '[') + std::string(10000, ']'), "deep.json");
  ASSERT_FALSE(j);
  EXPECT_NE(j.error().message.find("nested deeper than 256"), std::string::npos);
}

TEST(JsonDocumentKind, NamesOffsimFormats) {
  EXPECT_EQ(json_document_kind(nlohmann::json{{"format", "offsim-plan"}}),
            "a Plan JSON (offsim run --plan-out)");
  EXPECT_EQ(json_document_kind(nlohmann::json{{"traceEvents", nlohmann::json::array()}}),
            "a Chrome/Perfetto trace (offsim run --trace)");
  EXPECT_EQ(json_document_kind(nlohmann::json{{"format", 3}}), "");
  EXPECT_EQ(json_document_kind(nlohmann::json::array()), "");
}

TEST(EscapeForMessage, ShowsInvisibleAndControlCharacters) {
  EXPECT_EQ(escape_for_message("micro_batch"), "micro_batch");
  EXPECT_EQ(escape_for_message("micro\u200bbatch"), "micro\\u200Bbatch");
  EXPECT_EQ(escape_for_message("\xef\xbb\xbfname"), "\\uFEFFname");
  EXPECT_EQ(escape_for_message("a\u202eb"), "a\\u202Eb");
  EXPECT_EQ(escape_for_message("tag\U000E0041"), "tag\\U000E0041");
  EXPECT_EQ(escape_for_message("a\nb\tc\x1b[31m"), "a\\nb\\tc\\x1B[31m");
  EXPECT_EQ(escape_for_message("bad\xff\xc3"), "bad\\xFF\\xC3");
  // Visible non-ASCII text passes through.
  EXPECT_EQ(escape_for_message("8 × H100 — 80 GiB"), "8 × H100 — 80 GiB");
  EXPECT_EQ(escape_message_keep_lines("one\ntwo\u200b"), "one\ntwo\\u200B");
}

}  // namespace
}  // namespace offsim::sim
