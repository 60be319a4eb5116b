#include "sim/plan/plan_json.h"

#include <cmath>
#include <unordered_map>

#include "sim/core/file_io.h"
#include "sim/core/json_reader.h"

namespace offsim::sim {

using nlohmann::json;

namespace {

json sizes_to_json(const Op& op) {
  const OpSizes& s = op.sizes;
  json j = json::object();
  if (s.flops != 0.0) j["flops"] = s.flops;
  if (s.bytes != 0) j["bytes"] = s.bytes;
  switch (op.kind) {
    case OpKind::kGemm:
      j["gemm"] = {{"m", s.gemm.m},
                   {"n", s.gemm.n},
                   {"k", s.gemm.k},
                   {"batch", s.gemm.batch},
                   {"dtype", to_string(s.gemm.dtype)}};
      if (s.gemm.grouped) j["gemm"]["grouped"] = true;
      break;
    case OpKind::kAttention: {
      const AttentionShape& a = s.attention;
      j["attention"] = {
          {"batch", a.batch},   {"heads", a.heads},       {"kv_heads", a.kv_heads},
          {"seq_q", a.seq_q},   {"seq_kv", a.seq_kv},     {"head_dim", a.head_dim},
          {"causal", a.causal}, {"backward", a.backward}, {"dtype", to_string(a.dtype)}};
      break;
    }
    case OpKind::kCollective:
      j["collective"] = {{"kind", to_string(s.collective.kind)}, {"group", s.collective.group}};
      break;
    case OpKind::kCopy:
      j["direction"] = to_string(s.copy_direction);
      break;
    case OpKind::kP2P:
      j["peer"] = s.peer;
      j["role"] = to_string(s.p2p_role);
      if (s.p2p_pair >= 0) j["pair"] = s.p2p_pair;
      break;
    default:
      break;
  }
  return j;
}

json cost_to_json(const Plan& plan, const OpCost& c) {
  json j = json::object();
  j["work"] = c.work;
  if (std::isfinite(c.max_rate)) j["max_rate"] = c.max_rate;
  json uses = json::array();
  for (const ResourceUse& u : c.uses) {
    uses.push_back(json::array({plan.resources[u.resource.index()].name, u.per_unit}));
  }
  j["uses"] = std::move(uses);
  if (c.latency.count() != 0) j["latency_ns"] = c.latency.count();
  if (c.multiplicity != 1) j["multiplicity"] = c.multiplicity;
  return j;
}

json ids_to_json(const auto& ids) {
  json j = json::array();
  for (auto id : ids) j.push_back(id.value());
  return j;
}

}  // namespace

json plan_to_json(const Plan& plan) {
  json j;
  j["format"] = "offsim-plan";
  j["format_version"] = kPlanFormatVersion;
  json meta = json::array();
  for (const auto& [k, v] : plan.metadata) meta.push_back(json::array({k, v}));
  j["metadata"] = std::move(meta);
  if (!plan.representatives.empty()) {
    json reps = json::array();
    for (const Representative& r : plan.representatives) {
      reps.push_back({{"rank", r.rank}, {"multiplicity", r.multiplicity}, {"stride", r.stride}});
    }
    j["representatives"] = std::move(reps);
  }
  json lanes = json::array();
  for (const Lane& l : plan.lanes) {
    // A lane without identity stays a plain name (the format before lanes had one).
    if (l.rank < 0 && l.stage < 0 && l.role == LaneRole::kOther) {
      lanes.push_back(l.name);
    } else {
      lanes.push_back(
          {{"name", l.name}, {"rank", l.rank}, {"stage", l.stage}, {"role", to_string(l.role)}});
    }
  }
  j["lanes"] = std::move(lanes);
  json resources = json::array();
  for (const Resource& r : plan.resources) {
    resources.push_back({{"name", r.name}, {"capacity", r.capacity}});
  }
  j["resources"] = std::move(resources);
  json pools = json::array();
  for (const Pool& p : plan.pools) {
    json o = {{"name", p.name}, {"capacity_bytes", p.capacity_bytes}};
    if (p.kind != PoolKind::kOther || p.owner >= 0) {
      o["kind"] = to_string(p.kind);
      o["owner"] = p.owner;
    }
    pools.push_back(std::move(o));
  }
  j["pools"] = std::move(pools);
  json tensors = json::array();
  for (const Tensor& t : plan.tensors) {
    tensors.push_back({{"name", t.name},
                       {"pool", plan.pools[t.pool.index()].name},
                       {"bytes", t.bytes},
                       {"category", to_string(t.category)}});
  }
  j["tensors"] = std::move(tensors);
  j["initial_tensors"] = ids_to_json(plan.initial_tensors);
  json ops = json::array();
  for (const Op& op : plan.ops) {
    json o;
    o["name"] = op.name;
    o["lane"] = plan.lanes[op.lane.index()].name;
    o["kind"] = to_string(op.kind);
    if (op.category != OpCategory::kNone) o["category"] = to_string(op.category);
    if (op.layer >= 0) o["layer"] = op.layer;
    json sizes = sizes_to_json(op);
    if (!sizes.empty()) o["sizes"] = std::move(sizes);
    o["cost"] = cost_to_json(plan, op.cost);
    if (!op.deps.empty()) o["deps"] = ids_to_json(op.deps);
    if (!op.allocs.empty()) o["allocs"] = ids_to_json(op.allocs);
    if (!op.frees.empty()) o["frees"] = ids_to_json(op.frees);
    ops.push_back(std::move(o));
  }
  j["ops"] = std::move(ops);
  return j;
}

namespace {

class PlanParser {
 public:
  explicit PlanParser(const std::string& source) : r_(source) {}

