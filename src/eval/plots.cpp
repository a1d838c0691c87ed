#include "eval/plots.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "bevformer/error.h"

namespace bev::eval {

namespace {

// matplotlib's default cycle C0..C9 (BGR), which the devkit's plots use.
const cv::Scalar kColors[] = {{180, 119, 31}, {14, 127, 255}, {44, 160, 44},  {40, 39, 214},  {189, 103, 148},
                              {75, 86, 140},  {194, 119, 227}, {127, 127, 127}, {34, 189, 188}, {207, 190, 23}};
const cv::Scalar kBlack{0, 0, 0}, kGrey{150, 150, 150}, kLightGrey{235, 235, 235};

const char* pretty_class(std::string_view n) {
  if (n == "car") return "Car";
  if (n == "truck") return "Truck";
  if (n == "bus") return "Bus";
  if (n == "trailer") return "Trailer";
  if (n == "construction_vehicle") return "Constr. Veh.";
  if (n == "pedestrian") return "Pedestrian";
  if (n == "motorcycle") return "Motorcycle";
  if (n == "bicycle") return "Bicycle";
  if (n == "traffic_cone") return "Traffic Cone";
  return "Barrier";
}
const char* kPrettyTp[kNumTpMetrics] = {"Trans.", "Scale", "Orient.", "Vel.", "Attr."};
const char* kTpUnits[kNumTpMetrics] = {"m", "1-IOU", "rad.", "m/s", "1-acc."};

std::string printf_str(const char* spec, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), spec, v);
  return buf;
}

// One axes box mapping data coordinates [0, xmax] x [0, ymax] to pixels.
class Chart {
 public:
  // right_margin > 0 leaves room for the legend beside the axes (dist_pr_curve's legend axis).
  Chart(double xmax, double ymax, int right_margin = 0)
      : right_(kRight + right_margin),
        width_(kWidth + right_margin),
        img_(kHeight, width_, CV_8UC3, cv::Scalar(255, 255, 255)),
        xmax_(xmax),
        ymax_(ymax) {}

  cv::Point px(double x, double y) const {
    const double fx = x / xmax_, fy = y / ymax_;
    return {kLeft + static_cast<int>(std::lround(fx * (kWidth - kLeft - kRight))),
            kHeight - kBottom - static_cast<int>(std::lround(fy * (kHeight - kTop - kBottom)))};
  }

  void axes(const std::string& title, const std::string& xlabel, const std::string& ylabel) {
    for (int k = 0; k <= 5; ++k) {
      const double x = xmax_ * k / 5, y = ymax_ * k / 5;
      cv::line(img_, px(x, 0), px(x, ymax_), kLightGrey, 1);
      cv::line(img_, px(0, y), px(xmax_, y), kLightGrey, 1);
      text(printf_str(xmax_ >= 10 ? "%.0f" : "%.1f", x), px(x, 0) + cv::Point(-12, 26), 0.5);
      text(printf_str(ymax_ >= 10 ? "%.0f" : "%.2f", y), px(0, y) + cv::Point(-52, 5), 0.5);
    }
    cv::rectangle(img_, px(0, ymax_), px(xmax_, 0), kGrey, 1);
    text(title, {(kLeft + kWidth - kRight) / 2 - 8 * static_cast<int>(title.size()), 38}, 0.9, 2);
    text(xlabel, {(kLeft + kWidth - kRight) / 2 - 4 * static_cast<int>(xlabel.size()), kHeight - 22}, 0.6);
    cv::Mat label(30, 10 * static_cast<int>(ylabel.size()) + 10, CV_8UC3, cv::Scalar(255, 255, 255));
    cv::putText(label, ylabel, {2, 22}, cv::FONT_HERSHEY_SIMPLEX, 0.6, kBlack, 1, cv::LINE_AA);
    cv::Mat rotated;
    cv::rotate(label, rotated, cv::ROTATE_90_COUNTERCLOCKWISE);
    const int y0 = std::max(0, (kHeight - rotated.rows) / 2);
    if (y0 + rotated.rows <= kHeight) rotated.copyTo(img_(cv::Rect(8, y0, rotated.cols, rotated.rows)));
  }

