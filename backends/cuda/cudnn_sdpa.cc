#include "backends/cuda/cudnn_sdpa.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <limits>
#include <string>

#include <fmt/format.h>

namespace offsim::backends::cuda {
namespace {

// Tensor unique ids: the five real operands, the two by-value scalars, then the virtual ones.
enum Uid : std::int64_t {
  kQ = 1,
  kK = 2,
  kV = 3,
  kO = 4,
  kScale = 5,
  kMasked = 6,
  kStats = 7,
  kDO = 8,
  kDQ = 9,
  kDK = 10,
  kDV = 11,
  kSoftmaxSum = 12,
  kDQAccum = 13,
  kOne = 14,
  kS = 101,
  kScaled,
  kRow,
  kCol,
  kMask,
  kMaskedS,
  kMax,
  kCentered,
  kExp,
  kSum,
  kP,
  kLog,
  // Backward's virtual tensors.
  kDotDoO = 201,
  kBS,
  kBScaled,
  kBRow,
  kBCol,
  kBMask,
  kBMasked,
  kBCentered,
  kBP,
  kBPt,
  kBDP,
  kBDPMinus,
  kBDSRaw,
  kBDS,
  kBDSt,
  kBK,
  kBSumRaw,
};

using Dims = std::vector<std::int64_t>;

// Packed strides of `dims` (last dimension contiguous).
Dims packed(const Dims& dims) {
  Dims s(dims.size(), 1);
  for (std::size_t i = dims.size() - 1; i > 0; --i) s[i - 1] = s[i] * dims[i];
  return s;
}

// Builds descriptors, keeps them for destruction, and names the failing call in errors.
class Builder {
 public:
  Builder(const CudnnApi& api, std::vector<cudnnBackendDescriptor_t>& owned)
      : api_(api), owned_(owned) {}

  sim::Result<cudnnBackendDescriptor_t> make(cudnnBackendDescriptorType_t type, const char* what) {
    cudnnBackendDescriptor_t d = nullptr;
    OFFSIM_RETURN_IF_ERROR(api_.check(api_.BackendCreateDescriptor(type, &d),
                                      fmt::format("cudnnBackendCreateDescriptor ({})", what)));
    owned_.push_back(d);
    return d;
  }
  sim::Status set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                  cudnnBackendAttributeType_t type, std::int64_t count, const void* value,
                  const char* what) {
    return api_.check(
        api_.BackendSetAttribute(d, name, type, count, value),
        fmt::format("cudnnBackendSetAttribute ({}, attribute {})", what, static_cast<int>(name)));
  }
  sim::Status finalize(cudnnBackendDescriptor_t d, const char* what) {
    return api_.check(api_.BackendFinalize(d), fmt::format("cudnnBackendFinalize ({})", what));
  }