  Result<Plan> parse(const json& root) {
    // Another of offsim's files given where a plan is expected: say which.
    const std::string kind = json_document_kind(root);
    if (!kind.empty() && kind.rfind("a Plan JSON", 0) != 0) {
      return r_.error(
          "$",
          fmt::format("this is {}, expected a Plan JSON (write one with offsim run --plan-out)",
                      kind));
    }
    OFFSIM_RETURN_IF_ERROR(
        r_.only_keys(root,
                     {"format", "format_version", "metadata", "representatives", "lanes",
                      "resources", "pools", "tensors", "initial_tensors", "ops"},
                     "$"));
    OFFSIM_ASSIGN_OR_RETURN(std::string format, r_.string(root, "format", "$"));
    if (format != "offsim-plan") {
      return r_.error("$.format", fmt::format("expected \"offsim-plan\", got \"{}\"", format));
    }
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t version, r_.integer(root, "format_version", "$"));
    if (version != kPlanFormatVersion) {
      return r_.error("$.format_version", fmt::format("this offsim reads version {}, got {}",
                                                      kPlanFormatVersion, version));
    }
    OFFSIM_RETURN_IF_ERROR(parse_metadata(root));
    OFFSIM_RETURN_IF_ERROR(parse_representatives(root));
    OFFSIM_RETURN_IF_ERROR(parse_lanes(root));
    OFFSIM_RETURN_IF_ERROR(parse_resources(root));
    OFFSIM_RETURN_IF_ERROR(parse_pools(root));
    OFFSIM_RETURN_IF_ERROR(parse_tensors(root));
    OFFSIM_ASSIGN_OR_RETURN(const json* initial, r_.array(root, "initial_tensors", "$"));
    OFFSIM_RETURN_IF_ERROR(parse_ids(*initial, "$.initial_tensors", plan_.initial_tensors));
    OFFSIM_RETURN_IF_ERROR(parse_ops(root));
    Status valid = validate(plan_);
    if (!valid) return fail(with_context(valid.error(), r_.source() + ": "));
    return std::move(plan_);
  }

 private:
  Status parse_representatives(const json& root) {
    OFFSIM_ASSIGN_OR_RETURN(const json* list, r_.optional_member(root, "representatives", "$"));
    if (!list) return ok();
    if (!list->is_array()) return r_.error("$.representatives", "expected an array");
    for (std::size_t i = 0; i < list->size(); ++i) {
      const json& item = (*list)[i];
      const std::string path = fmt::format("$.representatives[{}]", i);
      OFFSIM_RETURN_IF_ERROR(r_.only_keys(item, {"rank", "multiplicity", "stride"}, path));
      Representative r;
      for (auto [key, field] :
           {std::pair{"rank", &r.rank}, std::pair{"multiplicity", &r.multiplicity},
            std::pair{"stride", &r.stride}}) {
        OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, r_.integer(item, key, path));
        if (v < 0 || v > (1 << 24)) {
          return r_.error(path + "." + key, "out of range (expected 0 .. 2^24)");
        }
        *field = static_cast<int>(v);
      }
      plan_.representatives.push_back(r);
    }
    return ok();
  }

