"""Exact, chunked α-entmax bridge weights: ``w_i = α-entmax(cos(new_i, source))`` as a sparse CSR
matrix.

Why not call ``entmax_bisect`` on full rows (the released reference): it holds N × M scores, runs 50
bisection passes over all M columns per row, and in fp32 it is off by up to 4e-3 at α=4 (the weight
at the support boundary is a cube root of a tiny margin). Here:

1. per chunk of rows, one GEMM gives screening scores (fp32, or bf16 when the run's precision asks
   for it) and :func:`top_candidates` keeps k per row;
2. the candidates' cosines are recomputed in float64 and the threshold τ is solved on them, for many
   chunks in one call, with the ``entmax`` package itself (``sparsemax`` for α=2, ``entmax15`` for
   α=1.5, ``entmax_bisect`` otherwise);
3. α-entmax's support is a prefix of the sorted scores, so if the k-th candidate lies below τ by
   more than twice the screening GEMM's error bound, no column outside the candidates can enter the
   support: the row is exact. Rows that fail are redone alone with 4× more candidates, up to the
   full row.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from sembridge_ray.sparse.csr import Entries, csr_from_sorted, sort_entries

if TYPE_CHECKING:  # the entmax package has no annotations: its three forms, as called here

    def sparsemax(x: torch.Tensor, /, dim: int = -1, k: int | None = None) -> torch.Tensor: ...

    def entmax15(x: torch.Tensor, /, dim: int = -1, k: int | None = None) -> torch.Tensor: ...

    def entmax_bisect(
        x: torch.Tensor,
        /,
        alpha: float = 1.5,
        dim: int = -1,
        n_iter: int = 50,
        ensure_sum_one: bool = True,
    ) -> torch.Tensor: ...

else:
    from entmax import entmax15, entmax_bisect, sparsemax

_CHUNK_BYTES = 32 << 20  # fp32 scores held per chunk: flat memory whatever N is


def screen_dtype(asked: torch.dtype | None = None) -> torch.dtype:
    """The GEMM that picks candidates: fp32 unless the caller asks for bf16 (``precision: bf16``).
    bf16 is 3x faster than fp32 on CPUs with AVX512-BF16/AMX (measured: 0.066 vs 0.203 ms per token
    at M=30,522, D=384) and its error is bounded below, so the weights stay exact; but which
    candidates tie at the k-th place can differ in the last bit, so the choice is the run's
    (recorded), never the CPU's. Callers keep fp32 on CUDA: cuBLAS may reduce bf16 products in
    reduced precision, which would void the bound."""
    return asked or torch.float32


def score_error(dtype: torch.dtype, dim: int) -> float:
    """Bound on |screened cosine - exact cosine| for unit vectors: rounding both inputs costs
    2u·Σ|x_i y_i| <= 2u (u = 2^-8 for bf16, 2^-24 for fp32) and fp32 accumulation at most (D +
    2)·2^-24."""
    u = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-24
    return 2 * u + (dim + 2) * 2.0**-24


@dataclass(frozen=True, kw_only=True)
class PreparedRows:
    """Rows as given (any float dtype), their fp32 unit version for the GEMM, and float64 norms.

    The source side of :func:`bridge_weights` is the same for every batch of new rows: a caller that
    weights several batches against one matrix prepares it once (:meth:`of`) and passes it instead
    of the tensor."""

    raw: torch.Tensor
    unit32: torch.Tensor
    norm64: torch.Tensor
    screen: torch.Tensor
    """Unit rows in the screening dtype."""

    @classmethod
    def of(
        cls, x: torch.Tensor, name: str, device: torch.device, screen: torch.dtype
    ) -> PreparedRows:
        if x.dim() != 2:
            raise ValueError(f"{name} must be 2-D (rows, dim), got shape {tuple(x.shape)}")
        x = x.detach().to(device=device)
        if not x.is_floating_point():
            x = x.float()
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} contains non-finite values (NaN or inf)")
        norm64 = torch.linalg.vector_norm(x, dim=1, dtype=torch.float64).clamp_min(1e-12)
        unit32 = torch.nn.functional.normalize(x.float(), dim=1)
        return cls(raw=x, unit32=unit32, norm64=norm64, screen=unit32.to(screen))

    def unit64(self, idx: torch.Tensor) -> torch.Tensor:
        """Float64 unit vectors of rows ``idx`` (any shape), normalised in float64 from the given
        values."""
        return self.raw[idx].double() / self.norm64[idx].unsqueeze(-1)

    def cosines(self, unit64: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Float64 cosines (B, k) of unit rows ``unit64`` (B, D) with rows ``idx`` (B, k) of these
        vectors: the dot product with the raw rows, then one division by their norms (not B·k·D of
        them).

        Wide rounds (k >= M / 128) take the dense float64 product with every row and gather from it
        instead of gathering B·k·D values: near-uniform bridge spaces (``relative`` on a
        cross-lingual vocabulary) widen the α-entmax supports until k reaches thousands, where the
        gather held 7 GB and took minutes. Measured on one thread, B=275, M=30,522, D=384: gather
        0.35 / 1.2 / 5.2 / 44 s at k = 128 / 512 / 2,048 / 8,192 against 0.4-0.7 s dense; the two
        agree within 1e-14."""
        if idx.shape[1] * 128 >= len(self.raw):
            return (unit64 @ self.raw64.T).gather(1, idx) / self.norm64[idx]
        return torch.einsum("bd,bkd->bk", unit64, self.raw[idx].double()) / self.norm64[idx]

    @functools.cached_property
    def raw64(self) -> torch.Tensor:
        """The rows in float64 (for the dense product of :meth:`cosines`), made once."""
        return self.raw.double()


