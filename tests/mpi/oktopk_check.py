"""Ok-Topk under real MPI ranks: `mpiexec -n P python -m tests.mpi.oktopk_check CHECK...`.

Checks (each asserts; any failure exits non-zero on every rank):
  exact     every interval = 1: output and residuals equal a numpy reference built from all
            ranks' inputs, every step
  default   default intervals, 200 steps of correlated heavy-tailed gradients: counts within
            [k/2, 2k], mass conserved (float64), residual = acc minus exactly S_r ∩ G, regions
            identical on all ranks and tiling [0, n)
  unsorted  the local selection is replaced by torch.topk's (index order unsorted): residuals
            are still cleared exactly on S_r ∩ G on the recompute steps (the original's bug)
  volume    bytes received per rank per step, averaged over 64 steps, <= 6k(P-1)/P words
  resume    a state_dict round trip mid-run continues bit-identically
  tracks    the count controller: on the benches' synthetic gradients, the mean global and local
            counts after the first 16 of 64 steps are within 5% of k
  rebalance the allgather without the re-cut to equal shares (option rebalance, on by default):
            exact against the reference, invariants over 40 default steps, shares as counted
  complete  option complete_values: exact against the reference, then 40 default steps: residual = acc
            with all of G zeroed on every rank, mass conserved, exact bytes of the index-only
            allgather (4 per index) and of the values' ring allreduce (2 x 4 G(P-1)/P)
"""
import sys
import traceback

import numpy as np
import torch

import sparse_asr.compression.oktopk as oktopk_module
from sparse_asr.comm import Communicator
from sparse_asr.comm.mpi import load_mpi
from sparse_asr.compression.oktopk import OkTopk
from sparse_asr.compression.synthetic import GradientSource
from tests.reference import oktopk_expected

MPI = load_mpi()

comm = Communicator()
P, RANK = comm.size, comm.rank


def gather(x: torch.Tensor) -> np.ndarray:
    """Every rank's copy of a 1-D tensor as a (P, n) float64 array (not counted as traffic)."""
    out = np.empty((P, x.numel()), dtype=np.float64)
    MPI.COMM_WORLD.Allgather(x.double().numpy(), out)
    return out


def reduce64(x: torch.Tensor, op) -> np.ndarray:
    """Element-wise SUM/MAX/MIN over ranks in float64 (not counted as traffic)."""
    out = np.empty(x.numel(), dtype=np.float64)
    MPI.COMM_WORLD.Allreduce(x.double().numpy(), out, op=op)
    return out


class CorrelatedGradients:
    """Gradients shaped like a network's: layers with log-normal scales, heavy-tailed per-entry
    magnitudes (Student-t), a direction shared by all ranks that drifts slowly from step to step
    (AR(1)), per-rank noise, and an overall scale decaying as training goes on."""

    def __init__(self, n: int, seed: int = 0):
        shared = np.random.default_rng(seed)
        cuts = np.sort(shared.choice(np.arange(1, n), size=7, replace=False))
        layer_scale = np.repeat(np.exp(shared.normal(0, 1.0, 8)), np.diff(np.r_[0, cuts, n]))
        self.scale = layer_scale * np.abs(shared.standard_t(3, n))
        self.direction = shared.standard_normal(n)
        self.shared = shared
        self.noise = np.random.default_rng(1000 + seed * 97 + RANK)
        self.n, self.t = n, 0

    def next(self) -> torch.Tensor:
        rho = 0.9
        self.direction = rho * self.direction + np.sqrt(1 - rho**2) * self.shared.standard_normal(self.n)
        g = self.scale * (self.direction + self.noise.standard_normal(self.n)) / np.sqrt(1 + self.t / 50)
        self.t += 1
        return torch.from_numpy(g.astype(np.float32))


def reference_step(acc: np.ndarray, k: int, options: dict):
    """tests/reference.py's Ok-Topk for acc (P, n) and these options: (output, residuals)."""
    expected = oktopk_expected(list(acc), k, None, options, 0)
    total, applied = expected.total, expected.applied
    residuals = acc.copy()
    for r, idx in enumerate(applied):
        residuals[r, idx] = 0.0
    return total / acc.shape[0], residuals