  Status parse_metadata(const json& root) {
    OFFSIM_ASSIGN_OR_RETURN(const json* meta, r_.optional_member(root, "metadata", "$"));
    if (meta == nullptr) return ok();
    if (!meta->is_array()) return r_.error("$.metadata", "expected an array of [key, value]");
    for (std::size_t i = 0; i < meta->size(); ++i) {
      const json& kv = (*meta)[i];
      const std::string path = fmt::format("$.metadata[{}]", i);
      if (!kv.is_array() || kv.size() != 2 || !kv[0].is_string() || !kv[1].is_string()) {
        return r_.error(path, "expected [key, value] with two strings");
      }
      plan_.metadata.emplace_back(kv[0].get<std::string>(), kv[1].get<std::string>());
    }
    return ok();
  }

  Status parse_lanes(const json& root) {
    OFFSIM_ASSIGN_OR_RETURN(const json* lanes, r_.array(root, "lanes", "$"));
    for (std::size_t i = 0; i < lanes->size(); ++i) {
      const std::string path = fmt::format("$.lanes[{}]", i);
      Lane lane;
      if ((*lanes)[i].is_string()) {
        OFFSIM_ASSIGN_OR_RETURN(lane.name, r_.as_string((*lanes)[i], path));
      } else {
        OFFSIM_ASSIGN_OR_RETURN(lane, parse_lane((*lanes)[i], path));
      }
      lane_ids_.emplace(lane.name, LaneId{i});
      plan_.lanes.push_back(std::move(lane));
    }
    return ok();
  }

  // A lane with identity: {"name", "rank", "stage", "role"}; a plain string is a name alone.
  Result<Lane> parse_lane(const json& item, const std::string& path) {
    OFFSIM_RETURN_IF_ERROR(r_.only_keys(item, {"name", "rank", "stage", "role"}, path));
    Lane lane;
    OFFSIM_ASSIGN_OR_RETURN(lane.name, r_.string(item, "name", path));
    OFFSIM_ASSIGN_OR_RETURN(lane.rank, rank_field(item, "rank", path));
    OFFSIM_ASSIGN_OR_RETURN(lane.stage, rank_field(item, "stage", path));
    OFFSIM_ASSIGN_OR_RETURN(
        std::optional<LaneRole> role,
        r_.optional_enum(item, "role", path, lane_role_from_string, "lane role",
                         " (expected other, compute, comm, p2p, recv, h2d, d2h or cpu)"));
    if (role) lane.role = *role;
    return lane;
  }

