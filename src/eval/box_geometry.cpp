#include "eval/box_geometry.h"

#include <cmath>
#include <limits>
#include <numbers>

#include "eval/detection_config.h"

namespace bev::eval {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Each sum below is a left-to-right chain in numpy's index order (np.dot of small arrays sums
// that way; checked against numpy 1.24's output, where any reordering changes the last bit).
double dot3(const Vec3& a, const Vec3& b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }

Vec3 mat_vec(const std::array<double, 9>& r, const Vec3& v) {
  return {r[0] * v[0] + r[1] * v[1] + r[2] * v[2], r[3] * v[0] + r[4] * v[1] + r[5] * v[2],
          r[6] * v[0] + r[7] * v[1] + r[8] * v[2]};
}

Vec3 add(const Vec3& a, const Vec3& b) { return {a[0] + b[0], a[1] + b[1], a[2] + b[2]}; }
Vec3 sub(const Vec3& a, const Vec3& b) { return {a[0] - b[0], a[1] - b[1], a[2] - b[2]}; }

}  // namespace

Quat normalised(Quat q) {
  const double sum_sq = q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3];
  if (std::abs(1.0 - sum_sq) < 1e-14) return q;
  const double n = std::sqrt(sum_sq);
  if (n > 0) {
    for (double& c : q) c = c / n;
  }
  return q;
}

std::array<double, 9> rotation_matrix(const Quat& q_in) {
  const Quat q = normalised(q_in);
  const double w = q[0], x = q[1], y = q[2], z = q[3];
  // Rows of pyquaternion's _q_matrix and _q_bar_matrix; product[i][j] = sum_k Q[i][k] * Qbar[j][k].
  const double qm[4][4] = {{w, -x, -y, -z}, {x, w, -z, y}, {y, z, w, -x}, {z, -y, x, w}};
  const double qb[4][4] = {{w, -x, -y, -z}, {x, w, z, -y}, {y, -z, w, x}, {z, y, -x, w}};
  std::array<double, 9> r{};
  for (int i = 1; i < 4; ++i) {
    for (int j = 1; j < 4; ++j) {
      r[static_cast<size_t>((i - 1) * 3 + (j - 1))] =
          qm[i][0] * qb[j][0] + qm[i][1] * qb[j][1] + qm[i][2] * qb[j][2] + qm[i][3] * qb[j][3];
    }
  }
  return r;
}

double quaternion_yaw(const Quat& q) {
  const Vec3 v = mat_vec(rotation_matrix(q), {1.0, 0.0, 0.0});
  return std::atan2(v[1], v[0]);
}

double python_mod(double a, double b) {
  double mod = std::fmod(a, b);
  if (mod != 0) {
    if ((b < 0) != (mod < 0)) mod += b;
  } else {
    mod = std::copysign(0.0, b);
  }
  return mod;
}

double angle_diff(double x, double y, double period) {
  double diff = python_mod(x - y + period / 2, period) - period / 2;
  if (diff > std::numbers::pi) diff = diff - 2 * std::numbers::pi;
  return diff;
}

double center_distance(const EvalBox& gt, const EvalBox& pred) {
  const double dx = pred.translation[0] - gt.translation[0];
  const double dy = pred.translation[1] - gt.translation[1];
  return std::sqrt(dx * dx + dy * dy);
}

double velocity_l2(const EvalBox& gt, const EvalBox& pred) {
  const double dx = pred.velocity[0] - gt.velocity[0];
  const double dy = pred.velocity[1] - gt.velocity[1];
  return std::sqrt(dx * dx + dy * dy);
}

double scale_iou(const EvalBox& gt, const EvalBox& pred) {
  const Vec3 m = {std::min(gt.size[0], pred.size[0]), std::min(gt.size[1], pred.size[1]),
                  std::min(gt.size[2], pred.size[2])};
  const double volume_gt = gt.size[0] * gt.size[1] * gt.size[2];
  const double volume_pred = pred.size[0] * pred.size[1] * pred.size[2];
  const double intersection = m[0] * m[1] * m[2];
  const double uni = volume_gt + volume_pred - intersection;
  return intersection / uni;
}

double yaw_diff(const EvalBox& gt, const EvalBox& pred, double period) {
  return std::abs(angle_diff(quaternion_yaw(gt.rotation), quaternion_yaw(pred.rotation), period));
}

double attr_error(const EvalBox& gt, const EvalBox& pred) {
  if (gt.attribute < 0) return kNaN;
  return 1.0 - (gt.attribute == pred.attribute ? 1.0 : 0.0);
}

bool point_in_box(const Vec3& point, const Vec3& center, const Vec3& wlh, const Quat& rotation) {
  const double w = wlh[0], l = wlh[1], h = wlh[2];
  const std::array<double, 9> r = rotation_matrix(rotation);
  // Box.corners(): corner 0 = (+l, +w, +h)/2, 4 = (-l, +w, +h)/2, 1 = (+l, -w, +h)/2, 3 = (+l, +w, -h)/2.
  const Vec3 p1 = add(mat_vec(r, {l / 2, w / 2, h / 2}), center);
  const Vec3 px = add(mat_vec(r, {-(l / 2), w / 2, h / 2}), center);
  const Vec3 py = add(mat_vec(r, {l / 2, -(w / 2), h / 2}), center);
  const Vec3 pz = add(mat_vec(r, {l / 2, w / 2, -(h / 2)}), center);
  const Vec3 i = sub(px, p1), j = sub(py, p1), k = sub(pz, p1);
  const Vec3 v = sub(point, p1);
  const double iv = dot3(i, v), jv = dot3(j, v), kv = dot3(k, v);
  return 0 <= iv && iv <= dot3(i, i) && 0 <= jv && jv <= dot3(j, j) && 0 <= kv && kv <= dot3(k, k);
}

}  // namespace bev::eval