  void curve(const std::vector<double>& xs, const std::vector<double>& ys, const cv::Scalar& color) {
    std::vector<cv::Point> pts;
    for (size_t i = 0; i < xs.size(); ++i) {
      if (std::isfinite(xs[i]) && std::isfinite(ys[i])) pts.push_back(px(xs[i], std::min(ys[i], ymax_)));
    }
    if (pts.size() >= 2) cv::polylines(img_, pts, false, color, 2, cv::LINE_AA);
  }

  // A dashed (dash_dot: dash-dot) vertical or horizontal line across the box.
  void dashed(bool vertical, double at, bool dash_dot = false) {
    const cv::Point a = vertical ? px(at, 0) : px(0, at), b = vertical ? px(at, ymax_) : px(xmax_, at);
    const double len = std::hypot(b.x - a.x, b.y - a.y);
    const int period = dash_dot ? 16 : 12;
    for (int s = 0; s < len; s += period) {
      const double t0 = s / len, t1 = std::min(1.0, (s + 7) / len);
      cv::line(img_, a + (b - a) * t0, a + (b - a) * t1, kGrey, 1, cv::LINE_AA);
      if (dash_dot && s + 11 < len) cv::circle(img_, a + (b - a) * ((s + 11) / len), 1, kGrey, -1);
    }
  }

  void legend(const std::vector<std::pair<std::string, cv::Scalar>>& entries) {
    size_t longest = 0;
    for (const auto& e : entries) longest = std::max(longest, e.first.size());
    const int w = 40 + 9 * static_cast<int>(longest), h = 24 * static_cast<int>(entries.size()) + 8;
    const cv::Point origin =
        right_ > kRight ? px(xmax_, ymax_) + cv::Point(24, 0) : px(xmax_, ymax_) + cv::Point(-w - 8, 8);
    cv::rectangle(img_, origin, origin + cv::Point(w, h), cv::Scalar(255, 255, 255), -1);
    cv::rectangle(img_, origin, origin + cv::Point(w, h), kGrey, 1);
    for (size_t i = 0; i < entries.size(); ++i) {
      const cv::Point row = origin + cv::Point(8, 20 + 24 * static_cast<int>(i));
      cv::line(img_, row + cv::Point(0, -5), row + cv::Point(22, -5), entries[i].second, 2, cv::LINE_AA);
      text(entries[i].first, row + cv::Point(28, 0), 0.5);
    }
  }

  void save(const std::string& path) const {
    bool ok = false;
    try {
      ok = cv::imwrite(path, img_);
    } catch (const cv::Exception& e) {
      throw Error(ErrorKind::kIo, std::string("cannot write the PNG: ") + e.what()).where(path);
    }
    if (!ok) throw Error(ErrorKind::kIo, "cannot write the PNG").where(path);
  }

 private:
  void text(const std::string& s, cv::Point at, double scale, int thickness = 1) {
    cv::putText(img_, s, at, cv::FONT_HERSHEY_SIMPLEX, scale, kBlack, thickness, cv::LINE_AA);
  }

  static constexpr int kWidth = 900, kHeight = 650, kLeft = 90, kRight = 30, kTop = 60, kBottom = 70;
  int right_, width_;
  cv::Mat img_;
  double xmax_, ymax_;
};

std::vector<double> vec(const Curve& c, size_t n = kCurvePoints) { return {c.begin(), c.begin() + static_cast<long>(n)}; }

}  // namespace