  // An optional rank-like integer field in [-1, 2^24]; -1 when absent.
  Result<int> rank_field(const json& item, const char* key, const std::string& path) {
    OFFSIM_ASSIGN_OR_RETURN(const json* value, r_.optional_member(item, key, path));
    if (!value) return -1;
    const std::string where = path + "." + key;
    OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, r_.as_integer(*value, where));
    if (v < -1 || v > (1 << 24)) return r_.error(where, "out of range (expected -1 .. 2^24)");
    return static_cast<int>(v);
  }

  Status parse_resources(const json& root) {
    OFFSIM_ASSIGN_OR_RETURN(const json* list, r_.array(root, "resources", "$"));
    for (std::size_t i = 0; i < list->size(); ++i) {
      const json& item = (*list)[i];
      const std::string path = fmt::format("$.resources[{}]", i);
      OFFSIM_RETURN_IF_ERROR(r_.only_keys(item, {"name", "capacity"}, path));
      OFFSIM_ASSIGN_OR_RETURN(std::string name, r_.string(item, "name", path));
      OFFSIM_ASSIGN_OR_RETURN(double capacity, r_.number(item, "capacity", path));
      resource_ids_.emplace(name, ResourceId{i});
      plan_.resources.push_back(Resource{std::move(name), capacity});
    }
    return ok();
  }

  Status parse_pools(const json& root) {
    OFFSIM_ASSIGN_OR_RETURN(const json* list, r_.array(root, "pools", "$"));
    for (std::size_t i = 0; i < list->size(); ++i) {
      const json& item = (*list)[i];
      const std::string path = fmt::format("$.pools[{}]", i);
      OFFSIM_RETURN_IF_ERROR(r_.only_keys(item, {"name", "capacity_bytes", "kind", "owner"}, path));
      OFFSIM_ASSIGN_OR_RETURN(std::string name, r_.string(item, "name", path));
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t capacity, r_.integer(item, "capacity_bytes", path));
      Pool pool{.name = name, .capacity_bytes = capacity};
      OFFSIM_ASSIGN_OR_RETURN(
          std::optional<PoolKind> kind,
          r_.optional_enum(item, "kind", path, pool_kind_from_string, "pool kind",
                           " (expected other, hbm or pinned_host)"));
      if (kind) pool.kind = *kind;
      OFFSIM_ASSIGN_OR_RETURN(pool.owner, rank_field(item, "owner", path));
      pool_ids_.emplace(name, PoolId{i});
      plan_.pools.push_back(std::move(pool));
    }
    return ok();
  }

  Result<OpCategory> parse_op_category(const json& value, const std::string& path) {
    OFFSIM_ASSIGN_OR_RETURN(std::string name, r_.as_string(value, path));
    auto c = op_category_from_string(name);
    if (!c) {
      return r_.error(path, fmt::format("unknown op category '{}' (expected one of {})", name,
                                        op_category_names()));
    }
    return *c;
  }

  Status parse_tensors(const json& root) {
    OFFSIM_ASSIGN_OR_RETURN(const json* list, r_.array(root, "tensors", "$"));
    for (std::size_t i = 0; i < list->size(); ++i) {
      const json& item = (*list)[i];
      const std::string path = fmt::format("$.tensors[{}]", i);
      OFFSIM_RETURN_IF_ERROR(r_.only_keys(item, {"name", "pool", "bytes", "category"}, path));
      Tensor t;
      OFFSIM_ASSIGN_OR_RETURN(t.name, r_.string(item, "name", path));
      OFFSIM_ASSIGN_OR_RETURN(std::string pool, r_.string(item, "pool", path));
      auto it = pool_ids_.find(pool);
      if (it == pool_ids_.end()) {
        return r_.error(path + ".pool", fmt::format("unknown pool '{}'", pool));
      }
      t.pool = it->second;
      OFFSIM_ASSIGN_OR_RETURN(t.bytes, r_.integer(item, "bytes", path));
      OFFSIM_ASSIGN_OR_RETURN(std::string category, r_.string(item, "category", path));
      auto c = tensor_category_from_string(category);
      if (!c) {
        return r_.error(path + ".category",
                        fmt::format("unknown tensor category '{}' (expected one of {})", category,
                                    tensor_category_names()));
      }
      t.category = *c;
      plan_.tensors.push_back(std::move(t));
    }
    return ok();
  }

  template <class Ids>  // a std::vector or sim::SmallVector of ids
  Status parse_ids(const json& list, const std::string& path, Ids& out) {
    if (!list.is_array()) return r_.error(path, "expected an array of ids");
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string item_path = fmt::format("{}[{}]", path, i);
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t v, r_.as_integer(list[i], item_path));
      if (v < 0 || v >= std::int64_t{TaggedId<void>::kInvalidValue}) {
        return r_.error(item_path, fmt::format("id {} is out of range", v));
      }
      out.push_back(typename Ids::value_type{static_cast<std::uint32_t>(v)});
    }
    return ok();
  }

  Status parse_sizes(const json& s, const std::string& path, Op& op) {
    OFFSIM_RETURN_IF_ERROR(r_.only_keys(
        s,
        {"flops", "bytes", "gemm", "attention", "collective", "direction", "peer", "role", "pair"},
        path));
    OpSizes& out = op.sizes;
    OFFSIM_ASSIGN_OR_RETURN(const json* flops, r_.optional_member(s, "flops", path));
    if (flops) {
      OFFSIM_ASSIGN_OR_RETURN(out.flops, r_.as_number(*flops, path + ".flops"));
    }
    OFFSIM_ASSIGN_OR_RETURN(const json* bytes, r_.optional_member(s, "bytes", path));
    if (bytes) {
      OFFSIM_ASSIGN_OR_RETURN(out.bytes, r_.as_integer(*bytes, path + ".bytes"));
    }
    OFFSIM_ASSIGN_OR_RETURN(const json* gemm, r_.optional_member(s, "gemm", path));
    if (gemm) OFFSIM_RETURN_IF_ERROR(parse_gemm(*gemm, path + ".gemm", out.gemm));
    OFFSIM_ASSIGN_OR_RETURN(const json* att, r_.optional_member(s, "attention", path));
    if (att) OFFSIM_RETURN_IF_ERROR(parse_attention(*att, path + ".attention", out.attention));
    OFFSIM_ASSIGN_OR_RETURN(const json* coll, r_.optional_member(s, "collective", path));
    if (coll) OFFSIM_RETURN_IF_ERROR(parse_collective(*coll, path + ".collective", out.collective));
    OFFSIM_ASSIGN_OR_RETURN(std::optional<CopyDirection> direction,
                            r_.optional_enum(s, "direction", path, copy_direction_from_string,
                                             "direction", " (expected h2d, d2h, d2d or h2h)"));
    if (direction) out.copy_direction = *direction;
    return parse_p2p(s, path, out);
  }

  Status parse_gemm(const json& gemm, const std::string& p, GemmShape& out) {
    OFFSIM_RETURN_IF_ERROR(r_.only_keys(gemm, {"m", "n", "k", "batch", "dtype", "grouped"}, p));
    OFFSIM_ASSIGN_OR_RETURN(out.m, r_.integer(gemm, "m", p));
    OFFSIM_ASSIGN_OR_RETURN(out.n, r_.integer(gemm, "n", p));
    OFFSIM_ASSIGN_OR_RETURN(out.k, r_.integer(gemm, "k", p));
    OFFSIM_ASSIGN_OR_RETURN(out.batch, r_.integer(gemm, "batch", p));
    OFFSIM_ASSIGN_OR_RETURN(out.dtype, parse_dtype(gemm, p));
    OFFSIM_ASSIGN_OR_RETURN(const json* grouped, r_.optional_member(gemm, "grouped", p));
    if (grouped) {
      if (!grouped->is_boolean()) return r_.error(p + ".grouped", "expected true or false");
      out.grouped = grouped->get<bool>();
    }
    return ok();
  }

  Status parse_attention(const json& att, const std::string& p, AttentionShape& a) {
    OFFSIM_RETURN_IF_ERROR(r_.only_keys(att,
                                        {"batch", "heads", "kv_heads", "seq_q", "seq_kv",
                                         "head_dim", "causal", "backward", "dtype"},
                                        p));
    OFFSIM_ASSIGN_OR_RETURN(a.batch, r_.integer(att, "batch", p));
    OFFSIM_ASSIGN_OR_RETURN(a.heads, r_.integer(att, "heads", p));
    OFFSIM_ASSIGN_OR_RETURN(a.kv_heads, r_.integer(att, "kv_heads", p));
    OFFSIM_ASSIGN_OR_RETURN(a.seq_q, r_.integer(att, "seq_q", p));
    OFFSIM_ASSIGN_OR_RETURN(a.seq_kv, r_.integer(att, "seq_kv", p));
    OFFSIM_ASSIGN_OR_RETURN(a.head_dim, r_.integer(att, "head_dim", p));
    OFFSIM_ASSIGN_OR_RETURN(a.causal, r_.boolean(att, "causal", p));
    OFFSIM_ASSIGN_OR_RETURN(a.backward, r_.boolean(att, "backward", p));
    OFFSIM_ASSIGN_OR_RETURN(a.dtype, parse_dtype(att, p));
    return ok();
  }

  Status parse_collective(const json& coll, const std::string& p, CollectiveSpec& out) {
    OFFSIM_RETURN_IF_ERROR(r_.only_keys(coll, {"kind", "group"}, p));
    OFFSIM_ASSIGN_OR_RETURN(std::string kind, r_.string(coll, "kind", p));
    auto k = collective_kind_from_string(kind);
    if (!k) {
      return r_.error(p + ".kind", fmt::format("unknown collective '{}' (expected all_reduce, "
                                               "all_gather, reduce_scatter, broadcast or "
                                               "all_to_all)",
                                               kind));
    }
    out.kind = *k;
    OFFSIM_ASSIGN_OR_RETURN(const json* group, r_.array(coll, "group", p));
    for (std::size_t i = 0; i < group->size(); ++i) {
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t rank,
                              r_.as_integer((*group)[i], fmt::format("{}.group[{}]", p, i)));
      if (rank < 0 || rank > (1 << 24)) {
        return r_.error(fmt::format("{}.group[{}]", p, i), "rank out of range");
      }
      out.group.push_back(static_cast<int>(rank));
    }
    return ok();
  }

  // The point-to-point fields of the sizes object `s`: "peer", "role" and "pair".
  Status parse_p2p(const json& s, const std::string& path, OpSizes& out) {
    OFFSIM_ASSIGN_OR_RETURN(const json* peer, r_.optional_member(s, "peer", path));
    if (peer) {
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t p, r_.as_integer(*peer, path + ".peer"));
      if (p < -1 || p > (1 << 24)) return r_.error(path + ".peer", "rank out of range");
      out.peer = static_cast<int>(p);
    }
    OFFSIM_ASSIGN_OR_RETURN(std::optional<P2PRole> role,
                            r_.optional_enum(s, "role", path, p2p_role_from_string, "p2p role",
                                             " (expected send or recv)"));
    if (role) out.p2p_role = *role;
    OFFSIM_ASSIGN_OR_RETURN(const json* pair, r_.optional_member(s, "pair", path));
    if (pair) {
      OFFSIM_ASSIGN_OR_RETURN(out.p2p_pair, r_.as_integer(*pair, path + ".pair"));
      if (out.p2p_pair < -1) return r_.error(path + ".pair", "expected -1 or a pair id >= 0");
    }
    return ok();
  }

  Result<DType> parse_dtype(const json& object, const std::string& path) {
    OFFSIM_ASSIGN_OR_RETURN(std::string name, r_.string(object, "dtype", path));
    auto d = dtype_from_string(name);
    if (!d) {
      return r_.error(path + ".dtype",
                      fmt::format("unknown dtype '{}' (expected fp32, bf16, fp16 or fp8)", name));
    }
    return *d;
  }

  Status parse_cost(const json& c, const std::string& path, Op& op) {
    OFFSIM_RETURN_IF_ERROR(
        r_.only_keys(c, {"work", "max_rate", "uses", "latency_ns", "multiplicity"}, path));
    OFFSIM_ASSIGN_OR_RETURN(op.cost.work, r_.number(c, "work", path));
    OFFSIM_ASSIGN_OR_RETURN(const json* rate, r_.optional_member(c, "max_rate", path));
    if (rate) {
      OFFSIM_ASSIGN_OR_RETURN(op.cost.max_rate, r_.as_number(*rate, path + ".max_rate"));
    }
    OFFSIM_ASSIGN_OR_RETURN(const json* uses, r_.array(c, "uses", path));
    for (std::size_t i = 0; i < uses->size(); ++i) {
      const json& u = (*uses)[i];
      const std::string p = fmt::format("{}.uses[{}]", path, i);
      if (!u.is_array() || u.size() != 2 || !u[0].is_string()) {
        return r_.error(p, "expected [resource name, per_unit]");
      }
      const std::string name = u[0].get<std::string>();
      auto it = resource_ids_.find(name);
      if (it == resource_ids_.end()) {
        return r_.error(p, fmt::format("unknown resource '{}'", name));
      }
      OFFSIM_ASSIGN_OR_RETURN(double per_unit, r_.as_number(u[1], p + "[1]"));
      op.cost.uses.push_back(ResourceUse{it->second, per_unit});
    }
    OFFSIM_ASSIGN_OR_RETURN(const json* latency, r_.optional_member(c, "latency_ns", path));
    if (latency) {
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t ns, r_.as_integer(*latency, path + ".latency_ns"));
      op.cost.latency = Duration{ns};
    }
    OFFSIM_ASSIGN_OR_RETURN(const json* mult, r_.optional_member(c, "multiplicity", path));
    if (mult) {
      OFFSIM_ASSIGN_OR_RETURN(std::int64_t k, r_.as_integer(*mult, path + ".multiplicity"));
      if (k < 1 || k > (1 << 24)) {
        return r_.error(path + ".multiplicity", fmt::format("{} is out of range [1, 2^24]", k));
      }
      op.cost.multiplicity = static_cast<int>(k);
    }
    return ok();
  }

  Status parse_ops(const json& root) {
    OFFSIM_ASSIGN_OR_RETURN(const json* list, r_.array(root, "ops", "$"));
    plan_.ops.reserve(list->size());
    for (std::size_t i = 0; i < list->size(); ++i) {
      const json& item = (*list)[i];
      const std::string path = fmt::format("$.ops[{}]", i);
      OFFSIM_RETURN_IF_ERROR(r_.only_keys(
          item,
          {"name", "lane", "kind", "category", "layer", "sizes", "cost", "deps", "allocs", "frees"},
          path));
      Op op;
      OFFSIM_ASSIGN_OR_RETURN(op.name, r_.string(item, "name", path));
      OFFSIM_ASSIGN_OR_RETURN(std::string lane, r_.string(item, "lane", path));
      auto lane_it = lane_ids_.find(lane);
      if (lane_it == lane_ids_.end()) {
        return r_.error(path + ".lane", fmt::format("unknown lane '{}'", lane));
      }
      op.lane = lane_it->second;
      OFFSIM_ASSIGN_OR_RETURN(std::string kind, r_.string(item, "kind", path));
      auto k = op_kind_from_string(kind);
      if (!k) {
        return r_.error(path + ".kind",
                        fmt::format("unknown op kind '{}' (expected gemm, attention, elementwise, "
                                    "copy, collective, p2p, host_compute, alloc, free or marker)",
                                    kind));
      }
      op.kind = *k;
      OFFSIM_ASSIGN_OR_RETURN(const json* category, r_.optional_member(item, "category", path));
      if (category) {
        OFFSIM_ASSIGN_OR_RETURN(op.category, parse_op_category(*category, path + ".category"));
      }
      OFFSIM_ASSIGN_OR_RETURN(const json* layer, r_.optional_member(item, "layer", path));
      if (layer) {
        OFFSIM_ASSIGN_OR_RETURN(std::int64_t l, r_.as_integer(*layer, path + ".layer"));
        if (l < -1 || l > (1 << 24)) return r_.error(path + ".layer", "layer out of range");
        op.layer = static_cast<int>(l);
      }
      OFFSIM_ASSIGN_OR_RETURN(const json* sizes, r_.optional_member(item, "sizes", path));
      if (sizes) OFFSIM_RETURN_IF_ERROR(parse_sizes(*sizes, path + ".sizes", op));
      OFFSIM_ASSIGN_OR_RETURN(const json* cost, r_.object(item, "cost", path));
      OFFSIM_RETURN_IF_ERROR(parse_cost(*cost, path + ".cost", op));
      for (const char* key : {"deps", "allocs", "frees"}) {
        OFFSIM_ASSIGN_OR_RETURN(const json* ids, r_.optional_member(item, key, path));
        if (ids == nullptr) continue;
        const std::string p = path + "." + key;
        if (key[0] == 'd') {
          OFFSIM_RETURN_IF_ERROR(parse_ids(*ids, p, op.deps));
        } else if (key[0] == 'a') {
          OFFSIM_RETURN_IF_ERROR(parse_ids(*ids, p, op.allocs));
        } else {
          OFFSIM_RETURN_IF_ERROR(parse_ids(*ids, p, op.frees));
        }
      }
      plan_.ops.push_back(std::move(op));
    }
    return ok();
  }

  JsonReader r_;
  Plan plan_;
  std::unordered_map<std::string, LaneId> lane_ids_;
  std::unordered_map<std::string, ResourceId> resource_ids_;
  std::unordered_map<std::string, PoolId> pool_ids_;
};

}  // namespace

Result<Plan> plan_from_json(const json& json, const std::string& source) {
  return PlanParser(source).parse(json);
}

Result<Plan> plan_from_json_text(const std::string& text, const std::string& source) {
  OFFSIM_ASSIGN_OR_RETURN(json parsed, parse_json_text(text, source));
  return plan_from_json(parsed, source);
}

Result<Plan> read_plan_file(const std::string& path) {
  OFFSIM_ASSIGN_OR_RETURN(std::string text, read_input_file(path, kPlanInput));
  return plan_from_json_text(text, path);
}

}  // namespace offsim::sim
