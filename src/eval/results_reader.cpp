// read_results / parse_results (eval/eval_boxes.h): results_nusc.json read from parser events
// straight into EvalBoxes. A val-sized file holds 1.8 M boxes; building a JSON object for each
// first took three times as long as the parse itself.
#include <cmath>
#include <limits>

#include "bevformer/error.h"
#include "core/log.h"
#include "eval/box_fields.h"
#include "eval/eval_boxes.h"

namespace bev::eval {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
using Kind = FieldValue::Kind;

// Containers open: 1 the root object, 2 `results`, 3 a sample's list, 4 a box, 5 a box field's
// list. A top-level value other than `results` (meta) is captured as a DOM; anything nested
// deeper than the evaluation looks is skipped.
class ResultsReader final : public nlohmann::json_sax<ojson> {
 public:
  ResultsReader(Results& results, const std::string& where) : r_(results), where_(where) {}

  bool null() override { return scalar(ojson(nullptr)); }
  bool boolean(bool v) override { return scalar(ojson(v)); }
  bool number_integer(number_integer_t v) override { return scalar(ojson(v)); }
  bool number_unsigned(number_unsigned_t v) override { return scalar(ojson(v)); }
  bool number_float(number_float_t v, const string_t&) override { return scalar(ojson(v)); }
  bool string(string_t& v) override { return scalar(ojson(v)); }
  bool binary(binary_t&) override { return scalar(ojson()); }
  bool start_object(std::size_t) override { return start(true); }
  bool start_array(std::size_t) override { return start(false); }
  bool end_object() override { return end(); }
  bool end_array() override { return end(); }
  bool key(string_t& k) override {
    if (skip_ > 0) return true;
    if (!stack_.empty()) {
      pending_key_ = k;
    } else if (depth_ == 1) {
      top_key_ = k;
    } else if (depth_ == 2) {
      begin_sample(k);
    } else if (depth_ == 4) {
      field_ = box_field(k);
      if (field_ != BoxField::kCount) box_[field_].clear();  // a repeated key: the last one counts
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    std::string msg = e.what();
    if (const auto p = msg.find("syntax error"); p != std::string::npos) msg = msg.substr(p);
    throw Error(ErrorKind::kInvalidInput, "not valid JSON: " + msg).where(where_);
  }

  void finish() {
    if (!results_seen_) {
      throw Error(ErrorKind::kInvalidInput, "no field 'results'")
          .where(where_)
          .expected("the nuScenes submission format {\"meta\": {...}, \"results\": {sample_token: [box, ...]}}");
    }
    if (!meta_seen_) {
      throw Error(ErrorKind::kInvalidInput, "no field 'meta'")
          .where(where_)
          .expected("\"meta\": {\"use_camera\": ..., \"use_lidar\": ..., ...} beside \"results\"");
    }
    r_.meta = std::move(meta_);
  }

 private:
  [[noreturn]] void fail(const std::string& problem, const std::string& path, const std::string& expected = {}) {
    Error e(ErrorKind::kInvalidInput, problem);
    e.where(where_ + (path.empty() ? "" : ": " + path));
    if (!expected.empty()) e.expected(expected);
    throw e;
  }
  std::string sample_path() const { return "results['" + r_.samples[current_].token + "']"; }
  std::string box_path() const {
    return sample_path() + "[" + std::to_string(r_.samples[current_].boxes.size()) + "]";
  }

  void begin_sample(const std::string& token) {
    if (r_.index.count(token) != 0) {
      // Refused, as across files: Python's json.load (the devkit) keeps the later list without a
      // word, so an evaluation of such a file silently drops boxes.
      fail("sample '" + token + "' appears twice in results", "results['" + token + "']",
           "each sample token once per file (the devkit would silently keep only the later list)");
    } else {
      current_ = r_.samples.size();
      r_.index.emplace(token, current_);
      r_.samples.push_back(ResultSample{token, {}, {}});
    }
  }

  bool scalar(ojson v) {
    if (skip_ > 0) return true;
    if (!stack_.empty()) {
      insert(std::move(v));
      return true;
    }
    switch (depth_) {
      case 1:
        if (top_key_ == "results") fail("'results' is not an object", "", "{sample_token: [box, ...], ...}");
        if (top_key_ == "meta") {
          meta_ = std::move(v);
          meta_seen_ = true;
        }
        return true;
      case 2: fail("is not a list of boxes", sample_path());
      case 3: fail("is not a box object", box_path());
      case 4:
        if (field_ != BoxField::kCount) set_field(box_[field_], v);
        return true;
      case 5: {
        FieldValue& f = box_[field_];
        f.items.push_back(v.is_number() ? v.get<double>() : kNaN);
        if (!v.is_number() && !v.is_null()) f.items_numeric = false;
        return true;
      }
      default: fail("is not an object", "", "the nuScenes submission format");
    }
  }

  static void set_field(FieldValue& f, const ojson& v) {
    if (v.is_null()) {
      f.kind = Kind::kNull;
    } else if (v.is_boolean()) {
      f.kind = Kind::kBool;
    } else if (v.is_number_integer()) {
      f.kind = Kind::kInteger;
      f.integer = v.get<int64_t>();
      f.number = v.get<double>();
    } else if (v.is_number()) {
      f.kind = Kind::kFloat;
      f.number = v.get<double>();
    } else if (v.is_string()) {
      f.kind = Kind::kString;
      f.text = v.get_ref<const std::string&>();
    }
  }

  bool start(bool object) {
    if (skip_ > 0) {
      ++skip_;
      return true;
    }
    if (!stack_.empty()) {
      insert(object ? ojson::object() : ojson::array());
      return true;
    }
    switch (depth_) {
      case 0:
        if (!object) fail("is a list", "", "the nuScenes submission format {\"meta\": ..., \"results\": ...}");
        break;
      case 1:
        if (top_key_ == "results") {
          if (!object) fail("'results' is not an object", "", "{sample_token: [box, ...], ...}");
          results_seen_ = true;
        } else {
          captured_ = object ? ojson::object() : ojson::array();
          stack_.push_back(&captured_);
          return true;
        }
        break;
      case 2:
        if (object) fail("is not a list of boxes", sample_path());
        break;
      case 3:
        if (!object) fail("is not a box object", box_path());
        box_.clear();
        field_ = BoxField::kCount;
        break;
      case 4:
        if (field_ == BoxField::kCount || object) {
          if (field_ != BoxField::kCount) box_[field_].kind = Kind::kObject;
          skip_ = 1;  // a field the evaluation ignores, or an object where a value belongs
          return true;
        }
        box_[field_].kind = Kind::kArray;
        break;
      default:  // a container inside a field's list
        box_[field_].items.push_back(kNaN);
        box_[field_].items_numeric = false;
        skip_ = 1;
        return true;
    }
    ++depth_;
    return true;
  }

  bool end() {
    if (skip_ > 0) {
      --skip_;
      return true;
    }
    if (!stack_.empty()) {
      stack_.pop_back();
      if (stack_.empty() && top_key_ == "meta") {
        meta_ = std::move(captured_);
        meta_seen_ = true;
      }
      return true;
    }
    if (depth_ == 4) finish_box();
    --depth_;
    return true;
  }

  // Into the captured DOM: appended to a list, or under the pending key of an object; a container
  // becomes the new innermost one.
  void insert(ojson v) {
    ojson& parent = *stack_.back();
    const bool container = v.is_structured();
    ojson* slot = nullptr;
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      slot = &parent.back();
    } else {
      slot = &(parent[pending_key_] = std::move(v));
    }
    if (container) stack_.push_back(slot);
  }

