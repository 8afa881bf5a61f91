// Runs a shell command and captures its exit status and combined output. For
// tests that drive the real binaries (build/bin).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace dtrain::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// The build's binaries and the source tree, fixed when the test is compiled
// (cmake/dtrain.cmake defines them for every test). The environment may move
// them: DTRAIN_TEST_BIN_DIR, DTRAIN_TEST_SOURCE_DIR, DTRAIN_TEST_PROGRAM_DIR
// (scripts/gpu-check.sh sets the first when it runs a bundle unpacked
// elsewhere than it was built).
inline std::string test_dir(const char* variable, const char* built) {
  const char* set = std::getenv(variable);
  return set != nullptr && *set != '\0' ? set : built;
}
inline std::string bin_dir() { return test_dir("DTRAIN_TEST_BIN_DIR", DTRAIN_TEST_BIN_DIR); }
inline std::string source_dir() { return test_dir("DTRAIN_TEST_SOURCE_DIR", DTRAIN_TEST_SOURCE_DIR); }
// Helper programs of multi-process tests (tests/programs/).
inline std::string program_dir() { return test_dir("DTRAIN_TEST_PROGRAM_DIR", DTRAIN_TEST_PROGRAM_DIR); }

// The project's Python (.venv/, made by scripts/setup.sh: ONNX Runtime, TensorBoard).
inline std::string venv_python() { return source_dir() + "/.venv/bin/python"; }

inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen failed: " + command);
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) result.output.append(buf.data(), n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

}  // namespace dtrain::testing
