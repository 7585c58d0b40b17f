"""Keep the database records whose kernel a code change left as it was: give them today's code stamp.

    python tools/restamp_records.py tuning_logs/cuda-sm90 --since REV --report r.json   # compare only
    python tools/restamp_records.py tuning_logs/cuda-sm90 --from-report r.json --write  # rewrite from that
    python tools/restamp_records.py tuning_logs/cuda-sm90 --since REV --write           # both in one go
    python tools/restamp_records.py tuning_logs/cuda-sm90 --since REV --only 'gemm_mn' --write   # those tasks only
    python tools/restamp_records.py tuning_logs/cuda-sm90 --since REV --set knobs.TILE_TAKEOVER=32 --write
    python tools/restamp_records.py DB --since REV --since-package OLD --jobs 8 --report r.json  # 16 cores, no git

Every record carries the hash of its space's kernel modules (schedules/code_version.py), so any edit there
makes all of that space's records stale, also where the edit changed no kernel a record timed (e.g. which token
buckets a kernel dispatches to). A record's knobs are indices into its task's candidate lists; records older than
the lists stored in their template (`wide.choices`) are decoded with REV's lists, and re-stamped ones keep them, so a
later change of a list cannot change what they mean. For each record stamped with REV's code version and not today's, this builds
the record's kernel (its task at its knob values, tuning.space.instantiate) under REV's modules, in a
subprocess run from `git archive REV`, and under today's, and compares their structural hashes. A record whose
kernel is the same TIR gets today's stamp; the others stay stale (wide-compile ignores them, `--prune` drops them).
`--set MODULE.NAME=VALUE` builds today's kernels with a constant of a kernel module (wide_tvm.schedules.MODULE) set
to VALUE (JSON): for a change that only moves a token bound between kernels, set to the value before it, so that a
record is re-stamped if the change is the bound alone. That is only sound where no record was timed at a count
that crosses the bound (the bound's comment says which); likewise for a new kernel path that a constant switches
off (wgmma_stream_k.STREAM_K_PARTS=1) where no record's timed counts take it. Building every record twice takes a
while (31 minutes for 471 CUDA records on this 2-core machine; 670 decode records about an hour, beside other
builds), hence `--report` / `--from-report` (which takes the reports of several `--only` parts; a report names its
records by a key of their workload and JSON, so records appended to the database after it do not move its stamps
onto others), and `--jobs N` with `--since-package` for a machine with more cores: all 1126 current CUDA records
took 12.8 minutes on the H200 host's 16 cores with `--jobs 8`, in three parts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HASHES = r"""
import importlib, json, os, re, sys
import tvm, tvm_ffi
try:
    from wide_tvm.tuning.database import task_records
    from wide_tvm.tuning.space import choices_of, instantiate, knob_values, replayed
    try:
        from wide_tvm.tuning.space import choices_json
    except ImportError:  # before the knobs had names (2026-12-07): positional lists
        choices_json = json.dumps
except ImportError:  # a revision before the tuning subpackage (2026-12-07)
    from wide_tvm.knob_tuning import task_records
    from wide_tvm.schedules.knob_space import choices_of, instantiate, knob_values, replayed
    choices_json = json.dumps
from wide_tvm.schedules.code_version import code_version
for pin in filter(None, os.environ.get("WIDE_RESTAMP_SET", "").split(";")):  # today's build only (kernel_hashes)
    name, value = pin.split("=", 1)
    module, attr = name.rsplit(".", 1)
    try:  # a kernel module, or a module of the package itself (knobs.TILE_TAKEOVER)
        module = "wide_tvm.schedules." + module
        target = importlib.import_module(module)
    except ImportError:
        module = "wide_tvm." + module.rsplit(".", 1)[-1]
        target = importlib.import_module(module)
    if not hasattr(target, attr):
        sys.exit(f"--set {pin}: {module} has no {attr}")
    setattr(target, attr, json.loads(value))
