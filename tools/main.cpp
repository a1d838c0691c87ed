// bevformer: the command-line front of bevformer.cpp.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

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

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The first word that is not a global option names the subcommand. CLI11 alone would call a
// mistyped one an unexpected argument; say what it is and what was meant instead. Returns false
// (after printing) when the word is no subcommand.
bool check_subcommand(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (!word.empty() && word[0] == '-') continue;  // -q, -v, --help, --version: global flags
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), word) != names.end()) return true;
    std::string best;
    size_t best_distance = 3;  // at most two edits away (detetc -> detect is two)
    for (const std::string& n : names) {
      const size_t d = edit_distance(word, n);
      if (d < best_distance || (d == best_distance && best.empty() && n.rfind(word, 0) == 0)) {
        best = n;
        best_distance = d;
      }
      if (best.empty() && word.size() >= 3 && n.rfind(word, 0) == 0) best = n;  // a prefix: "prof" -> profile
    }
    std::string all;
    for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
    std::fprintf(stderr, "bevformer: unknown subcommand '%s'%s\nsubcommands: %s (bevformer --help)\n", word.c_str(),
                 best.empty() ? "" : ("; did you mean '" + best + "'?").c_str(), all.c_str());
    return false;
  }
  return true;  // none given: CLI11 says one is required
}

}  // namespace

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
  add(&bev::cli::add_calibrate);
  add(&bev::cli::add_serve);
  add(&bev::cli::add_eval);
  add(&bev::cli::add_merge_results);

  if (!bev::cli::check_subcommand(app, argc, argv)) return 2;
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