  sim::Result<cudnnBackendDescriptor_t> tensor(std::int64_t uid, const Dims& dims,
                                               const Dims& strides, cudnnDataType_t type,
                                               bool is_virtual, bool by_value = false) {
    OFFSIM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t t,
                            make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor"));
    const std::int64_t alignment = 16;
    const auto n = static_cast<std::int64_t>(dims.size());
    OFFSIM_RETURN_IF_ERROR(
        set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor"));
    OFFSIM_RETURN_IF_ERROR(
        set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, n, dims.data(), "tensor"));
    OFFSIM_RETURN_IF_ERROR(
        set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, n, strides.data(), "tensor"));
    OFFSIM_RETURN_IF_ERROR(
        set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor"));
    OFFSIM_RETURN_IF_ERROR(
        set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "tensor"));
    if (is_virtual) {
      const bool yes = true;
      OFFSIM_RETURN_IF_ERROR(
          set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, "tensor"));
    }
    if (by_value) {
      const bool yes = true;
      OFFSIM_RETURN_IF_ERROR(
          set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, "tensor"));
    }
    OFFSIM_RETURN_IF_ERROR(finalize(t, "tensor"));
    return t;
  }

  sim::Result<cudnnBackendDescriptor_t> matmul(cudnnBackendDescriptor_t a,
                                               cudnnBackendDescriptor_t b,
                                               cudnnBackendDescriptor_t c) {
    OFFSIM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t desc,
                            make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul"));
    const cudnnDataType_t fp32 = CUDNN_DATA_FLOAT;
    OFFSIM_RETURN_IF_ERROR(
        set(desc, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &fp32, "matmul"));
    OFFSIM_RETURN_IF_ERROR(finalize(desc, "matmul"));
    OFFSIM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t op,
                            make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul op"));
    OFFSIM_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               1, &a, "matmul op"));
    OFFSIM_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               1, &b, "matmul op"));
    OFFSIM_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               1, &c, "matmul op"));
    OFFSIM_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               1, &desc, "matmul op"));
    OFFSIM_RETURN_IF_ERROR(finalize(op, "matmul op"));
    return op;
  }

  // y = mode(x[, b][, t]); `axis` >= 0 only for GEN_INDEX.
  sim::Result<cudnnBackendDescriptor_t> pointwise(
      cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
      cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, std::int64_t axis = -1) {
    OFFSIM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t desc,
                            make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise"));
    const cudnnDataType_t fp32 = CUDNN_DATA_FLOAT;
    OFFSIM_RETURN_IF_ERROR(
        set(desc, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise"));
    OFFSIM_RETURN_IF_ERROR(
        set(desc, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &fp32, "pointwise"));
    if (axis >= 0) {
      OFFSIM_RETURN_IF_ERROR(
          set(desc, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise"));
    }
    OFFSIM_RETURN_IF_ERROR(finalize(desc, "pointwise"));
    OFFSIM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t op,
                            make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise op"));
    OFFSIM_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &desc, "pointwise op"));
    OFFSIM_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "pointwise op"));
    if (b) {
      OFFSIM_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "pointwise op"));
    }
    if (t) {
      OFFSIM_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, "pointwise op"));
    }
    OFFSIM_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "pointwise op"));
    OFFSIM_RETURN_IF_ERROR(finalize(op, "pointwise op"));
    return op;
  }

  // y = x viewed with y's dimensions and strides (a transpose of a virtual tensor).
  sim::Result<cudnnBackendDescriptor_t> reshape(cudnnBackendDescriptor_t x,
                                                cudnnBackendDescriptor_t y) {
    OFFSIM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t op,
                            make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape op"));
    OFFSIM_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reshape op"));
    OFFSIM_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reshape op"));
    OFFSIM_RETURN_IF_ERROR(finalize(op, "reshape op"));
    return op;
  }

  sim::Result<cudnnBackendDescriptor_t> reduction(cudnnReduceTensorOp_t how,
                                                  cudnnBackendDescriptor_t x,
                                                  cudnnBackendDescriptor_t y) {
    OFFSIM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t desc,
                            make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction"));
    const cudnnDataType_t fp32 = CUDNN_DATA_FLOAT;
    OFFSIM_RETURN_IF_ERROR(set(desc, CUDNN_ATTR_REDUCTION_OPERATOR,
                               CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how, "reduction"));
    OFFSIM_RETURN_IF_ERROR(
        set(desc, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &fp32, "reduction"));
    OFFSIM_RETURN_IF_ERROR(finalize(desc, "reduction"));
    OFFSIM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t op,
                            make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction op"));
    OFFSIM_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reduction op"));
    OFFSIM_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reduction op"));
    OFFSIM_RETURN_IF_ERROR(set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &desc, "reduction op"));
    OFFSIM_RETURN_IF_ERROR(finalize(op, "reduction op"));
    return op;
  }

 private:
  const CudnnApi& api_;
  std::vector<cudnnBackendDescriptor_t>& owned_;
};

