// JSON as the nuScenes devkit reads and writes it. Python's json module reads and writes a bare
// NaN token (the devkit's metrics_summary.json has them; GT velocities are NaN), which strict JSON
// parsers refuse; and json.dump(obj, indent=2) has its own number and layout conventions. Reading
// maps NaN to null (every reader here treats a null number as NaN); writing reproduces Python's
// text byte for byte, so that our metrics_summary.json diffs cleanly against the devkit's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "io/byte_source.h"

namespace bev::eval {

using ojson = nlohmann::ordered_json;

// The largest file eval reads: the trainval database's sample_annotation.json is about 0.5 GB,
// a test-set results file under 2 GB.
inline constexpr uint64_t kMaxEvalFileBytes = uint64_t{16} << 30;

// The whole of a regular file of at most kMaxEvalFileBytes; kNotFound when it does not exist,
// kInvalidInput when it is not a regular file (a FIFO, a device, a directory) or too large, kIo
// when it cannot be read. (Writing: write_file_atomically, io/byte_source.h.)
std::string read_text_file(const std::string& path);

// `text` with every NaN token outside strings replaced by null; nullopt when there is none (the
// caller then parses `text` itself, without a copy).
std::optional<std::string> replace_nan_tokens(std::string_view text);

// Parses JSON text that may hold NaN tokens, keeping object order. Syntax errors are
// Error(kInvalidInput) naming `where` and the byte offset.
ojson parse_python_json(std::string_view text, const std::string& where);

// repr(float) of Python 3: the shortest text that reads back as x, "1.0" for integral values,
// exponent form outside [1e-4, 1e16) ("1e-05", "1.5e+16"); "NaN", "Infinity", "-Infinity" for the
// non-finite values as json.dump writes them.
std::string python_float_repr(double x);

// json.dumps(value, indent=indent) (ensure_ascii, ", " and ": " separators); a non-finite number
// is written as `nan_token` ("null" for strict JSON, "NaN" for what Python itself writes).
std::string dump_python(const ojson& value, int indent = 2, std::string_view nan_token = "null");

}  // namespace bev::eval
