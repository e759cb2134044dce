"""Looped vs stacked at equal depth, fits per family of cells, fits that say when they fail (a parameter at
its bound), the logistic's fitted ceiling, and the time-to-solve threshold with its source."""

import math

import numpy as np
import pandas as pd
import pytest

from studyrunner.analysis import depth, fits, solve, stats
from studyrunner.analysis.data import from_frame
from studyrunner.analysis.fits import scaling
from studyrunner.analysis.summary import analyze

# (block_layers, loops) -> mean accuracy; looped cells beat stacked ones at equal D by 0.05
DESIGN = {(1, 1): 0.20, (1, 2): 0.30, (1, 4): 0.40, (2, 1): 0.25, (4, 1): 0.35, (2, 2): 0.40}
NOISE = (-0.01, 0.0, 0.012)  # per seed, shared by every cell: paired differences have no spread from it


def frame(design=DESIGN, seeds=(0, 1, 2), baselines: dict | None = None, skew: float = 0.003) -> pd.DataFrame:
    rows = []
    for (bl, loops), mean in design.items():
        for seed in seeds:
            rows.append(
                {
                    "trial_key": f"b{bl}l{loops}-s{seed}",
                    "cell_hash": f"b{bl}l{loops}",
                    "cell": f"{bl}x{loops}",
                    "seed": seed,
                    "status": "succeeded",
                    "task.name": "phop",
                    "task.params.alphabet": 4,
                    "model.params.block_layers": bl,
                    "model.params.loops": loops,
                    "baseline_of": (baselines or {}).get((bl, loops), ""),
                    "effective_depth": float(bl * loops),
                    # a cell-dependent seed effect, so paired differences have some spread
                    "eval_accuracy": mean + NOISE[seed % 3] + skew * seed * loops,
                }
            )
    return pd.DataFrame(rows)


def test_equal_depth_pairs_looped_with_stacked_at_the_same_depth():
    data = from_frame(frame())
    table = depth.equal_depth_comparisons(data)
    pairs = {(r.looped, r.other): r for r in table.itertuples()}
    # 1x2 vs 2x1 (D=2), 1x4 vs 4x1 and 2x2 vs 4x1 (D=4); never a pair at different D or two looped cells
    assert set(pairs) == {("1x2", "2x1"), ("1x4", "4x1"), ("2x2", "4x1")}
    row = pairs[("1x4", "4x1")]
    assert row.D == 4 and row.kind == "1⊗4 vs 4⊗1" and row.method == "paired t (3 seeds)"
    a = data.done[data.done.cell == "1x4"].set_index("seed").eval_accuracy
    b = data.done[data.done.cell == "4x1"].set_index("seed").eval_accuracy
    lo, hi = stats.t_interval(a - b)
    assert row.diff == pytest.approx(0.05 + 0.003 * 3, abs=1e-9)  # 0.05 plus the seed skew (mean seed 1 x 3 loops)
    assert (row.lo, row.hi) == pytest.approx((lo, hi)) and lo < row.diff < hi
    assert row.p_looped_better == 1.0


def test_equal_depth_falls_back_to_welch_without_shared_seeds_and_follows_baselines():
    df = frame(baselines={(4, 1): "iso_flop:b1l4"})
    df = df[~((df.cell == "4x1") & (df.seed == 0)) & ~((df.cell == "1x4") & (df.seed > 0))]  # one shared seed: none
    df = pd.concat([df, frame({(4, 1): 0.35}, seeds=(5, 6)).assign(baseline_of="iso_flop:b1l4")])
    data = from_frame(df)
    table = depth.equal_depth_comparisons(data)
    row = table[(table.looped == "1x4") & (table.other == "4x1")].iloc[0]
    assert row.kind == "1⊗4 vs 4⊗1, iso-flop"  # both structural and linked by baseline_of: one row
    assert row.method.startswith("Welch t (1 vs")
    assert math.isnan(row.lo)  # one looped seed: no Welch interval, said rather than invented
    df2 = frame()
    df2 = df2[~((df2.cell == "4x1") & (df2.seed == 0))]
    df2.loc[df2.cell == "4x1", "seed"] += 10  # no seeds shared with 1x4
    row2 = depth.equal_depth_comparisons(from_frame(df2)).query("looped == '1x4' and other == '4x1'").iloc[0]
    a = df2[df2.cell == "1x4"].eval_accuracy.to_numpy()
    b = df2[df2.cell == "4x1"].eval_accuracy.to_numpy()
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    from scipy import stats as sps

    half = sps.t.ppf(0.975, dof) * math.sqrt(va + vb)
    assert row2.method == "Welch t (3 vs 2 seeds)"
    assert (row2.lo, row2.hi) == pytest.approx((a.mean() - b.mean() - half, a.mean() - b.mean() + half))