// The operation graph of `ops`, its heuristics and the first engine config that finalizes into
// an execution plan; that plan's workspace size goes to `workspace_bytes`.
sim::Result<cudnnBackendDescriptor_t> plan_for(Builder& b, const CudnnApi& api,
                                               cudnnHandle_t handle,
                                               std::vector<cudnnBackendDescriptor_t>& ops,
                                               std::int64_t& workspace_bytes) {
  OFFSIM_ASSIGN_OR_RETURN(auto graph, b.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "graph"));
  OFFSIM_RETURN_IF_ERROR(
      b.set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph"));
  OFFSIM_RETURN_IF_ERROR(b.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               static_cast<std::int64_t>(ops.size()), ops.data(), "graph"));
  OFFSIM_RETURN_IF_ERROR(b.finalize(graph, "graph"));

  OFFSIM_ASSIGN_OR_RETURN(auto heur, b.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics"));
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  OFFSIM_RETURN_IF_ERROR(b.set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph, "heuristics"));
  OFFSIM_RETURN_IF_ERROR(
      b.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics"));
  OFFSIM_RETURN_IF_ERROR(b.finalize(heur, "heuristics"));
  constexpr int kMaxConfigs = 8;
  std::vector<cudnnBackendDescriptor_t> configs;
  for (int i = 0; i < kMaxConfigs; ++i) {
    OFFSIM_ASSIGN_OR_RETURN(auto c, b.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"));
    configs.push_back(c);
  }
  std::int64_t found = 0;
  OFFSIM_RETURN_IF_ERROR(api.check(
      api.BackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                              kMaxConfigs, &found, configs.data()),
      "cudnnBackendGetAttribute (heuristic results)"));
  sim::Status last = sim::fail(sim::ErrorCode::kUnsupported,
                               "cuDNN SDPA: the heuristics offer no engine for this graph");
  for (std::int64_t i = 0; i < found && i < kMaxConfigs; ++i) {
    OFFSIM_ASSIGN_OR_RETURN(auto plan, b.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "plan"));
    OFFSIM_RETURN_IF_ERROR(
        b.set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "plan"));
    OFFSIM_RETURN_IF_ERROR(b.set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                 &configs[static_cast<std::size_t>(i)], "plan"));
    last = b.finalize(plan, "execution plan");
    if (!last) continue;  // this engine cannot run the graph here: try the next one
    std::int64_t got = 0;
    OFFSIM_RETURN_IF_ERROR(
        api.check(api.BackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                          CUDNN_TYPE_INT64, 1, &got, &workspace_bytes),
                  "cudnnBackendGetAttribute (workspace size)"));
    return plan;
  }
  return sim::fail(last.error());
}

// Executes `plan` with the (uid, pointer) pairs and `workspace`.
sim::Status execute(const CudnnApi& api, cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                    const std::vector<std::int64_t>& uids, const std::vector<void*>& ptrs,
                    void* workspace) {
  std::vector<cudnnBackendDescriptor_t> pack_owner;
  Builder b(api, pack_owner);
  const auto n = static_cast<std::int64_t>(uids.size());
  auto pack = b.make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
  sim::Status st = pack ? sim::ok() : sim::fail(pack.error());
  if (st)
    st = b.set(*pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids.data(), "pack");
  if (st) {
    st = b.set(*pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs.data(),
               "pack");
  }
  if (st) {
    st =
        b.set(*pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace, "pack");
  }
  if (st) st = b.finalize(*pack, "variant pack");
  if (st) st = api.check(api.BackendExecute(handle, plan, *pack), "cudnnBackendExecute");
  for (auto d : pack_owner) api.BackendDestroyDescriptor(d);
  return st;
}

std::int64_t align256(std::int64_t bytes) { return (bytes + 255) / 256 * 256; }

// The operations of a graph, in the order they are added.
class OpList {
 public:
  sim::Status add(sim::Result<cudnnBackendDescriptor_t> op) {
    if (!op) return sim::fail(op.error());
    ops.push_back(*op);
    return sim::ok();
  }
  std::vector<cudnnBackendDescriptor_t> ops;
};

using Desc = cudnnBackendDescriptor_t;

// The causally masked, scaled scores both graphs start from: S = Q·Kᵀ, scaled = scale · S,
// masked_s = scaled where row >= col, `masked` (−∞) elsewhere (row and col from GEN_INDEX over
// the last two dimensions).
struct MaskedScoreTensors {
  Desc q, kt, scale, masked;                 // operands
  Desc s, scaled, row, col, mask, masked_s;  // virtual intermediates
};

sim::Status add_masked_scores(Builder& b, OpList& l, const MaskedScoreTensors& t) {
  OFFSIM_RETURN_IF_ERROR(l.add(b.matmul(t.q, t.kt, t.s)));
  OFFSIM_RETURN_IF_ERROR(l.add(b.pointwise(CUDNN_POINTWISE_MUL, t.s, t.scale, nullptr, t.scaled)));
  OFFSIM_RETURN_IF_ERROR(
      l.add(b.pointwise(CUDNN_POINTWISE_GEN_INDEX, t.scaled, nullptr, nullptr, t.row, 2)));
  OFFSIM_RETURN_IF_ERROR(
      l.add(b.pointwise(CUDNN_POINTWISE_GEN_INDEX, t.scaled, nullptr, nullptr, t.col, 3)));
  OFFSIM_RETURN_IF_ERROR(l.add(b.pointwise(CUDNN_POINTWISE_CMP_GE, t.row, t.col, nullptr, t.mask)));
  return l.add(b.pointwise(CUDNN_POINTWISE_BINARY_SELECT, t.scaled, t.masked, t.mask, t.masked_s));
}

