"""``python3 -m dopt.run`` (installed as ``dopt-torchrun``): torch's own
launcher (``torch.distributed.run``, i.e. torchrun) with its arguments, its
rendezvous and its output, mended where torch 1.13 fails on Python 3.11.

    python3 -m dopt.run --nproc_per_node 2 train.py

torch 1.13's launcher reads ``--redirects`` and ``--tee`` (default "0") with
an enum lookup that Python 3.11 changed: "0" and "3" are no longer found, so
a plain ``torchrun`` dies with ``AttributeError: 'NoneType' object has no
attribute 'get'`` unless given ``--redirects 1 --tee 1`` (which sends the
workers' output through log files). Here the values are looked up by number
again, so the defaults work and the workers write to the console as usual.
On a torch or Python without that bug nothing is changed.
"""
import sys


def mend_std_lookup():
    """Makes torch's Std.from_str find every value (0..3) on Python 3.11+.
    Returns whether it had to."""
    try:
        from torch.distributed.elastic.multiprocessing import api
    except ImportError:
        return False
    std = api.Std
    if std.from_str("0") is not None and std.from_str("3") is not None:
        return False
    original = std.from_str

    def from_str(vm):
        got = original(vm)
        if got is None:
            return std(int(vm))
        if isinstance(got, dict) and None in got.values():
            return {int(i): std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
        return got

    std.from_str = staticmethod(from_str)
    return True


def main(argv=None):
    mend_std_lookup()
    from torch.distributed import run
    run.main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
