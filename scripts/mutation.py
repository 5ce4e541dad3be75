"""Mutation testing of the core modules with mutmut (run through scripts/mutation.sh; docs/mutation.md).

mutmut expects the package under ./src (it names mutants by their path, less a "src." prefix); this project's
source root is agent/. So each module gets a work directory, .mutation/<module>/, laid out as mutmut expects: src/ (a
copy of agent/), tests/, alerts/, and a pyproject.toml of its own whose [tool.mutmut] mutates that one module and
selects the tests scripts/mutation.toml lists for it. mutmut then copies it all into mutants/, where
mutants/agent is a link to mutants/src, so that the tests' REPO/agent (and PYTHONPATH in their subprocesses) is the
mutated tree.

Workers fork from mutmut's fork server (process_isolation = "forkserver"), not from the process that ran the
tests once to learn which test reaches which function: that process's caches (exposition's label-prefix cache,
for one) would be inherited by every mutant and hide its mutation.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "scripts" / "mutation.toml"
WORK = REPO / ".mutation"
DEFAULT_FLOOR = 0.90

# mutmut's exit codes per mutant (mutmut/stats.py): 1 and 3 are kills, 0 a survivor, 5/33 "no tests" (no selected
# test reaches the function: a survivor too), 36/24/-24/152/255 timeouts (the mutant hung the tests: detected).
KILLED = {1, 3}
TIMEOUT = {36, 24, -24, 152, 255}
NO_TESTS = {5, 33}
SURVIVED = {0}
NOT_RUN = {None, 2, 34}


@dataclass
class Module:
    name: str  # "metrics/exposition"
    tests: list[str]
    only: list[str] = field(default_factory=list)
    floor: float = DEFAULT_FLOOR
    equivalent: dict[str, str] = field(default_factory=dict)

    @property
    def source(self) -> Path:
        return Path("agent") / "outrider" / (self.name + ".py")

    @property
    def dotted(self) -> str:
        return "outrider." + self.name.replace("/", ".")

    @property
    def work(self) -> Path:
        return WORK / self.name.replace("/", ".")


def load_modules() -> dict[str, Module]:
    data = tomllib.loads(CONFIG.read_text())
    out = {}
    for name, spec in data["modules"].items():
        out[name] = Module(name, list(spec["tests"]), list(spec.get("only", [])),
                           float(spec.get("floor", DEFAULT_FLOOR)),
                           dict(spec.get("equivalent", {})))
        if not (REPO / out[name].source).is_file():
            sys.exit(f"{CONFIG}: module {name}: no file {out[name].source}")
    return out


def toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(s) for s in items) + "]"


def prepare(mod: Module) -> None:
    """A fresh work directory for one module (mutants and results of an earlier run are discarded)."""
    if mod.work.exists():
        shutil.rmtree(mod.work)
    mod.work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")
    shutil.copytree(REPO / "agent", mod.work / "src", ignore=ignore)
    shutil.copytree(REPO / "tests", mod.work / "tests", ignore=ignore)
    shutil.copytree(REPO / "alerts", mod.work / "alerts", symlinks=True, ignore=ignore)
    if (REPO / "docs").is_dir():  # boundary tests read the documented bounds (a repository may have no docs)
        shutil.copytree(REPO / "docs", mod.work / "docs", ignore=ignore)
    write_config(mod)
    # mutants/src made now, before mutmut starts: a PYTHONPATH entry missing at interpreter start is cached as
    # having no importer, and the mutated tree written there later would never be imported
    (mod.work / "mutants" / "src").mkdir(parents=True)
    (mod.work / "mutants" / "agent").symlink_to("src")
    install_hits(mod)


def install_hits(mod: Module) -> None:
    """What records the coverage of the processes the tests start (scripts/mutation_hits/sitecustomize.py says
    how), and an empty directory for it."""
    for name in ("sitecustomize.py", "mutation_hits_plugin.py"):
        shutil.copy(REPO / "scripts" / "mutation_hits" / name, mod.work / "mutants" / name)
    shutil.rmtree(mod.work / "hits", ignore_errors=True)
    (mod.work / "hits").mkdir()


def write_config(mod: Module) -> None:
    """The work directory's pyproject.toml: mutmut's settings for this module, with its tests as
    scripts/mutation.toml lists them now (written again by a rerun, which takes test files added to the list)."""
    pytest_opts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    markers = pytest_opts.get("markers", [])
    (mod.work / "pyproject.toml").write_text(
        "# written by scripts/mutation.py for one module's mutation run\n"
        "[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        f'only_mutate = [{json.dumps("src/" + str(mod.source.relative_to("agent")))}]\n'
        f"pytest_add_cli_args_test_selection = {toml_list(mod.tests)}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-p", "mutation_hits_plugin", "-q", "-x"]\n'
        'also_copy = ["alerts", "docs"]\n'
        'process_isolation = "forkserver"\n'
        "use_git_change_detection = false\n"
        "\n[tool.pytest.ini_options]\n"
        'testpaths = ["tests"]\n'
        f"markers = {toml_list(markers)}\n")


def env_for(mod: Module) -> dict[str, str]:
    env = dict(os.environ)
    mutants = mod.work / "mutants"
    # subprocesses the tests start import the mutated tree too (mutmut's MUTANT_UNDER_TEST reaches them)
    env["PYTHONPATH"] = f"{mutants / 'src'}{os.pathsep}{mutants}"
    env["MUTMUT_SUBPROCESS_HITS"] = str(mod.work / "hits")
    env.pop("PYTEST_ADDOPTS", None)
    return env


def mutmut(mod: Module, args: list[str], deadline: float | None, log: Path | None = None) -> int | None:
    """Runs mutmut in the module's work directory, in its own process group (stopped whole at the deadline);
    None when the deadline stopped it."""
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    try:
        proc = subprocess.Popen([sys.executable, "-m", "mutmut", *args], cwd=mod.work, env=env_for(mod),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=None if deadline is None else max(1.0, deadline - time.monotonic()))
            return proc.returncode
        except subprocess.TimeoutExpired:
            return None
        finally:
            # the whole group, always: mutmut's fork server and workers would outlive a stopped parent
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            gone(proc.pid)
    finally:
        if log:
            out.close()


def gone(pgid: int, wait_s: float = 10.0) -> None:
    """Waits until no process of the group is left: SIGKILL is delivered asynchronously, and on a loaded machine a
    worker of the group can outlive its leader's reaping by a moment (found by the house test's check)."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def results(mod: Module) -> dict[str, int | None]:
    meta = mod.work / "mutants" / "src" / (str(mod.source.relative_to("agent")) + ".meta")
    if not meta.exists():
        return {}
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    if mod.only:
        codes = {k: v for k, v in codes.items() if any(fnmatch.fnmatchcase(k, p) for p in mod.only)}
    return codes


