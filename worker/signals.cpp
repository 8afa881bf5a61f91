#include "worker/signals.h"

#include <csignal>

#include "core/syscall.h"

namespace dtrain::worker {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int signal) { g_stop_signal = signal; }

}  // namespace

void install_stop_signals() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a system call in flight goes on
  // SIGINT too: Ctrl-C reaches every process of the terminal's group, and a
  // run stopped that way resumes from the checkpoint it saves instead of
  // losing every step since the last one.
  for (const int signal : {SIGTERM, SIGINT, SIGUSR1}) DTRAIN_SYSCALL(::sigaction(signal, &action, nullptr));
}

int stop_signal() { return g_stop_signal; }

void request_stop(int signal) { g_stop_signal = signal; }

}  // namespace dtrain::worker
