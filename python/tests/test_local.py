"""The dopt Python package in one process, against torch.optim (bitwise):
every local optimizer, state dicts crossing both ways, an LR scheduler, the
functional forms, ZeRO on a world of one with bucket views (the torch
parameters must stay views of dopt's buckets), and the errors.

    PYTHONPATH=build/python python3 python/tests/test_local.py

Prints one line per test and exits non-zero on a failure (77 without torch).
"""
import copy
import os
import sys
import traceback

try:
    import torch
except ImportError as e:  # CTest: skipped
    print(f"skipped: no torch in {sys.executable}: {e}")
    sys.exit(77)

import dopt

CONFIGS = {
    "SGD": dict(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True),
    "Adam": dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1, amsgrad=True),
    "AdamW": dict(lr=0.01, weight_decay=0.05),
    "Adagrad": dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1),
    "RMSprop": dict(lr=0.01, momentum=0.5, centered=True),
    "Adamax": dict(lr=0.02),
    "Adadelta": dict(lr=0.5, rho=0.8),
    "Rprop": dict(lr=0.02),
}


def make_params(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=dtype).requires_grad_() for s in [(7,), (3, 4), (5,), (1,)]]


def grads_for(params, step):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in params]


def run(opt, params, steps, first=0, skip=None):
    for t in range(first, first + steps):
        opt.zero_grad(set_to_none=(t % 2 == 0))
        for i, (p, g) in enumerate(zip(params, grads_for(params, t))):
            if skip is None or not skip(t, i):
                p.grad = g
        opt.step()


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_every_optimizer_bitwise():
    for name, hp in CONFIGS.items():
        for dtype in (torch.float32, torch.float64):
            pt, pd = make_params(dtype), make_params(dtype)
            ot = getattr(torch.optim, name)(pt, **hp)
            od = getattr(dopt.optim, name)(pd, **hp)
            skip = lambda t, i: t == 3 and i == 1  # noqa: E731  (a parameter without a gradient)
            run(ot, pt, 8, skip=skip)
            run(od, pd, 8, skip=skip)
            assert same(pt, pd), f"{name} {dtype}: parameters differ from torch.optim.{name}"
            st, sd = ot.state_dict(), od.state_dict()
            for i in st["state"]:
                for k, v in st["state"][i].items():
                    w = sd["state"][i][k]
                    assert (torch.equal(v, w) if torch.is_tensor(v) else v == w), f"{name}: state {i}.{k}"
                    assert type(v) is type(w), f"{name}: state {i}.{k} is {type(w)} in dopt, {type(v)} in torch"


def test_state_dicts_cross_both_ways():
    for name, hp in CONFIGS.items():
        pt, pd = make_params(torch.float32), make_params(torch.float32)
        ot, od = getattr(torch.optim, name)(pt, **hp), getattr(dopt.optim, name)(pd, **hp)
        run(ot, pt, 4)
        run(od, pd, 4)
        # torch -> dopt and dopt -> torch through torch.save / torch.load.
        import io
        bt, bd = io.BytesIO(), io.BytesIO()
        torch.save(ot.state_dict(), bt)
        torch.save(od.state_dict(), bd)
        bt.seek(0)
        bd.seek(0)
        qt, qd = [p.detach().clone().requires_grad_() for p in pt], [p.detach().clone().requires_grad_() for p in pd]
        ot2, od2 = getattr(torch.optim, name)(qt, **hp), getattr(dopt.optim, name)(qd, **hp)
        ot2.load_state_dict(torch.load(bd))
        od2.load_state_dict(torch.load(bt))
        run(ot2, qt, 4, first=4)
        run(od2, qd, 4, first=4)
        run(ot, pt, 4, first=4)
        assert same(qt, pt), f"{name}: torch loading dopt's state dict did not resume like the uninterrupted run"
        assert same(qd, pt), f"{name}: dopt loading torch's state dict did not resume like torch"


