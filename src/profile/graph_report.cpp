#include "profile/graph_report.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <unordered_map>

#include "profile/profiler.h"

namespace bev {
namespace {

using nlohmann::json;

double product(const Shape& s) {
  double p = 1;
  for (int64_t d : s) p *= static_cast<double>(d);
  return p;
}

std::string shape_text(const json& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i].get<int64_t>());
  return s + "]";
}

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / (1 << 20));
  return buf;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// A stable colour per stage name, so that one stage's buffers read as one block in the plot.
std::string stage_colour(const std::string& stage) {
  const size_t h = std::hash<std::string>{}(stage);
  char buf[32];
  std::snprintf(buf, sizeof buf, "hsl(%zu, 60%%, 55%%)", h % 360);
  return buf;
}

}  // namespace

json graph_report_json(const RecordedStage& stage, const std::string& variant, Precision precision) {
  const std::vector<RecordedStage::ArenaBuffer> arena = stage.arena_buffers();
  std::unordered_map<const Storage*, size_t> buffer_of;
  for (size_t i = 0; i < arena.size(); ++i) buffer_of.emplace(arena[i].storage, i);
  // Tensors outside the arena, by storage in order of first appearance: stage inputs, constants
  // and kept outputs (the stage cannot tell an input written per frame from a constant).
  std::unordered_map<const Storage*, size_t> external_of;
  json external = json::array();

  json ops = json::array(), weights = json::array();
  size_t weight_bytes = 0;
  const std::vector<OpNode>& nodes = stage.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const OpNode& n = nodes[i];
    auto tensors = [&](const std::vector<Tensor>& ts, bool written) {
      json out = json::array();
      for (const Tensor& t : ts) {
        json j = {{"shape", t.shape()}, {"dtype", dtype_name(t.dtype())}};
        const Storage* s = t.storage().get();
        if (auto it = buffer_of.find(s); it != buffer_of.end()) {
          j["buffer"] = "b" + std::to_string(it->second);
        } else {
          auto [e, fresh] = external_of.try_emplace(s, external.size());
          if (fresh) {
            external.push_back({{"id", "x" + std::to_string(e->second)},
                                {"bytes", s->bytes()},
                                {"shape", t.shape()},
                                {"dtype", dtype_name(t.dtype())},
                                {"first_op", i},
                                {"last_op", i},
                                {"written", false}});
          }
          json& x = external[e->second];
          x["last_op"] = i;
          if (written) x["written"] = true;
          j["buffer"] = x["id"];
        }
        out.push_back(std::move(j));
      }
      return out;
    };
    json op = {{"index", i},
               {"kind", op_name(n.kind)},
               {"stage", n.stage},
               {"label", n.label},
               {"inputs", tensors(n.inputs, false)},
               {"outputs", tensors(n.outputs, true)}};
    std::vector<Shape> shapes;
    if (!n.weight_shape.empty()) shapes.push_back(n.weight_shape);
    if (const auto* b = std::get_if<BottleneckAttrs>(&n.attrs)) shapes = b->weight_shapes;
    if (!shapes.empty()) {
      op["weight_shapes"] = shapes;
      for (const Shape& w : shapes) {
        const auto bytes = static_cast<size_t>(product(w) * weight_element_bytes(n, precision));
        weight_bytes += bytes;
        weights.push_back({{"op", i}, {"label", n.label}, {"kind", op_name(n.kind)}, {"shape", w}, {"bytes", bytes}});
      }
    }
    ops.push_back(std::move(op));
  }
  json buffers = json::array();
  for (size_t i = 0; i < arena.size(); ++i) {
    const RecordedStage::ArenaBuffer& b = arena[i];
    buffers.push_back({{"id", "b" + std::to_string(i)},
                       {"offset", b.offset},
                       {"bytes", b.bytes},
                       {"first_op", b.first},
                       {"last_op", b.last},
                       {"stage", nodes[b.first].stage}});
  }
  return {{"variant", variant},
          {"stage", stage.name()},
          {"ops_count", nodes.size()},
          {"arena_bytes", stage.arena_bytes()},
          {"no_reuse_bytes", stage.no_reuse_bytes()},
          {"weight_bytes", weight_bytes},
          {"weight_precision", precision == Precision::kBF16 ? "bf16" : "f32"},
          {"ops", std::move(ops)},
          {"buffers", std::move(buffers)},
          {"external", std::move(external)},
          {"weights", std::move(weights)}};
}

size_t graph_report_estimated_bytes(const RecordedStage& stage) {
  // A JSON node costs about 100 bytes with its key; an op has about 30 of them per tensor and
  // writes about 400 bytes of HTML per tensor. Doubled for the texts built from the tree.
  size_t tensors = 0;
  for (const OpNode& n : stage.nodes()) tensors += n.inputs.size() + n.outputs.size() + 1;
  return 2 * (tensors * (30 * 100 + 400) + stage.buffers() * 1000);
}

