// The kdflow executable: parses the command line, runs one subcommand, and maps what it throws to
// the exit codes of docs/DESIGN.md in one place.
#include "commands.hpp"

#include "kdflow/core/error.hpp"

#include <csignal>
#include <cstdio>
#include <exception>
#include <system_error>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

int main(int argc, char** argv) {
  using namespace kdflow;
  // A file-size limit (ulimit -f, RLIMIT_FSIZE) then fails the write with EFBIG, which names the
  // file and removes its temporary, instead of killing the process in the middle of it.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"kdflow: knowledge distillation with the teacher on CPU cores, overlapped with the "
               "student on the GPU",
               "kdflow"};
  // A command-line error is one line, as every other bad input is.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("kdflow: {} (kdflow --help lists the options)\n", e.what());
  });
  app::Commands commands(app);
  try {
    app.parse(argc, argv);
    return commands.run();
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitBadInput;
  } catch (const InputError& e) {
    fmt::print(stderr, "kdflow: {}\n", e.what());
    return kExitBadInput;
  } catch (const StageError& e) {
    // A stage that stopped on bad input (an image a loader could not decode) is bad input too.
    try {
      std::rethrow_if_nested(e);
    } catch (const InputError&) {
      fmt::print(stderr, "kdflow: {}\n", e.what());
      return kExitBadInput;
    } catch (...) {
    }
    fmt::print(stderr, "kdflow: error: {}\n", e.what());
    return kExitFailure;
  } catch (const Interrupted& e) {
    fmt::print(stderr, "kdflow: interrupted: {}\n", e.what());
    return kExitInterrupted;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kdflow: error: {}\n", e.what());
    return kExitFailure;
  }
}
