#include "profile/report.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <unordered_map>

#include "bevformer/error.h"

namespace bev {
namespace {

std::string tensors_text_of(std::span<const RecordedTensor> tensors) {
  std::string s;
  for (const RecordedTensor& t : tensors) {
    if (!s.empty()) s += ' ';
    s += dtype_name(t.dtype);
    s += '[';
    for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
    s += ']';
  }
  return s;
}

bool same_meta(std::span<const RecordedTensor> a, std::span<const RecordedTensor> b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].dtype != b[i].dtype || a[i].shape != b[i].shape) return false;
  }
  return true;
}

size_t meta_bytes(const RecordedTensor& t) {
  size_t n = dtype_size(t.dtype);
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  return n;
}

double per_second(double amount, double ms) { return ms > 0 ? amount / (ms * 1e-3) : 0; }
double percent(double part, double whole) { return whole > 0 ? 100 * part / whole : 0; }

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  va_list ap, again;
  va_start(ap, fmt);
  va_copy(again, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, again);
  va_end(again);
  return out;
}

std::string mib(size_t bytes) { return format("%.1f MiB", static_cast<double>(bytes) / (1 << 20)); }

// The ops of round k: those inside the k-th image range, then the k-th bev range.
struct Round {
  SignpostRange image, bev;
  std::vector<size_t> ops;
  size_t image_ops = 0;
};

std::vector<Round> rounds_of(const Profiler& p) {
  // The profile command names round k >= 2's windows image{k} and bev{k}; a caller profiling its
  // own calls (ProfileSession, the Python profiler) may instead open "image" and "bev" again for
  // each round: then every pair of windows is a round.
  std::vector<std::pair<SignpostRange, SignpostRange>> windows;
  for (size_t k = 0;; ++k) {
    const std::vector<SignpostRange> image = p.ranges(round_signpost("image", k)),
                                     bev = p.ranges(round_signpost("bev", k));
    if (image.empty() || bev.empty()) break;
    windows.emplace_back(image.front(), bev.front());
  }
  if (windows.size() == 1) {
    const std::vector<SignpostRange> image = p.ranges("image"), bev = p.ranges("bev");
    for (size_t k = 1; k < std::min(image.size(), bev.size()); ++k) windows.emplace_back(image[k], bev[k]);
  }
  std::vector<Round> out;
  for (const auto& [image, bev] : windows) {
    Round r;
    r.image = image;
    r.bev = bev;
    r.ops = p.ops_in(r.image);
    r.image_ops = r.ops.size();
    for (size_t i : p.ops_in(r.bev)) r.ops.push_back(i);
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<size_t> eager_ops(const Profiler& p) {
  const std::vector<SignpostRange> eager = p.ranges("eager");
  return eager.empty() ? std::vector<size_t>{} : p.ops_in(eager.front());
}

std::string group_of_stage(const std::string& stage) { return stage.rfind("img.", 0) == 0 ? "image" : "bev"; }

bool ends_with_end(const std::string& name) {
  return name.size() > 4 && name.compare(name.size() - 4, 4, "_end") == 0;
}

}  // namespace

std::string tensors_text(std::span<const RecordedTensor> tensors) { return tensors_text_of(tensors); }

void summarize_overhead(ProfileReport& r) {
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  ProfileOverhead& cost = r.overhead;
  cost.profiled_frame_ms = median(r.round_frame_ms);
  cost.unprofiled_frame_ms = median(cost.unprofiled_round_ms);
  cost.on_percent = cost.unprofiled_frame_ms > 0
                        ? 100 * (cost.profiled_frame_ms - cost.unprofiled_frame_ms) / cost.unprofiled_frame_ms
                        : 0;
  const double ops = static_cast<double>(r.ops_per_frame);
  // Without unprofiled rounds (a caller's session may skip them) the profiled frame stands in.
  const double frame_ms = cost.unprofiled_frame_ms > 0 ? cost.unprofiled_frame_ms : r.frame_ms;
  cost.off_ns_per_op = detached_overhead_ns_per_op();
  cost.off_percent = frame_ms > 0 ? 100 * cost.off_ns_per_op * 1e-6 * ops / frame_ms : 0;
  cost.recording_ns_per_op = attached_cost_ns_per_op();
  cost.recording_percent = frame_ms > 0 ? 100 * cost.recording_ns_per_op * 1e-6 * ops / frame_ms : 0;
}

void write_text_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) throw Error(ErrorKind::kIo, "cannot write the file").where(path.string());
}

