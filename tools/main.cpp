// bevformer: the command-line front of bevformer.cpp.
#include <cstdio>
#include <map>
#include <string>

#include "bevformer/error.h"
#include "commands.h"
#include "core/log.h"

namespace bev::cli {

int report_exception() {
  try {
    throw;
  } catch (const Error& e) {
    std::fprintf(stderr, "bevformer: %s: %s\n", error_kind_name(e.kind()), e.what());
    // 2: the caller's input; 3: the machine or the engine (i/o, a bug, a resource busy for now).
    return e.kind() == ErrorKind::kInternal || e.kind() == ErrorKind::kIo || e.kind() == ErrorKind::kBusy ? 3 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bevformer: internal error: %s\n", e.what());
    return 3;
  }
}

}  // namespace bev::cli

int main(int argc, char** argv) {
  CLI::App app{"bevformer.cpp — native BEVFormer inference (camera-only 3D detection)", "bevformer"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "bevformer.cpp 0.1.0");
  bool quiet = false, verbose = false;
  app.add_flag("-q,--quiet", quiet, "Only print errors to stderr");
  app.add_flag("-v,--verbose", verbose, "Print debug messages to stderr");

  std::map<const CLI::App*, bev::cli::Runner> runners;
  auto add = [&](bev::cli::Runner (*fn)(CLI::App&)) {
    const size_t before = app.get_subcommands({}).size();
    bev::cli::Runner r = fn(app);
    runners[app.get_subcommands({})[before]] = std::move(r);
  };
  add(&bev::cli::add_inspect);
  add(&bev::cli::add_golden);
  add(&bev::cli::add_convert_info);
  add(&bev::cli::add_convert_pandaset);
  add(&bev::cli::add_detect);
  add(&bev::cli::add_describe);
  add(&bev::cli::add_random_weights);
  add(&bev::cli::add_profile);
  add(&bev::cli::add_bench);
  add(&bev::cli::add_serve);
  add(&bev::cli::add_eval);
  add(&bev::cli::add_merge_results);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (quiet) bev::set_log_level(bev::LogLevel::kError);
  if (verbose) bev::set_log_level(bev::LogLevel::kDebug);
  for (const CLI::App* sub : app.get_subcommands()) {
    try {
      return runners.at(sub)();
    } catch (...) {
      return bev::cli::report_exception();
    }
  }
  return 2;
}