def test_lr_scheduler_and_param_groups():
    pt, pd = make_params(torch.float32), make_params(torch.float32)
    groups = lambda ps: [{"params": ps[:2]}, {"params": ps[2:], "lr": 0.05, "momentum": 0.5}]  # noqa: E731
    ot, od = torch.optim.SGD(groups(pt), lr=0.1, momentum=0.9), dopt.optim.SGD(groups(pd), lr=0.1, momentum=0.9)
    st = torch.optim.lr_scheduler.MultiStepLR(ot, [2, 5], 0.3)
    sd = torch.optim.lr_scheduler.MultiStepLR(od, [2, 5], 0.3)
    for t in range(8):
        for o, ps, s in ((ot, pt, st), (od, pd, sd)):
            o.zero_grad()
            for p, g in zip(ps, grads_for(ps, t)):
                p.grad = g
            o.step()
            s.step()
    assert same(pt, pd), "SGD with two groups and MultiStepLR differs from torch"
    assert [g["lr"] for g in ot.param_groups] == [g["lr"] for g in od.param_groups]
    assert "initial_lr" in od.state_dict()["param_groups"][0]


def test_functional():
    for name in ("Adam", "SGD", "RMSprop"):
        hp = CONFIGS[name]
        pt, pd = make_params(torch.float32), make_params(torch.float32)
        ot = getattr(torch.optim, name)(pt, **hp)
        f = dopt.as_functional_optim(getattr(torch.optim, name), **hp)
        for t in range(5):
            ot.zero_grad()
            for p, g in zip(pt, grads_for(pt, t)):
                p.grad = g
            ot.step()
            for p, g in zip(pd, grads_for(pd, t)):
                f.step_param(p, g)
        assert same(pt, pd), f"as_functional_optim({name}) differs from torch.optim.{name}"
        assert len(f.state) == len(pd)


def test_zero_world_of_one_bucket_view():
    if not dopt.is_initialized():
        dopt.init_process_group()  # not launched: a world of one on a free port
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    ref = copy.deepcopy(model)
    zero = dopt.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, parameters_as_bucket_view=True,
                                        lr=0.01)
    plain = torch.optim.Adam(ref.parameters(), lr=0.01)
    ranges = [(b.data_ptr, b.data_ptr + 4 * b.numel) for kind in zero._c.buckets for b in kind]
    for i, p in enumerate(model.parameters()):
        assert any(lo <= p.data_ptr() < hi for lo, hi in ranges), f"parameter {i} is not a view of a bucket"
    x = torch.randn(16, 6, generator=torch.Generator().manual_seed(3))
    for _ in range(6):
        for m, o in ((model, zero), (ref, plain)):
            o.zero_grad()
            m(x).square().sum().backward()
            o.step()
    assert same(list(model.parameters()), list(ref.parameters())), "ZeRO(bucket view) differs from torch.optim.Adam"
    zero.consolidate_state_dict(0)
    assert zero.state_dict()["param_groups"][0]["params"] == [0, 1, 2, 3]
    # Freezing a parameter rebuilds the buckets; the torch parameters follow.
    model[0].weight.requires_grad_(False)
    ref[0].weight.requires_grad_(False)
    for m, o in ((model, zero), (ref, plain)):
        o.zero_grad(set_to_none=True)
        m(x).square().sum().backward()
        o.step()
    assert same(list(model.parameters()), list(ref.parameters())), "after a rebuild of the buckets"


def expect(exc, fn, text):
    try:
        fn()
    except exc as e:
        assert text in str(e), f"{exc.__name__} without '{text}': {e}"
        return
    raise AssertionError(f"no {exc.__name__} ('{text}')")


