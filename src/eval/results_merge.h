// Several results_nusc.json files (the shards of a dataset run) as one: samples in file order,
// then each file's own order. A sample in two files is refused with one error naming the sample
// and both files; samples missing from all of them are refused by check_same_samples against
// the ground truth (the error names the first one).
#pragma once

#include <string>
#include <vector>

#include "eval/eval_boxes.h"

namespace bev::eval {

// The meta of the first part is kept (a differing meta in a later part is logged as a warning).
Results merge_results(std::vector<Results> parts);
// read_results of each path, then merge_results.
Results read_results_files(const std::vector<std::string>& paths, int64_t max_boxes_per_sample);

// The submission format, one sample per line (each box with its sample_token).
std::string results_text(const Results& results);
void write_results(const std::string& path, const Results& results);

}  // namespace bev::eval
