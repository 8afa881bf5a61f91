#include "core/openmp_wait.h"

#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

#include <string>

namespace dtrain {

void choose_openmp_wait_policy(char** argv) {
  if (getenv("OMP_WAIT_POLICY") != nullptr || getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
  execv("/proc/self/exe", argv);
  // Only on failure (no /proc, say): run on with libgomp's default, which it has read already.
}

std::string openmp_wait_policy() {
  if (const char* count = getenv("GOMP_SPINCOUNT")) return std::string("spin count ") + count;
  const char* policy = getenv("OMP_WAIT_POLICY");
  if (policy == nullptr) return "libgomp's default";
  if (strcasecmp(policy, "passive") == 0) return "passive";
  if (strcasecmp(policy, "active") == 0) return "active";
  return std::string("\"") + policy + "\"";
}

}  // namespace dtrain