def test_errors():
    p = [torch.zeros(3, requires_grad=True)]
    expect(dopt.NotSupportedError, lambda: dopt.optim.Adam(p, foreach=True), "Adam(foreach=True) is not supported")
    expect(ValueError, lambda: dopt.optim.Adam(p, lr=-1.0), "Invalid learning rate")
    expect(ValueError, lambda: dopt.optim.Adam(p, bogus=1.0), "bogus")
    expect(ValueError, lambda: dopt.optim.Adam([]), "empty parameter list")
    expect(TypeError, lambda: dopt.optim.Adam([{"params": set(p)}]), "ordered collections")
    expect(ValueError, lambda: dopt.optim.SGD(p), "required optimization parameter lr")
    expect(ValueError, lambda: dopt.optim.SGD([torch.zeros(4, 4).t()], lr=0.1), "not contiguous")
    expect(ValueError, lambda: dopt.ZeroRedundancyOptimizer(p, "NoSuchOptimizer", lr=0.1), "no optimizer")
    expect(dopt.NotSupportedError, lambda: dopt.ZeroRedundancyOptimizer(p, torch.optim.Adam, overlap_with_ddp=True),
           "overlap_with_ddp")
    z = dopt.ZeroRedundancyOptimizer([torch.zeros(2, requires_grad=True)], torch.optim.SGD, lr=0.1)
    expect(RuntimeError, z.state_dict, "consolidate_state_dict")


def test_rendezvous_port_rules():
    from dopt import _launch
    alone = _launch.Launch("alone", 0, 1, 0, 1)
    os.environ["DOPT_MASTER_PORT"] = "40123"
    try:
        assert _launch.meet(alone, "pg").port == 40123
        assert _launch.meet(alone, "pg", master_port=40999).port == 40999
    finally:
        del os.environ["DOPT_MASTER_PORT"]
    launched = _launch.Launch("torchrun", 0, 2, 0, 2)
    launched.master_port = 29511
    assert _launch.meet(launched, "pg").port == 29512, "without a torch store: MASTER_PORT + 1"


def test_partial_launch_environment_is_an_error():
    from dopt import _launch
    saved = {k: os.environ.pop(k, None) for k in ("RANK", "WORLD_SIZE")}
    try:
        os.environ["WORLD_SIZE"] = "2"
        expect(ValueError, _launch.current, "WORLD_SIZE is set but RANK is not")
        expect(ValueError, _launch.current, "torch.distributed.init_process_group")
        del os.environ["WORLD_SIZE"]
        os.environ["RANK"] = "1"
        expect(ValueError, _launch.current, "RANK is set but WORLD_SIZE is not")
        os.environ["WORLD_SIZE"] = "1"
        expect(ValueError, _launch.current, "outside [0, WORLD_SIZE=1)")
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v
    assert _launch.current().source == "alone"