std::string graph_report_html(const json& g) {
  const auto arena = static_cast<double>(std::max<size_t>(g["arena_bytes"].get<size_t>(), 1));
  const size_t n_ops = std::max<size_t>(g["ops_count"].get<size_t>(), 1);
  const json& ops = g["ops"];
  constexpr double kW = 1100, kH = 420, kLiveH = 140, kLeft = 70, kTop = 20;
  auto x_of = [&](double op) { return kLeft + op / static_cast<double>(n_ops) * kW; };

  std::string svg;
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(kLeft + kW + 20) + "\" height=\"" +
         num(kTop + kH + kLiveH + 70) + "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  svg += "<rect x=\"" + num(kLeft) + "\" y=\"" + num(kTop) + "\" width=\"" + num(kW) + "\" height=\"" + num(kH) +
         "\" fill=\"#f6f6f6\" stroke=\"#999\"/>\n";
  // One rectangle per buffer: its life across, its bytes down.
  std::vector<double> live(n_ops, 0.0);
  for (const json& b : g["buffers"]) {
    const double first = b["first_op"].get<double>(), last = b["last_op"].get<double>();
    const double offset = b["offset"].get<double>(), bytes = b["bytes"].get<double>();
    for (size_t i = static_cast<size_t>(first); i <= static_cast<size_t>(last) && i < n_ops; ++i) live[i] += bytes;
    const double x = x_of(first), w = std::max(x_of(last + 1) - x, 1.0);
    const double y = kTop + offset / arena * kH, h = std::max(bytes / arena * kH, 0.5);
    svg += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(w) + "\" height=\"" + num(h) +
           "\" fill=\"" + stage_colour(b["stage"]) + "\" stroke=\"#333\" stroke-width=\"0.3\"><title>" +
           b["id"].get<std::string>() + ": " + mib(bytes) + " at +" + mib(offset) + ", ops " +
           std::to_string(static_cast<size_t>(first)) + ".." + std::to_string(static_cast<size_t>(last)) + " (" +
           html_escape(b["stage"]) + ")</title></rect>\n";
  }
  svg += "<text x=\"" + num(kLeft) + "\" y=\"" + num(kTop - 6) + "\">arena offset (down, 0 to " + mib(arena) +
         ") against op index (across, 0 to " + std::to_string(n_ops) + "); one rectangle per buffer</text>\n";
  for (int k = 0; k <= 4; ++k) {
    const double y = kTop + kH * k / 4;
    svg += "<text x=\"2\" y=\"" + num(y + 4) + "\">" + mib(arena * k / 4) + "</text>\n";
  }
  // Live bytes per op: what the arena must hold while that op runs.
  const double live_top = kTop + kH + 40;
  double live_max = 1;
  for (double v : live) live_max = std::max(live_max, v);
  std::string points;
  for (size_t i = 0; i < n_ops; ++i) {
    const double y = live_top + kLiveH - live[i] / live_max * kLiveH;
    points += num(x_of(static_cast<double>(i))) + "," + num(y) + " " + num(x_of(static_cast<double>(i + 1))) + "," +
              num(y) + " ";
  }
  svg += "<rect x=\"" + num(kLeft) + "\" y=\"" + num(live_top) + "\" width=\"" + num(kW) + "\" height=\"" +
         num(kLiveH) + "\" fill=\"#f6f6f6\" stroke=\"#999\"/>\n";
  svg += "<polyline fill=\"none\" stroke=\"#c33\" stroke-width=\"1.2\" points=\"" + points + "\"/>\n";
  svg += "<text x=\"" + num(kLeft) + "\" y=\"" + num(live_top - 6) + "\">live bytes per op (peak " + mib(live_max) +
         ")</text>\n";
  svg += "<text x=\"2\" y=\"" + num(live_top + 4) + "\">" + mib(live_max) + "</text>\n";
  svg += "<text x=\"2\" y=\"" + num(live_top + kLiveH) + "\">0</text>\n";
  svg += "</svg>\n";

  auto tensor_cells = [](const json& ts) {
    std::string s;
    for (const json& t : ts) {
      if (!s.empty()) s += "<br>";
      s += t["dtype"].get<std::string>() + shape_text(t["shape"]) + " <span class=\"buf\">" +
           t["buffer"].get<std::string>() + "</span>";
    }
    return s;
  };
  const std::string title = "graph report: " + g["variant"].get<std::string>() + " (" + g["stage"].get<std::string>() + ")";
  std::string html;
  html += "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + html_escape(title) + "</title>\n";
  html +=
      "<style>body{font-family:sans-serif;margin:16px}table{border-collapse:collapse;font-size:12px}"
      "td,th{border:1px solid #ccc;padding:2px 6px;vertical-align:top}th{background:#eee}"
      ".buf{color:#666}</style></head><body>\n";
  html += "<h1>" + html_escape(title) + "</h1>\n<p>" + std::to_string(ops.size()) + " ops, " +
          std::to_string(g["buffers"].size()) + " arena buffers in " + mib(arena) + " (" +
          mib(g["no_reuse_bytes"].get<double>()) + " without reuse), " + std::to_string(g["external"].size()) +
          " tensors outside the arena, weights " + mib(g["weight_bytes"].get<double>()) + " (" +
          g["weight_precision"].get<std::string>() + "). Buffer ids: <code>b</code> in the arena (graph.json: "
          "\"buffers\"), <code>x</code> outside it (\"external\").</p>\n";
  html += "<h2>Arena occupancy</h2>\n" + svg;
  html += "<h2>Ops</h2>\n<table><tr><th>#</th><th>stage</th><th>op</th><th>label</th><th>inputs</th><th>outputs</th></tr>\n";
  for (const json& op : ops) {
    html += "<tr><td>" + std::to_string(op["index"].get<size_t>()) + "</td><td>" + html_escape(op["stage"]) + "</td><td>" +
            html_escape(op["kind"]) + "</td><td>" + html_escape(op["label"]) + "</td><td>" + tensor_cells(op["inputs"]) +
            "</td><td>" + tensor_cells(op["outputs"]) + "</td></tr>\n";
  }
  html += "</table>\n</body></html>\n";
  return html;
}

}  // namespace bev