  void finish_box() {
    ResultSample& s = r_.samples[current_];
    const std::string& token = s.token;
    const BoxPlace at{where_, "results['", token, "']", static_cast<int64_t>(s.boxes.size())};
    EvalBox box = box_from_fields(box_, false, at);
    const FieldValue& own = box_[BoxField::kSampleToken];
    if (own.kind == Kind::kMissing) at.fail("has no field 'sample_token'", "each box's sample_token (the devkit requires it)");
    if (own.kind != Kind::kString) at.fail("sample_token is not a string");
    if (own.text != token) s.own_tokens.emplace_back(static_cast<uint32_t>(s.boxes.size()), own.text);
    box.sample = static_cast<uint32_t>(current_);
    box.index = static_cast<uint32_t>(s.boxes.size());
    s.boxes.push_back(box);
  }

  Results& r_;
  const std::string& where_;
  int depth_ = 0;
  int skip_ = 0;
  std::string top_key_;
  bool results_seen_ = false;
  bool meta_seen_ = false;
  ojson meta_;
  ojson captured_;
  std::vector<ojson*> stack_;
  std::string pending_key_;
  size_t current_ = 0;
  BoxFields box_;
  BoxField field_ = BoxField::kCount;
};

}  // namespace

Results parse_results(std::string_view text, const std::string& where, int64_t max_boxes_per_sample) {
  Results r;
  r.source = where;
  ResultsReader reader(r, where);
  const std::optional<std::string> fixed = replace_nan_tokens(text);
  const std::string_view input = fixed ? std::string_view(*fixed) : text;
  if (!ojson::sax_parse(input.begin(), input.end(), &reader)) {
    throw Error(ErrorKind::kInvalidInput, "not valid JSON").where(where);
  }
  reader.finish();
  for (const ResultSample& s : r.samples) {
    if (static_cast<int64_t>(s.boxes.size()) > max_boxes_per_sample) {
      throw Error(ErrorKind::kInvalidInput, "sample '" + s.token + "' has " + std::to_string(s.boxes.size()) + " boxes")
          .where(where + ": results['" + s.token + "']")
          .expected("at most " + std::to_string(max_boxes_per_sample) + " boxes per sample (max_boxes_per_sample)")
          .hint("keep each sample's highest-scoring boxes");
    }
  }
  return r;
}

Results read_results(const std::string& path, int64_t max_boxes_per_sample) {
  return parse_results(read_text_file(path), path, max_boxes_per_sample);
}

}  // namespace bev::eval