void write_profile_files(const std::filesystem::path& dir, const Profiler& profiler, ProfileReport& r, int top_ops) {
  const nlohmann::json meta = {{"config", r.config}, {"weights", r.weights}, {"precision", r.precision},
                               {"device", r.device}, {"backend", r.backend}, {"cpu", r.cpu},
                               {"isa", r.isa},       {"rounds", r.rounds},   {"peak_gflops", r.peak_gflops},
                               {"peak_gbps", r.peak_gbps}};
  for (const char* f : {"trace.json", "summary.json", "summary.md", "memory.json"}) r.files.push_back((dir / f).string());
  write_text_file(dir / "trace.json", chrome_trace_json(profiler, meta));
  write_text_file(dir / "summary.json", summary_json(r).dump(1) + "\n");
  write_text_file(dir / "summary.md", summary_markdown(r, top_ops));
  write_text_file(dir / "memory.json", memory_json(r.memory).dump(1) + "\n");
}

std::string round_signpost(const std::string& base, size_t k) {
  return k == 0 ? base : base + std::to_string(k + 1);
}

void summarize_rounds(const Profiler& p, ProfileReport& report) {
  const std::vector<Round> rounds = rounds_of(p);
  if (rounds.empty()) throw Error(ErrorKind::kInternal, "the profile has no replayed round (image and bev signposts)");
  const size_t n = rounds[0].ops.size();
  for (const Round& r : rounds) {
    bool same = r.ops.size() == n;
    for (size_t j = 0; same && j < n; ++j) same = p.ops()[r.ops[j]].kind == p.ops()[rounds[0].ops[j]].kind;
    if (!same) throw Error(ErrorKind::kInternal, "the replayed rounds ran different ops");
  }
  const double count = static_cast<double>(rounds.size());
  report.rounds = static_cast<int>(rounds.size());
  report.ops_per_frame = n;
  report.image_ms = report.bev_ms = 0;
  for (const Round& r : rounds) {
    report.image_ms += r.image.ms() / count;
    report.bev_ms += r.bev.ms() / count;
  }
  report.frame_ms = report.image_ms + report.bev_ms;
  report.round_frame_ms.clear();
  for (const Round& r : rounds) report.round_frame_ms.push_back(r.image.ms() + r.bev.ms());

  std::vector<double> ms(n, 0.0);
  for (const Round& r : rounds) {
    for (size_t j = 0; j < n; ++j) ms[j] += static_cast<double>(p.ops()[r.ops[j]].duration_ns) * 1e-6 / count;
  }

  report.ops.clear();
  report.stages.clear();
  report.op_kinds.clear();
  report.gflop_per_frame = report.gbyte_per_frame = 0;
  std::unordered_map<std::string, size_t> stage_index;
  std::vector<size_t> stage_of_op(n);
  std::map<OpKind, size_t> kind_index;
  const Round& r0 = rounds[0];
  for (size_t j = 0; j < n; ++j) {
    const OpRecord& rec = p.ops()[r0.ops[j]];
    ProfileOp op;
    op.index = j;
    op.name = op_name(rec.kind);
    op.stage = p.text(rec.stage);
    op.label = p.text(rec.label);
    op.inputs = tensors_text_of(p.inputs(rec));
    op.outputs = tensors_text_of(p.outputs(rec));
    op.start_ms = static_cast<double>(rec.start_ns - r0.image.begin_ns) * 1e-6;
    op.ms = ms[j];
    op.gflop = rec.flops * 1e-9;
    op.gbyte = rec.bytes * 1e-9;
    op.gflops = per_second(op.gflop, op.ms);
    op.gbps = per_second(op.gbyte, op.ms);
    op.percent_of_peak_flops = percent(op.gflops, report.peak_gflops);
    if (report.peak_gflops > 0 && report.peak_gbps > 0) {
      op.bound_ms = std::max(op.gflop / report.peak_gflops, op.gbyte / report.peak_gbps) * 1e3;
    }
    report.gflop_per_frame += op.gflop;
    report.gbyte_per_frame += op.gbyte;

    auto [it, added] = stage_index.emplace(op.stage, report.stages.size());
    if (added) {
      ProfileStage s;
      s.name = op.stage;
      s.group = j < r0.image_ops ? "image" : "bev";
      report.stages.push_back(s);
    }
    stage_of_op[j] = it->second;
    ProfileStage& s = report.stages[it->second];
    ++s.ops;
    s.ms += op.ms;
    s.bound_ms += op.bound_ms;
    s.gflop += op.gflop;
    s.gbyte += op.gbyte;
    for (const RecordedTensor& t : p.outputs(rec)) {
      s.output_bytes += meta_bytes(t);
      s.largest_output_bytes = std::max(s.largest_output_bytes, meta_bytes(t));
    }

    auto [kit, kadded] = kind_index.emplace(rec.kind, report.op_kinds.size());
    if (kadded) report.op_kinds.push_back(ProfileOpKind{op.name});
    ProfileOpKind& k = report.op_kinds[kit->second];
    ++k.count;
    k.ms += op.ms;
    k.gflop += op.gflop;
    k.gbyte += op.gbyte;
    report.ops.push_back(std::move(op));
  }
  // Each stage's best round: what it costs undisturbed, when other work shares the machine.
  std::vector<std::vector<double>> stage_round_ms(report.stages.size(), std::vector<double>(rounds.size(), 0.0));
  for (size_t k = 0; k < rounds.size(); ++k) {
    for (size_t j = 0; j < n; ++j) {
      stage_round_ms[stage_of_op[j]][k] += static_cast<double>(p.ops()[rounds[k].ops[j]].duration_ns) * 1e-6;
    }
  }
  for (size_t i = 0; i < report.stages.size(); ++i) {
    report.stages[i].best_ms = *std::min_element(stage_round_ms[i].begin(), stage_round_ms[i].end());
  }
  report.stage_sum_ms = 0;
  report.bound_ms = 0;
  report.flop_floor_ms = report.peak_gflops > 0 ? report.gflop_per_frame / report.peak_gflops * 1e3 : 0;
  for (ProfileStage& s : report.stages) {
    report.stage_sum_ms += s.ms;
    report.bound_ms += s.bound_ms;
    s.percent_of_frame = percent(s.ms, report.frame_ms);
    s.gflops = per_second(s.gflop, s.ms);
    s.gbps = per_second(s.gbyte, s.ms);
    s.percent_of_peak_flops = percent(s.gflops, report.peak_gflops);
    s.percent_of_peak_bandwidth = percent(s.gbps, report.peak_gbps);
  }
  for (ProfileOpKind& k : report.op_kinds) {
    k.percent_of_frame = percent(k.ms, report.frame_ms);
    k.gflops = per_second(k.gflop, k.ms);
    k.gbps = per_second(k.gbyte, k.ms);
  }
  std::stable_sort(report.op_kinds.begin(), report.op_kinds.end(),
                   [](const ProfileOpKind& a, const ProfileOpKind& b) { return a.ms > b.ms; });
}