def test_torch_usage_dopt_kernels_accept():
    """What torch accepts and dopt's kernels used to refuse or garble (a
    review as a PyTorch user): a group's own keys, a sparse gradient named,
    channels_last parameters under ZeRO, torchrun's variables without an
    address."""
    w, b = torch.randn(4, 3, requires_grad=True), torch.randn(4, requires_grad=True)
    o = dopt.optim.Adam([{"params": [w], "name": "weights", "lr_scale": 2.0}, {"params": [b]}], lr=0.1)
    assert o.param_groups[0]["name"] == "weights" and o.param_groups[0]["lr_scale"] == 2.0
    sched = torch.optim.lr_scheduler.StepLR(o, 1)
    w.grad, b.grad = torch.ones(4, 3), torch.ones(4)
    o.step()
    sched.step()
    assert "initial_lr" in o.param_groups[0] and o.state_dict()["param_groups"][0]["name"] == "weights"
    z = dopt.ZeroRedundancyOptimizer([{"params": [w], "name": "weights"}], torch.optim.Adam, lr=0.1)
    assert z.uses_dopt_kernels and z.param_groups[0]["name"] == "weights"
    emb = torch.nn.Embedding(10, 3, sparse=True)
    sparse_opt = dopt.optim.SGD(emb.parameters(), lr=0.1)
    emb(torch.tensor([1, 2])).sum().backward()
    expect(dopt.NotSupportedError, sparse_opt.step, "has a torch.sparse_coo gradient")
    conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    ref = copy.deepcopy(conv)
    expect(ValueError, lambda: dopt.optim.SGD(conv.parameters(), lr=0.1), "parameter 0 of group 0 (shape (4, 3, 3, 3)")
    zc = dopt.ZeroRedundancyOptimizer(conv.parameters(), torch.optim.SGD, lr=0.1)
    tc = torch.optim.SGD(ref.parameters(), lr=0.1)
    assert not zc.uses_dopt_kernels, "non-contiguous parameters: torch's class steps the shard"
    x = torch.randn(1, 3, 5, 5)
    for m in (conv, ref):
        m(x).sum().backward()
    zc.step()
    tc.step()
    assert same(list(conv.parameters()), list(ref.parameters()))
    from dopt import _launch
    saved = {k: os.environ.pop(k, None) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    try:
        os.environ.update(RANK="1", WORLD_SIZE="2")
        expect(ValueError, _launch.current, "MASTER_ADDR and MASTER_PORT are not")
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        expect(ValueError, _launch.current, "MASTER_PORT is not")
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


def test_world_of_one_is_announced():
    """Started alone, dopt says that its world is this process alone (an
    mp.spawn script that forgot torch's init_process_group must not run
    silently as N worlds of one), and follows torch once it is initialised."""
    import subprocess
    import tempfile
    script = (
        "import os, torch, torch.distributed as dist, dopt\n"
        "z = dopt.ZeroRedundancyOptimizer([torch.zeros(4, requires_grad=True)], torch.optim.SGD, lr=0.1)\n"
        "assert z.world_size == 1\n"
        "d = os.environ['WORK']\n"
        "dist.init_process_group('gloo', init_method='file://' + d + '/init', rank=0, world_size=1)\n"
        "assert dopt.get_world() is not None and dopt.distributed._world_torch_group is not None\n"
        "print('followed torch')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    with tempfile.TemporaryDirectory() as d:
        env["WORK"] = d
        r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "dopt's world is this process alone" in r.stderr and "init_process_group" in r.stderr, r.stderr
    assert "followed torch" in r.stdout, r.stdout


def test_meeting_through_a_store_is_bounded():
    """A rank that never comes is a dopt.TimeoutError naming it, not torch's 30-minute store wait."""
    import tempfile
    import time
    import torch.distributed as dist
    from dopt import _launch
    with tempfile.TemporaryDirectory() as d:
        launch = _launch.Launch("torch", 0, 2, store=dist.FileStore(d + "/store", 2))
        t0 = time.time()
        expect(dopt.TimeoutError, lambda: _launch.meet(launch, "pg-test", timeout=1), "rank 1 (for pg-test) did not arrive")
        assert time.time() - t0 < 10


def test_non_floating_parameters_are_skipped():
    """An int64 tensor among the parameters stays in the groups (torch's
    numbering) and is never stepped, as torch's optimizers do."""
    def params(seed):
        g = torch.Generator().manual_seed(seed)
        return [torch.randn(3, generator=g).requires_grad_(), torch.arange(4), torch.randn(2, generator=g).requires_grad_()]
    ours, theirs = params(1), params(1)
    o, t = dopt.optim.Adam(ours, lr=0.1), torch.optim.Adam(theirs, lr=0.1)
    for step in range(3):
        for ps in (ours, theirs):
            ps[0].grad, ps[2].grad = torch.full((3,), float(step + 1)), torch.ones(2)
        o.step()
        t.step()
    assert same(ours, theirs)
    sd, st = o.state_dict(), t.state_dict()
    assert sorted(sd["state"]) == sorted(st["state"]) == [0, 2], (sorted(sd["state"]), sorted(st["state"]))
    assert sd["param_groups"][0]["params"] == st["param_groups"][0]["params"] == [0, 1, 2]
    again = dopt.optim.Adam(params(1), lr=0.1)
    again.load_state_dict(st)
    assert torch.equal(again.state_dict()["state"][2]["exp_avg"], st["state"][2]["exp_avg"])
    z = dopt.ZeroRedundancyOptimizer(params(2), torch.optim.Adam, lr=0.1)
    assert not z.uses_dopt_kernels, "a non-floating parameter: torch's class steps the shard"


def test_duplicate_parameter_is_refused():
    p = torch.zeros(3, requires_grad=True)
    q = torch.zeros(2, requires_grad=True)
    expect(ValueError, lambda: dopt.optim.SGD([p, q, p], lr=0.1), "parameter 2 (shape (3,), torch.float32) is the same")
    expect(ValueError, lambda: dopt.ZeroRedundancyOptimizer([p, p], torch.optim.SGD, lr=0.1), "same tensor")
    expect(ValueError, lambda: dopt.optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1),
           "more than one parameter group")


class _HalfStep(torch.optim.SGD):
    """A user's subclass of torch's SGD: dopt must not take it for SGD."""

    def step(self, closure=None, scale=1.0):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    p.grad.mul_(scale)
        return super().step(closure)


def test_zero_takes_any_optimizer_class():
    ours, theirs = make_params(torch.float32), make_params(torch.float32)
    z = dopt.ZeroRedundancyOptimizer(ours, optimizer_class=_HalfStep, lr=0.1, momentum=0.9)
    t = _HalfStep(theirs, lr=0.1, momentum=0.9)
    assert not z.uses_dopt_kernels and isinstance(z, dopt.ZeroRedundancyOptimizer)
    assert isinstance(z, torch.optim.Optimizer)
    before = [p.detach().clone() for p in ours]
    for step in range(3):
        for ps in (ours, theirs):
            for p, g in zip(ps, grads_for(ps, step)):
                p.grad = g
        z.step(scale=0.5)
        t.step(scale=0.5)
    assert same(ours, theirs) and not same(ours, before)
    assert z.param_groups[0]["momentum"] == 0.9 and "dampening" in z.param_groups[0], z.param_groups[0]
    z.consolidate_state_dict(0)
    sd = z.state_dict()
    assert sd["state"].keys() == t.state_dict()["state"].keys() == {0, 1, 2, 3}
    kp = make_params(torch.float32)
    k = dopt.ZeroRedundancyOptimizer(kp, optimizer_class=torch.optim.SGD, lr=0.1, momentum=0.9)
    assert k.uses_dopt_kernels
    k.load_state_dict(sd)
    assert torch.equal(k.optim.state[kp[0]]["momentum_buffer"], sd["state"][0]["momentum_buffer"])
    assert [tuple(p.shape) for p in k.optim.param_groups[0]["params"]] == [(3, 4), (7,), (5,), (1,)], \
        "zero.optim holds its parameters in torch's order (by decreasing size)"
    assert type(k).__name__ == type(z).__name__ == "ZeroRedundancyOptimizer"
    assert k.defaults == {"lr": 0.1, "momentum": 0.9}, k.defaults  # torch's ZeRO: the keyword arguments given
    f = dopt.ZeroRedundancyOptimizer(make_params(torch.float32), optimizer_class=torch.optim.Adam, lr=0.1,
                                     foreach=True)
    assert not f.uses_dopt_kernels, "foreach=True: torch's Adam steps the shard"


def test_zero_step_async_equals_step():
    if not dopt.is_initialized():
        dopt.init_process_group()  # not launched: a world of one on a free port
    ours, theirs = make_params(torch.float32), make_params(torch.float32)
    a = dopt.ZeroRedundancyOptimizer(ours, torch.optim.Adam, lr=0.1)
    b = dopt.ZeroRedundancyOptimizer(theirs, torch.optim.Adam, lr=0.1)
    for step in range(3):
        for ps in (ours, theirs):
            for p, g in zip(ps, grads_for(ps, step)):
                p.grad = g
        a.step()
        f = b.step_async()
        f.wait()
        assert f.done()
    assert same(ours, theirs), "step_async differs from step"
    assert b._c.step_count == a._c.step_count == 3
    z = dopt.ZeroRedundancyOptimizer(make_params(torch.float32), optimizer_class=_HalfStep, lr=0.1)
    expect(dopt.NotSupportedError, z.step_async, "uses_dopt_kernels")


def main():
    torch.set_num_threads(1)
    failed = 0
    tests = [v for k, v in globals().items() if k.startswith("test_")]
    for t in tests:
        try:
            t()
            print(f"test_local: PASS {t.__name__}", flush=True)
        except Exception:
            failed += 1
            print(f"test_local: FAIL {t.__name__}\n{traceback.format_exc()}", flush=True)
    print(f"test_local: {len(tests) - failed}/{len(tests)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
