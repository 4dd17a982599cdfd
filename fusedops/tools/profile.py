"""torch.profiler for a model step: top ops by self time, launches per step, peak memory, trace.

    python -m fusedops.profile [--model predictor|gpt2|bert|vit] [--device cpu] [--quick] [--swap]

Everything is read from the Chrome trace torch.profiler exports (parse_trace), not from
key_averages(): the trace's event categories and "External id" links are the same from torch 2.4
to 2.14, while the FunctionEvent attributes were renamed (self_cuda_time_total ->
self_device_time_total, is_cuda -> device_type, ...). One parser serves live runs and recorded
traces alike.

- GPU: an op's self device time is the duration of the kernels (and memcpy/memset) it launched
  itself; a kernel belongs to the cpu_op whose "External id" it carries or, lacking one, to the
  innermost cpu_op around the launch call its "correlation" names. Step time is the busy
  device time per step. Launches are kernels per step.
- CPU (and MPS, whose kernels the profiler does not see): an op's self time is its duration less
  that of the ops nested in it; step time is the wall time of the step's range; "launches" are
  the top-level aten op calls per step.
- Labels: record_function ranges named LABEL + name (see labelled()) collect the time of what runs
  inside them, e.g. each module fusedops.swap would replace, for the Amdahl shares.
- Peak memory: the largest "Total Allocated" of the device's [memory] events, less what was
  allocated when profiling began.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gzip
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

import fusedops

STEP = "fusedops.step"  # the record_function range around each profiled step
LABEL = "fusedops.label::"  # prefix of labelled ranges
_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")  # device activity, lower case
_DEVICE_TYPE = {"cpu": 0, "cuda": 1}  # [memory] events' "Device Type"


@dataclass
class OpTime:
    name: str
    self_us: float  # per step
    calls: float  # per step


@dataclass
class Profile:
    """One profiled workload, every time per step (averaged over `steps`)."""

    device: str  # "gpu": self time is device time; "cpu": host wall time
    steps: int
    step_us: float
    launches: float  # kernels per step (gpu), top-level op calls per step (cpu)
    peak_bytes: int
    ops: list[OpTime]  # by self time, largest first
    labels: dict[str, float] = field(default_factory=dict)  # label -> µs per step
    trace: str | None = None

    def to_dict(self) -> dict:
        return asdict(self) | {"launch_kind": self.launch_kind}

    @property
    def launch_kind(self) -> str:
        return "kernel launches" if self.device == "gpu" else "top-level op calls"


def _load(trace: str | Path | dict) -> list[dict]:
    if isinstance(trace, dict):
        return trace["traceEvents"]
    path = Path(trace)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _nest(events: list[dict]) -> dict[int, list[dict]]:
    """Parents of every host range event (by id()), innermost first, from the nesting of the
    ranges on each thread."""
    by_thread = collections.defaultdict(list)
    for e in events:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    parents = {}
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict] = []
        for e in evs:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] < e["ts"] + e["dur"] - 1e-3:
                stack.pop()
            parents[id(e)] = stack[::-1]
            stack.append(e)
    return parents


def parse_trace(trace: str | Path | dict, device_type: str = "cpu") -> Profile:
    """A Profile from a torch.profiler Chrome trace (a path, .json or .json.gz, or its dict).

    Steps are the STEP ranges in it; device_type ("cpu", "cuda", "mps") picks the memory events
    counted. Whether times are device or host times follows from the trace: device when it holds
    kernel events.
    """
    events = [e for e in _load(trace) if isinstance(e, dict)]
    host = [
        e
        for e in events
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in ("cpu_op", "user_annotation")
    ]
    device = [
        e
        for e in events
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in _DEVICE_CATS and "dur" in e
    ]
    launches_on_host = [
        e
        for e in events
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in ("cuda_runtime", "cuda_driver")
    ]
    steps = [e for e in host if e["name"] == STEP]
    if not steps:
        raise ValueError(f"parse_trace: no '{STEP}' range in the trace: nothing to measure")
    parents = _nest(host + launches_on_host)
    # By time, not by nesting: the backward pass may run on another thread (autograd's).
    spans = [(s["ts"], s["ts"] + s["dur"]) for s in steps]
    in_step = [
        e
        for e in host
        if e["name"] != STEP
        and any(a - 1e-3 <= e["ts"] and e["ts"] + e["dur"] <= b + 1e-3 for a, b in spans)
    ]
    ops = [e for e in in_step if str(e["cat"]).lower() == "cpu_op"]
    parent_op = {
        id(e): next((p for p in parents[id(e)] if str(p["cat"]).lower() == "cpu_op"), None)
        for e in ops
    }
    self_us: dict[str, float] = collections.Counter()
    calls: dict[str, int] = collections.Counter()
    labels: dict[str, float] = collections.Counter()
    for e in ops:
        # An op that redispatches to itself (autograd kernel -> backend kernel) is one call.
        if parent_op[id(e)] is None or parent_op[id(e)]["name"] != e["name"]:
            calls[e["name"]] += 1

    def label_of(e: dict) -> str | None:
        chain = [e, *parents[id(e)]]
        return next((p["name"][len(LABEL) :] for p in chain if p["name"].startswith(LABEL)), None)

    if device:
        by_ext = {e["args"]["External id"]: e for e in ops if "External id" in e.get("args", {})}
        by_correlation = {
            e["args"]["correlation"]: e for e in launches_on_host if "correlation" in e["args"]
        }
        in_steps = {id(e) for e in ops}
        busy = 0.0
        launches = 0
        for k in device:
            args = k.get("args", {})
            op = by_ext.get(args.get("External id"))
            if op is None and (call := by_correlation.get(args.get("correlation"))) is not None:
                # No op id on the kernel: the op is the innermost one around its launch call.
                op = next((p for p in parents[id(call)] if str(p["cat"]).lower() == "cpu_op"), None)
                op = op if op is not None and id(op) in in_steps else None
            if op is None:  # outside the steps (warm-up, profiler start) or unattributed
                continue
            busy += k["dur"]
            launches += str(k["cat"]).lower() == "kernel"
            self_us[op["name"]] += k["dur"]
            if (name := label_of(op)) is not None:
                labels[name] += k["dur"]
        kind, step_total = "gpu", busy
    else:
        children = collections.Counter()
        for e in ops:
            if (parent := parent_op[id(e)]) is not None:
                children[id(parent)] += e["dur"]
        for e in ops:
            self_us[e["name"]] += e["dur"] - children[id(e)]
        for e in in_step:
            if e["name"].startswith(LABEL):  # outermost labelled range only: no double count
                if not any(p["name"].startswith(LABEL) for p in parents[id(e)]):
                    labels[e["name"][len(LABEL) :]] += e["dur"]
        launches = sum(parent_op[id(e)] is None for e in ops)
        kind, step_total = "cpu", sum(s["dur"] for s in steps)
    n = len(steps)
    table = [OpTime(name, us / n, calls[name] / n) for name, us in self_us.items()]
    table.sort(key=lambda o: -o.self_us)
    return Profile(
        device=kind,
        steps=n,
        step_us=step_total / n,
        launches=launches / n,
        peak_bytes=_peak_bytes(events, device_type),
        ops=table,
        labels={k: v / n for k, v in labels.items()},
        trace=None if isinstance(trace, dict) else str(trace),
    )


def _peak_bytes(events: list[dict], device_type: str) -> int:
    want = _DEVICE_TYPE.get(device_type)
    mem = [
        e["args"]
        for e in events
        if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == want
    ]
    if not mem:
        return 0
    mem.sort(key=lambda a: a.get("Ev Idx", 0))
    start = mem[0]["Total Allocated"] - mem[0]["Bytes"]
    return max(a["Total Allocated"] for a in mem) - start


@contextlib.contextmanager
def labelled(modules: Iterable[tuple[str, torch.nn.Module]]):
    """Wrap each (name, module)'s forward in a record_function range LABEL + name (hooks, removed
    on exit), so the profile charges what runs inside it to that name."""
    open_ranges: dict[int, list] = collections.defaultdict(list)
    handles = []

    def enter(name):
        def hook(module, args):
            rf = torch.autograd.profiler.record_function(LABEL + name)
            rf.__enter__()
            open_ranges[id(module)].append(rf)

        return hook

    def leave(module, args, output):
        open_ranges[id(module)].pop().__exit__(None, None, None)

    try:
        for name, m in modules:
            handles.append(m.register_forward_pre_hook(enter(name)))
            handles.append(m.register_forward_hook(leave))
        yield
    finally:
        for h in handles:
            h.remove()


def profile(
    step: Callable[[], object],
    device: torch.device,
    trace: str | Path,
    steps: int = 3,
    warmup: int = 2,
    labels: Iterable[tuple[str, torch.nn.Module]] = (),
    progress: Callable[[Iterable, str], Iterable] | None = None,
    desc: str = "profile",
) -> Profile:
    """Run step() `warmup` times, then `steps` times under torch.profiler (shapes and memory
    recorded, each step in a STEP range, labels as in labelled()); write the Chrome trace to
    `trace` and return its parse."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    else:
        # torch's profiler backend logs every session's start and stop and, in a CUDA build on a
        # machine without a GPU, a failed GPU query: noise in a CPU profile's output (a user's
        # own KINETO_LOG_LEVEL wins; read once, at the process's first profile).
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    rounds = range(warmup + steps)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    it = iter(progress(rounds, desc) if progress else rounds)
    for _ in range(warmup):
        next(it)
        step()
    sync()
    with labelled(labels):
        with torch_profile(activities=activities, record_shapes=True, profile_memory=True) as p:
            for _ in it:
                with torch.autograd.profiler.record_function(STEP):
                    step()
                sync()
    Path(trace).parent.mkdir(parents=True, exist_ok=True)
    p.export_chrome_trace(str(trace))
    return parse_trace(trace, device.type)