def test_family_fits_separate_looped_lines_from_stacked_cells():
    # looped line: slope 0.1 per ln D; stacked cells: slope 0.05 per ln D
    design = {(1, 1): 0.2, (1, 2): 0.2 + 0.1 * math.log(2), (1, 4): 0.2 + 0.1 * math.log(4)}
    design |= {(2, 1): 0.2 + 0.05 * math.log(2), (4, 1): 0.2 + 0.05 * math.log(4)}
    a = analyze(from_frame(frame(design, skew=0.0)), with_claims=False)
    fam = a.families.set_index("family")
    assert set(fam.index) == {"looped", "stacked"}
    assert fam.loc["looped", "alpha"] == pytest.approx(0.1, abs=1e-9)
    assert fam.loc["stacked", "alpha"] == pytest.approx(0.05, abs=1e-9)
    assert fam.loc["looped", "ratio"] == pytest.approx(2.0, abs=1e-6)
    assert fam.loc["looped", "cells"] == 3 and fam.loc["stacked", "cells"] == 3  # 1x1 starts both lines
    assert fam.loc["looped", "ci"]  # the interval method is always named
    doc = a.to_dict()
    assert {r["family"] for r in doc["families"]} == {"looped", "stacked"} and len(doc["equal_depth"]) == 2


def test_logistic_fits_its_ceiling_and_flags_a_parameter_at_its_bound():
    depth = np.repeat([1, 2, 4, 8, 16], 3)
    plateau = np.repeat([0.15, 0.30, 0.42, 0.44, 0.44], 3) + np.tile([-0.005, 0, 0.005], 5)
    f = fits.fit(depth, plateau, "logistic")
    assert f.params["top"] == pytest.approx(0.44, abs=0.01) and not f.flags  # the plateau, not 1.0
    fixed = fits.fit(depth, plateau, "logistic", top=1.0)
    assert "top" not in fixed.params and fixed.rss > f.rss
    # a slow, straight rise under a fixed ceiling of 1: the midpoint runs off to its bound
    slow = 0.02 * np.log(depth) + 0.1 + np.tile([0, 0.003, -0.003], 5)
    flagged = fits.fit(depth, slow, "logistic", top=1.0)
    assert flagged.flags == ["at bound: m"] and flagged.row()["flags"] == "at bound: m"


def test_flagged_fits_are_never_ranked_first(monkeypatch):
    good = fits.Fit("loglinear", "", {}, 10, 1.0, 0.9, 0.1, 5.0, 5.0)
    bad = fits.Fit("logistic", "", {}, 10, 0.5, 0.95, 0.05, -5.0, -5.0, flags=["at bound: k"])
    made = {"loglinear": good, "logistic": bad}
    monkeypatch.setattr(scaling, "fit", lambda d, y, form, **kw: made[form])  # where fit_forms looks it up
    points = pd.DataFrame({"depth": [1.0, 2.0], "y": [0.1, 0.2]})
    ranked = scaling.fit_forms(points, ("logistic", "loglinear"))
    assert [f.form for f in ranked] == ["loglinear", "logistic"]  # despite the better BIC


def test_analyze_takes_the_logistic_ceiling_from_the_study_file():
    depth_design = {(1, loops): 0.1 + 0.34 * (1 - 0.5 ** (loops - 1)) for loops in (1, 2, 4, 8, 16)}
    data = from_frame(frame(depth_design, skew=0.0), analysis={"logistic_top": 1.0})
    a = analyze(data, with_claims=False)
    logistic = next(f for f in a.fits if f.form == "logistic")
    assert "top" not in logistic.params and a.logistic_top == 1.0
    fitted = next(f for f in analyze(from_frame(frame(depth_design, skew=0.0)), with_claims=False).fits)
    assert fitted.form in ("logistic", "loglinear")


def test_solve_threshold_sources():
    data = from_frame(frame())
    value, source = solve.solve_threshold(data)
    assert value == pytest.approx(0.25 + 0.1 * 0.75) and source.startswith("chance 0.25 = 1/4 (phop, alphabet 4)")
    assert solve.chance_level(data) == (0.25, "1/4 (phop, alphabet 4)")
    data.analysis = {"solve_threshold": 0.3}
    assert solve.solve_threshold(data) == (0.3, "study file (analysis.solve_threshold)")
    assert solve.solve_threshold(data, threshold=0.5) == (0.5, "given (--threshold)")
    other = from_frame(frame().assign(**{"task.name": "charlm"}))
    value, source = solve.solve_threshold(other)
    assert value == pytest.approx(0.9 * other.done.groupby("cell_hash").eval_accuracy.mean().max())
    assert source.startswith("90% of the best cell mean")
    loss = from_frame(frame().rename(columns={"eval_accuracy": "eval_loss"}), metric="eval_loss", mode="min")
    assert solve.chance_level(loss) is None
    assert "mode min" in solve.solve_threshold(loss)[1]
    percent = from_frame(frame().assign(eval_accuracy=lambda d: 100 * d.eval_accuracy))
    assert solve.chance_level(percent)[0] == pytest.approx(25.0)


def test_report_shows_equal_depth_families_interval_method_and_threshold_source():
    from studyrunner.analysis import report

    data = from_frame(frame(baselines={(4, 1): "iso_flop:b1l4"}), failure="eval_accuracy < 0.15")
    a = analyze(data, with_claims=False)
    assert report.failure_threshold(a) == 0.15
    html = report.render(a)
    assert "Looped vs stacked at equal effective depth" in html and "1⊗4 vs 4⊗1, iso-flop" in html
    assert "Looped lines vs stacked cells" in html and "α/α_stacked" in html
    assert html.count("<th>interval</th>") >= 2  # the fit table and the family table name their method
    assert "Chance level of eval_accuracy: 0.25 = 1/4 (phop, alphabet 4)" in html
    assert "overflow-wrap" in html and 'class="wrap"' in html  # long labels wrap