def check_exact(**options):
    n, density, steps = 5000, 0.01, 6
    comp = OkTopk(comm, n, density, local_threshold_interval=1, global_threshold_interval=1, repartition_interval=1,
                  **options)
    rng = np.random.default_rng(7 + RANK)
    scale = np.exp(np.random.default_rng(3).normal(0, 1, n))  # shared: ranks' large entries overlap
    for step in range(steps):
        grad = torch.from_numpy((scale * rng.standard_normal(n)).astype(np.float32))
        acc = gather(comp.residual + grad)
        out_ref, res_ref = reference_step(acc, comp.k, options)
        flat = grad.clone()
        stats = comp.step(flat)
        assert stats.selected_local == comp.k, (step, stats.selected_local, comp.k)
        assert stats.selected_global == comp.k, (step, stats.selected_global, comp.k)
        assert np.array_equal(np.flatnonzero(flat.numpy()), np.flatnonzero(out_ref)), f"step {step}: support differs"
        np.testing.assert_allclose(flat.double().numpy(), out_ref, rtol=1e-6, atol=1e-6, err_msg=f"step {step} output")
        np.testing.assert_array_equal(comp.residual.double().numpy(), res_ref[RANK], err_msg=f"step {step} residual")


def check_step_invariants(comp, grad, step, stats_log):
    """One step with the invariants that hold for every step and interval choice."""
    before = comp.residual.clone()
    acc = before + grad
    flat = grad.clone()
    stats = comp.step(flat)
    stats_log.append(stats)
    # Residual: acc with exactly S_r ∩ G zeroed (S_r from the threshold used, G = output support).
    in_s = acc.abs() >= stats.extra["local_threshold"]
    in_g = flat != 0
    assert int(in_s.sum()) == stats.selected_local, (step, int(in_s.sum()), stats.selected_local)
    assert int(in_g.sum()) == stats.selected_global, (step, int(in_g.sum()), stats.selected_global)
    expected = torch.where(in_s & in_g, torch.zeros_like(acc), acc)
    assert torch.equal(comp.residual, expected), f"step {step}: residual is not acc minus exactly S ∩ G"
    # Mass conservation over ranks, in float64: P * output + sum residual_after == sum acc.
    total_acc = reduce64(acc, MPI.SUM)
    total_after = reduce64(comp.residual, MPI.SUM) + P * flat.double().numpy()
    np.testing.assert_allclose(total_after, total_acc, rtol=1e-6, atol=1e-6 * np.abs(total_acc).max(),
                               err_msg=f"step {step} mass")
    # Output identical on every rank.
    mine = flat.double().numpy()
    assert (reduce64(flat, MPI.MAX) == mine).all() and (reduce64(flat, MPI.MIN) == mine).all(), \
        f"step {step}: ranks disagree"
    return stats


def check_regions(comp):
    bounds = comp.boundaries
    assert all(b == bounds for b in comm.allgather_object(bounds)), "ranks disagree on the regions"
    assert bounds[0] == 0 and bounds[-1] == comp.numel and len(bounds) == P + 1, bounds
    assert all(a <= b for a, b in zip(bounds, bounds[1:])), f"regions overlap: {bounds}"