void summarize_eager(const Profiler& p, ProfileReport& report) {
  const std::vector<SignpostRange> eager = p.ranges("eager");
  if (eager.empty()) return;
  report.eager = true;
  report.eager_frame_ms = eager.front().ms();
  for (ProfileStage& s : report.stages) s.eager_ms = 0;
  for (size_t i : p.ops_in(eager.front())) {
    const OpRecord& rec = p.ops()[i];
    const std::string& stage = p.text(rec.stage);
    auto it = std::find_if(report.stages.begin(), report.stages.end(),
                           [&](const ProfileStage& s) { return s.name == stage; });
    if (it == report.stages.end()) {
      ProfileStage s;
      s.name = stage;
      s.group = group_of_stage(stage);
      s.eager_ms = 0;
      report.stages.push_back(s);
      it = report.stages.end() - 1;
    }
    it->eager_ms += static_cast<double>(rec.duration_ns) * 1e-6;
  }
}

bool carry_labels_from_eager(Profiler& p, std::string* note) {
  const std::vector<size_t> eager = eager_ops(p);
  const std::vector<Round> rounds = rounds_of(p);
  if (eager.empty() || rounds.empty()) {
    *note = "no eager frame: the replayed ops carry the labels recorded with their plans";
    return false;
  }
  const std::vector<size_t>& replay = rounds[0].ops;
  if (eager.size() != replay.size()) {
    *note = format("the eager frame ran %zu ops, a replayed frame %zu: labels are the plans' own", eager.size(),
                   replay.size());
    return false;
  }
  for (size_t j = 0; j < eager.size(); ++j) {
    const OpRecord& e = p.ops()[eager[j]];
    const OpRecord& r = p.ops()[replay[j]];
    if (e.kind != r.kind || !same_meta(p.inputs(e), p.inputs(r)) || !same_meta(p.outputs(e), p.outputs(r))) {
      *note = format("op %zu differs: eager %s %s -> %s, replayed %s %s -> %s; labels are the plans' own", j,
                     op_name(e.kind), tensors_text_of(p.inputs(e)).c_str(), tensors_text_of(p.outputs(e)).c_str(), op_name(r.kind),
                     tensors_text_of(p.inputs(r)).c_str(), tensors_text_of(p.outputs(r)).c_str());
      return false;
    }
  }
  for (const Round& round : rounds) {
    for (size_t j = 0; j < eager.size(); ++j) p.set_label(round.ops[j], p.text(p.ops()[eager[j]].label));
  }
  *note = format(
      "the eager frame and every replayed frame ran the same %zu ops (kinds, shapes, dtypes); labels "
      "carried over from the eager frame",
      eager.size());
  return true;
}