def amdahl(parts: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """Amdahl's law over primitives: parts are (f, s), the share f of step time a primitive takes
    and its speedup s. Returns (predicted speedup 1 / ((1 - sum f) + sum f / s), ceiling
    1 / (1 - sum f), what infinitely fast primitives would give; inf when sum f is 1)."""
    parts = list(parts)
    for f, s in parts:
        if not (0 <= f <= 1 and s > 0):
            raise ValueError(f"amdahl: need 0 <= f <= 1 and s > 0, got f={f}, s={s}")
    total = sum(f for f, _ in parts)
    if total > 1 + 1e-9:
        raise ValueError(f"amdahl: the shares add up to {total:.4f} > 1")
    rest = max(0.0, 1 - total)
    predicted = 1 / (rest + sum(f / s for f, s in parts))
    return predicted, (1 / rest if rest > 0 else float("inf"))


def table(prof: Profile, top: int = 12) -> str:
    """The top ops by self time per step as text, with the step's totals."""
    what = "self device time" if prof.device == "gpu" else "self CPU time"
    head = f"{'op':<48} {'µs/step':>10} {'%':>6} {'calls':>6}"
    lines = [f"top ops by {what} (per step, {prof.steps} steps profiled)", head]
    for o in prof.ops[:top]:
        pct = 100 * o.self_us / prof.step_us if prof.step_us else 0.0
        lines.append(f"{o.name[:48]:<48} {o.self_us:>10.1f} {pct:>6.1f} {o.calls:>6.0f}")
    lines.append(
        f"step {prof.step_us:.1f} µs, {prof.launches:.0f} {prof.launch_kind}, "
        f"peak memory +{prof.peak_bytes / 2**20:.1f} MiB"
    )
    return "\n".join(lines)


def main(argv=None) -> None:
    from fusedops.tools import demo

    ap = argparse.ArgumentParser(
        prog="python -m fusedops.profile", description=__doc__.splitlines()[0]
    )
    demo.add_workload_args(ap)
    ap.add_argument("--out", help="output folder (default: fusedops-demo/run-<UTC time>)")
    ap.add_argument("--swap", action="store_true", help="profile the model after fusedops.swap")
    args = ap.parse_args(argv)
    device, dtype = demo.resolve_device(args.device, args.dtype)
    out = demo.output_folder(args.out)
    work = demo.workload(args.model, device, dtype, args.quick, Path(args.cache))
    if args.swap:
        print(fusedops.swap(work.model), flush=True)
    for phase, step in (("inference", work.infer_step), ("training", work.train_step)):
        prof = profile(step, device, out / f"trace-{phase}.json", progress=demo.progress)
        print(f"\n{phase}: trace {prof.trace}\n{table(prof)}", flush=True)


if __name__ == "__main__":
    main()
