#include "render/render.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numbers>

#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include "bevformer/error.h"
#include "io/image.h"

namespace bev {

// ---------------------------------------------------------------------------------------------
// Geometry

const std::array<std::array<int, 2>, 12> kBoxEdges = {{{0, 1}, {1, 2}, {2, 3}, {3, 0},  // bottom
                                                       {4, 5}, {5, 6}, {6, 7}, {7, 4},  // top
                                                       {0, 4}, {1, 5}, {2, 6}, {3, 7}}};

std::array<std::array<double, 3>, 8> box_corners(const Box9& box) {
  const double x = box[0], y = box[1], z = box[2], w = box[3], l = box[4], h = box[5];
  const double heading = box_heading(box);
  const double fx = std::cos(heading), fy = std::sin(heading);  // forward (length)
  const double lx = -fy, ly = fx;                              // left (width)
  // (forward sign, left sign) of corners 0..3: front-left, front-right, back-right, back-left.
  constexpr int kSigns[4][2] = {{1, 1}, {1, -1}, {-1, -1}, {-1, 1}};
  std::array<std::array<double, 3>, 8> c{};
  for (size_t i = 0; i < 4; ++i) {
    const double a = 0.5 * l * kSigns[i][0], b = 0.5 * w * kSigns[i][1];
    c[i] = {x + a * fx + b * lx, y + a * fy + b * ly, z};
    c[i + 4] = {c[i][0], c[i][1], z + h};
  }
  return c;
}

namespace {

std::array<double, 3> homogeneous(const std::array<double, 16>& m, const std::array<double, 3>& p) {
  return {m[0] * p[0] + m[1] * p[1] + m[2] * p[2] + m[3], m[4] * p[0] + m[5] * p[1] + m[6] * p[2] + m[7],
          m[8] * p[0] + m[9] * p[1] + m[10] * p[2] + m[11]};
}

bool inside(double u, double v, int width, int height) { return u >= 0 && v >= 0 && u < width && v < height; }

}  // namespace

ProjectedBox project_box_corners(const Box9& box, const std::array<double, 16>& lidar2img, int width, int height) {
  ProjectedBox out;
  const auto corners = box_corners(box);
  for (size_t i = 0; i < 8; ++i) {
    const auto p = homogeneous(lidar2img, corners[i]);
    out.depth[i] = p[2];
    if (p[2] > kMinDepth) {
      out.uv[i] = {p[0] / p[2], p[1] / p[2]};
      out.visible[i] = inside(out.uv[i][0], out.uv[i][1], width, height);
    }
    out.num_visible += out.visible[i] ? 1 : 0;
  }
  const auto p = homogeneous(lidar2img, box_gravity_center(box));
  out.center_depth = p[2];
  if (p[2] > kMinDepth) {
    out.center_uv = {p[0] / p[2], p[1] / p[2]};
    out.center_visible = inside(out.center_uv[0], out.center_uv[1], width, height);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Drawing

namespace {

constexpr int kFont = cv::FONT_HERSHEY_SIMPLEX;
constexpr int kTitleHeight = 64;
constexpr int kLegendRowHeight = 30;
constexpr double kLegendFontScale = 0.55;
const cv::Scalar kGroundTruthColour(255, 255, 255);

// BGR per nuScenes class (readable on photos and on the dark BEV panel); other names by label.
cv::Scalar class_colour(const std::string& name, int label) {
  struct Entry {
    const char* name;
    cv::Scalar bgr;
  };
  static const Entry kColours[] = {
      {"car", {0, 158, 255}},          {"truck", {0, 230, 255}},     {"construction_vehicle", {40, 110, 170}},
      {"bus", {230, 50, 240}},         {"trailer", {180, 30, 145}},  {"barrier", {170, 170, 170}},
      {"motorcycle", {75, 25, 230}},   {"bicycle", {212, 190, 250}}, {"pedestrian", {255, 144, 30}},
      {"traffic_cone", {75, 180, 60}},
  };
  for (const Entry& e : kColours) {
    if (name == e.name) return e.bgr;
  }
  const size_t n = std::size(kColours);
  return kColours[static_cast<size_t>(std::max(label, 0)) % n].bgr;
}

std::string class_name(const std::vector<std::string>& names, int label) {
  if (label >= 0 && static_cast<size_t>(label) < names.size()) return names[static_cast<size_t>(label)];
  return "label " + std::to_string(label);
}

void check_image(const Tensor& image, const std::string& what) {
  if (!image.defined() || image.device() != Device::kCpu || image.dtype() != DType::kU8 || image.dim() != 3 ||
      image.size(2) != 3 || image.size(0) < 1 || image.size(1) < 1) {
    throw Error(ErrorKind::kInvalidInput, what + " is " + (image.defined() ? image.describe() : "undefined"))
        .where("render")
        .expected("a host u8 [H, W, 3] BGR image");
  }
}

cv::Mat as_mat(const Tensor& image, const std::string& what) {
  check_image(image, what);
  const Tensor c = image.contiguous();
  // The Mat borrows c's storage only for the clone.
  return cv::Mat(static_cast<int>(c.size(0)), static_cast<int>(c.size(1)), CV_8UC3, c.raw_data()).clone();
}

Tensor to_tensor(const cv::Mat& m) {
  Tensor t = Tensor::empty({m.rows, m.cols, 3}, DType::kU8);
  cv::Mat dst(m.rows, m.cols, CV_8UC3, t.raw_data());
  m.copyTo(dst);
  return t;
}

// Liang-Barsky: clips the segment a-b to [0, w] x [0, h]; false when nothing is left.
bool clip_segment(std::array<double, 2>& a, std::array<double, 2>& b, double w, double h) {
  double t0 = 0, t1 = 1;
  const double dx = b[0] - a[0], dy = b[1] - a[1];
  const double p[4] = {-dx, dx, -dy, dy}, q[4] = {a[0], w - a[0], a[1], h - a[1]};
  for (int i = 0; i < 4; ++i) {
    if (p[i] == 0) {
      if (q[i] < 0) return false;
      continue;
    }
    const double t = q[i] / p[i];
    if (p[i] < 0) {
      t0 = std::max(t0, t);
    } else {
      t1 = std::min(t1, t);
    }
    if (t0 > t1) return false;
  }
  const std::array<double, 2> a0 = a;
  a = {a0[0] + t0 * dx, a0[1] + t0 * dy};
  b = {a0[0] + t1 * dx, a0[1] + t1 * dy};
  return true;
}

cv::Point to_point(const std::array<double, 2>& p) {
  return {static_cast<int>(std::lround(p[0])), static_cast<int>(std::lround(p[1]))};
}

struct Pen {
  cv::Scalar colour;
  int thickness = 2;
  bool dashed = false;
};

// A segment already in pixel coordinates: clipped to the image, solid or dashed.
void draw_segment(cv::Mat& img, std::array<double, 2> a, std::array<double, 2> b, const Pen& pen) {
  if (!clip_segment(a, b, img.cols - 1, img.rows - 1)) return;
  if (!pen.dashed) {
    cv::line(img, to_point(a), to_point(b), pen.colour, pen.thickness, cv::LINE_AA);
    return;
  }
  constexpr double kDash = 8, kGap = 6;
  const double len = std::hypot(b[0] - a[0], b[1] - a[1]);
  if (len < 1e-9) return;
  for (double s = 0; s < len; s += kDash + kGap) {
    const double e = std::min(s + kDash, len);
    const std::array<double, 2> p = {a[0] + (b[0] - a[0]) * s / len, a[1] + (b[1] - a[1]) * s / len};
    const std::array<double, 2> q = {a[0] + (b[0] - a[0]) * e / len, a[1] + (b[1] - a[1]) * e / len};
    cv::line(img, to_point(p), to_point(q), pen.colour, pen.thickness, cv::LINE_AA);
  }
}

// A 3D segment through lidar2img, cut at the near plane (depth kMinDepth) so that an edge reaching
// behind the camera still shows its part in front.
void draw_3d_segment(cv::Mat& img, const std::array<double, 16>& lidar2img, const std::array<double, 3>& p0,
                     const std::array<double, 3>& p1, const Pen& pen) {
  std::array<double, 3> a = homogeneous(lidar2img, p0), b = homogeneous(lidar2img, p1);
  if (a[2] <= kMinDepth && b[2] <= kMinDepth) return;
  if (a[2] <= kMinDepth || b[2] <= kMinDepth) {
    const double t = (kMinDepth - a[2]) / (b[2] - a[2]);
    const std::array<double, 3> m = {a[0] + t * (b[0] - a[0]), a[1] + t * (b[1] - a[1]), kMinDepth};
    (a[2] <= kMinDepth ? a : b) = m;
  }
  draw_segment(img, {a[0] / a[2], a[1] / a[2]}, {b[0] / b[2], b[1] / b[2]}, pen);
}

void draw_box_in_camera(cv::Mat& img, const std::array<double, 16>& lidar2img, const Box9& box, const Pen& pen) {
  const auto c = box_corners(box);
  for (const auto& e : kBoxEdges) {
    draw_3d_segment(img, lidar2img, c[static_cast<size_t>(e[0])], c[static_cast<size_t>(e[1])], pen);
  }
  // The front face {0, 1, 5, 4}: a cross.
  Pen thin = pen;
  thin.thickness = std::max(1, pen.thickness - 1);
  draw_3d_segment(img, lidar2img, c[0], c[5], thin);
  draw_3d_segment(img, lidar2img, c[1], c[4], thin);
}

void put_text(cv::Mat& img, const std::string& text, cv::Point at, double scale, const cv::Scalar& colour,
              int thickness = 1) {
  cv::putText(img, text, at, kFont, scale, colour, thickness, cv::LINE_AA);
}

void put_label(cv::Mat& img, const std::string& text, cv::Point at) {  // white on a dark box
  int base = 0;
  const cv::Size s = cv::getTextSize(text, kFont, 0.6, 1, &base);
  cv::rectangle(img, cv::Rect(at.x, at.y, s.width + 10, s.height + base + 8), cv::Scalar(0, 0, 0), cv::FILLED);
  put_text(img, text, {at.x + 5, at.y + s.height + 4}, 0.6, cv::Scalar(255, 255, 255));
}

// ----- layout

const char* const kNuscTiles[6] = {"FRONT_LEFT", "FRONT", "FRONT_RIGHT", "BACK_LEFT", "BACK", "BACK_RIGHT"};
const char* const kNuscSlots[6] = {"FRONT", "FRONT_RIGHT", "FRONT_LEFT", "BACK", "BACK_LEFT", "BACK_RIGHT"};

int nusc_tile_of_name(std::string name) {
  if (name.rfind("CAM_", 0) == 0) name = name.substr(4);
  for (int t = 0; t < 6; ++t) {
    if (name == kNuscTiles[t]) return t;
  }
  return -1;
}

int nusc_tile_of_slot(size_t slot) {
  for (int t = 0; t < 6; ++t) {
    if (std::string(kNuscTiles[t]) == kNuscSlots[slot]) return t;
  }
  return -1;
}

struct LegendEntry {
  std::string text;
  cv::Scalar colour;
  bool dashed = false;
};

struct Layout {
  int tile_w = 0, tile_h = 0, cols = 0, rows = 0;
  std::vector<int> tile_of_camera;  // tile index (row-major) of each camera
  int bev_side = 0;
  int width = 0, height = 0;
  int legend_y = 0;
  std::vector<LegendEntry> legend;
  std::vector<cv::Point> legend_at;
};

Layout compute_layout(const RenderInput& in) {
  Layout L;
  const size_t n = in.cameras.size();
  if (in.tile_width < 16) {
    throw Error(ErrorKind::kInvalidInput, "tile_width " + std::to_string(in.tile_width) + " is too small")
        .where("render")
        .expected("at least 16 pixels");
  }
  if (n > 0) {
    const Tensor& first = in.cameras[0].image;
    check_image(first, "camera 0's image");
    L.tile_w = in.tile_width;
    L.tile_h = std::max(1, static_cast<int>(std::lround(static_cast<double>(in.tile_width) *
                                                        static_cast<double>(first.size(0)) /
                                                        static_cast<double>(first.size(1)))));
    L.cols = static_cast<int>(std::min<size_t>(n, 3));
    L.rows = static_cast<int>((n + 2) / 3);
    L.tile_of_camera.resize(n);
    // nuScenes layout by name, else by slot when there are six, else input order.
    bool by_name = n == 6, by_slot = n == 6;
    std::vector<int> from_name(n);
    for (size_t i = 0; i < n; ++i) from_name[i] = nusc_tile_of_name(in.cameras[i].name);
    for (size_t i = 0; i < n && by_name; ++i) {
      by_name = from_name[i] >= 0 && std::count(from_name.begin(), from_name.end(), from_name[i]) == 1;
    }
    for (size_t i = 0; i < n; ++i) {
      L.tile_of_camera[i] = by_name ? from_name[i] : by_slot ? nusc_tile_of_slot(i) : static_cast<int>(i);
    }
    L.bev_side = L.rows * L.tile_h;
  } else {
    L.bev_side = 720;
  }
  const int mosaic_w = L.cols * L.tile_w;
  L.width = mosaic_w + L.bev_side;
  const int body_h = std::max(L.rows * L.tile_h, L.bev_side);

  // Legend: every class, then ground truth; wrapped to the width.
  for (size_t c = 0; c < in.class_names.size(); ++c) {
    L.legend.push_back({in.class_names[c], class_colour(in.class_names[c], static_cast<int>(c)), false});
  }
  L.legend.push_back({"ground truth", kGroundTruthColour, true});
  int x = 10, row = 0;
  for (const LegendEntry& e : L.legend) {
    int base = 0;
    const int w = 34 + cv::getTextSize(e.text, kFont, kLegendFontScale, 1, &base).width + 18;
    if (x + w > L.width && x > 10) {
      x = 10;
      ++row;
    }
    L.legend_at.emplace_back(x, row);
    x += w;
  }
  L.legend_y = kTitleHeight + body_h;
  L.height = L.legend_y + (row + 1) * kLegendRowHeight + 6;
  return L;
}

// ----- BEV panel

struct BevMap {
  double x_min, y_max, sx, sy;
  cv::Point2d px(double x, double y) const { return {(x - x_min) * sx, (y_max - y) * sy}; }
  std::array<double, 2> pa(double x, double y) const { return {(x - x_min) * sx, (y_max - y) * sy}; }
};

void draw_box_in_bev(cv::Mat& panel, const BevMap& m, const Box9& box, const Pen& pen) {
  const auto c = box_corners(box);
  for (size_t i = 0; i < 4; ++i) {
    const auto& a = c[i];
    const auto& b = c[(i + 1) % 4];
    Pen p = pen;
    if (i == 0) p.thickness = pen.thickness + 1;  // the front edge
    draw_segment(panel, m.pa(a[0], a[1]), m.pa(b[0], b[1]), p);
  }
  // Heading tick: centre to the front edge's midpoint.
  const double fx = 0.5 * (c[0][0] + c[1][0]), fy = 0.5 * (c[0][1] + c[1][1]);
  Pen solid = pen;
  solid.dashed = false;
  solid.thickness = 1;
  draw_segment(panel, m.pa(box[0], box[1]), m.pa(fx, fy), solid);
}

cv::Mat draw_bev(const RenderInput& in, int side, const std::vector<const Detection*>& drawn) {
  cv::Mat panel(side, side, CV_8UC3, cv::Scalar(28, 28, 28));
  const auto& r = in.bev_range;
  if (!(r[2] > r[0] && r[3] > r[1])) {
    throw Error(ErrorKind::kInvalidInput, "empty BEV range").where("render").expected("x_min < x_max, y_min < y_max");
  }
  const BevMap m{r[0], r[3], side / static_cast<double>(r[2] - r[0]), side / static_cast<double>(r[3] - r[1])};
  const cv::Scalar grid(55, 55, 55), ring(90, 90, 90);
  // Grid every 10 m, range rings every 10 m up to the range, labelled.
  for (double g = std::ceil(r[0] / 10) * 10; g <= r[2]; g += 10) {
    cv::line(panel, m.px(g, r[1]), m.px(g, r[3]), grid, 1);
  }
  for (double g = std::ceil(r[1] / 10) * 10; g <= r[3]; g += 10) {
    cv::line(panel, m.px(r[0], g), m.px(r[2], g), grid, 1);
  }
  const double max_r = std::max({std::abs(r[0]), std::abs(r[1]), std::abs(r[2]), std::abs(r[3])});
  for (double rr = 10; rr <= max_r; rr += 10) {
    const cv::Point2d c = m.px(0, 0);
    cv::ellipse(panel, c, cv::Size2d(rr * m.sx, rr * m.sy), 0, 0, 360, ring, 1, cv::LINE_AA);
    const cv::Point2d t = m.px(rr * 0.7071, rr * 0.7071);
    put_text(panel, std::to_string(static_cast<int>(rr)) + " m", {static_cast<int>(t.x) + 3, static_cast<int>(t.y) - 3},
             0.4, ring);
  }
  // The ego car at the origin, pointing +y (forward), about 1.8 m x 4.4 m.
  {
    const cv::Point2d a = m.px(-0.9, 2.2), b = m.px(0.9, -2.2);
    cv::rectangle(panel, cv::Rect(cv::Point(static_cast<int>(a.x), static_cast<int>(a.y)),
                                  cv::Point(static_cast<int>(b.x), static_cast<int>(b.y))),
                  cv::Scalar(120, 200, 120), cv::FILLED);
    const cv::Point nose[3] = {m.px(-0.9, 2.2), m.px(0.9, 2.2), m.px(0, 3.4)};
    cv::fillConvexPoly(panel, nose, 3, cv::Scalar(120, 200, 120), cv::LINE_AA);
  }
  for (const Detection& g : in.ground_truth) draw_box_in_bev(panel, m, g.box, {kGroundTruthColour, 1, true});
  for (const Detection* d : drawn) {
    draw_box_in_bev(panel, m, d->box, {class_colour(class_name(in.class_names, d->label), d->label), 2, false});
  }
  put_label(panel, "BEV (LiDAR frame): x right, y forward", {4, 4});
  return panel;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

}  // namespace

RenderSize render_size(const RenderInput& input) {
  const Layout L = compute_layout(input);
  return {L.width, L.height};
}

Tensor render_frame(const RenderInput& in) {
  const Layout L = compute_layout(in);
  cv::Mat canvas(L.height, L.width, CV_8UC3, cv::Scalar(18, 18, 18));

  // Which detections are drawn: score >= threshold, or the top N when the weights are untrained.
  std::vector<const Detection*> drawn;
  for (const Detection& d : in.detections) drawn.push_back(&d);
  std::stable_sort(drawn.begin(), drawn.end(), [](const Detection* a, const Detection* b) { return a->score > b->score; });
  if (in.untrained) {
    drawn.resize(std::min(drawn.size(), static_cast<size_t>(std::max(in.untrained_top_n, 0))));
  } else {
    std::erase_if(drawn, [&](const Detection* d) { return !(d->score >= in.score_threshold); });
  }
  std::reverse(drawn.begin(), drawn.end());  // the best drawn last, on top

  // Cameras.
  for (size_t i = 0; i < in.cameras.size(); ++i) {
    const CameraView& cam = in.cameras[i];
    const cv::Mat src = as_mat(cam.image, cam.name.empty() ? "camera " + std::to_string(i) : cam.name);
    cv::Mat tile;
    cv::resize(src, tile, cv::Size(L.tile_w, L.tile_h), 0, 0, cv::INTER_AREA);
    std::array<double, 16> m = cam.lidar2img;  // rescaled to the tile: diag(sx, sy, 1, 1) @ lidar2img
    const double sx = static_cast<double>(L.tile_w) / src.cols, sy = static_cast<double>(L.tile_h) / src.rows;
    for (size_t k = 0; k < 4; ++k) {
      m[k] *= sx;
      m[4 + k] *= sy;
    }
    for (const Detection& g : in.ground_truth) draw_box_in_camera(tile, m, g.box, {kGroundTruthColour, 1, true});
    for (const Detection* d : drawn) {
      draw_box_in_camera(tile, m, d->box, {class_colour(class_name(in.class_names, d->label), d->label), 2, false});
    }
    put_label(tile, cam.name.empty() ? "camera " + std::to_string(i) : cam.name, {4, 4});
    const int t = L.tile_of_camera[i];
    tile.copyTo(canvas(cv::Rect((t % L.cols) * L.tile_w, kTitleHeight + (t / L.cols) * L.tile_h, L.tile_w, L.tile_h)));
  }
  // BEV panel.
  draw_bev(in, L.bev_side, drawn).copyTo(canvas(cv::Rect(L.cols * L.tile_w, kTitleHeight, L.bev_side, L.bev_side)));

  // Title.
  std::string line1 = "bevformer.cpp";
  if (!in.model.empty()) line1 += "   model " + in.model;
  if (!in.stream.empty()) line1 += "   stream " + in.stream;
  line1 += "   frame " + std::to_string(in.frame_index) + "   t = " + fixed(in.timestamp, 6) + " s";
  if (in.used_history) line1 += *in.used_history ? "   history used" : "   no history (first frame)";
  put_text(canvas, line1, {10, 26}, 0.7, cv::Scalar(235, 235, 235));
  std::string line2 = std::to_string(in.detections.size()) + " detections, " + std::to_string(drawn.size()) + " drawn ";
  line2 += in.untrained ? "(the top " + std::to_string(std::max(in.untrained_top_n, 0)) + " by score)"
                        : "(score >= " + fixed(in.score_threshold, 2) + ")";
  if (!in.ground_truth.empty()) line2 += ";  " + std::to_string(in.ground_truth.size()) + " ground-truth boxes (dashed)";
  if (in.untrained) {
    const std::string warn = "UNTRAINED WEIGHTS - boxes are meaningless.  ";
    put_text(canvas, warn, {10, 54}, 0.65, cv::Scalar(60, 60, 255), 2);
    int base = 0;
    const int w = cv::getTextSize(warn, kFont, 0.65, 2, &base).width;
    put_text(canvas, line2, {10 + w, 54}, 0.6, cv::Scalar(200, 200, 200));
  } else {
    put_text(canvas, line2, {10, 54}, 0.6, cv::Scalar(200, 200, 200));
  }

  // Legend.
  for (size_t k = 0; k < L.legend.size(); ++k) {
    const LegendEntry& e = L.legend[k];
    const int x = L.legend_at[k].x, y = L.legend_y + L.legend_at[k].y * kLegendRowHeight + kLegendRowHeight / 2 + 3;
    draw_segment(canvas, {static_cast<double>(x), static_cast<double>(y)}, {static_cast<double>(x + 26), static_cast<double>(y)},
                 {e.colour, 3, e.dashed});
    put_text(canvas, e.text, {x + 34, y + 6}, kLegendFontScale, cv::Scalar(230, 230, 230));
  }
  return to_tensor(canvas);
}

std::vector<uint8_t> render_frame_png(const RenderInput& input) { return encode_image(render_frame(input), ".png"); }

std::string picture_format(const std::string& path) {
  const size_t dot = path.rfind('.'), slash = path.rfind('/');
  std::string ext = dot == std::string::npos || (slash != std::string::npos && dot < slash) ? "" : path.substr(dot);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".png") return ".png";
  if (ext == ".jpg" || ext == ".jpeg") return ".jpg";
  throw Error(ErrorKind::kInvalidInput, ext.empty() ? "the picture's file name has no extension"
                                                    : "'" + ext + "' is not a picture format this writes")
      .where(path)
      .expected(".png (lossless) or .jpg / .jpeg (JPEG, quality 95)");
}

void render_frame_to_file(const RenderInput& input, const std::string& path) {
  const std::vector<uint8_t> bytes = encode_image(render_frame(input), picture_format(path));
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw Error(ErrorKind::kIo, "cannot write the picture").where(path);
}

}  // namespace bev
