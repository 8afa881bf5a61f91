// The exit codes of every dtrain binary (docs/launcher.md, "Exit codes"), so
// that scripts and the launcher read them the same way everywhere.
#pragma once

namespace dtrain {

inline constexpr int kExitOk = 0;
// The job or a check failed and the output says why: dtrain-launch's restarts
// are exhausted (summary printed), dtrain-ckpt verify found a bad step.
inline constexpr int kExitFailed = 1;
// An error dtrain names (a dtrain::Error): a bad command line or config, a
// missing file, a timeout, a lost peer. Printed as "<binary>: error: ...".
inline constexpr int kExitError = 2;
// An unexpected exception: a bug; the message is printed as it came.
inline constexpr int kExitUnexpected = 3;
// dtrain-launch's worker could not be executed (as a shell says it).
inline constexpr int kExitNotExecutable = 127;
// Stopped on signal N: kExitSignalBase + N (130 SIGINT, 143 SIGTERM).
inline constexpr int kExitSignalBase = 128;

}  // namespace dtrain
