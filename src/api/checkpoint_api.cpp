#include "bevformer/checkpoint.h"

#include "io/checkpoint.h"
#include "model/config.h"
#include "model/param_spec.h"

namespace bev {

CheckpointReport inspect_checkpoint(const std::string& path, const InspectOptions& options) {
  LoadOptions load;
  load.verify_crc = options.verify_crc;
  const Checkpoint ck = load_checkpoint(path, load);

  CheckpointReport r;
  r.path = ck.path;
  r.format = checkpoint_format_name(ck.format);
  r.file_bytes = ck.file_bytes;
  r.tensor_bytes = ck.tensor_bytes();
  r.meta_json = ck.meta.raw.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  r.classes = ck.meta.classes;
  r.mmcv_version = ck.meta.mmcv_version;
  r.config_text = ck.meta.config_text;
  r.top_level_keys = ck.meta.top_level_keys;
  std::vector<std::pair<std::string, TensorMeta>> metas;
  metas.reserve(ck.size());
  for (const auto& [name, t] : ck.tensors()) {
    r.tensors.push_back({name, dtype_name(t.dtype()), t.shape(), t.nbytes()});
    r.elements += t.numel();
    metas.emplace_back(name, TensorMeta{t.dtype(), t.shape()});
  }

  if (!options.config.empty()) {
    const ModelConfig cfg = load_config(options.config);
    const ValidationReport v = validate_state_dict(expected_params(cfg), metas);
    ConfigCheck& c = r.config_check;
    r.has_config_check = true;
    c.config = options.config;
    c.config_summary = config_summary(cfg);
    c.ok = v.ok();
    c.matched = v.matched;
    c.expected_parameters = v.expected_params;
    c.missing = v.missing;
    c.unexpected = v.unexpected;
    for (const auto& m : v.mismatched) c.mismatched.push_back({m.name, m.expected, m.got});
    c.report = format_report(v);
  }
  return r;
}

}  // namespace bev
