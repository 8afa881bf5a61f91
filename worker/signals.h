// Save-and-exit on SIGTERM, SIGINT (Ctrl-C, or dtrain-launch forwarding one)
// and SIGUSR1 (Slurm's preemption warning, a launcher's stop): the handler
// only records the signal; the training loop
// looks at the step boundary, all ranks agree through a collective, save a
// checkpoint and exit 0.
#pragma once

namespace dtrain::worker {

// Installs the handlers (dtrain-worker's main; not the library's business).
// Throws IoError when the system refuses them.
void install_stop_signals();
// The signal received so far, 0 when none.
int stop_signal();
// For tests: behave as if `signal` had arrived.
void request_stop(int signal);

}  // namespace dtrain::worker