def check_default():
    n, density, steps = 20000, 0.01, 200
    comp = OkTopk(comm, n, density)
    grads = CorrelatedGradients(n)
    log = []
    for step in range(steps):
        stats = check_step_invariants(comp, grads.next(), step, log)
        check_regions(comp)
        k = comp.k
        assert k / 2 <= stats.selected_local <= 2 * k, f"step {step}: local count {stats.selected_local}, k={k}"
        assert k / 2 <= stats.selected_global <= 2 * k, f"step {step}: global count {stats.selected_global}, k={k}"
    loc = [s.selected_local / comp.k for s in log]
    glo = [s.selected_global / comp.k for s in log]
    guards = sum(s.extra["guard_recomputed_local"] + s.extra["guard_recomputed_global"] for s in log)
    before = np.mean([s.extra["allgather_imbalance_before"] for s in log])
    after = np.mean([s.extra["allgather_imbalance_after"] for s in log])
    print(f"default P={P} rank {RANK}: local/k in [{min(loc):.2f}, {max(loc):.2f}] mean {np.mean(loc):.2f}, "
          f"global/k in [{min(glo):.2f}, {max(glo):.2f}] mean {np.mean(glo):.2f}, "
          f"guard recomputes {guards:.0f}/{steps}, "
          f"allgather imbalance max/mean {before:.2f} -> {after:.2f}")
    # The nudged thresholds must do the work: the exact guard may fire only rarely.
    assert guards <= 0.05 * steps, f"guard fired {guards:.0f} times in {steps} steps"


def check_unsorted():
    """The original intersected the local selection of a recompute step (topk: index order
    unsorted) with the global one as if both were sorted, so residuals were not cleared there."""

    def unsorted_topk(x, k):
        top = torch.topk(x.abs(), k)  # sorted by magnitude, so the indices are in no index order
        return top.indices, float(top.values[-1])

    original = oktopk_module.topk_threshold_select
    oktopk_module.topk_threshold_select = unsorted_topk
    try:
        n = 8000
        comp = OkTopk(comm, n, 0.02, local_threshold_interval=3, global_threshold_interval=2, repartition_interval=4)
        grads = CorrelatedGradients(n, seed=5)
        log = []
        for step in range(9):
            check_step_invariants(comp, grads.next(), step, log)
        assert all(log[i].extra["recomputed_local_threshold"] == 1.0 for i in (0, 3, 6))  # + any guard steps
    finally:
        oktopk_module.topk_threshold_select = original


def check_volume():
    n, density, steps = 50000, 0.01, 64
    comp = OkTopk(comm, n, density)
    grads = CorrelatedGradients(n, seed=11)
    recv = []
    for step in range(steps):
        flat = grads.next()
        recv.append(comp.step(flat).bytes_recv)  # everything: pairs, counts, histograms
    mean_recv = float(np.mean(recv))
    bound = 6 * comp.k * (P - 1) / P * 4
    lower = 2 * comp.k * (P - 1) / P * 4
    per_rank = comm.allgather_object(mean_recv)
    if RANK == 0:
        print(f"volume P={P} k={comp.k}: mean bytes received/step per rank {[round(v) for v in per_rank]}, "
              f"bound 6k(P-1)/P words = {bound:.0f} B, lower bound {lower:.0f} B")
    assert mean_recv <= bound, f"rank {RANK}: {mean_recv:.0f} B/step > bound {bound:.0f} B"


def check_resume():
    n = 6000

    def make():
        return OkTopk(comm, n, 0.02, local_threshold_interval=4, global_threshold_interval=3, repartition_interval=5)

    a = make()
    grads = CorrelatedGradients(n, seed=3)
    seq = [grads.next() for _ in range(14)]
    for step in range(7):
        a.step(seq[step].clone())
    b = make()
    b.load_state_dict(a.state_dict())
    for step in range(7, 14):
        fa, fb = seq[step].clone(), seq[step].clone()
        a.step(fa)
        b.step(fb)
        assert torch.equal(fa, fb) and torch.equal(a.residual, b.residual), f"resumed run diverged at step {step}"


def check_tracks():
    n, density, steps, settle = 50000, 0.02, 64, 16
    comp = OkTopk(comm, n, density)
    source = GradientSource(n, RANK)
    local, glob = [], []
    for step in range(steps):
        stats = comp.step(source.gradient(step))
        local.append(stats.selected_local / comp.k)
        glob.append(stats.selected_global / comp.k)
    local_mean, global_mean = np.mean(local[settle:]), np.mean(glob[settle:])
    print(f"tracks P={P} rank {RANK}: mean count / k over steps {settle}..{steps - 1}: local {local_mean:.3f}, "
          f"global {global_mean:.3f}")
    assert 0.95 <= local_mean <= 1.05, f"local count / k {local_mean:.3f}: {np.round(local, 2)}"
    assert 0.95 <= global_mean <= 1.05, f"global count / k {global_mean:.3f}: {np.round(glob, 2)}"


