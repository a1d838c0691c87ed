// results_nusc.json written one sample at a time, for dataset-scale `detect` runs: each sample is
// one line, flushed when added, so a crash loses at most the sample being written; reopening
// with resume keeps every complete sample (dropping a truncated last line) and lists them, so a
// run skips what is already done. finish() closes the JSON; a file reopened after finish() is
// reopened for more samples the same way.
//
//   {"meta": {...}, "results": {
//   "token-1": [{box}, ...]
//   ,"token-2": []
//   }}
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "eval/python_json.h"
#include "io/detections_json.h"

namespace bev::eval {

class ResultsWriter {
 public:
  // Without resume an existing file is replaced. With resume, the file's samples are kept; its
  // meta is kept too (a different `meta` is logged). A file that is not such a results file
  // (other than a truncated last line) is Error(kInvalidInput), never overwritten.
  ResultsWriter(std::string path, ojson meta, bool resume);
  ResultsWriter(const ResultsWriter&) = delete;
  ResultsWriter& operator=(const ResultsWriter&) = delete;
  ~ResultsWriter();  // finish()es if still open; errors there are logged, not thrown

  bool has_sample(const std::string& token) const { return written_.count(token) > 0; }
  const std::vector<std::string>& samples() const { return order_; }  // in file order

  // One sample's boxes: a JSON array of submission-format boxes (sample_token is set to `token`
  // in each), or the engine's NuscBox list. A token already written is Error(kInvalidInput).
  void add_sample(const std::string& token, const ojson& boxes);
  void add_sample(const std::string& token, const std::vector<NuscBox>& boxes);
  // The engine's own text of one sample (Detections::nuscenes_json: one line, each box carrying
  // its sample_token), written as it is: a frame's boxes are not parsed back into JSON values.
  void add_sample_text(const std::string& token, std::string_view boxes_json);
  void finish();

 private:
  void write(const std::string& text);

  std::string path_;
  std::FILE* file_ = nullptr;
  std::vector<std::string> order_;
  std::unordered_set<std::string> written_;
};

}  // namespace bev::eval
