#include "scenarios/document.h"

#include <gtest/gtest.h>

#include <string>

namespace offsim::scenarios {
namespace {

TEST(Document, ParsesMapsListsAndScalarsWithPositions) {
  auto doc = parse_document("name: x\ntraining:\n  micro_batch: 2\n  tags: [a, \"1\"]\n", "s.yaml");
  ASSERT_TRUE(doc) << doc.error().message;
  ASSERT_EQ(doc->kind, NodeKind::kMap);
  const Node* mb = find_path(*doc, "training.micro_batch");
  ASSERT_NE(mb, nullptr);
  EXPECT_EQ(scalar_int(*mb), 2);
  // Line 3, column 16 (1-based) is where the value "2" starts.
  EXPECT_EQ(mb->origin, "s.yaml:3:16");
  const Node* tag = find_path(*doc, "training.tags.1");
  ASSERT_NE(tag, nullptr);
  EXPECT_TRUE(tag->quoted);
  EXPECT_EQ(scalar_int(*tag), std::nullopt);  // "1" in quotes is a string
}

TEST(Document, TypedScalars) {
  auto doc = parse_document("{a: 1e3, b: 2.5, c: true, d: ~, e: .inf, f: 0x10, g: -3}", "t");
  ASSERT_TRUE(doc);
  EXPECT_EQ(scalar_int(*doc->find("a")), 1000);
  EXPECT_EQ(scalar_int(*doc->find("b")), std::nullopt);
  EXPECT_EQ(scalar_double(*doc->find("b")), 2.5);
  EXPECT_EQ(scalar_bool(*doc->find("c")), true);
  EXPECT_TRUE(is_null_scalar(*doc->find("d")));
  EXPECT_EQ(scalar_double(*doc->find("e")), std::nullopt);  // no infinities
  EXPECT_EQ(scalar_int(*doc->find("f")), std::nullopt);     // no hex
  EXPECT_EQ(scalar_int(*doc->find("g")), -3);
}

TEST(Document, DuplicateKeyIsAnErrorWithBothPositions) {
  auto doc = parse_document("a: 1\nb: 2\na: 3\n", "dup.yaml");
  ASSERT_FALSE(doc);
  EXPECT_EQ(doc.error().message, "dup.yaml:3:1: duplicate key 'a' (first at dup.yaml:1:4)");
}

TEST(Document, SyntaxErrorNamesFileLineColumn) {
  auto doc = parse_document("a: [1, 2\nb: 3\n", "bad.yaml");
  ASSERT_FALSE(doc);
  EXPECT_EQ(doc.error().code, sim::ErrorCode::kInvalidInput);
  EXPECT_EQ(doc.error().message.rfind("bad.yaml:", 0), 0u) << doc.error().message;
  EXPECT_NE(doc.error().message.find("YAML syntax error"), std::string::npos);
}

TEST(Document, AliasBombIsRefused) {
  // Each level multiplies by 9: 9^9 = 387,420,489 nodes if expanded.
  std::string text = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i <= 9; ++i) {
    text += fmt::format("a{}: &a{} [", i, i);
    for (int j = 0; j < 9; ++j) text += fmt::format("{}*a{}", j ? ", " : "", i - 1);
    text += "]\n";
  }
  auto doc = parse_document(text, "bomb.yaml");
  ASSERT_FALSE(doc);
  EXPECT_EQ(doc.error().code, sim::ErrorCode::kLimitExceeded);
  EXPECT_NE(doc.error().message.find("alias bomb"), std::string::npos) << doc.error().message;
}

TEST(Document, SmallAliasesAreExpanded) {
  auto doc = parse_document("base: &b {tp: 2}\nother: *b\n", "a.yaml");
  ASSERT_TRUE(doc) << doc.error().message;
  EXPECT_EQ(scalar_int(*find_path(*doc, "other.tp")), 2);
}

TEST(Document, DeepNestingIsRefused) {
  const std::string text = std::string(100, '[') + std::string(100, ']');
  auto doc = parse_document(text, "deep.yaml");
  ASSERT_FALSE(doc);
  EXPECT_EQ(doc.error().code, sim::ErrorCode::kLimitExceeded);
  EXPECT_NE(doc.error().message.find("nesting deeper than 64"), std::string::npos)
      << doc.error().message;
  // Very deep input must not overflow the stack either.
  const std::string huge = std::string(200000, '[');
  EXPECT_FALSE(parse_document(huge, "huge.yaml"));
}

TEST(Document, HugeInputIsRefused) {
  DocumentLimits limits;
  limits.max_bytes = 100;
  auto doc = parse_document(std::string(200, 'a'), "big.yaml", limits);
  ASSERT_FALSE(doc);
  EXPECT_EQ(doc.error().code, sim::ErrorCode::kLimitExceeded);
}

TEST(Document, MultipleDocumentsAndMergeKeysAreRefused) {
  EXPECT_FALSE(parse_document("a: 1\n---\nb: 2\n", "m.yaml"));
  auto merge = parse_document("x: &x {a: 1}\ny:\n  <<: *x\n", "m.yaml");
  ASSERT_FALSE(merge);
  EXPECT_NE(merge.error().message.find("merge keys"), std::string::npos);
}

TEST(Document, OverridesSetScalarsAndFlowValuesAndRememberOrigin) {
  auto doc = parse_document("training:\n  micro_batch: 1\n", "s.yaml");
  ASSERT_TRUE(doc);
  ASSERT_TRUE(apply_override(*doc, "training.micro_batch=4"));
  ASSERT_TRUE(apply_override(*doc, "parallelism={tp: 2, dp: 4}"));
  ASSERT_TRUE(apply_override(*doc, "offload.rules=[{tensor: activations}]"));
  EXPECT_EQ(scalar_int(*find_path(*doc, "training.micro_batch")), 4);
  EXPECT_EQ(find_path(*doc, "training.micro_batch")->origin, "--set training.micro_batch=4");
  EXPECT_EQ(scalar_int(*find_path(*doc, "parallelism.dp")), 4);
  EXPECT_EQ(find_path(*doc, "offload.rules.0.tensor")->scalar, "activations");
  ASSERT_TRUE(apply_override(*doc, "offload.rules.0.where=host"));
  EXPECT_EQ(find_path(*doc, "offload.rules.0.where")->scalar, "host");
}

TEST(Document, BadOverridesAreErrors) {
  auto doc = parse_document("training:\n  micro_batch: 1\n", "s.yaml");
  ASSERT_TRUE(doc);
  EXPECT_FALSE(apply_override(*doc, "training.micro_batch"));   // no '='
  EXPECT_FALSE(apply_override(*doc, "training..x=1"));          // empty segment
  EXPECT_FALSE(apply_override(*doc, "training.micro_batch="));  // no value
  auto st = apply_override(*doc, "training.micro_batch.x=1");   // through a scalar
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("--set training.micro_batch.x=1"), std::string::npos);
  EXPECT_FALSE(apply_override(*doc, "a=[1, 2"));  // syntax error in the value
}

TEST(Document, EmitRoundTrips) {
  const std::string text =
      "name: \"x: y\"\nmodel:\n  layers: 80\n  tags: [a, \"true\", \"1\"]\nrules:\n  - tensor: "
      "activations\n    layers: {fraction: 0.5}\n  - tensor: params\nempty: null\n";
  auto doc = parse_document(text, "r.yaml");
  ASSERT_TRUE(doc) << doc.error().message;
  const std::string emitted = emit_yaml(*doc);
  auto again = parse_document(emitted, "r2.yaml");
  ASSERT_TRUE(again) << again.error().message << "\n" << emitted;
  EXPECT_EQ(emit_yaml(*again), emitted);
  EXPECT_TRUE(find_path(*again, "model.tags.1")->quoted);
  EXPECT_EQ(find_path(*again, "name")->scalar, "x: y");
  EXPECT_EQ(emit_flow(*find_path(*again, "rules.0.layers")), "{fraction: 0.5}");
}

}  // namespace
}  // namespace offsim::scenarios
