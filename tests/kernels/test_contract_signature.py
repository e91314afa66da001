"""The kernels' signatures are checked when a backend is loaded (kernels/backends/contract.py,
``signature_problems``): a parameter the suite passes that the method cannot take, or a required one the
suite never passes, is named in the one line of the contract's UsageError (exit 2 on the command line),
never an error on every case. ``*args``/``**kwargs`` take anything; every backend of the suite passes."""
from __future__ import annotations

import inspect

import pytest

from pfa_verify import golden, kernels
from pfa_verify.cases import cli
from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels.backends import Backend
from pfa_verify.kernels.backends.contract import PASSED_ARGUMENTS, KernelBackend, capabilities_of, signature_problems
from tests.checkout import REPO_ROOT

TENSORS = "q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs"


def _backend(paged: str, qk: str | None = None):
    """A backend whose paged_attention_fp8 (and qk_matmul_scale, when given) has the parameters ``paged`` (``qk``)."""
    namespace: dict = {}
    code = f"def paged_attention_fp8(self, {paged}):\n    return None\n"
    if qk is not None:
        code += f"def qk_matmul_scale(self, {qk}):\n    return None\n"
    exec(code, namespace)       # the signature under test, spelled as a user would
    methods = {k: v for k, v in namespace.items() if k in ("paged_attention_fp8", "qk_matmul_scale")}
    return type("Double", (), {"name": "double", "codec": None, **methods})()


@pytest.mark.parametrize("paged, qk, named", [
    (f"{TENSORS}, *, softmax_scale=None, g_tile=None", None,
     "paged_attention_fp8 has no parameter 's2_tile', which the suite passes by keyword (docs/spec.md §1)"),
    ("q, /, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, **kw", None,
     "paged_attention_fp8's parameter 'q' is positional-only, but the suite passes it by keyword"),
    (f"{TENSORS}, *, softmax_scale, s2_tile, g_tile, layout", None,
     "paged_attention_fp8's parameter 'layout' has no default, but the suite never passes it"),
    (f"{TENSORS}, **kw", "q, k, *, q_scale=None, k_scale=None",
     "qk_matmul_scale has no parameter 'scale', which the suite passes by keyword (docs/spec.md §6)"),
    (f"{TENSORS}, **kw", "q, k, *, scale=None, q_scale, k_scale=None",
     "qk_matmul_scale's parameter 'q_scale' has no default, but the suite passes it only sometimes"),
], ids=["missing s2_tile", "positional-only q", "required extra", "qk missing scale", "qk required q_scale"])
def test_a_signature_the_suite_cannot_call_is_refused_at_load_naming_the_parameter(paged, qk, named):
    with pytest.raises(UsageError) as info:
        capabilities_of(_backend(paged, qk), source="my.module:factory")
    text = str(info.value)
    assert text.startswith("backend 'my.module:factory' breaks the backend contract") and named in text
    assert "\n" not in text


def test_each_problem_is_named_once():
    problems = signature_problems(_backend("q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, /, "
                                           "*, extra").paged_attention_fp8, "paged_attention_fp8")
    # 7 positional-only, 4 missing (kv_act_seqs, softmax_scale, s2_tile, g_tile), 1 required: each once
    assert [sum(what in p for p in problems) for what in ("positional-only", "has no parameter", "no default")] \
        == [7, 4, 1], problems
    assert problems[-1] == "paged_attention_fp8's parameter 'extra' has no default, but the suite never passes it"


@pytest.mark.parametrize("paged, qk", [
    ("*args, **kwargs", "*args, **kwargs"),
    (f"{TENSORS}, **kw", "q, k, **kw"),
    (f"{TENSORS}, *, softmax_scale, s2_tile, g_tile, codec=None", "q, k, *, scale=None, q_scale=None, k_scale=None"),
], ids=["args and kwargs", "kwargs", "keyword-only, required where always passed"])
def test_signatures_that_take_every_call_are_accepted(paged, qk):
    assert capabilities_of(_backend(paged, qk)).operators == ("paged_attention_fp8", "qk_matmul_scale")


def test_an_undeclared_operator_is_not_checked():
    """A kernel that declares it has no AT-12 entry (its qk_matmul_scale inherited) is never called there."""
    backend = _backend(f"{TENSORS}, **kw", "q")
    type(backend).operators = ("paged_attention_fp8",)
    assert capabilities_of(backend).operators == ("paged_attention_fp8",)


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_the_suites_backends_and_the_example_take_every_call():
    kernels.get_backend("mutant:missing_l_rescale")          # imports the mutants' and variants' classes
    kernels.get_backend("conforming:forward")
    example = REPO_ROOT / "docs" / "examples" / "my_backend.py"
    for factory in ("make_backend", "make_buggy_backend"):
        capabilities_of(kernels.get_backend(f"{example}:{factory}"))
    for cls in (KernelBackend, *_subclasses(Backend)):
        instance = object.__new__(cls)                      # no constructor: its methods' signatures only
        for op in ("paged_attention_fp8", "qk_matmul_scale"):
            assert signature_problems(getattr(instance, op), op) == [], (cls, op)


def test_the_arguments_the_suite_passes_are_the_contracts():
    """PASSED_ARGUMENTS is what the run and the laws pass (an InputBundle's kwargs) and the Protocol's
    parameters but ``codec`` (the golden's own, never passed)."""
    bundle = golden.make_inputs(golden.PagedAttentionConfig(batch=1, s1=1, s2=16, nq=1, nkv=1, head_dim=8,
                                                            block_size=16, s2_tile=16), seed=0)
    assert PASSED_ARGUMENTS["paged_attention_fp8"] == (tuple(bundle.kwargs()), ())
    for op, (always, sometimes) in PASSED_ARGUMENTS.items():
        params = [p for p in inspect.signature(getattr(KernelBackend, op)).parameters if p not in ("self", "codec")]
        assert sorted(params) == sorted(always + sometimes), op


def test_a_kernel_missing_s2_tile_is_exit_2_naming_it_supervised_and_in_process(tmp_path, capsys):
    file = tmp_path / "no_s2_tile.py"
    file.write_text("class B:\n    name = 'no-s2'\n    codec = None\n\n"
                    f"    def paged_attention_fp8(self, {TENSORS}, *, softmax_scale=None, g_tile=None):\n"
                    "        raise AssertionError('never called')\n\n\ndef make():\n    return B()\n")
    for mode in ([], ["--in-process"]):
        assert cli.main(["run", "--backend", f"{file}:make", "--cases", "edge_causal_s1_3_short", "--examples", "0",
                         "--no-capture", *mode]) == 2
        err = capsys.readouterr().err
        assert err.startswith("pfa-verify: error: backend ") and err.count("\n") == 1, err
        assert "paged_attention_fp8 has no parameter 's2_tile'" in err
