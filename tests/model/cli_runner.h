// Helpers for tests that drive the real build/moecel binary: run it, capture exit code and output, and make
// scratch folders.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace moecel::test {

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A fresh folder under the system temp dir, removed by the destructor.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& tag) {
    path = std::filesystem::temp_directory_path() /
           ("moecel-test-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

// Runs `moecel ARGS` (ARGS already shell-quoted as needed), with ENV (NAME=VALUE ..., shell-quoted) added to
// its environment.
inline CliResult run_cli(const std::string& args, const std::string& env = "") {
  ScratchDir tmp("cli");
  const std::string out = tmp.str() + "/out", err = tmp.str() + "/err";
  const std::string cmd = (env.empty() ? std::string() : "env " + env + " ") + "'" + MOECEL_BINARY + "' " + args +
                          " >'" + out + "' 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  r.out = read_text(out);
  r.err = read_text(err);
  return r;
}

}  // namespace moecel::test
