#include "eval/box_fields.h"

#include <cmath>
#include <limits>

#include "bevformer/error.h"
#include "eval/detection_config.h"

namespace bev::eval {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
using Kind = FieldValue::Kind;

const char* field_name(BoxField f) {
  static const char* kNames[] = {"sample_token",   "translation",    "size",            "rotation", "velocity",
                                 "detection_name", "attribute_name", "detection_score", "num_pts"};
  return kNames[static_cast<size_t>(f)];
}

std::string describe(const FieldValue& v) {
  switch (v.kind) {
    case Kind::kMissing: return "missing";
    case Kind::kNull: return "null";
    case Kind::kBool: return "a boolean";
    case Kind::kInteger:
    case Kind::kFloat: return "the number " + ojson(v.number).dump();
    case Kind::kString: return "the string '" + v.text + "'";
    case Kind::kArray: return "a list of " + std::to_string(v.items.size());
    case Kind::kObject: return "an object";
  }
  return "?";
}

const FieldValue& present(const BoxFields& fields, BoxField f, const BoxPlace& at) {
  const FieldValue& v = fields[f];
  if (v.kind == Kind::kMissing) at.fail(std::string("has no field '") + field_name(f) + "'");
  return v;
}

// N numbers; null (a NaN in the file) reads as NaN and is refused unless allow_nan.
template <size_t N>
std::array<double, N> numbers(const BoxFields& fields, BoxField f, const BoxPlace& at, bool allow_nan) {
  const FieldValue& v = present(fields, f, at);
  if (v.kind != Kind::kArray || v.items.size() != N) {
    at.fail(std::string(field_name(f)) + " is " + describe(v), "a list of " + std::to_string(N) + " numbers");
  }
  if (!v.items_numeric) at.fail(std::string(field_name(f)) + " holds something that is not a number");
  std::array<double, N> out{};
  for (size_t i = 0; i < N; ++i) {
    out[i] = v.items[i];
    if (std::isnan(out[i]) && !allow_nan) at.fail(std::string(field_name(f)) + " may not be NaN");
  }
  return out;
}

const std::string& text(const BoxFields& fields, BoxField f, const BoxPlace& at) {
  const FieldValue& v = present(fields, f, at);
  if (v.kind != Kind::kString) at.fail(std::string(field_name(f)) + " is " + describe(v), "a string");
  return v.text;
}

int64_t integer(const FieldValue& v, const BoxPlace& at) {
  if (v.kind == Kind::kInteger) return v.integer;
  // Python's int() of a float truncates, to an integer of any size; past int64 we saturate,
  // which keeps the sign and whether it is zero: all the devkit asks of num_pts (casting such a
  // float to int64 is undefined behaviour; found by fuzz_eval_results).
  if (v.kind == Kind::kFloat && std::isfinite(v.number)) {
    constexpr double kTwo63 = 9223372036854775808.0;
    if (v.number >= kTwo63) return std::numeric_limits<int64_t>::max();
    if (v.number < -kTwo63) return std::numeric_limits<int64_t>::min();
    return static_cast<int64_t>(v.number);
  }
  at.fail("num_pts is " + describe(v), "an integer");
}

}  // namespace

BoxField box_field(std::string_view key) {
  for (size_t i = 0; i < static_cast<size_t>(BoxField::kCount); ++i) {
    if (key == field_name(static_cast<BoxField>(i))) return static_cast<BoxField>(i);
  }
  return BoxField::kCount;
}

std::string BoxPlace::path() const {
  std::string p = std::string(before) + token + std::string(after);
  if (index >= 0) p += "[" + std::to_string(index) + "]";
  return p;
}

void BoxPlace::fail(const std::string& problem, const std::string& expected) const {
  Error e(ErrorKind::kInvalidInput, problem);
  e.where(where + ": " + path());
  if (!expected.empty()) e.expected(expected);
  throw e;
}

BoxFields fields_from_json(const ojson& object) {
  BoxFields fields;
  if (!object.is_object()) return fields;
  for (const auto& [key, value] : object.items()) {
    const BoxField f = box_field(key);
    if (f == BoxField::kCount) continue;
    FieldValue& v = fields[f];
    v.clear();
    switch (value.type()) {
      case ojson::value_t::null: v.kind = Kind::kNull; break;
      case ojson::value_t::boolean: v.kind = Kind::kBool; break;
      case ojson::value_t::number_integer:
      case ojson::value_t::number_unsigned:
        v.kind = Kind::kInteger;
        v.integer = value.get<int64_t>();
        v.number = value.get<double>();
        break;
      case ojson::value_t::number_float:
        v.kind = Kind::kFloat;
        v.number = value.get<double>();
        break;
      case ojson::value_t::string:
        v.kind = Kind::kString;
        v.text = value.get<std::string>();
        break;
      case ojson::value_t::array:
        v.kind = Kind::kArray;
        for (const ojson& item : value) {
          if (item.is_number()) {
            v.items.push_back(item.get<double>());
          } else {
            v.items.push_back(kNaN);
            if (!item.is_null()) v.items_numeric = false;
          }
        }
        break;
      default: v.kind = Kind::kObject; break;
    }
  }
  return fields;
}

EvalBox box_from_fields(const BoxFields& fields, bool ground_truth, const BoxPlace& at) {
  EvalBox box;
  box.translation = numbers<3>(fields, BoxField::kTranslation, at, false);
  box.size = numbers<3>(fields, BoxField::kSize, at, false);
  box.rotation = numbers<4>(fields, BoxField::kRotation, at, false);
  box.velocity = numbers<2>(fields, BoxField::kVelocity, at, true);
  const std::string& name = text(fields, BoxField::kDetectionName, at);
  const std::optional<int> cls = detection_index(name);
  if (!cls) at.fail("unknown detection_name '" + name + "'", detection_names_text());
  box.detection = *cls;
  const bool no_attribute = ground_truth && fields[BoxField::kAttributeName].kind == Kind::kMissing;
  const std::string attr = no_attribute ? "" : text(fields, BoxField::kAttributeName, at);
  const std::optional<int> a = attribute_index(attr);
  if (!a) {
    std::string names;
    for (std::string_view n : attribute_names()) names += std::string(n) + ", ";
    at.fail("unknown attribute_name '" + attr + "'", names + "or \"\"");
  }
  box.attribute = *a;
  const FieldValue& pts = fields[BoxField::kNumPts];
  if (ground_truth) {
    box.num_pts = integer(present(fields, BoxField::kNumPts, at), at);
    return box;
  }
  if (pts.kind != Kind::kMissing) box.num_pts = integer(pts, at);
  const FieldValue& score = fields[BoxField::kDetectionScore];
  if (score.kind == Kind::kNull) at.fail("detection_score may not be NaN");
  if (score.kind != Kind::kMissing) {
    if (score.kind != Kind::kInteger && score.kind != Kind::kFloat) {
      at.fail("detection_score is " + describe(score), "a number");
    }
    box.score = score.number;
  }
  return box;
}

}  // namespace bev::eval
