// Slurm's compressed list expressions, as found in SLURM_STEP_NODELIST and
// SLURM_STEP_TASKS_PER_NODE.
//
// Hostlists: hosts separated by commas; a name may hold any number of bracket
// groups "[a-b,c,...]" anywhere in it. Numbers keep the width of the range's
// low end ("n[08-10]" -> n08 n09 n10, "n[8-10]" -> n8 n9 n10). Several groups
// expand in Slurm's order, the first group outermost
// ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2).
//
// All functions are pure and thread-safe. Malformed input throws dtrain::Error
// naming the list, the position (0-based) and the problem.
#pragma once

#include <string>
#include <vector>

namespace dtrain::cluster {

// Upper bound on the hosts (or nodes) one expression may expand to; a list
// beyond it is rejected rather than allocated.
inline constexpr long kMaxExpandedHosts = 1L << 20;

// "n[01-02],gpu7" -> {"n01", "n02", "gpu7"}.
std::vector<std::string> expand_hostlist(const std::string& hostlist);

// The first host of the list, without expanding the rest (the whole list is
// still validated): "n[01-04]" -> "n01".
std::string first_host(const std::string& hostlist);

// Tasks per node, as Slurm writes it: "2(x3),1" -> {2, 2, 2, 1}. Each count
// must be >= 0 and each repetition >= 1.
std::vector<int> expand_tasks_per_node(const std::string& spec);

}  // namespace dtrain::cluster
