"""What a profile may hand its engine: an allow-list of arguments and environment per engine.

The rule is one pure function (agent.launch_rules.launch_problems) that the
YAML loader and the API (through catalog.definitions), the admin (through
Profile.clean) and the agent before it starts an engine all call. Anything
not on an engine's list is refused, with a sentence naming the entry.
"""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import launch_rules as L
from catalog import writes as service
from catalog.definitions import parse_definition
from catalog.models import CatalogModel, Profile

ENGINES = sorted(L.ENGINE_FLAGS)


def definition(engine_args=(), env=None, engine="vllm") -> dict:
    profile = {"engine": engine, "gpu_class": "h100-80g", "engine_args": list(engine_args), "env": env or {}}
    return {"name": "m", "profiles": [profile]}


def refused(engine_args=(), env=None, engine="vllm") -> list[str]:
    spec, problems = parse_definition(definition(engine_args, env, engine))
    assert (spec is None) == bool(problems)
    return problems


# The findings (#42 item 10), and the deny-list's, for every engine.
HARMFUL_ENV = ["CUDA_INJECTION64_PATH", "OPENSSL_CONF", "HF_ENDPOINT", "VLLM_PLUGINS", "LD_PRELOAD", "LD_AUDIT"]
HARMFUL_ENV += ["DYLD_INSERT_LIBRARIES", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONBREAKPOINT", "PATH"]
HARMFUL_ENV += ["NODE_OPTIONS", "BASH_ENV", "ENV", "GCONV_PATH", "VLLM_API_KEY", "API_KEY", "HOST", "PORT", "host"]
HARMFUL_ENV += ["CONFIG_FILE", "LLMGW_NNODES", "NCCL_NET_PLUGIN", "VLLM_ALLOW_INSECURE_SERIALIZATION", "LORA_PATH"]
HARMFUL_ENV += ["VLLM_LOGGING_CONFIG_PATH", "BAD=NAME", "SSL_CERT_FILE", "HTTPS_PROXY", "TRANSFORMERS_CACHE"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", HARMFUL_ENV)
def test_env_outside_the_engines_list_is_refused_by_name(engine, name):
    (problem,) = refused(env={name: "/tmp/x"}, engine=engine)
    assert problem.startswith(f"profiles[0].env.{name} is refused: "), problem


HARMFUL_ARGS = {
    "vllm": [
        ["--allowed-local-media-path", "/"],
        ["--allowed-local-media-path=/etc/ssl"],
        ["--allowed-local-media-path", "/data/../etc"],
        ["--allowed-local-media-path", "/data"],
        ["--tokenizer", "other/repo", "--trust-remote-code"],
        ["--trust-remote-code", "--tokenizer=/models/other"],
        ["--chat-template", "/etc/shadow"],
        ["--generation-config", "/models/other"],
        ["-O", '{"backend": "evil.compile"}'],
        ["--compilation-config", '{"level": 3}'],
        ["--speculative-config", '{"model": "evil/draft"}'],
        ["--hf-overrides", '{"auto_map": {}}'],
        ["--kv-transfer-config", "{}"],
        ["--host", "0.0.0.0"],
        ["--host=0.0.0.0"],
        ["--ho", "0.0.0.0"],
        ["--port", "80"],
        ["--api-key", "mine"],
        ["--api_key", "mine"],
        ["--API-KEY=mine"],
        ["--served-model-name", "other"],
        ["-tp", "8"],
        ["--middleware", "evil.App"],
        ["--tool-parser-plugin", "/tmp/evil.py"],
        ["--logits-processors", "evil.Proc"],
        ["--worker-extension-cls", "evil.Ext"],
        ["--config", "/tmp/args.yaml"],
        ["--enable-log-requests"],
        ["--enable-log-outputs"],
        ["--max-model-len", "8192\0"],
        ["--max-model-len", "lots"],
        ["--dtype", "bf16; rm -rf /"],
        ["stray"],
        ["--enforce-eager=yes"],
        ["--max-num-seqs"],
    ],
    "sglang": [
        ["--tokenizer-path", "other/repo", "--trust-remote-code"],
        ["--chat-template", "/etc/passwd"],
        ["--log-requests"],
        ["--enable-custom-logit-processor"],
        ["--api-key", "mine"],
        ["--tp-size", "8"],
        ["--config", "/tmp/x.yaml"],
    ],
    "llamacpp": [
        ["--lora_path", "/models/secret-adapter.gguf"],
        ["--hf_model_repo_id", "evil/model"],
        ["--rpc_servers", "10.0.0.9:50052"],
        ["--config_file", "/tmp/llama.json"],
        ["--ssl_certfile", "/tmp/c.pem"],
        ["--n_ctx", "lots"],
        ["--verbose", "maybe"],
    ],
}


@pytest.mark.parametrize(("engine", "args"), [(e, a) for e, cases in HARMFUL_ARGS.items() for a in cases])
def test_engine_args_outside_the_list_or_with_a_value_that_names_a_path_repo_or_code_are_refused(engine, args):
    problems = refused(engine_args=["--seed" if engine != "sglang" else "--random-seed", "1", *args], engine=engine)
    assert problems and all(p.startswith("profiles[0].engine_args[") and " is refused: " in p for p in problems)


ALLOWED = {
    "vllm": (
        [
            *("--max-model-len", "32k", "-q", "fp8", "--enforce-eager", "--no-enable-prefix-caching", "-O3"),
            *("--gpu-memory-utilization", "0.92", "--trust-remote-code", "--no-enable-log-requests"),
            *("--allowed-local-media-path", "/data/media"),
            *("--chat-template", "{% for m in messages %}{{m}}{% endfor %}"),
            *("--limit-mm-per-prompt", '{"image": 2}', "--compilation-config", "3"),
        ],
        {"PYTHONUNBUFFERED": "1", "NCCL_DEBUG": "WARN", "HF_HOME": "/models/hf", "VLLM_HOST_IP": "10.0.0.1"},
    ),
    "sglang": (
        [*("--context-length", "8192", "--mem-fraction-static", "0.85"), "--trust-remote-code", "--chat-template", "x"],
        {"NCCL_IB_HCA": "mlx5_0", "OMP_NUM_THREADS": "8"},
    ),
    "llamacpp": (
        ["--n_ctx", "4096", "--n_gpu_layers", "-1", "--flash_attn", "True", "--interrupt_requests", "True"],
        {"N_THREADS": "8", "OMP_NUM_THREADS": "2"},
    ),
}


@pytest.mark.parametrize("engine", ENGINES)
def test_tuning_is_allowed(engine):
    args, env = ALLOWED[engine]
    spec, problems = parse_definition(definition(engine_args=args, env=env, engine=engine))
    assert problems == [] and spec.profiles[0].engine_args == tuple(args)
    assert L.launch_problems(engine, args, {**env, "LLMGW_NNODES": "2", "CUDA_VISIBLE_DEVICES": "0"}, placed=True) == []


def _value(rule: L.Flag, draw) -> list[str]:
    samples = {
        L.word: "bfloat16",
        L.integer: "-1",
        L.size: "8192",
        L.number: "0.9",
        L.boolean: "False",
        L.optimization_level: "2",
        L.media_directory: "/data/media",
        L.repository_or_path: "org/name",
        L.inline_template: "{{ messages }}",
        L.template_name: "chatml",
        L.generation_config: "auto",
        L.mm_limits: '{"image": 1}',
    }
    return [] if rule.check is None else [samples[rule.check]]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(ENGINES), st.data())
def test_any_sequence_of_listed_flags_with_fitting_values_passes(engine, data):
    flags = data.draw(st.lists(st.sampled_from(sorted(L.ENGINE_FLAGS[engine])), max_size=12))
    args: list[str] = []
    for name in flags:
        rule = L.ENGINE_FLAGS[engine][name]
        if name == "enable-log-requests":
            args.append("--no-enable-log-requests")
            continue
        named = {L.flag_name(a) for a in args}
        if {name, *named} >= {"trust-remote-code"} and {name, *named} & set(L.TOKENIZER_FLAGS):
            continue  # refused together: test_engine_args_outside_the_list_or_with_a_value...
        value = _value(rule, data.draw)
        args += [f"--{name}={value[0]}"] if value and data.draw(st.booleans()) else [f"--{name}", *value]
    assert L.engine_arg_problems(engine, args) == [], args


@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from(ENGINES),
    st.from_regex(r"-{1,2}[A-Za-z][A-Za-z0-9_-]{0,30}(=[^\x00]{0,10})?", fullmatch=True),
    st.booleans(),
)
def test_any_flag_not_listed_is_refused_however_it_is_spelt(engine, arg, with_value):
    """A prefix of a refused flag, another case, '_' for '-': argparse may read any of them as something else."""
    name = L.flag_name(arg) or ""
    listed = name in L.ENGINE_FLAGS[engine] or (
        name.startswith("no-") and L.ENGINE_FLAGS[engine].get(name[3:], L.Flag()).negatable
    )
    short = not arg.startswith("--") and arg.lstrip("-").split("=")[0] in L.ALIASES.get(engine, {})
    if listed or short or (engine == "vllm" and arg.split("=")[0] in ("-O0", "-O1", "-O2", "-O3")):
        return
    problems = L.engine_arg_problems(engine, [arg, "x"] if with_value else [arg])
    assert problems and problems[0][0] == 0


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(ENGINES), st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,24}", fullmatch=True))
def test_any_variable_not_listed_is_refused(engine, name):
    assert (L.env_problem(engine, name, "x") is None) == (name in L.ENGINE_ENV[engine])


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["LD_", "DYLD_", "PYTHON", "LLMGW_", "CUDA_INJECTION"]), st.from_regex(r"[A-Z0-9_]{0,12}"))
def test_every_variable_of_a_code_loading_family_is_refused(prefix, rest):
    name = prefix + rest
    for engine in ENGINES:
        assert (L.env_problem(engine, name, "x") is None) == (name in L.PYTHON_ENV)


@pytest.mark.django_db
def test_the_api_and_the_admin_refuse_them_too():
    with pytest.raises(service.CatalogError, match=r"profiles\[0\]\.env\.CUDA_INJECTION64_PATH is refused") as no:
        service.add_model(definition(env={"CUDA_INJECTION64_PATH": "/tmp/evil.so"}), actor="t")
    assert no.value.status == 400 and not CatalogModel.objects.exists()
    model = service.add_model(definition(), actor="t")
    profile = Profile.objects.get(model=model)
    profile.engine_args = ["--allowed-local-media-path", "/"]
    with pytest.raises(ValidationError, match=r"engine_args\[1\] '/' is refused: --allowed-local-media-path must"):
        profile.full_clean()
    profile.engine_args, profile.env = [], {"OPENSSL_CONF": "/tmp/openssl.cnf"}
    with pytest.raises(ValidationError, match=r"env\.OPENSSL_CONF is refused: OpenSSL loads"):
        profile.full_clean()