// ---- Chrome trace ----

std::string chrome_trace_json(const Profiler& p, const nlohmann::json& metadata) {
  using nlohmann::json;
  constexpr int kPid = 1, kTid = 1;
  json events = json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", kPid}, {"args", {{"name", "bevformer.cpp"}}}});
  events.push_back(
      {{"ph", "M"}, {"name", "thread_name"}, {"pid", kPid}, {"tid", kTid}, {"args", {{"name", "engine"}}}});
  auto us = [](int64_t ns) { return static_cast<double>(ns) * 1e-3; };
  auto range_event = [&](const std::string& name, const char* cat, int64_t begin, int64_t end) {
    events.push_back({{"ph", "X"},
                      {"name", name},
                      {"cat", cat},
                      {"pid", kPid},
                      {"tid", kTid},
                      {"ts", us(begin)},
                      {"dur", us(end - begin)}});
  };

  // A signpost whose "_end" follows is a range (B/E); one without (a module stage an eager run
  // entered) is an instant event, so that every B has its E.
  std::set<std::string> closed;
  for (const Signpost& s : p.signposts()) {
    if (ends_with_end(s.name)) closed.insert(s.name.substr(0, s.name.size() - 4));
  }
  std::vector<int64_t> marks;  // range signpost times: stage ranges never span one
  for (const Signpost& s : p.signposts()) {
    const bool end = ends_with_end(s.name);
    if (!end && !closed.count(s.name)) {
      events.push_back({{"ph", "i"},
                        {"s", "t"},
                        {"name", s.name},
                        {"cat", "stage_signpost"},
                        {"pid", kPid},
                        {"tid", kTid},
                        {"ts", us(s.t_ns)},
                        {"args", {{"signpost", s.name}}}});
      continue;
    }
    events.push_back({{"ph", end ? "E" : "B"},
                      {"name", end ? s.name.substr(0, s.name.size() - 4) : s.name},
                      {"cat", "signpost"},
                      {"pid", kPid},
                      {"tid", kTid},
                      {"ts", us(s.t_ns)},
                      {"args", {{"signpost", s.name}}}});
    marks.push_back(s.t_ns);
  }
  std::sort(marks.begin(), marks.end());

  const std::vector<OpRecord>& ops = p.ops();
  // Stage ranges: runs of consecutive ops with one stage and no signpost between them.
  auto split = [&](size_t a, size_t b) {
    const int64_t gap_begin = ops[a].start_ns + ops[a].duration_ns, gap_end = ops[b].start_ns;
    const auto it = std::lower_bound(marks.begin(), marks.end(), gap_begin);
    return it != marks.end() && *it <= gap_end;
  };
  for (size_t i = 0; i < ops.size();) {
    size_t j = i + 1;
    while (j < ops.size() && ops[j].stage == ops[i].stage && !split(j - 1, j)) ++j;
    if (ops[i].stage != 0) {
      range_event(p.text(ops[i].stage), "stage", ops[i].start_ns, ops[j - 1].start_ns + ops[j - 1].duration_ns);
    }
    i = j;
  }
  // The ops last: viewers nest events that start together in file order, parents first.
  for (const OpRecord& r : ops) {
    const double ms = static_cast<double>(r.duration_ns) * 1e-6;
    json args = {{"stage", p.text(r.stage)},
                 {"label", p.text(r.label)},
                 {"inputs", tensors_text_of(p.inputs(r))},
                 {"outputs", tensors_text_of(p.outputs(r))},
                 {"dtype", r.outputs ? dtype_name(p.outputs(r)[0].dtype) : ""},
                 {"gflop", r.flops * 1e-9},
                 {"mbyte", r.bytes * 1e-6},
                 {"gflops", per_second(r.flops * 1e-9, ms)},
                 {"gbps", per_second(r.bytes * 1e-9, ms)}};
    events.push_back({{"ph", "X"},
                      {"name", op_name(r.kind)},
                      {"cat", "op"},
                      {"pid", kPid},
                      {"tid", kTid},
                      {"ts", us(r.start_ns)},
                      {"dur", us(r.duration_ns)},
                      {"args", std::move(args)}});
  }
  const json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", metadata}};
  return doc.dump();
}