def short(mutant: str, mod: Module) -> str:
    return mutant[len(mod.dotted) + 1:] if mutant.startswith(mod.dotted + ".") else mutant


def summarise(mod: Module, seconds: float, complete: bool) -> dict[str, object]:
    codes = results(mod)
    total = len(codes)
    killed = sum(1 for c in codes.values() if c in KILLED)
    timeouts = sum(1 for c in codes.values() if c in TIMEOUT)
    not_run = sorted(short(k, mod) for k, c in codes.items() if c in NOT_RUN)
    survivors = sorted((short(k, mod) for k, c in codes.items()
                        if c not in KILLED and c not in TIMEOUT and c not in NOT_RUN),
                       key=lambda s: (s.rsplit("__mutmut_", 1)[0], int(s.rsplit("_", 1)[1])))
    score = (killed + timeouts) / total if total else 0.0
    summary = {
        "module": mod.name, "total": total, "killed": killed, "timeouts": timeouts, "survivors": survivors,
        "not_run": not_run, "equivalent": {s: mod.equivalent[s] for s in survivors if s in mod.equivalent},
        "score": round(score, 4), "floor": mod.floor, "complete": complete and not not_run,
        "seconds": round(seconds, 1), "tests": mod.tests,
    }
    (mod.work / "score.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def report(s: dict[str, object], mod: Module) -> None:
    survivors = s["survivors"]
    assert isinstance(survivors, list)
    state = "" if s["complete"] else f" (INCOMPLETE: {len(s['not_run'])} not run)"  # type: ignore[arg-type]
    print(f"{mod.name}: {s['killed']} killed + {s['timeouts']} timed out of {s['total']} = "
          f"{100 * float(s['score']):.1f}% (floor {100 * mod.floor:.0f}%) in {s['seconds']} s{state}")  # type: ignore[arg-type]
    for name in survivors:
        why = mod.equivalent.get(name)
        print(f"  survived {name}: " + (f"equivalent: {why}" if why else "NOT JUDGED EQUIVALENT"))
    stale = sorted(set(mod.equivalent) - set(survivors))
    for name in stale:
        print(f"  note: {name} is listed as equivalent in {CONFIG.name} but did not survive (or no longer exists)")


def run_module(mod: Module, jobs: int, deadline: float | None, rerun: bool) -> dict[str, object]:
    t0 = time.monotonic()
    log = mod.work / "mutmut.log"
    if rerun and (mod.work / "score.json").exists():
        # iterate on tests: bring the new tests in, rerun only what survived last time
        last = json.loads((mod.work / "score.json").read_text())
        for sub in ("tests",):
            shutil.rmtree(mod.work / sub)
            shutil.copytree(REPO / sub, mod.work / sub, ignore=shutil.ignore_patterns("__pycache__"))
            shutil.rmtree(mod.work / "mutants" / sub)
            shutil.copytree(REPO / sub, mod.work / "mutants" / sub, ignore=shutil.ignore_patterns("__pycache__"))
        write_config(mod)
        install_hits(mod)
        names = [f"{mod.dotted}.{s}" for s in last["survivors"]]
        if not names:
            return summarise(mod, 0.0, True)
        (mod.work / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)  # tests changed: learn coverage again
        rc = mutmut(mod, ["run", "--max-children", str(jobs), *names], deadline, log)
    else:
        prepare(mod)
        args = ["run", "--max-children", str(jobs)]
        if mod.only:
            args += [f"{p}" for p in mod.only]
        rc = mutmut(mod, args, deadline, log)
    complete = rc is not None
    if rc not in (None, 0):
        print(f"{mod.name}: mutmut exited {rc}; its log: {log}", file=sys.stderr)
        complete = False
    return summarise(mod, time.monotonic() - t0, complete)


def changed_modules(modules: dict[str, Module], base: str | None) -> list[Module]:
    """Modules whose source file differs between the base and the work tree. The base: the one given, else the
    merge base with main (or origin/main), else (on main itself, as in CI's clone, or where there is no main) the
    first parent: what the last commit or merge brought in. Where none can be found (a shallow clone, no git),
    nothing is run, and that is said: a guess would either run every module or none without saying so."""
    def git(*args: str) -> tuple[int, str]:
        r = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return r.returncode, r.stdout.strip()

    if base is None:
        base = find_base(git)
    if base is None:
        print("cannot tell which module sources changed: no merge base with main and no parent commit (a shallow "
              "clone? `git fetch --unshallow`, or name the modules); none run")
        return []
    rc, committed = git("diff", "--name-only", base, "--", "agent/outrider")
    rc_tree, uncommitted = git("diff", "--name-only", "--", "agent/outrider")
    if rc or rc_tree:
        print(f"cannot tell which module sources changed: `git diff {base}` failed; none run")
        return []
    changed = set(committed.splitlines()) | set(uncommitted.splitlines())
    print(f"changed against {base[:12]}: {', '.join(sorted(changed)) or 'no module source'}")
    return [m for m in modules.values() if str(m.source) in changed]


def find_base(git: Callable[..., tuple[int, str]]) -> str | None:
    rc, head = git("rev-parse", "--verify", "-q", "HEAD")
    if rc:
        return None
    for ref in ("main", "origin/main"):
        rc, merge_base = git("merge-base", "HEAD", ref)
        if rc == 0 and merge_base and merge_base != head:
            return merge_base
        if rc == 0 and merge_base == head:
            break  # on main: what the last commit or merge brought in
    rc, parent = git("rev-parse", "--verify", "-q", "HEAD^1")
    return parent if rc == 0 and parent else None


def show(mod: Module) -> None:
    path = mod.work / "score.json"
    if not path.exists():
        return
    for name in json.loads(path.read_text())["survivors"]:
        why = mod.equivalent.get(name)
        if why:
            print(f"# {mod.dotted}.{name}: equivalent: {why}")
        sys.stdout.flush()
        subprocess.run([sys.executable, "-m", "mutmut", "show", f"{mod.dotted}.{name}"], cwd=mod.work,
                       env=env_for(mod), check=False)


def table(modules: dict[str, Module]) -> None:
    print("| module | mutants | killed | timed out | score | survivors (judged equivalent) |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for mod in modules.values():
        path = mod.work / "score.json"
        if not path.exists():
            print(f"| {mod.name} | | | | not run | |")
            continue
        s = json.loads(path.read_text())
        surv = len(s["survivors"])
        print(f"| {mod.name} | {s['total']} | {s['killed']} | {s['timeouts']} | {100 * s['score']:.1f}% | "
              f"{surv} ({len(s['equivalent'])}) |")


def main() -> int:
    modules = load_modules()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("modules", nargs="*", help=f"modules to run (default: all): {', '.join(modules)}")
    ap.add_argument("--changed", nargs="?", const="", metavar="BASE",
                    help="only modules whose source changed against BASE (default: the merge base with main, or "
                         "on main the first parent)")
    ap.add_argument("--budget", type=float, metavar="SECONDS",
                    help="stop after this long; a module cut short is reported incomplete and does not fail the run")
    ap.add_argument("--jobs", type=int, default=2, help="mutants tested at once (default 2)")
    ap.add_argument("--rerun", action="store_true",
                    help="keep the mutants of the last run, copy the tests again, and rerun only its survivors")
    ap.add_argument("--table", action="store_true", help="print the score table of the last runs and exit")
    ap.add_argument("--list", action="store_true", help="print the modules that would run, and exit")
    ap.add_argument("--show", action="store_true", help="print the diff of each survivor of the last runs and exit")
    args = ap.parse_args()
    unknown = [m for m in args.modules if m not in modules]
    if unknown:
        ap.error(f"unknown module(s): {', '.join(unknown)}")
    if args.table:
        table(modules)
        return 0
    if args.show:
        for mod in [modules[m] for m in args.modules] if args.modules else modules.values():
            show(mod)
        return 0
    if args.changed is not None:
        selected = changed_modules(modules, args.changed or None)
        if args.modules:
            selected = [m for m in selected if m.name in args.modules]
    else:
        selected = [modules[m] for m in args.modules] if args.modules else list(modules.values())
    if args.list:
        print("\n".join(m.name for m in selected))
        return 0
    deadline = time.monotonic() + args.budget if args.budget else None
    failed = []
    for mod in selected:
        if deadline is not None and time.monotonic() >= deadline - 5:
            print(f"{mod.name}: not run (budget of {args.budget:.0f} s spent)")
            continue
        s = run_module(mod, args.jobs, deadline, args.rerun)
        report(s, mod)
        if s["complete"] and float(s["score"]) < mod.floor:  # type: ignore[arg-type]
            failed.append(mod.name)
    if failed:
        print(f"below the floor: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
