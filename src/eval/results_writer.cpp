#include "eval/results_writer.h"

#include <filesystem>

#include "bevformer/error.h"
#include "core/log.h"

namespace bev::eval {

namespace {

const std::string kFooter = "}}";

std::string header_line(const ojson& meta) { return "{\"meta\": " + meta.dump() + ", \"results\": {"; }

// The complete sample lines of an existing file: their tokens, the file's meta, and the byte
// length to keep (up to the end of the last complete sample line).
struct Existing {
  ojson meta;
  std::vector<std::string> tokens;
  size_t keep = 0;
};

Existing scan(const std::string& path, const std::string& text) {
  auto bad = [&](const std::string& problem) {
    return Error(ErrorKind::kInvalidInput, problem)
        .where(path)
        .hint("--resume continues a results file this writer started; move this one away to start afresh");
  };
  Existing e;
  size_t pos = text.find('\n');
  if (!text.starts_with(std::string_view("{\"meta\": ").substr(0, text.size()))) {
    throw bad("is not a results file written incrementally");
  }
  if (pos == std::string::npos) return e;  // at most the header line: no sample yet
  try {
    e.meta = ojson::parse(text.substr(0, pos) + "}}").at("meta");
  } catch (const std::exception&) {
    throw bad("its first line is not {\"meta\": ..., \"results\": {");
  }
  e.keep = pos;
  while (pos < text.size()) {
    const size_t end = std::min(text.find('\n', pos + 1), text.size());
    std::string line = text.substr(pos + 1, end - pos - 1);
    const bool last = end >= text.size() || text.find_first_not_of("\n", end) == std::string::npos;
    if (line.empty() || line == kFooter) {
      if (line == kFooter && !last) throw bad("has lines after its closing brackets");
      pos = end;
      continue;
    }
    if (line.front() == ',') line.erase(0, 1);
    ojson entry;
    try {
      entry = ojson::parse("{" + line + "}");
    } catch (const std::exception&) {
      if (last) {
        log_warn(path, ": dropping a truncated last sample line (", line.size(), " bytes)");
        break;
      }
      throw bad("line " + std::to_string(e.tokens.size() + 2) + " is not a complete sample");
    }
    if (entry.size() != 1 || !entry.begin()->is_array()) throw bad("a line holds no single sample list");
    e.tokens.push_back(entry.begin().key());
    e.keep = end;
    pos = end;
  }
  return e;
}

}  // namespace

ResultsWriter::ResultsWriter(std::string path, ojson meta, bool resume) : path_(std::move(path)) {
  std::error_code ec;
  if (resume && std::filesystem::exists(path_, ec)) {
    const std::string text = read_text_file(path_);
    Existing e = scan(path_, text);
    if (e.keep > 0) {
      if (e.meta != meta) log_warn(path_, ": keeping the file's meta ", e.meta.dump(), " over ", meta.dump());
      std::filesystem::resize_file(path_, e.keep, ec);
      if (ec) throw Error(ErrorKind::kIo, "cannot truncate: " + ec.message()).where(path_);
      for (std::string& t : e.tokens) {
        if (!written_.insert(t).second) {
          throw Error(ErrorKind::kInvalidInput, "sample '" + t + "' appears twice").where(path_);
        }
        order_.push_back(std::move(t));
      }
      file_ = std::fopen(path_.c_str(), "ab");
      if (!file_) throw Error(ErrorKind::kIo, "cannot open for appending").where(path_);
      log_info(path_, ": resuming after ", order_.size(), " samples");
      return;
    }
  }
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw Error(ErrorKind::kIo, "cannot open for writing").where(path_);
  write(header_line(meta));
}

ResultsWriter::~ResultsWriter() {
  try {
    finish();
  } catch (const std::exception& e) {
    log_error(path_, ": ", e.what());
  }
}

void ResultsWriter::write(const std::string& text) {
  if (!file_) throw Error(ErrorKind::kInternal, "results writer already finished").where(path_);
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0) {
    throw Error(ErrorKind::kIo, "write failed").where(path_);
  }
}

void ResultsWriter::add_sample(const std::string& token, const ojson& boxes) {
  if (!boxes.is_array()) throw Error(ErrorKind::kInvalidInput, "boxes of sample '" + token + "' are not a list");
  if (written_.count(token)) {
    throw Error(ErrorKind::kInvalidInput, "sample '" + token + "' was already written").where(path_);
  }
  std::string line = "\n" + std::string(order_.empty() ? "" : ",") + ojson(token).dump() + ": [";
  for (size_t i = 0; i < boxes.size(); ++i) {
    ojson b = boxes[i];
    b["sample_token"] = token;
    line += (i ? ", " : "") + b.dump();
  }
  write(line + "]");
  written_.insert(token);
  order_.push_back(token);
}

void ResultsWriter::add_sample_text(const std::string& token, std::string_view boxes_json) {
  // One line per sample is what resume reads back.
  if (boxes_json.empty() || boxes_json.front() != '[' || boxes_json.back() != ']' ||
      boxes_json.find('\n') != std::string_view::npos) {
    throw Error(ErrorKind::kInvalidInput, "boxes of sample '" + token + "' are not a one-line JSON list");
  }
  if (written_.count(token)) {
    throw Error(ErrorKind::kInvalidInput, "sample '" + token + "' was already written").where(path_);
  }
  write("\n" + std::string(order_.empty() ? "" : ",") + ojson(token).dump() + ": " + std::string(boxes_json));
  written_.insert(token);
  order_.push_back(token);
}

void ResultsWriter::add_sample(const std::string& token, const std::vector<NuscBox>& boxes) {
  ojson list = ojson::array();
  for (const NuscBox& b : boxes) list.push_back(ojson::parse(to_json(b).dump()));
  add_sample(token, list);
}

void ResultsWriter::finish() {
  if (!file_) return;
  write("\n" + kFooter + "\n");
  std::fclose(file_);
  file_ = nullptr;
}

}  // namespace bev::eval
