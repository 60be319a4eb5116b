#include "models/layer_policy.h"

#include <algorithm>
#include <atomic>
#include <set>
#include <string>

namespace offsim::models {

namespace {
std::atomic<std::int64_t> g_layer_policies{0};

// A weight, gradient, optimizer-state or master-weight rule's placement, for a layer's policy and
// for the groups outside the layers alike (both carry the same four flags).
template <typename Placed>
void place_group(Placed& p, TensorClass cls, bool to_host) {
  switch (cls) {
    case TensorClass::kParams:
      p.params_on_host = to_host;
      break;
    case TensorClass::kGrads:
      p.grads_on_host = to_host;
      break;
    case TensorClass::kOptimizerStates:
      p.opt_on_host = to_host;
      break;
    case TensorClass::kMasterWeights:
      p.master_on_host = to_host;
      p.master_on_hbm = !to_host;
      break;
    default:
      break;
  }
}
}  // namespace

std::int64_t layer_policies_worked_out() {
  return g_layer_policies.load(std::memory_order_relaxed);
}

LayerPolicy layer_policy(const Scenario& s, const LayerDims& d, int layer) {
  g_layer_policies.fetch_add(1, std::memory_order_relaxed);
  LayerPolicy lp;
  std::set<std::string> named;
  std::array<bool, kNumActs> host{};
  bool any_host_rule = false;
  const PipelineLayout layout = pipeline_layout(s.model.layers, s.parallelism);
  const bool mtp = layer >= s.model.layers;
  for (const OffloadRule& r : s.offload.rules) {
    // An MTP module's layer follows the rules that select every layer.
    if (mtp ? r.layers.kind != LayerSelection::Kind::kAll : !r.layers.contains(layer, layout)) {
      continue;
    }
    const bool to_host = r.where == Placement::kHost;
    switch (r.cls) {
      case TensorClass::kActivations:
        host.fill(to_host);
        break;
      case TensorClass::kNamedActivation:
        named.insert(r.name);
        for (int a = 0; a < kNumActs; ++a) {
          if (r.name == maxtext_name(static_cast<Act>(a))) host[a] = to_host;
        }
        break;
      case TensorClass::kParams:
        lp.param_prefetch = std::max(1, r.prefetch_layers);
        place_group(lp, r.cls, to_host);
        break;
      default:
        place_group(lp, r.cls, to_host);
        break;
    }
    if (to_host && (r.cls == TensorClass::kActivations || r.cls == TensorClass::kNamedActivation)) {
      lp.prefetch = any_host_rule ? std::max(lp.prefetch, r.prefetch_layers) : r.prefetch_layers;
      lp.chunk_bytes = r.chunk_bytes;
      any_host_rule = true;
    }
  }
  lp.acts = layer_activations(d, recompute_mode(s.recompute, layer), s.recompute.modules, named,
                              s.recompute.rerun);
  for (int a = 0; a < kNumActs; ++a) lp.on_host[a] = lp.acts.saved[a] && host[a];
  return lp;
}
GroupPlacement non_layer_placement(const Scenario& s) {
  GroupPlacement p;
  for (const OffloadRule& r : s.offload.rules) {
    if (r.layers.kind != LayerSelection::Kind::kAll) continue;
    place_group(p, r.cls, r.where == Placement::kHost);
  }
  return p;
}

LayerPolicies resolve_layer_policies(const Scenario& s) {
  LayerPolicies out;
  out.layers.reserve(static_cast<std::size_t>(std::max(0, built_layers(s.model))));
  for (int l = 0; l < built_layers(s.model); ++l) {
    out.layers.push_back(layer_policy(s, layer_dims(s.model, s.training, s.parallelism, l), l));
  }
  out.outside = non_layer_placement(s);
  return out;
}

}  // namespace offsim::models