def check_rebalance():
    """The default checks run with the re-cut (P > 2): here without it, and the shares checked both ways."""
    check_exact(rebalance=False)
    n, density, steps = 20000, 0.01, 40
    for rebalance in (False, True):
        check_rebalanced_steps(OkTopk(comm, n, density, rebalance=rebalance), CorrelatedGradients(n, seed=2), steps)


def check_rebalanced_steps(comp, grads, steps):
    log = []
    for step in range(steps):
        stats = check_step_invariants(comp, grads.next(), step, log)
        check_regions(comp)
        total, before, after = (stats.selected_global, stats.extra["allgather_imbalance_before"],
                                stats.extra["allgather_imbalance_after"])
        if comp.options.rebalance and P > 2:  # equal shares (at P = 2 the re-cut is skipped)
            assert after * total / P <= -(-total // P) + 1e-9 and after <= before + 1e-12, stats.extra
        else:
            assert after == before, stats.extra


def check_complete():
    check_exact(complete_values=True)
    check_exact(complete_values=True, candidate_factor=2.0)
    for candidate_factor in (1.0, 2.0):
        check_complete_steps(candidate_factor)


def check_complete_steps(candidate_factor):
    """40 default steps: applied = G (or the k largest complete sums of the g k candidates) on every rank,
    residual = acc minus them, mass conserved, exact bytes of the index allgather and of the allreduce."""
    n, density, steps = 20000, 0.01, 40
    comp = OkTopk(comm, n, density, complete_values=True, candidate_factor=candidate_factor)
    grads = CorrelatedGradients(n, seed=4)
    for step in range(steps):
        grad = grads.next()
        acc = comp.residual + grad
        flat = grad.clone()
        stats = comp.step(flat)
        in_g = flat != 0
        G = int(stats.extra["global_count"])  # the global selection: the candidates
        applied = min(G, comp.k) if comp.k_global > comp.k else G  # at P = 1 there are no more candidates
        assert int(in_g.sum()) == stats.selected_global == applied, (step, int(in_g.sum()), stats.selected_global, G)
        assert comp.k_global / 2 <= G <= 2 * comp.k_global, (step, G, comp.k_global)
        everywhere = comm.allgather_object(torch.nonzero(in_g).flatten().tolist())
        assert all(s == everywhere[0] for s in everywhere), f"step {step}: ranks applied different sets"
        assert torch.equal(comp.residual, torch.where(in_g, torch.zeros_like(acc), acc)), \
            f"step {step}: residual is not acc minus G"
        total_acc = reduce64(acc, MPI.SUM)
        total_after = reduce64(comp.residual, MPI.SUM) + P * flat.double().numpy()
        np.testing.assert_allclose(total_after, total_acc, rtol=1e-6, atol=1e-6 * np.abs(total_acc).max(),
                                   err_msg=f"step {step} mass")
        gathered = comm.allgather_object(stats.extra["bytes_recv_allgather"])  # each rank gets all G but its own block
        assert sum(gathered) == 4 * G * (P - 1), (step, gathered, G)
        assert stats.extra["bytes_recv_complete"] == 2 * 4 * G * (P - 1) // P, \
            (step, stats.extra["bytes_recv_complete"], G)


CHECKS = {"exact": check_exact, "default": check_default, "unsorted": check_unsorted, "volume": check_volume,
          "resume": check_resume, "tracks": check_tracks, "rebalance": check_rebalance,
          "complete": check_complete}

if __name__ == "__main__":
    torch.set_num_threads(1)
    for name in sys.argv[1:]:
        try:
            CHECKS[name]()
        except Exception:
            traceback.print_exc()
            print(f"rank {RANK}: check {name} FAILED", flush=True)
            comm.abort(1)
        comm.barrier()
        if RANK == 0:
            print(f"ok {name} P={P}", flush=True)
