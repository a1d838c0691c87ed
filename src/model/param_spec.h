// The state_dict a config expects: every key an official BEVFormer checkpoint of that config
// holds, in upstream's names and shapes (docs/bevformer-spec.md §6), and the check of a loaded
// checkpoint against it that reports every missing, unexpected and mismatched name at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "model/config.h"

namespace bev {

struct ParamSpec {
  std::string name;  // upstream state_dict key, e.g. "img_backbone.layer1.0.conv1.weight"
  Shape shape;       // PyTorch order: Linear (out, in), Conv (out, in, kh, kw)
  DType dtype;       // kF32 for float tensors (any float dtype loads), kI64 for counters
  bool optional;     // may be absent without failing the load (num_batches_tracked, code_weights)
  bool used;         // read by inference (false: training-only, or switched off by the config)
  // Non-empty: upstream registers the same module under several names (without box refinement
  // every cls/reg branch index is one module), so this key holds the same tensor as alias_of.
  std::string alias_of = {};
};

// In the order upstream's state_dict lists them (head, backbone, neck); validates cfg first.
std::vector<ParamSpec> expected_params(const ModelConfig& cfg);

struct TensorMeta {
  DType dtype;
  Shape shape;
};

struct ValidationReport {
  std::vector<std::string> missing;     // non-optional specs with no tensor
  std::vector<std::string> unexpected;  // tensors no spec names
  struct Mismatch {
    std::string name;
    std::string expected;  // "float [256, 512]"
    std::string got;       // "f32 [512, 256]"
  };
  std::vector<Mismatch> mismatched;  // wrong shape, wrong dtype kind, or a name given twice
  size_t matched = 0;                // specs found with the right shape and dtype kind
  int64_t expected_params = 0;       // numel of non-optional used float params (aliases once)
  bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
};

// Float specs accept f32, f16, bf16 or f64 (converted at load); integer specs any integer dtype.
ValidationReport validate_state_dict(const std::vector<ParamSpec>& specs,
                                     const std::vector<std::pair<std::string, TensorMeta>>& tensors);

// A headline plus one section per kind of problem, each cut at max_lines_per_section names.
std::string format_report(const ValidationReport& report, size_t max_lines_per_section = 50);

// Parameters as spec §1 counts them: every spec's numel except BN running statistics,
// num_batches_tracked and aliases (frozen parameters and the loss-only code_weights count).
int64_t count_parameters(const std::vector<ParamSpec>& specs);

}  // namespace bev
