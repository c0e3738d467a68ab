"""Exact Student t quantiles and the paired interval (rllib_r3l.stats), against printed table values."""

import math

import pytest

from rllib_r3l.stats import betainc, paired_interval, t_cdf, t_quantile


@pytest.mark.parametrize(
    "df, q", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (30, 2.0423), (31, 2.0395), (120, 1.9799)]
)
def test_t_quantiles_match_the_table(df, q):
    assert t_quantile(0.975, df) == pytest.approx(q, abs=1e-4)
    assert t_quantile(0.025, df) == pytest.approx(-q, abs=1e-4)  # symmetric


def test_cdf_and_beta_hand_values():
    assert t_cdf(0.0, 5) == pytest.approx(0.5)
    assert t_cdf(1.0, 1) == pytest.approx(0.75)  # Cauchy: 1/2 + atan(1)/pi
    assert betainc(1.0, 1.0, 0.3) == pytest.approx(0.3)  # uniform
    assert betainc(2.0, 3.0, 0.5) == pytest.approx(0.6875)  # 11/16 by hand
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)


def test_paired_interval_by_hand():
    # differences 1, 0, 1, 1, 0: mean 0.6, sd sqrt(0.3), t(0.975, 4) = 2.7764
    out = paired_interval([1, 0, 1, 1, 0])
    half = 2.776445 * math.sqrt(0.3) / math.sqrt(5)
    assert out["n"] == 5 and out["mean"] == pytest.approx(0.6)
    assert out["low"] == pytest.approx(0.6 - half, abs=1e-5) and out["high"] == pytest.approx(0.6 + half, abs=1e-5)
    assert math.isnan(paired_interval([1.0])["low"]) and paired_interval([])["n"] == 0
