// One box of a results or ground-truth list as read: each field the devkit looks at, with what the
// JSON held there. The results reader fills it from parser events (a val-sized file would
// otherwise build 1.8 M JSON objects), the ground-truth reader from a parsed object; both then
// go through box_from_fields, the one place that applies DetectionBox's checks.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "eval/eval_boxes.h"

namespace bev::eval {

struct FieldValue {
  enum class Kind : uint8_t { kMissing, kNull, kBool, kInteger, kFloat, kString, kArray, kObject };
  Kind kind = Kind::kMissing;
  double number = 0;           // kInteger, kFloat
  int64_t integer = 0;         // kInteger
  std::string text;            // kString
  std::vector<double> items;   // kArray: its numbers, NaN for null
  bool items_numeric = true;   // kArray: every item a number or null

  void clear() {
    kind = Kind::kMissing;
    text.clear();
    items.clear();
    items_numeric = true;
  }
};

enum class BoxField : uint8_t {
  kSampleToken, kTranslation, kSize, kRotation, kVelocity, kDetectionName, kAttributeName, kDetectionScore,
  kNumPts, kCount
};
// The field a key names; kCount for a key the evaluation ignores.
BoxField box_field(std::string_view key);

struct BoxFields {
  std::array<FieldValue, static_cast<size_t>(BoxField::kCount)> values;
  FieldValue& operator[](BoxField f) { return values[static_cast<size_t>(f)]; }
  const FieldValue& operator[](BoxField f) const { return values[static_cast<size_t>(f)]; }
  void clear() {
    for (FieldValue& v : values) v.clear();
  }
};

// Where a box is, as a user finds it in the file: BEFORE + token + AFTER [+ "[index]"], e.g.
// "results['tok'][3]" or "samples['tok'].boxes[3]". Formatted only for a message.
struct BoxPlace {
  const std::string& where;
  std::string_view before;
  const std::string& token;
  std::string_view after;
  int64_t index = -1;

  std::string path() const;
  [[noreturn]] void fail(const std::string& problem, const std::string& expected = {}) const;
};

// The fields of a parsed JSON object (any other type: every field missing).
BoxFields fields_from_json(const ojson& object);
// DetectionBox.deserialize and its asserts: 3/3/4/2 numbers (NaN only in velocity), a known
// detection_name and attribute_name, a score that is a number; for ground truth num_pts too and
// no score. Error(kInvalidInput) at `at` otherwise. sample_token is the caller's to check.
EvalBox box_from_fields(const BoxFields& fields, bool ground_truth, const BoxPlace& at);

}  // namespace bev::eval
