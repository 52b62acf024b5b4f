"""What a profile may hand its engine: tuning, yes; code, another address or key, or logged prompts, never.

The rule is one pure function (catalog.rules.launch_problems) that the YAML
loader and the API (through catalog.definitions) and the admin (through
Profile.clean) all call.
"""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import rules
from catalog import writes as service
from catalog.definitions import parse_definition
from catalog.models import CatalogModel, Profile


def definition(engine_args=(), env=None) -> dict:
    profile = {"engine": "vllm", "gpu_class": "h100-80g", "engine_args": list(engine_args), "env": env or {}}
    return {"name": "m", "profiles": [profile]}


@pytest.mark.parametrize(
    "name",
    [
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "ld_audit",
        "DYLD_INSERT_LIBRARIES",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "PYTHONBREAKPOINT",
        "PYTHONWARNINGS",
        "NODE_OPTIONS",
        "BASH_ENV",
        "ENV",
        "PATH",
        "GCONV_PATH",
        "VLLM_API_KEY",
        "API_KEY",
        "HOST",
        "PORT",
        "CONFIG_FILE",
        "LLMGW_NNODES",
        "BAD=NAME",
    ],
)
def test_env_that_loads_code_or_undoes_the_address_or_key_is_refused_by_name(name):
    spec, problems = parse_definition(definition(env={name: "/tmp/x"}))
    assert spec is None
    (problem,) = problems
    assert problem.startswith(f"profiles[0].env.{name} is refused: "), problem


@pytest.mark.parametrize(
    "args",
    [
        ["--host", "0.0.0.0"],
        ["--host=0.0.0.0"],
        ["--ho", "0.0.0.0"],
        ["--port", "80"],
        ["--api-key", "mine"],
        ["--api_key", "mine"],
        ["--API-KEY=mine"],
        ["--middleware", "evil.App"],
        ["--tool-parser-plugin", "/tmp/evil.py"],
        ["--logits-processors", "evil.Proc"],
        ["--worker-extension-cls", "evil.Ext"],
        ["--enable-custom-logit-processor"],
        ["--config", "/tmp/args.yaml"],
        ["--config_file", "/tmp/llama.json"],
        ["--enable-log-requests"],
        ["--enable-log-outputs"],
        ["--log-requests"],
        ["--max-model-len", "8192\0"],
    ],
)
def test_engine_args_that_load_code_undo_the_address_or_key_or_log_prompts_are_refused(args):
    spec, problems = parse_definition(definition(engine_args=["--max-model-len", "8192", *args]))
    assert spec is None
    assert any(p.startswith("profiles[0].engine_args[") and " is refused: " in p for p in problems), problems


def test_tuning_is_allowed():
    args = ["--max-model-len", "8192", "-tp", "8", "--trust-remote-code", "--no-enable-log-requests", "-1"]
    env = {"PYTHONUNBUFFERED": "1", "NCCL_DEBUG": "WARN", "HF_HOME": "/models/hf", "VLLM_HOST_IP": "10.0.0.1"}
    spec, problems = parse_definition(definition(engine_args=args, env=env))
    assert problems == [] and spec.profiles[0].engine_args == tuple(args)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(rules.ENGINE_FLAGS)),
    st.integers(min_value=1, max_value=40),
    st.sampled_from(["--", "--="]),
    st.booleans(),
)
def test_a_refused_flag_is_refused_however_it_is_spelt_or_abbreviated(flag, cut, form, underscores):
    """Any long-option prefix of a refused flag is refused: argparse would expand it."""
    name = flag[:cut]
    if underscores:
        name = name.replace("-", "_")
    arg = f"--{name}=x" if form == "--=" else f"--{name.upper() if cut % 2 else name}"
    assert rules.engine_arg_problem(arg) is not None


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["LD_", "DYLD_", "PYTHON", "LLMGW_"]), st.from_regex(r"[A-Z0-9_]{0,12}", fullmatch=True))
def test_every_variable_of_a_code_loading_family_is_refused(prefix, rest):
    name = prefix + rest
    assert (rules.env_problem(name, "x") is None) == (name in rules.PYTHON_ENV_ALLOWED)


@pytest.mark.django_db
def test_the_api_and_the_admin_refuse_them_too():
    with pytest.raises(service.CatalogError, match=r"profiles\[0\]\.env\.LD_PRELOAD is refused") as refused:
        service.add_model(definition(env={"LD_PRELOAD": "/tmp/evil.so"}), actor="t")
    assert refused.value.status == 400 and not CatalogModel.objects.exists()
    model = service.add_model(definition(), actor="t")
    profile = Profile.objects.get(model=model)
    profile.engine_args = ["--host", "0.0.0.0"]
    with pytest.raises(ValidationError, match=r"engine_args\[0\] '--host' is refused"):
        profile.full_clean()
    profile.engine_args, profile.env = [], {"PYTHONPATH": "/tmp"}
    with pytest.raises(ValidationError, match=r"env\.PYTHONPATH is refused: Python loads code"):
        profile.full_clean()
