// The bevformer CLI's subcommands: each registers itself on the app and returns the exit code
// of its run. Exit codes: 0 success, 1 the input was read but failed a check (validation,
// tolerance), 2 invalid input or usage, 3 an internal or i/o error.
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "bevformer/engine_knobs.h"

namespace bev::cli {

using Runner = std::function<int()>;

Runner add_inspect(CLI::App& app);
Runner add_golden(CLI::App& app);
Runner add_convert_info(CLI::App& app);
Runner add_convert_pandaset(CLI::App& app);
Runner add_detect(CLI::App& app);
Runner add_describe(CLI::App& app);
Runner add_random_weights(CLI::App& app);
Runner add_profile(CLI::App& app);
Runner add_bench(CLI::App& app);
Runner add_calibrate(CLI::App& app);
Runner add_serve(CLI::App& app);
Runner add_eval(CLI::App& app);
Runner add_merge_results(CLI::App& app);

// Maps an exception escaping a command to a message on stderr and an exit code.
int report_exception();

// An output path that a long run could only fail to write at its end, checked before the run: its
// folder must exist and be writable, and an existing file must be a writable regular file (a FIFO
// or a device is refused, never replaced by a regular file). `option` names it ("-o").
void check_writable(const std::string& path, const char* option);

// The engine's knobs (bevformer/engine_knobs.h) as options: --threads, --backend, --device, and
// with `precision` --precision and --calibration.
void add_engine_options(CLI::App* sub, EngineKnobs& knobs, bool precision = true);
// --backend NAME (default "cpu"), listing the backends this binary was built with.
CLI::Option* add_backend_option(CLI::App* sub, std::string& backend);
// --precision f32|bf16|int8 and --calibration FILE (int8's activation ranges).
CLI::Option* add_precision_options(CLI::App* sub, std::string& precision, std::string& calibration);

}  // namespace bev::cli
