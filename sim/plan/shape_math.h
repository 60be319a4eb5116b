// Shape arithmetic next to the shapes of sim/plan (target offsim_sim_core): what a GEMM of a
// given GemmShape computes and writes, for the step builder, the cost model and the replay.
//
//   const double flops = sim::gemm_flops({.m = 4096, .n = 14336, .k = 4096});
//   const sim::DType out = sim::gemm_output_dtype(sim::DType::kFp8);  // kBf16
//   const double bytes = sim::gemm_bytes({.m = 4096, .n = 4096, .k = 4096});  // A, B, C once
#pragma once

#include "sim/plan/plan.h"

namespace offsim::sim {

// A GEMM's floating-point operations: 2·m·n·k per product, `batch` products (at least one).
double gemm_flops(const GemmShape& shape);
// The element type a GEMM writes for inputs of `input`: fp8 products are written as bf16
// (Transformer Engine's FP8 GEMMs output the activation dtype).
DType gemm_output_dtype(DType input);
// The bytes a GEMM moves at least: A and B read once in its input dtype, C written once in
// gemm_output_dtype(), `batch` products (at least one).
double gemm_bytes(const GemmShape& shape);

}  // namespace offsim::sim
