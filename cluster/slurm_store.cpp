#include "cluster/slurm_store.h"

#include <charconv>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain::cluster {
namespace {

long long parse_id(const std::string& name, const std::string& value) {
  long long id = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, id);
  if (value.empty() || ec != std::errc() || ptr != end || id < 0) {
    throw Error(fmt::format(
        "{}='{}' is not a job or step number, so no store port can be derived from it; "
        "set DTRAIN_STORE_PORT (or DTRAIN_STORE=host:port) for the step",
        name, value));
  }
  return id;
}

}  // namespace

int slurm_store_port(const std::string& job_id, const std::string& step_id) {
  const long long job = parse_id("SLURM_JOB_ID", job_id);
  const long long step = parse_id("SLURM_STEP_ID", step_id);
  const long long slot = (job % kSlurmStorePortSpan) * kSlurmStepsPerJob + step % kSlurmStepsPerJob;
  return kSlurmStorePortBase + static_cast<int>(slot % kSlurmStorePortSpan);
}

std::filesystem::path slurm_token_file(const std::filesystem::path& dir, const std::string& job_id,
                                       const std::string& step_id, const std::string& restart_count) {
  std::string name = fmt::format(".store-token-{}.{}", job_id, step_id);
  if (!restart_count.empty() && restart_count != "0") name += ".r" + restart_count;
  return dir / name;
}

}  // namespace dtrain::cluster
