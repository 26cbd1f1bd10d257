#!/usr/bin/env python3
"""Mutation testing of relay's pure-Python modules with Cosmic Ray (issue #24).

Every run works on throw-away copies of the tree in a temporary directory (the
tracked and untracked, not-ignored files plus the compiled extensions built in
place by ``pip install -e``), so the working tree is never modified, even if the
run is interrupted; the copies are removed on exit. A module that is itself
compiled from its .py (Cython's pure Python mode, e.g. relay/server/room.py with
relay/server/room.pxd) is copied without its extension, so the mutated source is what
imports and runs.

For each module it:
  1. copies the tree, writes a Cosmic Ray config for that module whose test
     command runs only the module's test files (tools/mutation.toml) with
     ``pytest -x``, and runs ``cosmic-ray init``;
  2. runs the test command once unmutated (the baseline; it must pass) and sets
     the per-mutant timeout from its duration;
  3. keeps all mutants or a seeded random sample (``--sample N``), marking the
     others skipped in the session database;
  4. runs ``cosmic-ray exec`` (in ``--jobs`` copies at once, each with its share);
  5. prints mutants, killed, survived, timeouts, the score and every surviving
     mutant (file:line, operator, the change), PASS/FAIL against the threshold.

Survivors listed in tools/mutation_equivalent.toml (file, the line's code, column,
operator, why) are reported as equivalent and left out of the score.

    python tools/mutation.py                           # every configured module
    python tools/mutation.py --module relay/server/room.py    # one module
    python tools/mutation.py --changed                 # modules touched since HEAD~1
    python tools/mutation.py --changed origin/main --sample 60 --jobs 2

Exit status: 0 if every module measured reaches the threshold, 1 if one does
not, 2 on a usage or baseline error.
"""

from __future__ import annotations

import argparse
import ast
import importlib.machinery
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = Path(__file__).resolve().parent / "mutation.toml"
EQUIVALENT = Path(__file__).resolve().parent / "mutation_equivalent.toml"
COMPILED_DIRS = ("relay", "relay_core")


def load_config(path: Path = CONFIG) -> tuple[dict, dict[str, list[str]]]:
    data = tomllib.loads(path.read_text())
    settings = data.get("settings", {})
    modules = {name: list(entry["tests"]) for name, entry in data["modules"].items()}
    return settings, modules


def load_equivalent(path: Path = EQUIVALENT) -> list[dict]:
    if not path.exists():
        return []
    entries = tomllib.loads(path.read_text()).get("equivalent", [])
    for entry in entries:
        missing = {"file", "code", "operator", "why"} - entry.keys()
        if missing:
            raise SystemExit(f"{path}: entry {entry} lacks {sorted(missing)}")
    return entries