// The forward graph's tensors: operands (by address or value) and virtual intermediates.
struct ForwardTensors {
  Dims row_dims;
  Desc q, kt, v, o, scale, masked;
  Desc s, scaled, row, col, mask, masked_s, max, centered, exp, sum, p;
};

sim::Result<ForwardTensors> forward_tensors(Builder& b, const SdpaShape& s) {
  const cudnnDataType_t bf16 = CUDNN_DATA_BFLOAT16, fp32 = CUDNN_DATA_FLOAT;
  const Dims q_dims{s.batch, s.q_heads, s.seq_q, s.head_dim};
  const Dims kv_dims{s.batch, s.kv_heads, s.seq_kv, s.head_dim};
  const Dims kv_strides = packed(kv_dims);
  // Kᵀ: the same memory as K read with its last two dimensions swapped.
  const Dims kt_dims{s.batch, s.kv_heads, s.head_dim, s.seq_kv};
  const Dims kt_strides{kv_strides[0], kv_strides[1], 1, s.head_dim};
  const Dims s_dims{s.batch, s.q_heads, s.seq_q, s.seq_kv};
  const Dims one{1, 1, 1, 1};
  ForwardTensors t;
  t.row_dims = {s.batch, s.q_heads, s.seq_q, 1};
  const Dims& row_dims = t.row_dims;
  OFFSIM_ASSIGN_OR_RETURN(t.q, b.tensor(kQ, q_dims, packed(q_dims), bf16, false));
  OFFSIM_ASSIGN_OR_RETURN(t.kt, b.tensor(kK, kt_dims, kt_strides, bf16, false));
  OFFSIM_ASSIGN_OR_RETURN(t.v, b.tensor(kV, kv_dims, kv_strides, bf16, false));
  OFFSIM_ASSIGN_OR_RETURN(t.o, b.tensor(kO, q_dims, packed(q_dims), bf16, false));
  OFFSIM_ASSIGN_OR_RETURN(t.scale, b.tensor(kScale, one, one, fp32, false, true));
  OFFSIM_ASSIGN_OR_RETURN(t.masked, b.tensor(kMasked, one, one, fp32, false, true));
  OFFSIM_ASSIGN_OR_RETURN(t.s, b.tensor(kS, s_dims, packed(s_dims), fp32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.scaled, b.tensor(kScaled, s_dims, packed(s_dims), fp32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.row, b.tensor(kRow, s_dims, packed(s_dims), CUDNN_DATA_INT32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.col, b.tensor(kCol, s_dims, packed(s_dims), CUDNN_DATA_INT32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.mask,
                          b.tensor(kMask, s_dims, packed(s_dims), CUDNN_DATA_BOOLEAN, true));
  OFFSIM_ASSIGN_OR_RETURN(t.masked_s, b.tensor(kMaskedS, s_dims, packed(s_dims), fp32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.max, b.tensor(kMax, row_dims, packed(row_dims), fp32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.centered, b.tensor(kCentered, s_dims, packed(s_dims), fp32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.exp, b.tensor(kExp, s_dims, packed(s_dims), fp32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.sum, b.tensor(kSum, row_dims, packed(row_dims), fp32, true));
  // Probabilities in bf16 for the second tensor-core GEMM, as flash attention does.
  OFFSIM_ASSIGN_OR_RETURN(t.p, b.tensor(kP, s_dims, packed(s_dims), bf16, true));
  return t;
}

// O = softmax(mask(scale · Q·Kᵀ)) · V, and (with_stats) Stats = rowmax + log(rowsum).
sim::Result<std::vector<Desc>> forward_ops(Builder& b, const ForwardTensors& t, bool with_stats) {
  const cudnnDataType_t fp32 = CUDNN_DATA_FLOAT;
  OpList l;
  OFFSIM_RETURN_IF_ERROR(add_masked_scores(
      b, l, {t.q, t.kt, t.scale, t.masked, t.s, t.scaled, t.row, t.col, t.mask, t.masked_s}));
  OFFSIM_RETURN_IF_ERROR(l.add(b.reduction(CUDNN_REDUCE_TENSOR_MAX, t.masked_s, t.max)));
  OFFSIM_RETURN_IF_ERROR(
      l.add(b.pointwise(CUDNN_POINTWISE_SUB, t.masked_s, t.max, nullptr, t.centered)));
  OFFSIM_RETURN_IF_ERROR(
      l.add(b.pointwise(CUDNN_POINTWISE_EXP, t.centered, nullptr, nullptr, t.exp)));
  OFFSIM_RETURN_IF_ERROR(l.add(b.reduction(CUDNN_REDUCE_TENSOR_ADD, t.exp, t.sum)));
  if (with_stats) {
    // Stats = rowmax + log(rowsum): what the backward needs to rebuild P without a second pass.
    const Dims& row_dims = t.row_dims;
    OFFSIM_ASSIGN_OR_RETURN(auto t_log, b.tensor(kLog, row_dims, packed(row_dims), fp32, true));
    OFFSIM_ASSIGN_OR_RETURN(auto stats, b.tensor(kStats, row_dims, packed(row_dims), fp32, false));
    OFFSIM_RETURN_IF_ERROR(l.add(b.pointwise(CUDNN_POINTWISE_LOG, t.sum, nullptr, nullptr, t_log)));
    OFFSIM_RETURN_IF_ERROR(l.add(b.pointwise(CUDNN_POINTWISE_ADD, t_log, t.max, nullptr, stats)));
  }
  OFFSIM_RETURN_IF_ERROR(l.add(b.pointwise(CUDNN_POINTWISE_DIV, t.exp, t.sum, nullptr, t.p)));
  OFFSIM_RETURN_IF_ERROR(l.add(b.matmul(t.p, t.v, t.o)));
  return std::move(l.ops);
}

// The backward graph's tensors: operands, gradients, the engine's own buffers (softmax sum,
// fp32 dQ accumulator) and virtual intermediates.
struct BackwardTensors {
  Desc q, kt, vt, o, d_o, stats, scale, masked, dq, dk, dv, softmax_sum, dq_accum, one;
  Desc sum_raw, dot, s, scaled, row, col, mask, masked_s, centered, p, pt, dp, dp_minus, ds_raw, ds,
      dst, k;
};

sim::Result<BackwardTensors> backward_operand_tensors(Builder& b, const SdpaShape& s) {
  const cudnnDataType_t bf16 = CUDNN_DATA_BFLOAT16, fp32 = CUDNN_DATA_FLOAT;
  const Dims q_dims{s.batch, s.q_heads, s.seq_q, s.head_dim};
  const Dims q_strides = packed(q_dims);
  const Dims kv_dims{s.batch, s.kv_heads, s.seq_kv, s.head_dim};
  const Dims kv_strides = packed(kv_dims);
  // Kᵀ and Vᵀ: K and V read with their last two dimensions swapped.
  const Dims t_dims{s.batch, s.kv_heads, s.head_dim, s.seq_kv};
  const Dims t_strides{kv_strides[0], kv_strides[1], 1, s.head_dim};
  const Dims row_dims{s.batch, s.q_heads, s.seq_q, 1};
  const Dims row_strides = packed(row_dims);
  const Dims one{1, 1, 1, 1};
  BackwardTensors t{};
  OFFSIM_ASSIGN_OR_RETURN(t.q, b.tensor(kQ, q_dims, q_strides, bf16, false));
  OFFSIM_ASSIGN_OR_RETURN(t.kt, b.tensor(kK, t_dims, t_strides, bf16, false));
  OFFSIM_ASSIGN_OR_RETURN(t.vt, b.tensor(kV, t_dims, t_strides, bf16, false));
  OFFSIM_ASSIGN_OR_RETURN(t.o, b.tensor(kO, q_dims, q_strides, bf16, false));
  OFFSIM_ASSIGN_OR_RETURN(t.d_o, b.tensor(kDO, q_dims, q_strides, bf16, false));
  OFFSIM_ASSIGN_OR_RETURN(t.stats, b.tensor(kStats, row_dims, row_strides, fp32, false));
  OFFSIM_ASSIGN_OR_RETURN(t.scale, b.tensor(kScale, one, one, fp32, false, true));
  OFFSIM_ASSIGN_OR_RETURN(t.masked, b.tensor(kMasked, one, one, fp32, false, true));
  OFFSIM_ASSIGN_OR_RETURN(t.dq, b.tensor(kDQ, q_dims, q_strides, bf16, false));
  OFFSIM_ASSIGN_OR_RETURN(t.dk, b.tensor(kDK, kv_dims, kv_strides, bf16, false));
  OFFSIM_ASSIGN_OR_RETURN(t.dv, b.tensor(kDV, kv_dims, kv_strides, bf16, false));
  OFFSIM_ASSIGN_OR_RETURN(t.softmax_sum, b.tensor(kSoftmaxSum, row_dims, row_strides, fp32, false));
  // Plain BHSD fp32, as cudnn-frontend (v1.8 on) builds it; its earlier F16x16 tile order is
  // not needed.
  OFFSIM_ASSIGN_OR_RETURN(t.dq_accum, b.tensor(kDQAccum, q_dims, q_strides, fp32, false));
  OFFSIM_ASSIGN_OR_RETURN(t.one, b.tensor(kOne, one, one, fp32, false, true));
  return t;
}

// The virtual intermediates of the backward graph, after its operands (backward_operand_tensors).
sim::Status backward_virtual_tensors(Builder& b, const SdpaShape& s, BackwardTensors& t) {
  const cudnnDataType_t bf16 = CUDNN_DATA_BFLOAT16, fp32 = CUDNN_DATA_FLOAT;
  const Dims q_dims{s.batch, s.q_heads, s.seq_q, s.head_dim};
  const Dims q_strides = packed(q_dims);
  const Dims kv_dims{s.batch, s.kv_heads, s.seq_kv, s.head_dim};
  const Dims kv_strides = packed(kv_dims);
  const Dims p_dims{s.batch, s.q_heads, s.seq_q, s.seq_kv};
  const Dims p_strides = packed(p_dims);
  const Dims pt_dims{s.batch, s.q_heads, s.seq_kv, s.seq_q};
  const Dims pt_strides{p_strides[0], p_strides[1], 1, s.seq_kv};
  // dO ∘ O with the strides cudnn-frontend gives it.
  const Dims dot_strides{s.q_heads * s.seq_q * s.head_dim, s.seq_q * s.head_dim,
                         s.q_heads * s.head_dim, 1};
  const Dims row_dims{s.batch, s.q_heads, s.seq_q, 1};
  OFFSIM_ASSIGN_OR_RETURN(t.dot, b.tensor(kDotDoO, q_dims, dot_strides, fp32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.sum_raw, b.tensor(kBSumRaw, row_dims, packed(row_dims), fp32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.s, b.tensor(kBS, p_dims, p_strides, fp32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.scaled, b.tensor(kBScaled, p_dims, p_strides, fp32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.row, b.tensor(kBRow, p_dims, p_strides, CUDNN_DATA_INT32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.col, b.tensor(kBCol, p_dims, p_strides, CUDNN_DATA_INT32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.mask, b.tensor(kBMask, p_dims, p_strides, CUDNN_DATA_BOOLEAN, true));
  OFFSIM_ASSIGN_OR_RETURN(t.masked_s, b.tensor(kBMasked, p_dims, p_strides, fp32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.centered, b.tensor(kBCentered, p_dims, p_strides, fp32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.p, b.tensor(kBP, p_dims, p_strides, fp32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.pt, b.tensor(kBPt, pt_dims, pt_strides, bf16, true));
  OFFSIM_ASSIGN_OR_RETURN(t.dp, b.tensor(kBDP, p_dims, p_strides, fp32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.dp_minus, b.tensor(kBDPMinus, p_dims, p_strides, fp32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.ds_raw, b.tensor(kBDSRaw, p_dims, p_strides, fp32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.ds, b.tensor(kBDS, p_dims, p_strides, fp32, true));
  OFFSIM_ASSIGN_OR_RETURN(t.dst, b.tensor(kBDSt, pt_dims, pt_strides, bf16, true));
  OFFSIM_ASSIGN_OR_RETURN(t.k, b.tensor(kBK, kv_dims, kv_strides, bf16, true));
  return sim::ok();
}

// dQ, dK, dV of O = softmax(mask(scale · Q·Kᵀ)) · V from dO, O and the forward's Stats.
sim::Result<std::vector<Desc>> backward_ops(Builder& b, const BackwardTensors& t) {
  OpList l;
  // softmax_sum = rowsum(dO ∘ O) · 1. The product with a by-value 1 (cudnn-frontend's inverse
  // dropout scale) is part of the pattern the fused engine recognises: without it, cuDNN on an
  // H200 (2026-12-04) accepted the graph but never wrote softmax_sum, and dQ and dK came out as if
  // it were zero (tests/backends/cuda_replay_test.cc checks both against a host reference).
  OFFSIM_RETURN_IF_ERROR(l.add(b.pointwise(CUDNN_POINTWISE_MUL, t.d_o, t.o, nullptr, t.dot)));
  OFFSIM_RETURN_IF_ERROR(l.add(b.reduction(CUDNN_REDUCE_TENSOR_ADD, t.dot, t.sum_raw)));
  OFFSIM_RETURN_IF_ERROR(
      l.add(b.pointwise(CUDNN_POINTWISE_MUL, t.sum_raw, t.one, nullptr, t.softmax_sum)));
  // P = exp(mask(scale · Q·Kᵀ) − Stats)
  OFFSIM_RETURN_IF_ERROR(add_masked_scores(
      b, l, {t.q, t.kt, t.scale, t.masked, t.s, t.scaled, t.row, t.col, t.mask, t.masked_s}));
  OFFSIM_RETURN_IF_ERROR(
      l.add(b.pointwise(CUDNN_POINTWISE_SUB, t.masked_s, t.stats, nullptr, t.centered)));
  OFFSIM_RETURN_IF_ERROR(
      l.add(b.pointwise(CUDNN_POINTWISE_EXP, t.centered, nullptr, nullptr, t.p)));
  // dV = Pᵀ · dO
  OFFSIM_RETURN_IF_ERROR(l.add(b.reshape(t.p, t.pt)));
  OFFSIM_RETURN_IF_ERROR(l.add(b.matmul(t.pt, t.d_o, t.dv)));
  // dS = scale · P ∘ (dO·Vᵀ − softmax_sum)
  OFFSIM_RETURN_IF_ERROR(l.add(b.matmul(t.d_o, t.vt, t.dp)));
  OFFSIM_RETURN_IF_ERROR(
      l.add(b.pointwise(CUDNN_POINTWISE_SUB, t.dp, t.softmax_sum, nullptr, t.dp_minus)));
  OFFSIM_RETURN_IF_ERROR(
      l.add(b.pointwise(CUDNN_POINTWISE_MUL, t.dp_minus, t.p, nullptr, t.ds_raw)));
  OFFSIM_RETURN_IF_ERROR(l.add(b.pointwise(CUDNN_POINTWISE_MUL, t.ds_raw, t.scale, nullptr, t.ds)));
  // dQ = dS · K, accumulated in fp32 then cast; dK = dSᵀ · Q.
  OFFSIM_RETURN_IF_ERROR(l.add(b.reshape(t.kt, t.k)));
  // dS enters dQ's GEMM in fp32; the transpose for dK's casts it to bf16 (as the frontend).
  OFFSIM_RETURN_IF_ERROR(l.add(b.matmul(t.ds, t.k, t.dq_accum)));
  OFFSIM_RETURN_IF_ERROR(l.add(b.reshape(t.ds, t.dst)));
  OFFSIM_RETURN_IF_ERROR(l.add(b.matmul(t.dst, t.q, t.dk)));
  OFFSIM_RETURN_IF_ERROR(
      l.add(b.pointwise(CUDNN_POINTWISE_IDENTITY, t.dq_accum, nullptr, nullptr, t.dq)));
  return std::move(l.ops);
}

}  // namespace

CudnnSdpaForward::~CudnnSdpaForward() {
  for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) api_.BackendDestroyDescriptor(*it);
}

sim::Result<std::unique_ptr<CudnnSdpaForward>> CudnnSdpaForward::build(const CudnnApi& api,
                                                                       cudnnHandle_t handle,
                                                                       const SdpaShape& s,
                                                                       bool with_stats) {
  if (s.batch < 1 || s.q_heads < 1 || s.kv_heads < 1 || s.q_heads % s.kv_heads != 0 ||
      s.seq_q < 1 || s.seq_kv < 1 || s.head_dim < 1 || s.head_dim % 8 != 0) {
    return sim::fail(sim::ErrorCode::kUnsupported,
                     "cuDNN SDPA: batch {} heads {}/{} seq {}x{} head_dim {} (needs positive "
                     "sizes, kv heads dividing query heads, head_dim a multiple of 8)",
                     s.batch, s.q_heads, s.kv_heads, s.seq_q, s.seq_kv, s.head_dim);
  }
  std::unique_ptr<CudnnSdpaForward> f(new CudnnSdpaForward(api));
  f->with_stats_ = with_stats;
  f->scale_ = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  f->masked_ = -std::numeric_limits<float>::infinity();
  Builder b(api, f->owned_);
  OFFSIM_ASSIGN_OR_RETURN(const ForwardTensors t, forward_tensors(b, s));
  OFFSIM_ASSIGN_OR_RETURN(std::vector<Desc> ops, forward_ops(b, t, with_stats));
  sim::Result<cudnnBackendDescriptor_t> plan = plan_for(b, api, handle, ops, f->workspace_bytes_);
  if (!plan) return sim::fail(sim::with_context(plan.error(), "cuDNN SDPA forward: "));
  f->plan_ = *plan;
  return f;
}

sim::Status CudnnSdpaForward::run(cudnnHandle_t handle, const void* q, const void* k, const void* v,
                                  void* out, void* workspace, void* stats) const {
  std::vector<std::int64_t> uids = {kQ, kK, kV, kO, kScale, kMasked};
  std::vector<void*> ptrs = {const_cast<void*>(q),        const_cast<void*>(k),
                             const_cast<void*>(v),        out,
                             const_cast<float*>(&scale_), const_cast<float*>(&masked_)};
  if (with_stats_) {
    if (!stats) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "cuDNN SDPA forward built with statistics run without a stats buffer");
    }
    uids.push_back(kStats);
    ptrs.push_back(stats);
  }
  return execute(api_, handle, plan_, uids, ptrs, workspace);
}

CudnnSdpaBackward::~CudnnSdpaBackward() {
  for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) api_.BackendDestroyDescriptor(*it);
}

sim::Result<std::unique_ptr<CudnnSdpaBackward>> CudnnSdpaBackward::build(const CudnnApi& api,
                                                                         cudnnHandle_t handle,
                                                                         const SdpaShape& s) {
  if (s.batch < 1 || s.q_heads < 1 || s.kv_heads != s.q_heads || s.seq_q < 1 || s.seq_kv < 1 ||
      s.head_dim < 1 || s.head_dim % 8 != 0) {
    return sim::fail(sim::ErrorCode::kUnsupported,
                     "cuDNN SDPA backward: batch {} heads {}/{} seq {}x{} head_dim {} (needs "
                     "positive sizes, key/value heads equal to query heads, head_dim a multiple "
                     "of 8)",
                     s.batch, s.q_heads, s.kv_heads, s.seq_q, s.seq_kv, s.head_dim);
  }
  std::unique_ptr<CudnnSdpaBackward> f(new CudnnSdpaBackward(api));
  f->scale_ = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  f->masked_ = -std::numeric_limits<float>::infinity();
  Builder b(api, f->owned_);
  OFFSIM_ASSIGN_OR_RETURN(BackwardTensors t, backward_operand_tensors(b, s));
  OFFSIM_RETURN_IF_ERROR(backward_virtual_tensors(b, s, t));
  OFFSIM_ASSIGN_OR_RETURN(std::vector<Desc> ops, backward_ops(b, t));
  sim::Result<cudnnBackendDescriptor_t> plan = plan_for(b, api, handle, ops, f->workspace_bytes_);
  if (!plan) return sim::fail(sim::with_context(plan.error(), "cuDNN SDPA backward: "));
  f->plan_ = *plan;
  f->workspace_bytes_ = align256(f->workspace_bytes_);
  f->sum_bytes_ = align256(s.batch * s.q_heads * s.seq_q * 4);
  f->accum_bytes_ = align256(s.batch * s.q_heads * s.seq_q * s.head_dim * 4);
  return f;
}

sim::Status CudnnSdpaBackward::run(cudnnHandle_t handle, cudaStream_t stream,
                                   const SdpaBackwardOperands& x, void* workspace) const {
  char* ws = static_cast<char*>(workspace);
  void* sum = ws + workspace_bytes_;
  void* accum = ws + workspace_bytes_ + sum_bytes_;
  const cudaError_t zeroed =
      cudaMemsetAsync(accum, 0, static_cast<std::size_t>(accum_bytes_), stream);
  if (zeroed != cudaSuccess) {
    cudaGetLastError();
    return sim::fail(sim::ErrorCode::kDevice,
                     "cuDNN SDPA backward: cudaMemsetAsync of the dQ accumulator: {}",
                     cudaGetErrorString(zeroed));
  }
  const std::vector<std::int64_t> uids = {kQ,      kK,  kV,  kO,  kDO,         kStats,   kScale,
                                          kMasked, kDQ, kDK, kDV, kSoftmaxSum, kDQAccum, kOne};
  const std::vector<void*> ptrs = {const_cast<void*>(x.q),
                                   const_cast<void*>(x.k),
                                   const_cast<void*>(x.v),
                                   const_cast<void*>(x.o),
                                   const_cast<void*>(x.d_o),
                                   const_cast<void*>(x.stats),
                                   const_cast<float*>(&scale_),
                                   const_cast<float*>(&masked_),
                                   x.dq,
                                   x.dk,
                                   x.dv,
                                   sum,
                                   accum,
                                   const_cast<float*>(&one_)};
  return execute(api_, handle, plan_, uids, ptrs, workspace);
}

}  // namespace offsim::backends::cuda