// ---- summaries ----

nlohmann::json memory_json(const ProfileMemory& m) {
  nlohmann::json plans = nlohmann::json::array();
  for (const ProfilePlanMemory& p : m.plans) {
    plans.push_back({{"name", p.name},
                     {"ops", p.ops},
                     {"buffers", p.buffers},
                     {"arena_bytes", p.arena_bytes},
                     {"no_reuse_bytes", p.no_reuse_bytes}});
  }
  return {{"weight_bytes", m.weight_bytes},
          {"plans", std::move(plans)},
          {"arena_bytes", m.arena_bytes},
          {"rss_bytes", m.rss_bytes},
          {"peak_rss_bytes", m.peak_rss_bytes}};
}

nlohmann::json summary_json(const ProfileReport& r) {
  using nlohmann::json;
  json stages = json::array(), ops = json::array(), kinds = json::array();
  for (const ProfileStage& s : r.stages) {
    json j = {{"name", s.name},
              {"group", s.group},
              {"ops", s.ops},
              {"ms", s.ms},
              {"best_ms", s.best_ms},
              {"percent_of_frame", s.percent_of_frame},
              {"gflop", s.gflop},
              {"gbyte", s.gbyte},
              {"gflops", s.gflops},
              {"gbps", s.gbps},
              {"percent_of_peak_flops", s.percent_of_peak_flops},
              {"percent_of_peak_bandwidth", s.percent_of_peak_bandwidth},
              {"bound_ms", s.bound_ms},
              {"output_bytes", s.output_bytes},
              {"largest_output_bytes", s.largest_output_bytes}};
    if (s.eager_ms >= 0) j["eager_ms"] = s.eager_ms;
    stages.push_back(std::move(j));
  }
  for (const ProfileOp& o : r.ops) {
    ops.push_back({{"index", o.index},
                   {"name", o.name},
                   {"stage", o.stage},
                   {"label", o.label},
                   {"inputs", o.inputs},
                   {"outputs", o.outputs},
                   {"start_ms", o.start_ms},
                   {"ms", o.ms},
                   {"gflop", o.gflop},
                   {"gbyte", o.gbyte},
                   {"gflops", o.gflops},
                   {"gbps", o.gbps},
                   {"percent_of_peak_flops", o.percent_of_peak_flops},
                   {"bound_ms", o.bound_ms}});
  }
  for (const ProfileOpKind& k : r.op_kinds) {
    kinds.push_back({{"name", k.name},
                     {"count", k.count},
                     {"ms", k.ms},
                     {"percent_of_frame", k.percent_of_frame},
                     {"gflop", k.gflop},
                     {"gbyte", k.gbyte},
                     {"gflops", k.gflops},
                     {"gbps", k.gbps}});
  }
  json doc = {{"config", r.config},
              {"weights", r.weights},
              {"precision", r.precision},
              {"device", r.device},
              {"threads", r.threads},
              {"rounds", r.rounds},
              {"ops_per_frame", r.ops_per_frame},
              {"frame_ms", r.frame_ms},
              {"round_frame_ms", r.round_frame_ms},
              {"image_ms", r.image_ms},
              {"bev_ms", r.bev_ms},
              {"stage_sum_ms", r.stage_sum_ms},
              {"forward_ms", r.forward_ms},
              {"host_waits_per_frame", r.host_waits_per_frame},
              {"peak_gflops", r.peak_gflops},
              {"peak_gbps", r.peak_gbps},
              {"gflop_per_frame", r.gflop_per_frame},
              {"gbyte_per_frame", r.gbyte_per_frame},
              {"bound_ms", r.bound_ms},
              {"flop_floor_ms", r.flop_floor_ms},
              {"stages", std::move(stages)},
              {"op_kinds", std::move(kinds)},
              {"ops", std::move(ops)},
              {"memory", memory_json(r.memory)},
              {"overhead",
               {{"off_ns_per_op", r.overhead.off_ns_per_op},
                {"off_percent", r.overhead.off_percent},
                {"unprofiled_round_ms", r.overhead.unprofiled_round_ms},
                {"unprofiled_frame_ms", r.overhead.unprofiled_frame_ms},
                {"profiled_frame_ms", r.overhead.profiled_frame_ms},
                {"recording_ns_per_op", r.overhead.recording_ns_per_op},
                {"recording_percent", r.overhead.recording_percent},
                {"on_percent", r.overhead.on_percent}}},
              {"labels_from_eager", r.labels_from_eager},
              {"labels_note", r.labels_note}};
  if (r.eager) doc["eager_frame_ms"] = r.eager_frame_ms;
  return doc;
}

