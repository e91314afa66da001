"""properties/search/generation.py: the same seed gives the same cases whatever else the process imported (issue 20).

Each import context runs in a fresh process (what a module harvested once stays harvested): a plain
one, and one that has also loaded the PyPTO-Gym backend module, the mutants and a user's kernel file
(a file outside any test folder, with literals of its own). Both generate ``pfa-verify run``'s cases
(cases.data.collect.generated_cases, kernel-sized as for sim and pypto-gym, and the directed ones of
collect_items) and the ``sim`` profile's
derandomized law examples (tests/conftest.py's profile, properties/search/law_examples.py), and print them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis.internal.conjecture import providers
from hypothesis.internal.constants_ast import Constants

from pfa_verify.cases.data.collect import generated_cases
from pfa_verify.kernels.config import KERNEL_SHAPES
from pfa_verify.properties.search.generation import local_constants_pinned, pin_local_constants
from pfa_verify.properties.search.law_examples import PAGED_LAWS
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
    spec = importlib.util.spec_from_file_location("suite_conftest", "tests/conftest.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))        # registers the profiles
    from hypothesis import given, settings
    from hypothesis.internal.constants_ast import constants_from_module, is_local_module_file
    from pfa_verify.kernels.config import KERNEL_SHAPES
    from pfa_verify.properties.search import law_examples

    class KernelShapes:
        supported_shapes = KERNEL_SHAPES

    laws = {}
    for law in law_examples.PAGED_LAWS:
        drawn = []

        @settings(settings.get_profile("sim"))
        @given(law_examples.examples(law, KernelShapes()))
        def draw(example):
            case, params = example
            drawn.append([case.config.to_dict(), case.seed, params])
        draw()
        laws[law] = drawn
    # What Hypothesis would harvest here without the pin: literals of the local modules loaded.
    harvest = set()
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if f and is_local_module_file(f):
            harvest |= set(constants_from_module(m).integers)
    from pfa_verify.cases.data.collect import collect_items, generated_cases
    cases = generated_cases(12, 0, supported=KERNEL_SHAPES)
    directed = [[i.case.config.to_dict(), i.case.seed, i.aim.kept_for] for i in
                collect_items("catalog", examples=12, seed=0, supported=KERNEL_SHAPES) if i.source == "generated"]
    print(json.dumps({"seeds": [c.seed for c in cases], "configs": [c.config.to_dict() for c in cases],
                      "directed": directed, "laws": laws, "harvestable_integers": len(harvest)}))
""")

_USERS_KERNEL = ("OFFSETS = [17713194, 2147483647, 65537, 999331, -77, 4096, 129, 255, 257, 383, 511, 513, 639]\n"
                 "SCALE = 0.3183\nNAME = 'kernel'\n")


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
    # The premise: the loaded context holds literals Hypothesis would have mixed into its draws.
    assert loaded["harvestable_integers"] > plain["harvestable_integers"]
    assert loaded["seeds"] == plain["seeds"] and len(plain["seeds"]) == 12
    assert loaded["configs"] == plain["configs"]
    # pfa-verify run's cases, aimed at the catalog's holes first (properties/search/directed.py)
    assert len(plain["directed"]) == 12 and any(target for _, _, target in plain["directed"])
    assert loaded["directed"] == plain["directed"]


def test_sim_profile_law_examples_do_not_depend_on_imports(contexts):
    plain, loaded = contexts
    assert set(plain["laws"]) == set(PAGED_LAWS)
    for law in PAGED_LAWS:
        assert len(plain["laws"][law]) == 10          # the sim profile's max_examples
        assert loaded["laws"][law] == plain["laws"][law], law


def test_pin_is_in_force_in_the_suite():
    assert pin_local_constants() is True             # this Hypothesis harvests local constants...
    assert local_constants_pinned()                  # ...and the pin replaced the harvester


def test_a_local_constant_pool_would_change_the_cases(monkeypatch):
    """The mechanism the pin removes: the same seed, a pool with two constants, other cases. (The pool
    holds a 1, as every module's source does: since the block tables are drawn by Hypothesis (issue 18),
    a pool of 17713194 alone, which fits only the seed draws, no longer happens to change the first 12.)"""

    pinned = [c.seed for c in generated_cases(12, 0, supported=KERNEL_SHAPES)]
    providers.CONSTANTS_CACHE.cache.clear()
    monkeypatch.setattr(providers, "_get_local_constants", lambda: Constants(integers={17713194, 1}))
    try:
        pooled = [c.seed for c in generated_cases(12, 0, supported=KERNEL_SHAPES)]
    finally:
        providers.CONSTANTS_CACHE.cache.clear()
    assert pooled != pinned