std::vector<std::string> render_curves(const Evaluation& e, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(ErrorKind::kIo, "cannot create the folder: " + ec.message()).where(dir);
  const DetectionMetrics& m = e.metrics;
  const DetectionConfig& cfg = m.cfg;
  const size_t min_recall_ind = static_cast<size_t>(std::nearbyint(100 * cfg.min_recall));
  std::vector<std::string> written;
  for (size_t ci = 0; ci < cfg.classes.size(); ++ci) {
    const int c = cfg.classes[ci];
    const std::string name(detection_names()[static_cast<size_t>(c)]);
    // class_pr_curve
    Chart pr(1, 1);
    pr.axes(pretty_class(name), "Recall", "Precision");
    pr.dashed(true, cfg.min_recall);
    pr.dashed(false, cfg.min_precision);
    std::vector<std::pair<std::string, cv::Scalar>> entries;
    for (size_t t = 0; t < cfg.dist_ths.size(); ++t) {
      const MetricData& md = e.data(ci, t);
      pr.curve(vec(md.recall), vec(md.precision), kColors[t % 10]);
      entries.emplace_back("Dist. : " + cfg.dist_th_keys[t] + ", AP: " +
                               printf_str("%.1f", m.label_aps[static_cast<size_t>(c)][t] * 100),
                           kColors[t % 10]);
    }
    pr.legend(entries);
    written.push_back(dir + "/" + name + "_pr.png");
    pr.save(written.back());

    // class_tp_curve
    const MetricData& md = e.data(ci, cfg.dist_th_tp_index);
    const size_t max_ind = md.max_recall_ind();
    const auto& errors = m.label_tp_errors[static_cast<size_t>(c)];
    double ylimit = 1.0;
    if (min_recall_ind <= max_ind) {
      ylimit = 0;
      for (size_t k = 0; k < kNumTpMetrics; ++k) {
        if (std::isnan(errors[k])) continue;
        for (size_t i = min_recall_ind; i <= max_ind; ++i) ylimit = std::max(ylimit, md.tp[k][i]);
      }
      ylimit *= 1.1;
      if (!(ylimit > 0)) ylimit = 1.0;
    }
    Chart tp(1, ylimit);
    tp.axes(pretty_class(name), "Recall", "Error");
    tp.dashed(true, cfg.min_recall);
    entries.clear();
    for (size_t k = 0; k < kNumTpMetrics; ++k) {
      std::string label = kPrettyTp[k];
      if (std::isnan(errors[k])) {
        label += ": n/a";
      } else if (min_recall_ind > max_ind) {
        label += ": nan";
      } else {
        label += ": " + printf_str("%.2f", errors[k]) + " (" + kTpUnits[k] + ")";
        tp.curve(vec(md.recall, max_ind + 1), vec(md.tp[k], max_ind + 1), kColors[k]);
      }
      entries.emplace_back(label, kColors[k]);
    }
    tp.dashed(true, md.recall[max_ind], true);
    tp.legend(entries);
    written.push_back(dir + "/" + name + "_tp.png");
    tp.save(written.back());
  }
  // dist_pr_curve
  for (size_t t = 0; t < cfg.dist_ths.size(); ++t) {
    Chart pr(1, 1, 230);
    pr.axes("Distance threshold " + cfg.dist_th_keys[t] + " m", "Recall", "Precision");
    pr.dashed(true, cfg.min_recall);
    pr.dashed(false, cfg.min_precision);
    std::vector<std::pair<std::string, cv::Scalar>> entries;
    for (size_t ci = 0; ci < cfg.classes.size(); ++ci) {
      const int c = cfg.classes[ci];
      const cv::Scalar color = kColors[static_cast<size_t>(c)];
      pr.curve(vec(e.data(ci, t).recall), vec(e.data(ci, t).precision), color);
      entries.emplace_back(std::string(pretty_class(detection_names()[static_cast<size_t>(c)])) + ": " +
                               printf_str("%.1f", m.label_aps[static_cast<size_t>(c)][t] * 100) + "%",
                           color);
    }
    pr.legend(entries);
    written.push_back(dir + "/dist_pr_" + cfg.dist_th_keys[t] + ".png");
    pr.save(written.back());
  }
  return written;
}

}  // namespace bev::eval
