"""Run by ``tests/test_distributed.py``, one process per rank: DTensor checks on every rank.

Usage: ``python tests/distributed_worker.py BACKEND RANK WORLD_SIZE STORE_FILE``. The ranks
meet through a file store (no ports to race for). Any failed check raises, which fails
that rank's process; rank 0 prints ``ok N checks`` at the end.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import neuralops_gqa
from helpers import Expand, GQAttention

EXPAND = torch.ops.neuralops.gqa_expand
REDUCE = torch.ops.neuralops.gqa_reduce
checks = 0


def check(cond: bool, what: str) -> None:
    global checks
    if not cond:
        raise AssertionError(f"rank {dist.get_rank()}: {what}")
    checks += 1


def test_placements(mesh, device: str) -> None:
    world = mesh.size()
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(2 * world, 2 * world, 3 * world + 1, 8 * world, generator=gen).to(device)
    v = torch.randn(2 * world, 2 * world, 3 * world + 1, 4 * world, generator=gen).to(device)
    kv, heads = k.shape[1], 3 * k.shape[1]
    for placement in (Replicate(), Shard(0), Shard(1), Shard(2), Shard(3), Partial()):
        if isinstance(placement, Partial):
            # Each rank holds a summand; expanding the sum is the sum of the expansions.
            kd = DTensor.from_local(k / world, mesh, [placement], run_check=False)
            vd = DTensor.from_local(v / world, mesh, [placement], run_check=False)
        else:
            kd, vd = distribute_tensor(k, mesh, [placement]), distribute_tensor(v, mesh, [placement])
        with CommDebugMode() as comms:
            ko, vo = EXPAND(kd, vd, kv, heads)
        check(comms.get_total_counts() == 0, f"{placement}: expansion communicated")
        check(ko.placements == (placement,) and vo.placements == (placement,), f"{placement}: placements")
        full_k, full_v = ko.full_tensor(), vo.full_tensor()
        check(torch.allclose(full_k, k.repeat_interleave(3, 1)), f"{placement}: k values")
        check(torch.allclose(full_v, v.repeat_interleave(3, 1)), f"{placement}: v values")
        if not isinstance(placement, Partial):
            check(torch.equal(full_k, k.repeat_interleave(3, 1)), f"{placement}: k bits")
        g = torch.randn(k.shape[0], heads, k.shape[2], k.shape[3], generator=gen).to(device)
        if isinstance(placement, Partial):
            gd = DTensor.from_local(g / world, mesh, [placement], run_check=False)
        else:
            gd = distribute_tensor(g, mesh, [placement])
        with CommDebugMode() as comms:
            rk, _ = REDUCE(gd, gd, kv, heads)
        check(comms.get_total_counts() == 0, f"{placement}: reduction communicated")
        check(rk.placements == (placement,), f"{placement}: reduction placements")
        ref = g.unflatten(1, (kv, 3)).sum(2)
        check(torch.allclose(rk.full_tensor(), ref, atol=1e-5), f"{placement}: reduction values")


def test_backward(mesh, device: str) -> None:
    gen = torch.Generator().manual_seed(1)
    world = mesh.size()
    k = torch.randn(2, 2 * world, 5, 8, generator=gen).to(device)
    v = torch.randn(2, 2 * world, 5, 6, generator=gen).to(device)
    gk = torch.randn(2, 4 * world, 5, 8, generator=gen).to(device)
    gv = torch.randn(2, 4 * world, 5, 6, generator=gen).to(device)
    for placement in (Replicate(), Shard(0), Shard(1), Shard(2)):
        for used in ("both", "k"):
            kd = distribute_tensor(k, mesh, [placement]).requires_grad_()
            vd = distribute_tensor(v, mesh, [placement]).requires_grad_()
            ko, vo = EXPAND(kd, vd, 2 * world, 4 * world)
            loss = (ko * distribute_tensor(gk, mesh, [placement])).sum()
            if used == "both":
                loss = loss + (vo * distribute_tensor(gv, mesh, [placement])).sum()
            loss.backward()
            check(torch.allclose(kd.grad.full_tensor(), gk.unflatten(1, (2 * world, 2)).sum(2), atol=1e-5),
                  f"{placement}/{used}: grad k")  # fmt: skip
            if used == "both":
                check(torch.allclose(vd.grad.full_tensor(), gv.unflatten(1, (2 * world, 2)).sum(2), atol=1e-5),
                      f"{placement}: grad v")  # fmt: skip
            else:
                check(vd.grad is None, f"{placement}: unused output gave v a gradient")


def test_errors(mesh, device: str) -> None:
    world = mesh.size()
    if world > 1:  # on one rank every head count shards evenly
        k = torch.randn(1, 2 * world + 1, 4, 8).to(device)
        kd = distribute_tensor(k, mesh, [Shard(1)])
        try:
            EXPAND(kd, kd, 2 * world + 1, 2 * (2 * world + 1))
        except (ValueError, RuntimeError) as exc:
            check("must be divisible by the" in str(exc) and "num_kv_heads" in str(exc), f"message: {exc}")
        else:
            check(False, "uneven head sharding was accepted")
    kr = distribute_tensor(torch.randn(1, 2, 4, 8).to(device), mesh, [Replicate()])
    ks = distribute_tensor(torch.randn(1, 2, 4, 8).to(device), mesh, [Shard(0)])
    try:
        EXPAND(kr, ks, 2, 4)
    except (ValueError, RuntimeError) as exc:
        check("must share one device mesh and placements" in str(exc), f"message: {exc}")
    else:
        check(False, "mixed placements were accepted")


def test_2d_mesh(device: str) -> None:
    world = dist.get_world_size()
    if world % 2:
        return
    mesh = init_device_mesh(device, (2, world // 2), mesh_dim_names=("dp", "tp"))
    gen = torch.Generator().manual_seed(2)
    k = torch.randn(4, 2 * world, 6, 8, generator=gen).to(device)
    kd = distribute_tensor(k, mesh, [Shard(0), Shard(1)]).requires_grad_()
    with CommDebugMode() as comms:
        ko, _ = EXPAND(kd, kd.detach(), 2 * world, 8 * world)
    check(comms.get_total_counts() == 0, "2-D mesh: expansion communicated")
    check(ko.placements == (Shard(0), Shard(1)), "2-D mesh: placements")
    check(torch.equal(ko.full_tensor(), k.repeat_interleave(4, 1)), "2-D mesh: values")
    g = torch.randn(4, 8 * world, 6, 8, generator=gen).to(device)
    (ko * distribute_tensor(g, mesh, [Shard(0), Shard(1)])).sum().backward()
    check(
        torch.allclose(kd.grad.full_tensor(), g.unflatten(1, (2 * world, 4)).sum(2), atol=1e-5),
        "2-D mesh: grad",
    )


def _recording_expand(seen: list[object]) -> Expand:
    """The op with global head counts; records what it was given (DTensor placements)."""

    def expand(
        k: torch.Tensor, v: torch.Tensor, kv_heads: int, heads: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append((type(k), getattr(k, "placements", None)))
        return EXPAND(k, v, kv_heads, heads)

    return expand


def _head_sharded_matmul_error(mesh: DeviceMesh, device: str) -> str | None:
    """Why this torch's DTensor can't multiply 4-D tensors sharded on heads; None if it can.

    The eager block's ``q @ k.transpose(2, 3)`` needs it; some torch releases refuse to
    flatten the sharded head dim into the batch of the matmul.
    """
    a = distribute_tensor(torch.randn(2, 2 * mesh.size(), 3, 4, device=device), mesh, [Shard(1)])
    try:
        a @ a.transpose(2, 3)
    except RuntimeError as e:
        return " ".join(str(e).split())[:300]
    return None


def test_tensor_parallel_block(device: str) -> None:
    world = dist.get_world_size()
    mesh = init_device_mesh(device, (world,))
    reason = _head_sharded_matmul_error(mesh, device)
    if reason is not None:
        print(
            f"skipped: tensor-parallel block, torch {torch.__version__}'s DTensor has no head-sharded matmul ({reason})"
        )
        return
    torch.manual_seed(3)
    seen: list[object] = []
    ref = GQAttention(16 * world, 4 * world, 2 * world, EXPAND).to(device)
    tp = GQAttention(16 * world, 4 * world, 2 * world, _recording_expand(seen)).to(device)
    tp.load_state_dict(ref.state_dict())
    colwise = ColwiseParallel(use_local_output=False)
    parallelize_module(tp, mesh, {"q_proj": colwise, "k_proj": colwise, "v_proj": colwise,
                                  "o_proj": RowwiseParallel(input_layouts=Shard(-1))})  # fmt: skip
    x = torch.randn(2, 7, 16 * world, generator=torch.Generator().manual_seed(4)).to(device)
    out_ref = ref(x)
    out_tp = tp(x)
    check(seen == [(DTensor, (Shard(1),))], f"TP block expanded {seen}, not head-sharded DTensors")
    check(torch.allclose(out_tp, out_ref, atol=1e-5), "TP block output")
    g = torch.randn_like(out_ref)
    out_ref.backward(g)
    out_tp.backward(g)
    for name, p in tp.named_parameters():
        p_ref = dict(ref.named_parameters())[name]
        full = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        check(torch.allclose(full, p_ref.grad, atol=1e-5), f"TP block grad {name}")


def main() -> None:
    backend, rank, world, store = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    device = "cuda" if backend == "nccl" else "cpu"
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    if device == "cuda":
        torch.cuda.set_device(dist.get_rank())
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    test_placements(mesh, device)
    test_backward(mesh, device)
    test_errors(mesh, device)
    test_2d_mesh(device)
    test_tensor_parallel_block(device)
    dist.barrier()
    if dist.get_rank() == 0:
        print(f"ok {checks} checks, {neuralops_gqa.__version__}")
    sys.stdout.flush()
    sys.stderr.flush()
    # Every check has passed on every rank (the barrier). Interpreter teardown with gloo's
    # and Triton's background threads alive sometimes aborts ("terminate called without an
    # active exception", SIGABRT) after that; leave without a teardown instead.
    os._exit(0)


if __name__ == "__main__":
    main()
