// Small float64 matrix helpers for the frame geometry: row-major 3x3 and 4x4 as std::array
// (poses, intrinsics, lidar2img). Header-only; nothing here knows JSON or the model.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <utility>

namespace bev {

using Mat3 = std::array<double, 9>;   // row-major 3x3
using Mat4 = std::array<double, 16>;  // row-major 4x4

inline Mat4 mat4_identity() { return {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}; }

// a @ b; each element summed in k order from 0 (as numpy's 4x4 matmul).
inline Mat4 mat4_mul(const Mat4& a, const Mat4& b) {
  Mat4 c{};
  for (int r = 0; r < 4; ++r) {
    for (int k = 0; k < 4; ++k) {
      for (int col = 0; col < 4; ++col) c[r * 4 + col] += a[r * 4 + k] * b[k * 4 + col];
    }
  }
  return c;
}

// General inverse (Gauss-Jordan, partial pivoting), as numpy.linalg.inv; nullopt when singular.
inline std::optional<Mat4> mat4_inverse(const Mat4& m) {
  double a[4][8];
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 4; ++c) {
      a[r][c] = m[r * 4 + c];
      a[r][c + 4] = r == c ? 1 : 0;
    }
  }
  for (int col = 0; col < 4; ++col) {
    int piv = col;
    for (int r = col + 1; r < 4; ++r) {
      if (std::abs(a[r][col]) > std::abs(a[piv][col])) piv = r;
    }
    if (a[piv][col] == 0 || !std::isfinite(a[piv][col])) return std::nullopt;
    if (piv != col) std::swap(a[piv], a[col]);
    const double inv = 1 / a[col][col];
    for (double& x : a[col]) x *= inv;
    for (int r = 0; r < 4; ++r) {
      if (r == col || a[r][col] == 0) continue;
      const double f = a[r][col];
      for (int c = 0; c < 8; ++c) a[r][c] -= f * a[col][c];
    }
  }
  Mat4 out{};
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 4; ++c) out[r * 4 + c] = a[r][c + 4];
  }
  return out;
}

// [K 0; 0 1].
inline Mat4 mat4_from_intrinsics(const Mat3& k) {
  return {k[0], k[1], k[2], 0, k[3], k[4], k[5], 0, k[6], k[7], k[8], 0, 0, 0, 0, 1};
}

// Largest |(RᵀR − I)_ij| of the top-left 3x3.
inline double rotation_orthogonality_error(const Mat4& t) {
  double worst = 0;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) {
      double s = 0;
      for (int k = 0; k < 3; ++k) s += t[k * 4 + i] * t[k * 4 + j];
      worst = std::max(worst, std::abs(s - (i == j ? 1.0 : 0.0)));
    }
  }
  return worst;
}

// The determinant of the top-left 3x3.
inline double rotation_determinant(const Mat4& t) {
  return t[0] * (t[5] * t[10] - t[6] * t[9]) - t[1] * (t[4] * t[10] - t[6] * t[8]) +
         t[2] * (t[4] * t[9] - t[5] * t[8]);
}

}  // namespace bev