given = json.load(open(sys.argv[3])) if len(sys.argv) > 3 else {}
out, seen = {}, {}
for i, (task, rec) in enumerate(task_records(sys.argv[1])):
    mod = rec.workload.mod
    if str(mod["main"].attrs.get("wide.code", "")) != sys.argv[2]:
        continue
    if not re.search(os.environ.get("WIDE_RESTAMP_ONLY", ""), task.name):
        continue
    seen[task.name] = seen.get(task.name, 0) + 1
    if seen[task.name] > (int(os.environ.get("WIDE_RESTAMP_SAMPLE") or 0) or 10**9):  # --sample: a task's first N
        continue
    lists = None
    if mod["main"].attrs.get("wide.choices") is None:  # decisions index lists that are not stored with them
        if str(i) in given:
            mod = tvm.IRModule({"main": mod["main"].with_attr("wide.choices", given[str(i)])})
        else:
            lists = choices_json(choices_of(mod))  # this code's lists
    values = knob_values(replayed(mod, rec.trace))
    out[i] = [task.space, code_version(task.space), str(tvm_ffi.structural_hash(instantiate(task, values))), lists]
json.dump(out, sys.stdout)
"""


def with_path(package_root: str) -> str:
    """PYTHONPATH with package_root first: its wide_tvm, and whatever else this process finds there (e.g. a TVM
    that PYTHONPATH provides)."""
    return os.pathsep.join(filter(None, (package_root, os.environ.get("PYTHONPATH", ""))))


def kernel_hashes(folder: str, stamp: str, package_root: str | None = None,
                  choices: str | None = None, only: str | None = None) -> subprocess.Popen:
    """A subprocess printing {record index: [space, code version, kernel hash, candidate lists]} of FOLDER's
    records stamped `stamp`, built by the wide_tvm package under package_root (default: the installed one); see
    `collect`. Records that do not store their candidate lists (templates older than `wide.choices`) are decoded
    with the lists of the JSON file `choices` ({record index: lists}) where it has them, else with the package's
    own lists, which are then reported (else None). `only`: a regex of the task names to build (default: the
    WIDE_RESTAMP_ONLY of this process)."""
    env = dict(os.environ)
    if package_root:
        env |= {"PYTHONPATH": with_path(package_root), "WIDE_RESTAMP_SET": ""}
    if only is not None:
        env["WIDE_RESTAMP_ONLY"] = only
    return subprocess.Popen([sys.executable, "-c", HASHES, os.path.abspath(folder), stamp]
                            + ([os.path.abspath(choices)] if choices else []), env=env,
                            cwd=package_root or tempfile.gettempdir(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def task_chunks(folder: str, stamp: str, jobs: int) -> list[str]:
    """Regexes that split FOLDER's tasks with records stamped `stamp` (and matching WIDE_RESTAMP_ONLY) into up to
    `jobs` groups of about equal record counts, one group a pair of builds."""
    from wide_tvm.tuning.database import task_records

    counts: dict[str, int] = {}
    for task, rec in task_records(folder):
        if (str(rec.workload.mod["main"].attrs.get("wide.code", "")) == stamp
                and re.search(os.environ.get("WIDE_RESTAMP_ONLY", ""), task.name)):
            counts[task.name] = counts.get(task.name, 0) + 1
    groups: list[list[str]] = [[] for _ in range(max(1, min(jobs, len(counts))))]
    sizes = [0] * len(groups)
    for name in sorted(counts, key=lambda n: -counts[n]):  # largest first, each into the lightest group
        i = sizes.index(min(sizes))
        groups[i].append(name)
        sizes[i] += counts[name]
    return ["^(" + "|".join(map(re.escape, g)) + ")$" for g in groups if g]


def collect(run: subprocess.Popen, what: str) -> dict:
    out, err = run.communicate()
    if run.returncode:
        raise SystemExit(f"building the records' kernels with {what} failed:\n" + err[-2000:])
    return json.loads(out)


def package_at(rev: str, dest: str) -> str:
    """The wide_tvm package as of git revision `rev`, laid out as pyproject.toml maps it, under dest."""
    os.makedirs(dest, exist_ok=True)
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True).stdout.strip()
    archive = subprocess.run(["git", "-C", root, "archive", rev, "wide_tvm", "schedules", "passes", "frontends"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "x", "-C", dest], input=archive, check=True)
    for sub in ("schedules", "passes", "frontends"):
        os.rename(os.path.join(dest, sub), os.path.join(dest, "wide_tvm", sub))
    return dest


def package_versions(root: str) -> dict[str, str]:
    """Code version per space of the wide_tvm package laid out under `root` (package_at), computed by a process of
    its own: its kernel modules, not the ones this process imported."""
    spaces = ("cpu", "decode", "tile")
    probe = subprocess.run([sys.executable, "-c", "import sys; from wide_tvm.schedules.code_version import "
                            "code_version as c; print(*(c(s) for s in sys.argv[1:]))", *spaces],
                           env=dict(os.environ, PYTHONPATH=with_path(root)), cwd=root, capture_output=True,
                           text=True, check=True).stdout.split()
    return dict(zip(spaces, probe))


def compare(folder: str, since: str, jobs: int = 1, since_package: str | None = None, sample: int = 0
            ) -> tuple[set[int], dict[str, str]]:
    """Indices (task_records order) of FOLDER's records stamped by `since`'s code whose kernel is the same today,
    and the candidate lists of `since`'s code for those records that do not store theirs: a record's decisions are
    indices into the lists it was sampled from, so today's build must decode them with those, not today's. The
    records are split by task over `jobs` pairs of builds run at once. `since_package`: a folder holding `since`'s
    wide_tvm package (package_at's layout) instead of `git archive` (a machine without the repository). `sample`
    N: build only the first N records of each task; a task whose N all build the same kernel has all its records
    count as the same (unsampled_records)."""
    from wide_tvm.schedules.code_version import code_version

    with tempfile.TemporaryDirectory(prefix="wide-restamp-") as tmp:
        old_root = os.path.abspath(since_package) if since_package else package_at(since, tmp)
        old, new, lists = {}, {}, {}
        for space, stamp in package_versions(old_root).items():
            if stamp == code_version(space):
                continue
            # both builds of each chunk at once; today's again with the old lists where some records need them
            # and today's lists differ
            chunks = task_chunks(folder, stamp, jobs)
            runs = [(c, kernel_hashes(folder, stamp, old_root, only=c), kernel_hashes(folder, stamp, only=c))
                    for c in chunks]
            for n, (chunk, before, today) in enumerate(runs):
                found = collect(before, f"{since}'s code")
                now = collect(today, "today's code")
                old |= found
                given = {i: r[3] for i, r in found.items() if r[3] is not None}
                lists |= given
                if any(now[i][3] != v for i, v in given.items()):
                    with open(os.path.join(tmp, f"lists_{space}_{n}.json"), "w") as f:
                        json.dump(given, f)
                    now = collect(kernel_hashes(folder, stamp, choices=f.name, only=chunk), "today's code")
                new |= now
    same = {int(i) for i, r in old.items() if new[i][2] == r[2]}
    print(f"{len(old)} records stamped by {since}'s code: {len(same)} build the same kernel today, "
          f"{len(old) - len(same)} do not; {len(lists)} get their candidate lists stored")
    if sample:
        same |= unsampled_records(folder, old, same)
    for i, (space, *_) in sorted(old.items(), key=lambda kv: int(kv[0])):
        if int(i) not in same:
            print(f"  record {i} ({space}): its kernel changed")
    return same, {i: v for i, v in lists.items() if int(i) in same}


def unsampled_records(folder: str, built: dict, same: set[int]) -> set[int]:
    """Indices of the records `--sample` did not build, of tasks whose every built record kept its kernel: each
    record stamped by a version that `built` holds records of, in a task all of whose built records are in
    `same` (and that matches WIDE_RESTAMP_ONLY). Records whose template does not store its candidate lists are
    left out (their decisions would need the old lists, which only a build reports)."""
    from wide_tvm.tuning.database import task_records

    records = task_records(folder)
    stamps = {str(records[int(i)][1].workload.mod["main"].attrs.get("wide.code", "")) for i in built}
    tasks: dict[str, list[int]] = {}
    for i, (task, rec) in enumerate(records):
        main = rec.workload.mod["main"]
        if (str(main.attrs.get("wide.code", "")) in stamps and main.attrs.get("wide.choices") is not None
                and re.search(os.environ.get("WIDE_RESTAMP_ONLY", ""), task.name)):
            tasks.setdefault(task.name, []).append(i)
    extra = set()
    for name, idx in tasks.items():
        sampled = [i for i in idx if str(i) in built]
        if sampled and all(i in same for i in sampled):
            extra |= {i for i in idx if str(i) not in built}
    print(f"--sample: {len(extra)} more records of tasks whose sampled records all kept their kernel")
    return extra


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder")
    p.add_argument("--since", help="git revision whose kernel code stamped the records")
    p.add_argument("--report", help="write the records that build the same kernel today here (JSON)")
    p.add_argument("--from-report", nargs="+", help="take them from earlier --report files (their union) instead "
                   "of building the kernels")
    p.add_argument("--write", action="store_true", help="rewrite the database with the new stamps")
    p.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE",
                   help="build today's kernels with this constant of wide_tvm.schedules.MODULE (JSON value; see above)")
    p.add_argument("--jobs", type=int, default=1, help="pairs of builds run at once, the records split by task "
                   "(each pair takes two cores)")
    p.add_argument("--since-package", help="a folder with --since's wide_tvm package (package_at's layout), for a "
                   "machine without the repository")
    p.add_argument("--sample", type=int, default=0, help="build only the first N records of each task and count "
                   "a task's other records the same where those N are: for an edit that by its diff leaves a space's "
                   "kernels alone (e.g. code moved out of a module the space hashes), checked on a sample")
    p.add_argument("--only", default="", help="build only the records of the tasks this regex finds (wide-tune's "
                   "task names; e.g. a kernel whose code changed knowingly, whose records are re-tuned instead)")
    args = p.parse_args()
    os.environ["WIDE_RESTAMP_ONLY"] = args.only  # read by the subprocesses that build the kernels
    os.environ["WIDE_RESTAMP_SET"] = ";".join(args.set)  # ... today's only
    os.environ["WIDE_RESTAMP_SAMPLE"] = str(args.sample)
    if args.set and not args.since:
        p.error("--set applies to the builds of --since")
    if bool(args.since) == bool(args.from_report):
        p.error("give --since REV (build and compare) or --from-report FILE")
    import tvm

    from wide_tvm.tuning.database import record_key, rewrite_database, task_records
    from wide_tvm.schedules.code_version import code_version

    records = task_records(args.folder)
    keys = [record_key(rec) for _, rec in records]
    if args.from_report:
        same, lists = set(), {}  # record keys; candidate lists by key
        for path in args.from_report:  # reports of parts (--only) of one database, e.g. run on several machines
            with open(path) as f:
                report = json.load(f)
            if "keys" not in report:
                p.error(f"{path}: a report without record keys (written before they existed): run --report again")
            same |= {report["keys"][str(i)] for i in report["same"]}
            lists |= {report["keys"][i]: v for i, v in report.get("lists", {}).items()}
        missing = same - set(keys)
        if missing:
            p.error(f"{len(missing)} records of the report are not in {args.folder} (another database, or changed "
                    "since the report was written)")
    else:
        found, found_lists = compare(args.folder, args.since, args.jobs, args.since_package, args.sample)
        same, lists = {keys[i] for i in found}, {keys[int(i)]: v for i, v in found_lists.items()}
        if args.report:
            with open(args.report, "w") as f:
                json.dump({"folder": args.folder, "since": args.since, "same": sorted(found), "lists": found_lists,
                           "keys": {str(i): keys[i] for i in sorted(found)}}, f)
    if not args.write:
        return 0
    rewritten = []
    for key, (task, rec) in zip(keys, records):
        mod = rec.workload.mod
        if key in same:
            func = mod["main"].with_attr("wide.code", code_version(task.space))
            if key in lists:  # the lists its decisions index, from the code that stamped it
                func = func.with_attr("wide.choices", lists[key])
            mod = tvm.IRModule({"main": func})
        rewritten.append((mod, rec))
    rewrite_database(args.folder, rewritten)
    print(f"rewrote {args.folder}: {len(same)} records re-stamped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
