"""Small numeric helpers (numpy only)."""

from __future__ import annotations

import numpy as np


def norm_ppf(p):
    """Inverse standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9)."""
    p = np.clip(np.asarray(p, dtype=float), 1e-12, 1 - 1e-12)
    a = [
        -3.969683028665376e01,
        2.209460984245205e02,
        -2.759285104469687e02,
        1.383577518672690e02,
        -3.066479806614716e01,
        2.506628277459239e00,
    ]
    b = [
        -5.447609879822406e01,
        1.615858368580409e02,
        -1.556989798598866e02,
        6.680131188771972e01,
        -1.328068155288572e01,
    ]
    c = [
        -7.784894002430293e-03,
        -3.223964580411365e-01,
        -2.400758277161838e00,
        -2.549732539343734e00,
        4.374664141464968e00,
        2.938163982698783e00,
    ]
    d = [7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00]
    q = np.where(p < 0.5, p, 1 - p)
    t = np.sqrt(-2 * np.log(q))
    tail = (((((c[0] * t + c[1]) * t + c[2]) * t + c[3]) * t + c[4]) * t + c[5]) / (
        (((d[0] * t + d[1]) * t + d[2]) * t + d[3]) * t + 1
    )
    r = p - 0.5
    s = r * r
    mid = (
        (((((a[0] * s + a[1]) * s + a[2]) * s + a[3]) * s + a[4]) * s + a[5])
        * r
        / (((((b[0] * s + b[1]) * s + b[2]) * s + b[3]) * s + b[4]) * s + 1)
    )
    low = np.where(p < 0.5, tail, -tail)  # tail is negative: the lower region's value
    return np.where(np.abs(r) <= 0.425, mid, low)


def expected_max_z(n):
    """E[max of n standard normals] (Blom's approximation); 0 for n = 1."""
    n = np.maximum(np.asarray(n, dtype=float), 1.0)
    return np.where(n <= 1, 0.0, norm_ppf((n - 0.375) / (n + 0.25)))
