// Checked system calls (STYLE.md point 4, as the NCCL, MPI and CUDA checks
// do for their libraries): a call whose failure matters is wrapped where it is
// written, so that a failure names the call as written, its file:line, what it
// worked on when that helps, and errno's text:
//
//   DTRAIN_SYSCALL(call [, subject])         calls that fail with -1 and errno
//                                            (unistd.h, signal.h, ...); returns
//                                            the call's result
//   DTRAIN_SYSCALL_ERRNUM(call [, subject])  calls that return 0 or an error
//                                            number (posix_spawn*, posix_fadvise,
//                                            pthread_*)
//   DTRAIN_SYSCALL_IN_CHILD(call, log_fd)    between fork and exec (see below)
//
// The first two throw IoError (core/error.h), whose message reads
// "[<subject>: ]<call> failed at <file>:<line>: <errno text>", the file
// relative to the source tree. Callable from any thread.
//
// Left unchecked on purpose: close() of a descriptor whose data nothing
// depends on (a pipe, a socket, /dev/null, a file only read or already
// fsynced, a worker's log, whose write errors are ignored too): Linux releases
// the descriptor whatever close returns, so there is nothing to act on; and
// clean-up on a path that is already throwing, whose first error is the one
// to report.
#pragma once

#include <cerrno>
#include <string_view>

namespace dtrain {

// Where a checked call is written; the macros fill it in.
struct CallSite {
  const char* call;  // the call's text, as written
  const char* file;
  int line;
};

// Throws IoError for a failed call with error number `err`.
[[noreturn]] void throw_call_error(int err, const CallSite& site, std::string_view subject = {});

// `result`, unless it is -1: then throws IoError with errno.
template <typename Result>
Result check_syscall(Result result, const CallSite& site, std::string_view subject = {}) {
  if (result == static_cast<Result>(-1)) throw_call_error(errno, site, subject);
  return result;
}

// Throws IoError when `result` (an error number) is not 0.
inline void check_errnum(int result, const CallSite& site, std::string_view subject = {}) {
  if (result != 0) throw_call_error(result, site, subject);
}

// For a forked child before exec, where only async-signal-safe code may run
// (no exception, no allocation, no lock): when `failed`, writes "dtrain:
// <call> failed at <file>:<line> in a forked child: <errno text>" to `log_fd`
// with write(2) and ends the child with _exit(127). Returns otherwise.
void check_in_child(bool failed, const CallSite& site, int log_fd) noexcept;

}  // namespace dtrain

// Each macro takes #call itself: passed on to another macro, the call's
// macros (POSIX_FADV_DONTNEED, TEMP_FAILURE_RETRY) would be expanded first.

// DTRAIN_SYSCALL(::sigaction(SIGTERM, &action, nullptr)), DTRAIN_SYSCALL(::kill(pid, SIGKILL), "rank 3")
#define DTRAIN_SYSCALL(call, ...) \
  ::dtrain::check_syscall((call), ::dtrain::CallSite{#call, __FILE__, __LINE__} __VA_OPT__(, ) __VA_ARGS__)

// DTRAIN_SYSCALL_ERRNUM(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), path.string())
#define DTRAIN_SYSCALL_ERRNUM(call, ...) \
  ::dtrain::check_errnum((call), ::dtrain::CallSite{#call, __FILE__, __LINE__} __VA_OPT__(, ) __VA_ARGS__)

// DTRAIN_SYSCALL_IN_CHILD(::dup2(out_fd, 1), out_fd): a -1 result ends the
// child with exit code 127, its reason written to log_fd.
#define DTRAIN_SYSCALL_IN_CHILD(call, log_fd) \
  ::dtrain::check_in_child((call) == -1, ::dtrain::CallSite{#call, __FILE__, __LINE__}, (log_fd))
