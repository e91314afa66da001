"""properties/search/generation.py: the same seed gives the same cases whatever else the process imported (issue 20),
by public Hypothesis API only, changing nothing for other Hypothesis code in the process (issue 54).

Each import context runs in a fresh process (what a module harvested once stays harvested): a plain
one, and one that has also loaded the PyPTO-Gym backend module, the mutants and a user's kernel file
(a module of literals, loaded as a local module). Both generate ``pfa-verify run``'s cases
(cases.data.collect.generated_cases, kernel-sized as for sim and pypto-gym, and the directed ones of
collect_items) and print them, with what an ordinary derandomized Hypothesis test drew there.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import strategies as st

from pfa_verify.cases.running.shrink import hunt
from pfa_verify.properties.search.generation import seeded_buffers, seeded_examples
from tests.checkout import REPO_ROOT

_SCRIPT = textwrap.dedent("""
    import importlib.util, json, sys
    context, kernel_file = sys.argv[1], sys.argv[2]
    if context == "loaded":
        import pfa_verify.kernels.backends.upstream, pfa_verify.cases.measuring.mutants, pfa_verify.kernels.mutants.golden_level  # noqa: F401
        spec = importlib.util.spec_from_file_location("a_users_kernel", kernel_file)
        module = importlib.util.module_from_spec(spec)
        sys.modules["a_users_kernel"] = module
        spec.loader.exec_module(module)
    from hypothesis import given, settings, strategies as st
    from pfa_verify.kernels.config import KERNEL_SHAPES
    from pfa_verify.cases.data.collect import collect_items, generated_cases

    # The control: Hypothesis' own derandomized draws, which may take the literals of local modules.
    plain_hypothesis = []

    @settings(derandomize=True, database=None, max_examples=200)
    @given(st.integers(0, 2**40))
    def draw(value):
        plain_hypothesis.append(value)
    draw()
    cases = generated_cases(12, 0, supported=KERNEL_SHAPES)
    directed = [[i.case.config.to_dict(), i.case.seed, i.aim.kept_for] for i in
                collect_items("catalog", examples=12, seed=0, supported=KERNEL_SHAPES) if i.source == "generated"]
    print(json.dumps({"seeds": [c.seed for c in cases], "configs": [c.config.to_dict() for c in cases],
                      "directed": directed, "hypothesis": plain_hypothesis}))
""")

# A user's kernel file: literals Hypothesis' own draws may take once it is imported.
_USERS_KERNEL = ("OFFSETS = [17713194, 2147483647, 65537, 999331, -77, 4096, 129, 255, 257, 383, 511, 513, 639, "
                 "1099511627775, 1099511627776, 987654321987]\nSCALE = 0.3183\nNAME = 'kernel'\n")


def _generate(script, context: str, kernel_file) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script), context, str(kernel_file)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def contexts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("generation")
    kernel, script = folder / "users_kernel.py", folder / "generate.py"
    kernel.write_text(_USERS_KERNEL)
    # A file, not ``python -c``: derandomized draws are seeded from the test function's source.
    script.write_text(_SCRIPT)
    return _generate(script, "plain", kernel), _generate(script, "loaded", kernel)


def test_generated_cases_do_not_depend_on_imports(contexts):
    plain, loaded = contexts
    # The premise: in the loaded context Hypothesis' own draws do change (the kernel file's literals),
    # so the same cases below are not for want of anything to change them.
    assert loaded["hypothesis"] != plain["hypothesis"]
    assert loaded["seeds"] == plain["seeds"] and len(plain["seeds"]) == 12
    assert loaded["configs"] == plain["configs"]
    # pfa-verify run's cases, aimed at the catalog's holes first (properties/search/directed.py)
    assert len(plain["directed"]) == 12 and any(target for _, _, target in plain["directed"])
    assert loaded["directed"] == plain["directed"]


def test_seeded_examples_are_the_seeds_and_differ_between_seeds():
    strategy = st.tuples(st.integers(0, 2**31 - 1), st.lists(st.booleans(), max_size=8))
    first = seeded_examples(strategy, 7, 20)
    assert len(first) == 20 and first == seeded_examples(strategy, 7, 20)
    assert seeded_examples(strategy, 7, 5) == first[:5]          # a prefix: fewer draws, the same first ones
    assert seeded_examples(strategy, 8, 20) != first
    assert len({value for value, _ in first}) > 15               # draws, not one value repeated


def test_a_strategy_that_rejects_every_draw_gives_none_and_ends():
    assert seeded_examples(st.integers(0, 10).filter(lambda _: False), 0, 3) == []
    assert len(list(seeded_buffers(0, 3))) == 30                  # ten buffers an example, no more


@pytest.mark.parametrize("bad", [{"seed": -1}, {"count": -2}])
def test_seeded_generation_names_a_bad_argument(bad):
    args = {"seed": 0, "count": 1, **bad}
    with pytest.raises(ValueError, match=next(iter(bad))):
        seeded_examples(st.integers(), args["seed"], args["count"])


def test_a_seeded_hunt_meets_the_seeded_draws_and_hypothesis_shrinks_the_failure():
    """What ``pfa-verify run`` relies on to shrink a generated failure (cases/running/shrink.py): the hunt
    checks the seed's examples in the run's order, stops at the first failure, and Hypothesis shrinks it."""
    drawn = seeded_examples(st.integers(0, 1000), 3, 20)
    first_bad = next(k for k, x in enumerate(drawn) if x > 500)
    checked: list[int] = []

    def check(x):
        checked.append(x)
        assert x <= 500

    found = hunt(st.integers(0, 1000), check, seed=3, examples=20, shrink_s=30, seeded=True)
    assert checked[:first_bad + 1] == drawn[:first_bad + 1]
    assert found.examples == first_bad + 1
    assert found.example == 501                                    # the smallest failure
    assert checked.count(drawn[first_bad]) == 1                   # handed over, not asked again
    assert found.shrink_calls == len(checked) - found.examples


def test_a_hunt_whose_filters_reject_every_draw_checks_none_and_raises_nothing():
    """Hypothesis gives up (Unsatisfiable): the search checked no example, which its caller reports as
    too few (cases/running/search.py), never an error of the kernel."""
    never = st.integers(0, 2**64).filter(lambda _: False)
    found = hunt(never, lambda x: None, seed=0, examples=20)
    assert (found.examples, found.error) == (0, None)