@contextlib.contextmanager
def one_thread(device: torch.device) -> Iterator[None]:
    """Run the per-chunk ops after the GEMM (top-k, float64 gathers, entmax on (B, k)) on one CPU
    thread.

    Each is a short pass split across an OpenMP team; when the cores are shared (another process
    busy), a team member is often descheduled and the others spin at the barrier. Measured on 2
    loaded cores: the solve stage took 0.49-0.66 s per 1,500 rows on 2 threads vs 0.17-0.27 s on 1;
    the candidate search (group maxima and top-k over (274, 30,522)) 0.33-0.66 s per 3,000 rows on 2
    threads vs 0.15-0.17 s on 1 (idle: 0.05 vs 0.08). The GEMM keeps its threads."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def initial_k(alpha: float) -> int:
    """Candidates per row before certification: α=4 supports are 2-6 wide, α=2 up to ~60 on real
    vocabularies. A row whose k-th candidate could still be in the support is redone with 4k; at
    α=4, k=8 is 18% faster than 16 on the synthetic benchmark (supports 3-7 wide there) since the
    float64 solve costs in proportion to k."""
    return 8 if alpha >= 3 else 96 if alpha >= 1.5 else 512


def entmax_rows(scores: torch.Tensor, alpha: float) -> torch.Tensor:
    """α-entmax over the last dim of float64 ``scores`` (B, k), via the entmax package (exact
    sort-based forms where they exist)."""
    if alpha == 2.0:
        return sparsemax(scores, dim=-1)
    if alpha == 1.5:
        return entmax15(scores, dim=-1)
    return entmax_bisect(scores, alpha=alpha, dim=-1, n_iter=60)


GROUP = 32
"""Columns per group in :func:`top_candidates`."""


def top_candidates(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Column ids (B, k) of the k largest entries of each row of ``scores`` (B, M): a top-k set as
    ``torch.topk`` gives, any order, ties broken either way.

    Why not ``scores.topk(k)`` directly: it walks all M columns with a selection per row; here one
    vectorised ``amax`` takes the maximum of each group of ``GROUP`` columns and ``topk`` runs on
    the M / GROUP maxima, then on the k·GROUP columns of the k best groups. Exact: an entry outside
    those groups is at most each of their k maxima, so it is not above the k-th value returned.
    Measured at (274, 30,522), k=8, one thread: 6.5 ms vs 12.9 ms; ``torch.topk`` is the oracle in
    the tests."""
    b, m = scores.shape
    groups = -(-m // GROUP)
    if groups <= 4 * k:  # too few groups to narrow anything
        return scores.topk(k, dim=1).indices
    full = m // GROUP * GROUP
    maxima = scores[:, :full].view(b, full // GROUP, GROUP).amax(dim=2)
    if full < m:
        maxima = torch.cat([maxima, scores[:, full:].amax(dim=1, keepdim=True)], dim=1)
    best = maxima.topk(k, dim=1).indices
    cols = (best.unsqueeze(-1) * GROUP + torch.arange(GROUP, device=scores.device)).view(b, -1)
    outside = cols >= m  # the short last group's missing columns
    values = scores.gather(1, cols.clamp_max(m - 1)).masked_fill_(outside, float("-inf"))
    return cols.gather(1, values.topk(k, dim=1).indices)


_SOLVE_ROWS = 8192
"""Rows whose candidates are solved together: one entmax call over many chunks (its per-call cost is
mostly fixed: 26-38 ms for 3,000 rows in one call vs 64-114 ms in 11), with their (rows, k)
candidates bounded."""


def _kept(rows: torch.Tensor, idx: torch.Tensor, probs: torch.Tensor) -> Entries:
    keep = probs > 0
    return rows[:, None].expand_as(idx)[keep], idx[keep], probs[keep]


def _candidates(
    new: PreparedRows, rows: torch.Tensor, src: PreparedRows, k: int, offsets: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """For ``rows`` of ``new``: the k best source ids by screening score (one GEMM in the screening
    dtype, on all threads) and their float64 cosines (+ offsets), (B, k) each."""
    scores = new.unit32[rows].to(src.screen.dtype) @ src.screen.T
    if offsets is not None:  # added in fp32 (not bf16): one more rounding, counted in _screen_error
        scores = scores.float() + offsets.float()
    with one_thread(scores.device):
        idx = top_candidates(scores, k)
        exact = src.cosines(new.unit64(rows), idx)
        if offsets is not None:
            exact = exact + offsets[idx]
        return idx, exact


def _screen_error(src: PreparedRows, offsets: torch.Tensor | None) -> float:
    """Bound on |screening score - exact score| (see :func:`score_error`), offsets' fp32 addition
    included."""
    error = score_error(src.screen.dtype, src.screen.shape[1])
    if offsets is not None:
        error += 2.0**-24 * (1 + float(offsets.abs().max()))
    return error


def support_temperature(scores: torch.Tensor, alpha: float, sizes: torch.Tensor) -> torch.Tensor:
    """Per row, a temperature T at which α-entmax(scores / T) keeps exactly ``sizes`` entries: (B,)
    float64 for float64 ``scores`` (B, k) sorted descending, ``1 <= sizes < k``, α > 1.

    Closed form, no bisection: entry s (1-based, sorted) is in the support of α-entmax(x / T) iff
    the others above it hold less than all the mass at τ = (α-1) x_s / T, i.e. ``Σ_{i<s} ((α-1)(x_i
    - x_s) / T)^(1/(α-1)) < 1``, i.e. T > T_s := (Σ_{i<s} ((α-1)(x_i - x_s))^(1/(α-1)))^(α-1). T_s
    grows with s, so the support is exactly s on (T_s, T_{s+1}]; the geometric middle of that
    interval is returned (half of T_{s+1} when s = 1). A tie across the s-th place (x_s = x_{s+1})
    leaves that interval empty: the support is then the largest size below s that keeps the tie
    whole, or, where the tie reaches the top, the smallest above it (1 where none is in ``scores``).
    ``entmax_bisect`` is the oracle in the tests."""
    b, k = scores.shape
    # T_1 .. T_span: enough for every row's s and s + 1
    span = min(k, int(sizes.max()) + 2) if b else 1
    head = scores[:, :span]
    gaps = (
        ((alpha - 1) * (head.unsqueeze(1) - head.unsqueeze(2))).clamp_min(0).pow(1.0 / (alpha - 1))
    )
    # (s, i): i < s
    above = torch.ones(span, span, dtype=torch.bool, device=scores.device).triu(1).T
    bounds = (gaps * above).sum(2).pow(alpha - 1)  # (B, span): T_s for s = 1..span
    # (B, span - 1): (T_s, T_{s+1}] is not empty, s = 1..span-1
    open_ = bounds[:, 1:] > bounds[:, :-1]
    cols = torch.arange(1, span, device=scores.device)
    want = sizes.unsqueeze(1)
    below = torch.where(open_ & (cols <= want), cols, 0).amax(1)
    upper = torch.where(open_ & (cols > want), cols, span).amin(1)
    chosen = torch.where(below > 0, below, upper)
    found = chosen < span
    at = chosen.clamp(max=span - 1).unsqueeze(1)
    low, high = bounds.gather(1, at - 1).squeeze(1), bounds.gather(1, at).squeeze(1)
    middle = torch.where(low > 0, (low * high).sqrt(), high / 2)
    return torch.where(found, middle, torch.ones_like(middle))


def _certify(
    exact: torch.Tensor, idx: torch.Tensor, alpha: float, slack: torch.Tensor | float, whole: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Candidates' float64 scores and ids (B, k) -> (probs f64 (B, k), source ids, certified mask),
    sorted by score. A row is certified when its last candidate is outside the support by more than
    ``slack`` (twice the screening error, over the temperature; per row or one for all): no column
    left out can then enter it. ``whole``: every column is a candidate, so every row is exact."""
    exact, order = exact.sort(dim=1, descending=True, stable=True)
    idx = idx.gather(1, order)
    probs = entmax_rows(exact, alpha)
    if whole:
        return probs, idx, torch.ones(len(idx), dtype=torch.bool, device=idx.device)
    # τ from the top (always supported) entry: p_1^(α-1) = (α-1) s_1 - τ
    threshold = (alpha - 1) * exact[:, 0] - probs[:, 0] ** (alpha - 1)
    margin = threshold - (alpha - 1) * (exact[:, -1] + slack)
    return probs, idx, (probs[:, -1] == 0) & (margin >= 0)


def _entmax_round(
    new: PreparedRows,
    rows: torch.Tensor,
    src: PreparedRows,
    alpha: float,
    k: int,
    chunk: int,
    temperature: float,
    offsets: torch.Tensor | None,
    support: torch.Tensor | None = None,
) -> tuple[Entries, torch.Tensor]:
    """One round over ``rows`` with ``k`` candidates each: screened chunk by chunk (N × M is never
    held), then solved in one call. Returns the certified rows' triplets and the rows left for a
    wider round. ``support`` (sizes of ``rows``): each row's own temperature
    (:func:`support_temperature`) instead of ``temperature``."""
    m = src.screen.shape[0]
    found = [_candidates(new, part, src, k, offsets) for part in rows.split(chunk)]
    idx, exact = (torch.cat(col) for col in zip(*found, strict=True))
    with one_thread(idx.device):
        error = 2 * _screen_error(src, offsets)
        scale: torch.Tensor | float = temperature
        slack: torch.Tensor | float = error / temperature
        if support is not None:
            exact, order = exact.sort(dim=1, descending=True, stable=True)
            idx, sizes = idx.gather(1, order), support.clamp(max=k - 1)
            temps = torch.ones(len(rows), dtype=torch.float64, device=exact.device)
            if k > 1:  # one source row: weight 1 whatever the temperature
                temps = support_temperature(exact, alpha, sizes)
            scale, slack = temps[:, None], error / temps
        probs, idx, ok = _certify(exact / scale, idx, alpha, slack, whole=k == m)
        # the temperature comes from the top s + 1 scores: no column left out may be among them
        if support is not None and k < m:
            ok &= exact.gather(1, sizes.unsqueeze(1)).squeeze(1) - exact[:, -1] >= error
        return _kept(rows[ok], idx[ok], probs[ok]), rows[~ok]


def bridge_weights(
    new_vecs: torch.Tensor,
    source_vecs: torch.Tensor | PreparedRows,
    alpha: float = 4.0,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    device: str | torch.device | None = None,
    offsets: torch.Tensor | None = None,
    screen: torch.dtype | None = None,
    support: torch.Tensor | None = None,
) -> torch.Tensor:
    """Convex weights over source tokens for each new token: sparse CSR (N, M), float32, rows
    summing to 1.

    ``alpha > 1``: exact α-entmax of the cosine similarities (``temperature`` divides them; 1 by
    default, as in the paper). ``alpha == 2`` equals ``entmax.sparsemax``. ``alpha == 1``:
    softmax(cos / temperature) over the ``top_k`` most similar source tokens (all of them when None:
    dense rows), as WECHSEL does with k=10, T=0.1. ``offsets`` (M,): an additive prior on the
    cosines, the same for every row (before ``temperature``; see ``embed_init.position``). Cosines
    are computed in row chunks on ``device`` (default: where ``new_vecs`` lives); N × M is never
    held; ``screen`` is the dtype of the candidate-screening GEMM (fp32 by default, see
    :func:`screen_dtype`). ``source_vecs`` may come prepared (:meth:`PreparedRows.of`, for many
    calls against one matrix): its device and screening dtype then hold. Non-finite input raises
    ``ValueError``.

    ``support`` (N,) ints >= 1, α > 1 only (adaptive sparsity): row i keeps exactly ``support[i]``
    source tokens (fewer only when ties or the source size allow no more), each row divided by its
    own temperature (:func:`support_temperature`, from the row's full top ``support[i] + 1`` scores)
    instead of ``temperature``."""
    if alpha < 1:
        raise ValueError(f"alpha must be >= 1, got {alpha}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    new, src, dev = _prepared_pair(new_vecs, source_vecs, device, screen)
    offsets = _checked_offsets(offsets, len(src.raw), dev)
    support = _checked_support(support, alpha, len(new.raw), dev)
    if alpha == 1:
        return _softmax_weights(new, src, temperature, top_k, offsets)
    return _entmax_weights(new, src, alpha, temperature, offsets, support, dev)


def _prepared_pair(
    new_vecs: torch.Tensor,
    source_vecs: torch.Tensor | PreparedRows,
    device: str | torch.device | None,
    screen: torch.dtype | None,
) -> tuple[PreparedRows, PreparedRows, torch.device]:
    """Both sides of :func:`bridge_weights` prepared, on one device and of one dimension, and the
    device asked for. The source side is prepared here, or as the caller prepared it (on ``device``,
    in the screening dtype ``screen`` when the caller asked for one)."""
    if isinstance(source_vecs, PreparedRows) and device is None:
        device = source_vecs.raw.device
    dev = torch.device(device) if device is not None else new_vecs.device
    asked, src = screen_dtype(screen), source_vecs
    if not isinstance(src, PreparedRows):
        src = PreparedRows.of(src, "source_vecs", dev, asked)
    elif src.raw.device.type != dev.type or (screen is not None and src.screen.dtype != asked):
        raise ValueError(
            f"source_vecs were prepared on {src.raw.device} for {src.screen.dtype} screening, "
            f"asked: {dev}, {asked}"
        )
    new = PreparedRows.of(new_vecs, "new_vecs", src.raw.device, src.screen.dtype)
    if new.raw.shape[1] != src.raw.shape[1]:
        raise ValueError(
            f"dimension mismatch: new_vecs {new.raw.shape[1]} vs source_vecs {src.raw.shape[1]}"
        )
    return new, src, dev


def _checked_offsets(
    offsets: torch.Tensor | None, m: int, dev: torch.device
) -> torch.Tensor | None:
    """``offsets`` (m,) as float64 on ``dev``, refused unless finite and of that shape."""
    if offsets is None:
        return None
    if offsets.shape != (m,) or not bool(torch.isfinite(offsets).all()):
        raise ValueError(f"offsets must be finite with shape ({m},), got {tuple(offsets.shape)}")
    return offsets.to(device=dev, dtype=torch.float64)


def _checked_support(
    support: torch.Tensor | None, alpha: float, n: int, dev: torch.device
) -> torch.Tensor | None:
    """``support`` (n,) as int64 on ``dev``, refused unless α > 1 and every size >= 1."""
    if support is None:
        return None
    if alpha == 1 or support.shape != (n,) or (n and int(support.min()) < 1):
        raise ValueError(f"support needs alpha > 1 and shape ({n},) with sizes >= 1")
    return support.to(device=dev, dtype=torch.int64)


def _row_chunk(m: int) -> int:
    """Rows screened per GEMM: ``_CHUNK_BYTES`` of fp32 scores against ``m`` source rows."""
    return max(1, _CHUNK_BYTES // (4 * max(m, 1)))


def _softmax_weights(
    new: PreparedRows,
    src: PreparedRows,
    temperature: float,
    top_k: int | None,
    offsets: torch.Tensor | None,
) -> torch.Tensor:
    """α = 1: every row's softmax over its ``top_k`` nearest source rows (all when None), chunk by
    chunk: float64 cosines of the candidates an fp32 GEMM screens, or of every row by one float64
    GEMM when rows are dense (not a (B, M, D) gather)."""
    n, m = len(new.raw), len(src.raw)
    chunk, dev = _row_chunk(m), src.raw.device
    parts: list[Entries] = []
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        new64 = new.unit64(torch.arange(start, stop, device=dev))
        if top_k is None or top_k >= m:
            idx = torch.arange(m, device=dev).expand(stop - start, m)
            exact = (new64 @ src.raw64.T) / src.norm64
        else:
            scores32 = new.unit32[start:stop] @ src.unit32.T
            if offsets is not None:
                scores32 = scores32 + offsets.float()
            idx = scores32.topk(top_k, dim=1).indices
            exact = src.cosines(new64, idx)
        if offsets is not None:
            exact = exact + offsets[idx]
        probs = torch.softmax(exact / temperature, dim=1)
        rows, cols, vals = _kept(torch.arange(stop - start, device=dev), idx, probs)
        parts.append((rows.cpu() + start, cols.cpu(), vals.cpu()))
    return _to_csr(parts, n, m)


def _entmax_weights(
    new: PreparedRows,
    src: PreparedRows,
    alpha: float,
    temperature: float,
    offsets: torch.Tensor | None,
    support: torch.Tensor | None,
    dev: torch.device,
) -> torch.Tensor:
    """α > 1: rounds of :func:`_entmax_round` until every row is certified exact, each with 4x the
    candidates."""
    n, m = len(new.raw), len(src.raw)
    chunk = _row_chunk(m)
    parts: list[Entries] = []
    pending, k = torch.arange(n, device=dev), initial_k(alpha)
    # the temperature needs the top s + 1 scores, and a candidate below them
    if support is not None and n:
        k = max(k, int(support.max()) + 2)
    while len(pending):  # later rounds: only the rows that failed, with 4x the candidates
        failed = []
        for group in pending.split(_SOLVE_ROWS):
            sizes = None if support is None else support[group]
            (rows, cols, vals), left = _entmax_round(
                new, group, src, alpha, min(k, m), chunk, temperature, offsets, sizes
            )
            parts.append((rows.cpu(), cols.cpu(), vals.cpu()))
            failed.append(left)
        pending, k = torch.cat(failed), k * 4
    return _to_csr(parts, n, m)


def _to_csr(parts: list[Entries], n: int, m: int) -> torch.Tensor:
    """Entries -> CSR with columns ascending in each row and each row renormalised to sum to 1."""
    none = torch.zeros(0, dtype=torch.int64)
    rows, cols, vals = (torch.cat(c) for c in zip((none, none, none.double()), *parts, strict=True))
    rows, cols, vals = sort_entries(rows, cols, vals, m)
    # summed in the sorted order
    sums = torch.zeros(n, dtype=torch.float64).index_add_(0, rows, vals)
    return csr_from_sorted(rows, cols, (vals / sums[rows]).to(torch.float32), n, m)
