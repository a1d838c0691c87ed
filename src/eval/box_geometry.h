// The devkit's per-box arithmetic (nuscenes/eval/common/utils.py, pyquaternion, points_in_box),
// written so that each result is the same double the devkit computes: the same operations in
// the same order, without FMA contraction (bev_eval builds with -ffp-contract=off), because the
// evaluation compares these values with strict thresholds.
#pragma once

#include <array>

#include "eval/eval_boxes.h"

namespace bev::eval {

using Quat = std::array<double, 4>;  // w, x, y, z
using Vec3 = std::array<double, 3>;

// pyquaternion's in-place normalisation before any rotation: only when |1 - |q|^2| >= 1e-14,
// and never for the zero quaternion.
Quat normalised(Quat q);
// Quaternion.rotation_matrix: Q(q) @ Qbar(q)^T of the normalised q, lower-right 3x3, row-major.
std::array<double, 9> rotation_matrix(const Quat& q);
// quaternion_yaw: atan2 of the rotated x axis' y and x: the heading of the box's x axis in the
// ground plane, exact under pitch and roll.
double quaternion_yaw(const Quat& q);
// angle_diff(x, y, period): (x - y + period/2) mod period - period/2 with a floor modulo (the
// sign of period, as Python's %), then shifted from (pi, 2pi] to (-pi, 0].
double angle_diff(double x, double y, double period);
// Python's float %: the result has the sign of the divisor.
double python_mod(double a, double b);

// center_distance: the xy distance of the centres.
double center_distance(const EvalBox& gt, const EvalBox& pred);
// velocity_l2: NaN when either velocity is unknown.
double velocity_l2(const EvalBox& gt, const EvalBox& pred);
// scale_iou: the IoU of the two boxes aligned and centred (1 - it is the scale error). Sizes
// must be > 0 (the devkit asserts it; accumulate() checks before calling).
double scale_iou(const EvalBox& gt, const EvalBox& pred);
// yaw_diff: |angle_diff(yaw_gt, yaw_pred, period)|.
double yaw_diff(const EvalBox& gt, const EvalBox& pred, double period);
// 1 - attr_acc: NaN when the GT has no attribute, else 0 when equal and 1 when not.
double attr_error(const EvalBox& gt, const EvalBox& pred);

// points_in_box for one point and a box of size [w, l, h]: inclusive bounds on all three axes
// (height counts), from the corners as nuScenes' Box.corners() computes them.
bool point_in_box(const Vec3& point, const Vec3& center, const Vec3& wlh, const Quat& rotation);

}  // namespace bev::eval
