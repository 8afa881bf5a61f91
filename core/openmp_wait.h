// How dtrain's OpenMP threads wait at the end of a parallel region. GCC's
// OpenMP runtime (libgomp) spins by default, for up to ~0.3 s, before it
// sleeps; on a machine where another process takes a core, the spinning
// threads take the time the thread with work needs, and two threads ran
// slower than one (docs/performance.md, "Threads under load"). dtrain's
// programs therefore wait passively (OMP_WAIT_POLICY=PASSIVE: a thread with
// nothing to do sleeps at once) unless the environment chooses: an
// OMP_WAIT_POLICY or GOMP_SPINCOUNT of the user's is kept.
//
// libgomp reads these variables once, when it is loaded, before main runs:
// so the program executes itself again with the variable set (the same
// process id, arguments and environment otherwise), before it does anything.
#pragma once

#include <string>

namespace dtrain {

// Call first in main(). Returns at once when the environment chose a wait
// policy (or this is the second execution); else replaces the process
// image and does not return, unless the exec fails (then it returns and the
// program runs with libgomp's default).
void choose_openmp_wait_policy(char** argv);

// How this process's OpenMP threads wait, as its environment set it:
// "passive", "active", "spin count N", or "libgomp's default".
std::string openmp_wait_policy();

}  // namespace dtrain
