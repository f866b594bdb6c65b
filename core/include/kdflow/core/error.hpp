// Error types shared by every module. `main` catches these once and maps them to the exit codes of
// docs/DESIGN.md: InputError -> 2 (one line naming the file, key or node), Interrupted -> 130,
// others
// -> 1.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace kdflow {

// Bad usage or bad input: the message is one line that names the file, key or node.
class InputError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

// The run was interrupted (SIGINT/SIGTERM) after its state was saved.
class Interrupted : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

// A pipeline stage (loader, teacher, student, ...) failed; carries the stage's name to the
// consumer, with the original exception nested (std::rethrow_if_nested reaches it).
class StageError : public std::runtime_error {
public:
  StageError(std::string stage, const std::string& what)
      : std::runtime_error("stage '" + stage + "' failed: " + what), stage_(std::move(stage)) {}
  // The batch the stage was working on (the run's batch number: the step it feeds).
  StageError(std::string stage, std::uint64_t batch, const std::string& what)
      : std::runtime_error("stage '" + stage + "' failed at batch " + std::to_string(batch) + ": " +
                           what),
        stage_(std::move(stage)), batch_(batch) {}
  [[nodiscard]] const std::string& stage() const { return stage_; }
  [[nodiscard]] std::optional<std::uint64_t> batch() const { return batch_; }

private:
  std::string stage_;
  std::optional<std::uint64_t> batch_;
};

// Throws std::system_error for errno `err` with what was being done and where (the caller's
// file and line: builtins, as clang 14, the fuzz build's compiler, has no std::source_location).
[[noreturn]] void throw_errno(int err, const std::string& doing,
                              const char* file = __builtin_FILE(), int line = __builtin_LINE());

// Exit codes (docs/DESIGN.md).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitInterrupted = 130;

} // namespace kdflow