std::string summary_markdown(const ProfileReport& r, int top_ops) {
  std::string md;
  md += format("# Profile: %s\n\n", r.config.c_str());
  md += format(
      "weights %s, %s, %s. A frame is the image and bev stages replayed from their recorded plans "
      "(steady state: the history is in use); times are means of %d rounds.\n\n",
      r.weights.c_str(), r.precision.c_str(), r.device.c_str(), r.rounds);
  md += format("| | |\n|---|---|\n");
  md += format("| frame (replayed image + bev) | **%.2f ms** (image %.2f ms, bev %.2f ms) |\n", r.frame_ms, r.image_ms,
               r.bev_ms);
  md += format("| stages' op time | %.2f ms (%.1f%% of the frame; the rest lies between ops) |\n", r.stage_sum_ms,
               percent(r.stage_sum_ms, r.frame_ms));
  md += format("| forward() of the last warm-up frame | %.2f ms (host geometry, input copies, both stages); "
               "the host waited for the backend %d time(s) |\n",
               r.forward_ms, r.host_waits_per_frame);
  if (r.eager) md += format("| eager forward() with history | %.2f ms |\n", r.eager_frame_ms);
  md += format("| work per frame | %.2f GFLOP, %.2f GB moved (from shapes), %zu ops |\n", r.gflop_per_frame,
               r.gbyte_per_frame, r.ops_per_frame);
  md +=
      format("| achieved | %.1f GFLOP/s (%.0f%% of peak), %.1f GB/s |\n", per_second(r.gflop_per_frame, r.stage_sum_ms),
             percent(per_second(r.gflop_per_frame, r.stage_sum_ms), r.peak_gflops),
             per_second(r.gbyte_per_frame, r.stage_sum_ms));
  md += format("| measured peaks | %.0f GFLOP/s (%s matmul), %.1f GB/s (copy, read + write) |\n", r.peak_gflops,
               r.precision.c_str(), r.peak_gbps);
  if (r.bound_ms > 0) {
    md += format(
        "| floors at those peaks | every op at its bound (the slower of its arithmetic and its bytes): **%.2f ms** "
        "(%.0f%% of the stages' op time); the arithmetic alone: %.2f ms |\n",
        r.bound_ms, percent(r.bound_ms, r.stage_sum_ms), r.flop_floor_ms);
  }
  md += format("| profiler off | at most %.1f ns per op x %zu ops = %.5f%% of the frame |\n", r.overhead.off_ns_per_op,
               r.ops_per_frame, r.overhead.off_percent);
  md += format(
      "| profiler on | recording %.0f ns per op x %zu ops = %.4f%% of the frame; measured %+.2f%% "
      "(median %.2f ms profiled against %.2f ms unprofiled, rounds interleaved) |\n",
      r.overhead.recording_ns_per_op, r.ops_per_frame, r.overhead.recording_percent, r.overhead.on_percent,
      r.overhead.profiled_frame_ms, r.overhead.unprofiled_frame_ms);

  md += "\n## Stages\n\n";
  md += "GFLOP and GB are per frame, computed from shapes; % peak is against the measured peaks above.\n\n";
  md += "ms is the mean over the rounds, best ms the stage's fastest round, bound ms its ops each at their bound "
        "(the slower of arithmetic and bytes at the measured peaks).\n\n";
  md += r.eager ? "| stage | ops | ms | best ms | bound ms | % frame | GFLOP | GFLOP/s | % peak | GB | GB/s | % BW | eager ms |\n"
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
                : "| stage | ops | ms | best ms | bound ms | % frame | GFLOP | GFLOP/s | % peak | GB | GB/s | % BW |\n"
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const ProfileStage& s : r.stages) {
    md += format("| %s | %zu | %.2f | %.2f | %.2f | %.1f | %.3f | %.1f | %.0f | %.3f | %.1f | %.0f |", s.name.c_str(),
                 s.ops, s.ms, s.best_ms, s.bound_ms, s.percent_of_frame, s.gflop, s.gflops, s.percent_of_peak_flops,
                 s.gbyte, s.gbps, s.percent_of_peak_bandwidth);
    md += r.eager ? format(" %.2f |\n", s.eager_ms) : "\n";
  }

  md += format("\n## Top %d ops\n\n", top_ops);
  md +=
      "| # | op | stage | label | inputs -> outputs | ms | % frame | GFLOP/s | % peak | GB/s |\n"
      "|---:|---|---|---|---|---:|---:|---:|---:|---:|\n";
  std::vector<const ProfileOp*> by_time;
  for (const ProfileOp& o : r.ops) by_time.push_back(&o);
  std::stable_sort(by_time.begin(), by_time.end(),
                   [](const ProfileOp* a, const ProfileOp* b) { return a->ms > b->ms; });
  for (size_t i = 0; i < by_time.size() && i < static_cast<size_t>(std::max(0, top_ops)); ++i) {
    const ProfileOp& o = *by_time[i];
    md += format("| %zu | %s | %s | %s | %s -> %s | %.2f | %.1f | %.1f | %.0f | %.1f |\n", o.index, o.name.c_str(),
                 o.stage.c_str(), o.label.empty() ? "-" : o.label.c_str(), o.inputs.c_str(), o.outputs.c_str(), o.ms,
                 percent(o.ms, r.frame_ms), o.gflops, o.percent_of_peak_flops, o.gbps);
  }

  md +=
      "\n## Op kinds\n\n| op | count | ms | % frame | GFLOP | GFLOP/s | GB | GB/s |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const ProfileOpKind& k : r.op_kinds) {
    md += format("| %s | %zu | %.2f | %.1f | %.3f | %.1f | %.3f | %.1f |\n", k.name.c_str(), k.count, k.ms,
                 k.percent_of_frame, k.gflop, k.gflops, k.gbyte, k.gbps);
  }

  const ProfileMemory& m = r.memory;
  md += "\n## Memory\n\n| | |\n|---|---|\n";
  md += format("| weights (checkpoint tensors as loaded) | %s |\n", mib(m.weight_bytes).c_str());
  for (const ProfilePlanMemory& p : m.plans) {
    md += format("| arena of plan \"%s\" (%zu ops, %zu buffers) | %s (%s without reuse) |\n", p.name.c_str(), p.ops,
                 p.buffers, mib(p.arena_bytes).c_str(), mib(p.no_reuse_bytes).c_str());
  }
  md += format("| all arenas | %s |\n", mib(m.arena_bytes).c_str());
  md += format("| resident set after the rounds | %s (peak %s) |\n", mib(m.rss_bytes).c_str(),
               mib(m.peak_rss_bytes).c_str());
  md +=
      "\nPer-stage buffers: what each stage's ops write per frame (before the arena shares bytes between "
      "buffers whose lives do not overlap), and the largest single output.\n\n"
      "| stage | written | largest |\n|---|---:|---:|\n";
  for (const ProfileStage& s : r.stages) {
    if (s.ops == 0) continue;
    md +=
        format("| %s | %s | %s |\n", s.name.c_str(), mib(s.output_bytes).c_str(), mib(s.largest_output_bytes).c_str());
  }
  md += "\n## Labels\n\n" + r.labels_note + "\n";
  return md;
}

}  // namespace bev
