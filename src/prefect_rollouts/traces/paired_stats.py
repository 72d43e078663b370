"""Statistics of rewards: ``pass_at_k`` (the unbiased pass@k of one task, for ``traces.summary``) and
paired statistics of two runs over the same tasks: a task-clustered bootstrap interval, the
clustered standard error, the exact McNemar test and a task-level sign-flip test. Numpy only.

Every function takes per-task (cluster) figures: ``sums[g]``, the sum over task g's paired
rollouts of ``reward_b - reward_a``, and ``counts[g]``, how many paired rollouts task g has.
The statistic is the mean paired difference ``sums.sum() / counts.sum()`` (every paired rollout
weighs the same). ``traces.compare`` says where the method comes from.
"""

from __future__ import annotations

import math

import numpy as np

#: Random draws per block of resampled tasks in the bootstrap (bounds its memory: 8 bytes each).
_BLOCK = 1 << 22


def clustered_stderr(sums: np.ndarray, counts: np.ndarray) -> float | None:
    """Standard error of the mean paired difference with tasks as clusters (Miller 2024, "clustered standard errors").

    ``sqrt(G / (G - 1) * sum_g (sums[g] - counts[g] * mean) ** 2) / N`` for G tasks and N paired
    rollouts; with one rollout per task it is the usual ``std(ddof=1) / sqrt(N)``.

    Returns:
        The standard error, or None below 2 tasks (no spread to estimate).
    """
    tasks = len(sums)
    if tasks < 2:
        return None
    total = float(counts.sum())
    mean = float(sums.sum()) / total
    spread = float(np.square(sums - counts * mean).sum())
    return math.sqrt(tasks / (tasks - 1) * spread) / total


def bootstrap_interval(sums: np.ndarray, counts: np.ndarray, *, confidence: float, resamples: int,
                       rng: np.random.Generator) -> tuple[float, float]:
    """Percentile interval of the mean paired difference from a paired bootstrap over tasks.

    Each of ``resamples`` replicates draws G tasks with replacement (all paired rollouts of a drawn
    task come along, so rollouts of one task stay together) and takes the mean difference over the
    drawn rollouts; the interval is the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2``
    quantiles of the replicates (linear interpolation, ``numpy.quantile``'s default).

    Tasks with the same ``(sum, count)`` are interchangeable, so when there are few distinct pairs
    (binary rewards: at most ``(2r + 1) * r`` for r rollouts per task) a replicate draws how many
    tasks of each kind it takes from ``multinomial(G, share of each kind)``, which is the same
    distribution as drawing G task indices, at ``resamples x kinds`` cost instead of
    ``resamples x G``. Otherwise (non-binary rewards: nearly every task its own kind) task indices
    are drawn, in blocks of ``_BLOCK`` draws: about 2 ns of CPU per draw, e.g. 1 s for 10,000
    resamples of 50,000 tasks.

    Returns:
        ``(low, high)``; both equal the mean when every task has the same mean difference.
    """
    tasks = len(sums)
    kinds, share = np.unique(sums + 1j * counts, return_counts=True)   # (sum, count) pairs, sorted
    if len(kinds) * 4 <= tasks:
        drawn = rng.multinomial(tasks, share / tasks, size=resamples).astype(np.float64)
        means = (drawn @ kinds.real) / (drawn @ kinds.imag)
    else:   # int32 draws are about 4 times faster than int64; equal counts need no second gather
        means = np.empty(resamples)
        step = max(1, _BLOCK // tasks)
        same = counts.min() == counts.max()
        for start in range(0, resamples, step):
            picks = rng.integers(0, tasks, size=(min(step, resamples - start), tasks), dtype=np.int32)
            drawn = counts[0] * tasks if same else counts[picks].sum(axis=1)
            means[start:start + len(picks)] = sums[picks].sum(axis=1) / drawn
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def mcnemar_exact(to_fail: int, to_pass: int) -> float:
    """Two-sided exact McNemar test (McNemar 1947): the binomial test of the discordant pairs.

    Under the null hypothesis that both runs pass as often, each of the ``n = to_fail + to_pass``
    pairs that changed outcome went either way with probability 1/2, so the p-value is
    ``min(1, 2 * P(X <= min(to_fail, to_pass)))`` for ``X ~ Binomial(n, 1/2)``; 1.0 when n = 0.
    Computed in log space (``math.lgamma``), exact to float precision for any n.
    """
    n, k = to_fail + to_pass, min(to_fail, to_pass)
    if n == 0:
        return 1.0
    log_half = n * math.log(0.5)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + log_half for i in range(k + 1)]
    return min(1.0, 2.0 * math.fsum(math.exp(t) for t in terms))


def sign_flip_pvalue(sums: np.ndarray, *, resamples: int, rng: np.random.Generator) -> float:
    """Two-sided p-value of a randomization test that the runs do equally well, tasks as clusters.

    Under the null hypothesis the labels A and B are exchangeable within a task, so each task's sum
    of differences is as likely negated: the test statistic ``|sum(sums)|`` is compared with
    ``resamples`` replicates in which each task's sign is flipped with probability 1/2;
    ``p = (1 + replicates at least as extreme) / (1 + resamples)`` (Phipson and Smyth 2010), never 0.
    With one binary rollout per task this is McNemar's test; ``traces.compare`` uses it when a
    task has several rollouts, where McNemar's independent pairs do not hold.
    """
    observed = abs(float(sums.sum()))
    kinds, share = np.unique(sums, return_counts=True)   # tasks with the same sum flip alike in distribution
    kept = rng.binomial(share, 0.5, size=(resamples, len(kinds)))
    flipped = np.abs((2 * kept - share) @ kinds)
    extreme = int(np.count_nonzero(flipped >= observed - 1e-9 * max(1.0, observed)))
    return (1 + extreme) / (1 + resamples)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task: ``1 - C(n - c, k) / C(n, k)`` (n samples, c passing).

    Raises:
        ValueError: ``k > n`` (the estimator needs at least k samples).
    """
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
