// core/syscall.h: a failing call's error names the call as written, where it
// was written, what it worked on and errno's text; in a forked child the same
// goes to a descriptor and the child exits 127.
#include "core/syscall.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"

namespace dtrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using ::testing::ThrowsMessage;

TEST(Syscall, ReturnsTheResultOfACallThatWorks) {
  int fds[2];
  EXPECT_EQ(DTRAIN_SYSCALL(::pipe(fds)), 0);
  EXPECT_EQ(DTRAIN_SYSCALL(::write(fds[1], "ab", 2)), 2);
  EXPECT_EQ(DTRAIN_SYSCALL(::dup2(fds[0], fds[0])), fds[0]);
  sigset_t mask;
  EXPECT_NO_THROW(DTRAIN_SYSCALL_ERRNUM(::pthread_sigmask(SIG_SETMASK, nullptr, &mask)));
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST(Syscall, AFailingCallNamesTheCallTheFileAndErrnosText) {
  EXPECT_THAT([] { DTRAIN_SYSCALL(::close(-1)); },
              ThrowsMessage<IoError>(AllOf(StartsWith("::close(-1) failed at tests/unit/test_core_syscall.cpp:"),
                                           HasSubstr(std::strerror(EBADF)))));
}

TEST(Syscall, ASubjectLeadsTheMessage) {
  EXPECT_THAT([] { DTRAIN_SYSCALL(::kill(::getpid(), 12345), "signalling rank 3"); },
              ThrowsMessage<IoError>(AllOf(StartsWith("signalling rank 3: ::kill(::getpid(), 12345) failed at "),
                                           HasSubstr(std::strerror(EINVAL)))));
}

TEST(Syscall, ACallReturningAnErrorNumberIsCheckedToo) {
  EXPECT_THAT([] { DTRAIN_SYSCALL_ERRNUM(::posix_fadvise(-1, 0, 0, POSIX_FADV_DONTNEED), "'some/file'"); },
              ThrowsMessage<IoError>(
                  AllOf(StartsWith("'some/file': ::posix_fadvise(-1, 0, 0, POSIX_FADV_DONTNEED) failed at "),
                        HasSubstr(std::strerror(EBADF)))));
}

TEST(Syscall, AFailureInAForkedChildIsWrittenAndEndsItWith127) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    DTRAIN_SYSCALL_IN_CHILD(::dup2(fds[1], 1), fds[1]);  // works: goes on
    DTRAIN_SYSCALL_IN_CHILD(::dup2(-1, 1), fds[1]);
    ::_exit(0);  // not reached
  }
  ::close(fds[1]);
  std::string text;
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 127);
  EXPECT_THAT(text, StartsWith("dtrain: ::dup2(-1, 1) failed at tests/unit/test_core_syscall.cpp:"));
  EXPECT_THAT(text, HasSubstr(" in a forked child: Bad file descriptor\n"));
}

}  // namespace
}  // namespace dtrain
