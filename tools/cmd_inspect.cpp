// bevformer inspect FILE [--config C]: what a checkpoint holds and whether it fits a config.
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "bevformer/checkpoint.h"
#include "commands.h"

namespace bev::cli {
namespace {

struct InspectArgs {
  std::string file;
  std::string config;
  bool json = false;
  bool no_tensors = false;
  bool show_config_text = false;
  bool skip_crc = false;
};

std::string human_bytes(uint64_t b) {
  char buf[64];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1ull << 30));
  else if (b >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(b) / (1ull << 20));
  else if (b >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024);
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

nlohmann::json to_json(const CheckpointReport& r) {
  nlohmann::json j;
  j["path"] = r.path;
  j["format"] = r.format;
  j["file_bytes"] = r.file_bytes;
  j["tensor_bytes"] = r.tensor_bytes;
  j["elements"] = r.elements;
  j["tensor_count"] = r.tensors.size();
  j["tensors"] = nlohmann::json::array();
  for (const auto& t : r.tensors) {
    j["tensors"].push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"bytes", t.bytes}});
  }
  j["meta"] = nlohmann::json::parse(r.meta_json, nullptr, false);
  j["classes"] = r.classes;
  j["mmcv_version"] = r.mmcv_version;
  j["top_level_keys"] = r.top_level_keys;
  if (r.has_config_check) {
    const ConfigCheck& c = r.config_check;
    nlohmann::json m = nlohmann::json::array();
    for (const auto& x : c.mismatched) m.push_back({{"name", x.name}, {"expected", x.expected}, {"got", x.got}});
    j["validation"] = {{"config", c.config}, {"ok", c.ok}, {"matched", c.matched},
                       {"expected_parameters", c.expected_parameters}, {"missing", c.missing},
                       {"unexpected", c.unexpected}, {"mismatched", m}};
  }
  return j;
}

void print_text(const CheckpointReport& r, const InspectArgs& a) {
  std::printf("%s\n", r.path.c_str());
  std::printf("  format        %s, %s on disk\n", r.format.c_str(), human_bytes(r.file_bytes).c_str());
  std::printf("  tensors       %zu, %lld elements, %s\n", r.tensors.size(), static_cast<long long>(r.elements),
              human_bytes(r.tensor_bytes).c_str());
  if (!r.top_level_keys.empty()) {
    std::string keys;
    for (const auto& k : r.top_level_keys) keys += (keys.empty() ? "" : ", ") + k;
    std::printf("  top level     %s\n", keys.c_str());
  }
  if (!r.mmcv_version.empty()) std::printf("  mmcv_version  %s\n", r.mmcv_version.c_str());
  if (!r.classes.empty()) {
    std::string cls;
    for (const auto& c : r.classes) cls += (cls.empty() ? "" : ", ") + c;
    std::printf("  CLASSES       %s\n", cls.c_str());
  }
  if (!r.config_text.empty()) {
    std::printf("  config        %zu characters of training config embedded%s\n", r.config_text.size(),
                a.show_config_text ? ":" : " (--show-config-text prints it)");
    if (a.show_config_text) std::printf("%s\n", r.config_text.c_str());
  }
  if (!a.no_tensors) {
    size_t w = 4;
    for (const auto& t : r.tensors) w = std::max(w, t.name.size());
    std::printf("\n  %-*s  %-5s  %-22s  %s\n", static_cast<int>(w), "name", "dtype", "shape", "bytes");
    for (const auto& t : r.tensors) {
      std::printf("  %-*s  %-5s  %-22s  %llu\n", static_cast<int>(w), t.name.c_str(), t.dtype.c_str(),
                  shape_text(t.shape).c_str(), static_cast<unsigned long long>(t.bytes));
    }
  }
  if (r.has_config_check) {
    const ConfigCheck& c = r.config_check;
    std::printf("\nconfig %s\n%s\n%s\n", c.config.c_str(), c.config_summary.c_str(), c.report.c_str());
  }
}

}  // namespace

Runner add_inspect(CLI::App& app) {
  auto a = std::make_shared<InspectArgs>();
  CLI::App* sub = app.add_subcommand("inspect", "List a checkpoint's tensors and metadata; with --config, validate it");
  sub->add_option("file", a->file, "Checkpoint: .pth (torch >= 1.6 zip) or .safetensors")->required();
  sub->add_option("-c,--config", a->config, "Validate against a config: tiny, small, base, or a JSON file");
  sub->add_flag("--json", a->json, "Print one JSON object instead of text");
  sub->add_flag("--no-tensors", a->no_tensors, "Do not list the tensors");
  sub->add_flag("--show-config-text", a->show_config_text, "Print the training config embedded in the checkpoint");
  sub->add_flag("--skip-crc", a->skip_crc, "Do not verify the CRC-32 of .pth entries (faster, misses bit flips)");
  return [a]() {
    InspectOptions o;
    o.config = a->config;
    o.verify_crc = !a->skip_crc;
    const CheckpointReport r = inspect_checkpoint(a->file, o);
    if (a->json) {
      std::printf("%s\n", to_json(r).dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      print_text(r, *a);
    }
    return r.has_config_check && !r.config_check.ok ? 1 : 0;
  };
}

}  // namespace bev::cli
