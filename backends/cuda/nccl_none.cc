// NcclComm in a build without NCCL (OFFSIM_WITH_NCCL=OFF or no <nccl.h>): no communicator can
// be made, so only the creators and the without-NCCL answers are ever called; each says that
// offsim was built without NCCL.
#include "backends/cuda/nccl_comm.h"

#include <fmt/format.h>

namespace offsim::backends::cuda {
namespace {

sim::Status built_without_nccl(std::string_view what) {
  return sim::fail(sim::ErrorCode::kUnsupported, "{}: offsim was built without NCCL", what);
}

}  // namespace

NcclComm::~NcclComm() = default;

sim::Result<std::unique_ptr<NcclComm>> NcclComm::create_local(
    const std::vector<int>& gpus, std::vector<std::int64_t>& added_bytes) {
  added_bytes.assign(gpus.size(), -1);
  if (gpus.size() > 1) {
    return sim::fail(
        built_without_nccl(fmt::format("collectives between {} GPUs", gpus.size())).error());
  }
  return std::unique_ptr<NcclComm>();  // one member: nothing to exchange
}

sim::Result<NcclUniqueId> NcclComm::new_unique_id() {
  return sim::fail(built_without_nccl("communicators across processes").error());
}

sim::Result<std::unique_ptr<NcclComm>> NcclComm::join(int, int, int, const NcclUniqueId&,
                                                      const StopQuery&, std::int64_t& added_bytes) {
  added_bytes = -1;
  return sim::fail(built_without_nccl("communicators across processes").error());
}

std::string NcclComm::version() const { return ""; }

// No NcclComm exists without NCCL; these keep the class whole (and its fields used).
ncclComm* NcclComm::member(int index) const {
  return api_ != nullptr && index >= 0 && static_cast<std::size_t>(index) < comms_.size()
             ? comms_[static_cast<std::size_t>(index)]
             : nullptr;
}

sim::Status NcclComm::collective(ncclComm*, int, int, sim::CollectiveKind, char*, std::int64_t,
                                 cudaStream_t, const StopQuery&) const {
  return built_without_nccl("collective");
}

sim::Status NcclComm::p2p(ncclComm*, int, bool, void*, std::size_t, cudaStream_t,
                          const StopQuery&) const {
  return built_without_nccl("p2p");
}

std::optional<sim::Error> NcclComm::async_error() const { return std::nullopt; }

void NcclComm::abort() { comms_.clear(); }

void NcclComm::finalize_all(std::vector<NcclComm*>&) {}

sim::Status collective_without_nccl(std::string_view op_name) {
  return built_without_nccl(fmt::format("collective '{}'", op_name));
}

sim::Status p2p_without_nccl(std::string_view op_name) {
  return built_without_nccl(fmt::format("p2p '{}'", op_name));
}

}  // namespace offsim::backends::cuda