def changed_modules(rev: str, modules: list[str]) -> list[str]:
    """The configured modules that ``git diff --name-only REV`` reports (working tree vs REV)."""
    out = subprocess.run(
        ["git", "diff", "--name-only", rev, "--"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.split()
    touched = set(out)
    return [m for m in modules if m in touched]


def changed_lines(rev: str, module: str) -> set[int]:
    """Line numbers (in the working tree's file) that ``git diff -U0 REV`` adds or changes."""
    out = subprocess.run(["git", "diff", "-U0", rev, "--", module],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    lines: set[int] = set()
    for m in re.finditer(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", out, re.M):
        start, count = int(m.group(1)), int(m.group(2) or 1)
        lines.update(range(start, start + count))
    return lines


def tree_files() -> list[str]:
    """Tracked and untracked (not ignored) files, plus the in-place compiled extensions."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    files = [f for f in listed if f and (ROOT / f).is_file()]
    for d in COMPILED_DIRS:
        files += [str(p.relative_to(ROOT)) for p in (ROOT / d).rglob("*.so")]
    return sorted(set(files))


def without_extension_of(module: str, files: list[str]) -> list[str]:
    """``files`` less the compiled extension built from ``module`` (``relay/server/room.py`` ->
    ``relay/server/room.cpython-311-x86_64-linux-gnu.so``): Python imports an extension before the
    source next to it, so a copy that kept it would test the unmutated build."""
    stem = module.removesuffix(".py")
    built = {stem + suffix for suffix in importlib.machinery.EXTENSION_SUFFIXES}
    return [f for f in files if f not in built]


def copy_tree(dest: Path, files: list[str]) -> None:
    for f in files:
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, target)


def test_command(tests: list[str]) -> str:
    # -p no:cacheprovider: no .pytest_cache churn; -x: the first failure kills the mutant.
    return " ".join(
        [shlex.quote(sys.executable), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
        + [shlex.quote(t) for t in tests]
    )


def cosmic_ray_config(module: str, command: str, timeout: float) -> str:
    return (
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(module)}\n"
        f"timeout = {timeout:.1f}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(command)}\n"
        "\n[cosmic-ray.distributor]\n"
        'name = "local"\n'
    )


def cosmic_ray(args: list[str], cwd: Path, env: dict) -> None:
    exe = Path(sys.executable).with_name("cosmic-ray")
    cmd = [str(exe) if exe.exists() else "cosmic-ray"] + args
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")


@dataclass
class Mutant:
    job_id: str
    file: str
    line: int
    column: int
    operator: str
    occurrence: int
    outcome: str = ""          # killed | survived | timeout | incompetent | error | no-test
    change: str = ""
    why: str = ""              # set when the survivor is in the equivalent list

    def key(self):
        return (self.file, self.line, self.column, self.operator, self.occurrence)


@dataclass
class ModuleResult:
    module: str
    total: int = 0
    eligible: int = 0
    mutants: list[Mutant] = field(default_factory=list)
    baseline_s: float = 0.0
    elapsed_s: float = 0.0
    in_annotations: int = 0     # mutants inside never-evaluated annotations: not run

    def count(self, outcome: str) -> int:
        return sum(1 for m in self.mutants if m.outcome == outcome)

    @property
    def scored(self) -> int:
        # every tested mutant except the equivalent ones and those that could not run
        return sum(1 for m in self.mutants if m.outcome in ("killed", "timeout", "survived"))

    @property
    def killed_or_timeout(self) -> int:
        return self.count("killed") + self.count("timeout")

    @property
    def score(self) -> float:
        return 100.0 * self.killed_or_timeout / self.scored if self.scored else 100.0


def change_of(diff: str) -> str:
    """'old -> new' from a unified diff (the first removed and added lines)."""
    old = new = ""
    for line in (diff or "").splitlines():
        if line.startswith("---") or line.startswith("+++"):
            continue
        if line.startswith("-") and not old:
            old = line[1:].strip()
        elif line.startswith("+") and not new:
            new = line[1:].strip()
    return f"{old}  ->  {new}"


def equivalent_entry(m: "Mutant", entries: list[dict], source: list[str]) -> dict | None:
    """The entry of tools/mutation_equivalent.toml that explains survivor ``m`` (same file,
    operator, the text of its line and, if the entry gives one, column), or None."""
    code = source[m.line - 1].strip()
    for e in entries:
        if (e["file"] == m.file and e["operator"] == m.operator and e["code"] == code
                and int(e.get("column", m.column)) == m.column):
            return e
    return None


def annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) positions, as (line, column), of every annotation in a module that has
    ``from __future__ import annotations``: they are never evaluated, so a mutant there cannot
    change behaviour and is not run. Empty for a module without that import."""
    tree = ast.parse(source)
    future = any(isinstance(node, ast.ImportFrom) and node.module == "__future__"
                 and any(alias.name == "annotations" for alias in node.names)
                 for node in tree.body)
    if not future:
        return []
    spans = []
    for node in ast.walk(tree):
        annotations = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            annotations.append(node.returns)
        elif isinstance(node, ast.arg):
            annotations.append(node.annotation)
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        spans += [((a.lineno, a.col_offset), (a.end_lineno, a.end_col_offset))
                  for a in annotations if a is not None]
    return spans


def in_annotation(m: "Mutant", spans) -> bool:
    return any(start <= (m.line, m.column) < end for start, end in spans)


def run_module(module: str, tests: list[str], settings: dict, args, equivalent: list[dict],
               files: list[str]) -> ModuleResult:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    result = ModuleResult(module)
    started = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="relay-mutation-"))
    try:
        copies = [base / f"tree{i}" for i in range(max(1, args.jobs))]
        for c in copies:
            copy_tree(c, without_extension_of(module, files))
        env = dict(os.environ)
        # The copy's packages come first: the editable install's finder would
        # otherwise import relay/relay_core from the working tree.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, ["{tree}", env.get("PYTHONPATH", "")]))
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        command = test_command(tests)

        # Baseline: the tests must pass on the unmutated copy.
        first = copies[0]
        t0 = time.monotonic()
        proc = subprocess.run(shlex.split(command), cwd=first,
                              env={**env, "PYTHONPATH": env["PYTHONPATH"].replace("{tree}", str(first))},
                              capture_output=True, text=True)
        result.baseline_s = time.monotonic() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"baseline failed for {module}:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
        timeout = max(float(settings.get("min_timeout", 30)),
                      float(settings.get("timeout_factor", 3)) * result.baseline_s)

        cfg_text = cosmic_ray_config(module, command, timeout)
        for c in copies:
            (c / "mutation-session.toml").write_text(cfg_text)
        first_env = {**env, "PYTHONPATH": env["PYTHONPATH"].replace("{tree}", str(first))}
        cosmic_ray(["init", "mutation-session.toml", "session.sqlite"], first, first_env)

        exclude = [re.compile(p) for p in settings.get("exclude_operators", [])]
        with use_db(str(first / "session.sqlite"), WorkDB.Mode.open) as db:
            items = list(db.work_items)
        mutants = {}
        for item in items:
            spec = item.mutations[0]
            mutants[item.job_id] = Mutant(item.job_id, module, spec.start_pos[0], spec.start_pos[1],
                                          spec.operator_name, spec.occurrence)
        result.total = len(mutants)
        spans = annotation_spans((ROOT / module).read_text())
        result.in_annotations = sum(in_annotation(m, spans) for m in mutants.values())
        eligible = sorted((m for m in mutants.values()
                           if not any(p.search(m.operator) for p in exclude)
                           and not in_annotation(m, spans)), key=Mutant.key)
        if args.changed and args.changed_lines:
            touched = changed_lines(args.changed, module)
            eligible = [m for m in eligible if m.line in touched]
        chosen = eligible
        result.eligible = len(eligible)
        if args.sample and args.sample < len(eligible):
            rng = random.Random(f"{settings.get('seed', 24) if args.seed is None else args.seed}:{module}")
            chosen = sorted(rng.sample(eligible, args.sample), key=Mutant.key)
        shares = [chosen[i::len(copies)] for i in range(len(copies))]

        for c in copies[1:]:   # every copy starts from the unmarked session
            shutil.copy2(first / "session.sqlite", c / "session.sqlite")
        for c, share in zip(copies, shares):
            keep = {m.job_id for m in share}
            with use_db(str(c / "session.sqlite"), WorkDB.Mode.open) as db:
                db.set_multiple_results([j for j in mutants if j not in keep],
                                        WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
        procs = []
        for c, share in zip(copies, shares):
            if not share:
                continue
            exe = Path(sys.executable).with_name("cosmic-ray")
            procs.append(subprocess.Popen(
                [str(exe) if exe.exists() else "cosmic-ray", "exec", "mutation-session.toml", "session.sqlite"],
                cwd=c, env={**env, "PYTHONPATH": env["PYTHONPATH"].replace("{tree}", str(c))},
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        try:
            for p in procs:
                _, err = p.communicate()
                if p.returncode != 0:
                    raise RuntimeError(f"cosmic-ray exec failed:\n{err[-3000:]}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
                    p.wait()

        for c, share in zip(copies, shares):
            keep = {m.job_id for m in share}
            with use_db(str(c / "session.sqlite"), WorkDB.Mode.open) as db:
                for job_id, res in db.results:
                    if job_id not in keep:
                        continue
                    m = mutants[job_id]
                    m.change = change_of(res.diff)
                    if res.worker_outcome == WorkerOutcome.NORMAL:
                        if res.test_outcome.value == "survived":
                            m.outcome = "survived"
                        elif res.test_outcome.value == "incompetent":
                            m.outcome = "incompetent"
                        elif (res.output or "").strip() == "timeout":
                            m.outcome = "timeout"
                        else:
                            m.outcome = "killed"
                    elif res.worker_outcome == WorkerOutcome.NO_TEST:
                        m.outcome = "no-test"
                    else:               # exception, abnormal or skipped: not measured
                        m.outcome = "error"
                        m.change = f"{res.worker_outcome.value}: {(res.output or '').strip()[-200:]}"
                    result.mutants.append(m)
        source = (ROOT / module).read_text().splitlines()
        for m in result.mutants:
            entry = equivalent_entry(m, equivalent, source) if m.outcome == "survived" else None
            if entry is not None:
                m.outcome, m.why = "equivalent", entry["why"]
        result.mutants.sort(key=Mutant.key)
        result.elapsed_s = time.monotonic() - started
        return result
    finally:
        if args.keep:
            print(f"kept {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)


def report(r: ModuleResult, threshold: float) -> bool:
    ok = r.score >= threshold
    scope = [] if r.eligible == r.total else [f"{r.eligible} eligible"]
    if r.in_annotations:
        scope.append(f"{r.in_annotations} in annotations left out")
    print(f"\n== {r.module}: {len(r.mutants)} of {r.total} mutants tested"
          + (f" ({'; '.join(scope)})" if scope else "")
          + f" (baseline {r.baseline_s:.1f} s, {r.elapsed_s:.0f} s in all)")
    print(f"   killed {r.count('killed')}  timeouts {r.count('timeout')}  survived {r.count('survived')}  "
          f"equivalent {r.count('equivalent')}  incompetent {r.count('incompetent')}  "
          f"errors {r.count('error') + r.count('no-test')}")
    print(f"   score {r.score:.1f} %  ({r.killed_or_timeout}/{r.scored})  "
          f"{'PASS' if ok else 'FAIL'} (threshold {threshold:g} %)")
    for m in r.mutants:
        if m.outcome == "survived":
            print(f"   survived  {m.file}:{m.line}:{m.column}  {m.operator}  {m.change}")
    for m in r.mutants:
        if m.outcome in ("error", "no-test"):
            print(f"   not measured  {m.file}:{m.line}:{m.column}  {m.operator}  {m.change}")
    for m in r.mutants:
        if m.outcome == "equivalent":
            print(f"   equivalent  {m.file}:{m.line}:{m.column}  {m.operator}  ({m.why})")
    return ok


def main(argv=None) -> int:
    # A terminated run still removes its copies (the finally blocks run on SystemExit).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    settings, modules = load_config()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--module", action="append", metavar="PATH",
                       help="mutate this configured module (repeatable); default: all")
    which.add_argument("--changed", nargs="?", const="HEAD~1", metavar="REV",
                       help="mutate the configured modules `git diff --name-only REV` touched (default HEAD~1)")
    ap.add_argument("--changed-lines", action="store_true",
                    help="with --changed: only the mutants on lines the diff adds or changes")
    ap.add_argument("--sample", type=int, default=0, metavar="N",
                    help="test a seeded random sample of N mutants per module (default: all)")
    ap.add_argument("--seed", type=int, default=None, help="sample seed (default: settings.seed)")
    ap.add_argument("--jobs", type=int, default=1, help="tree copies run in parallel (default 1)")
    ap.add_argument("--threshold", type=float, default=float(settings.get("threshold", 90)))
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copies (debugging)")
    args = ap.parse_args(argv)

    if args.module:
        unknown = [m for m in args.module if m not in modules]
        if unknown:
            ap.error(f"not configured in {CONFIG.name}: {', '.join(unknown)} (known: {', '.join(modules)})")
        selected = args.module
    elif args.changed:
        selected = changed_modules(args.changed, list(modules))
        if not selected:
            print(f"no configured module changed since {args.changed}; nothing to mutate")
            return 0
    else:
        selected = list(modules)

    equivalent = load_equivalent()
    files = tree_files()
    results, ok = [], True
    for module in selected:
        try:
            r = run_module(module, modules[module], settings, args, equivalent, files)
        except RuntimeError as exc:
            print(f"\n== {module}: {exc}", file=sys.stderr)
            return 2
        ok = report(r, args.threshold) and ok
        results.append(r)
    if len(results) > 1:
        print("\nmodule                     tested  killed  survived  timeouts  score")
        for r in results:
            print(f"{r.module:<26} {len(r.mutants):>6}  {r.count('killed'):>6}  {r.count('survived'):>8}  "
                  f"{r.count('timeout'):>8}  {r.score:5.1f} %")
    if args.json:
        args.json.write_text(json.dumps([
            {"module": r.module, "total": r.total, "eligible": r.eligible, "tested": len(r.mutants),
             "score": round(r.score, 1), "mutants": [m.__dict__ for m in r.mutants]} for r in results], indent=2))
    print("\nPASS" if ok else "\nFAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
