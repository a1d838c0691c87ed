#include "eval/results_merge.h"

#include <unordered_map>

#include "bevformer/error.h"
#include "core/log.h"

namespace bev::eval {

Results merge_results(std::vector<Results> parts) {
  if (parts.empty()) throw Error(ErrorKind::kInvalidInput, "no results file to merge");
  if (parts.size() == 1) return std::move(parts.front());
  Results out;
  out.meta = parts.front().meta;
  std::unordered_map<std::string, size_t> owner;  // token -> part it came from
  for (size_t p = 0; p < parts.size(); ++p) {
    Results& part = parts[p];
    out.source += (p ? " + " : "") + part.source;
    if (part.meta != out.meta) {
      log_warn(part.source, ": meta differs from ", parts.front().source, "'s; keeping the first file's");
    }
    for (ResultSample& s : part.samples) {
      const auto [it, fresh] = owner.emplace(s.token, p);
      if (!fresh) {
        throw Error(ErrorKind::kInvalidInput, "sample '" + s.token + "' is in both " + parts[it->second].source +
                                                  " and " + part.source)
            .expected("each sample in exactly one results file")
            .hint("shards of one run split the samples; re-run or drop the duplicate shard");
      }
      const auto index = static_cast<uint32_t>(out.samples.size());
      for (EvalBox& b : s.boxes) b.sample = index;
      out.index.emplace(s.token, index);
      out.samples.push_back(std::move(s));
    }
  }
  return out;
}

Results read_results_files(const std::vector<std::string>& paths, int64_t max_boxes_per_sample) {
  std::vector<Results> parts;
  for (const std::string& p : paths) parts.push_back(read_results(p, max_boxes_per_sample));
  return merge_results(std::move(parts));
}

std::string results_text(const Results& results) {
  std::string out = "{\"meta\": " + results.meta.dump() + ",\n\"results\": {";
  bool first = true;
  for (const ResultSample& s : results.samples) {
    std::vector<const std::string*> own(s.boxes.size(), &s.token);
    for (const auto& [i, token] : s.own_tokens) own[i] = &token;
    out += first ? "\n" : ",\n";
    first = false;
    out += ojson(s.token).dump() + ": [";
    for (size_t i = 0; i < s.boxes.size(); ++i) {
      out += (i ? ", " : "") + box_to_json(s.boxes[i], *own[i], false).dump();
    }
    out += "]";
  }
  out += "\n}}\n";
  return out;
}

void write_results(const std::string& path, const Results& results) { write_file_atomically(path, results_text(results)); }

}  // namespace bev::eval
