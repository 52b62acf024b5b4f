"""What a profile may hand its engine: an allow-list of arguments and environment, per engine.

A profile's ``engine_args`` and ``env`` reach a process on every node the
model is placed on. They may tune the engine; they may not load code of
their choosing into it, point it at files or repositories of their choosing,
undo the address and key the agent gives it (which is what keeps budgets
and rate limits in front of every engine), or make it log requests, whose
tails reach the control plane (``Shard.error``).

A deny-list of what does harm kept missing names (``CUDA_INJECTION64_PATH``,
``OPENSSL_CONF``, ``HF_ENDPOINT``, ``VLLM_PLUGINS``, ``--allowed-local-media-path /``),
and every engine release adds more; so this lists what may be set, and
everything else is refused. Where an allowed flag's value could name a path,
a remote repository or code, the value is checked too (:data:`VALUES`).
Names llmgw knows to be harmful are refused with the reason in
:data:`REFUSED_ENV` and :data:`REFUSED_FLAGS`; any other unlisted name with a
sentence saying it is not on the list.

One home for the rule, free of Django and of the control plane, so both
sides call it: the catalog when a profile is written (YAML, API, admin:
``catalog.rules.launch_problems``), and the agent before it starts an engine
(``agent.supervisor``), so a control plane that sends something else (an
older one, or one that was tampered with) still starts nothing outside it.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

# --- values -----------------------------------------------------------------------------------

Check = Callable[[str], str | None]
"""Why a flag's value is refused, or None when it may be passed."""

_WORD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,63}$")
_INT_RE = re.compile(r"^-?\d{1,12}$")
_SIZE_RE = re.compile(r"^\d{1,12}[kKmMgG]?$")  # vLLM reads --max-model-len 32k
_NUM_RE = re.compile(r"^-?(\d{1,12}(\.\d{0,12})?|\.\d{1,12})([eE]-?\d{1,3})?$")
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_BOOLS = {"true", "false", "1", "0", "yes", "no", "on", "off"}
# Top-level directories no engine may be told to read from or write to: the system's own files,
# every user's home, and where services keep their state (the agent's included).
SYSTEM_ROOTS = frozenset(
    {"bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "proc", "root", "run", "sbin", "snap"}
    | {"sys", "tmp", "usr", "var"}
)


def word(value: str) -> str | None:
    """A choice such as a dtype or a backend's name: letters, digits, '.', '_', ':', '+', '-'."""
    return None if _WORD_RE.match(value) else "must be one word (a name such as a dtype or a backend)"


def integer(value: str) -> str | None:
    return None if _INT_RE.match(value) else "must be a whole number"


def size(value: str) -> str | None:
    return None if _SIZE_RE.match(value) else "must be a whole number, or one with k, m or g"


def number(value: str) -> str | None:
    return None if _NUM_RE.match(value) else "must be a number"


def boolean(value: str) -> str | None:
    return None if value.lower() in _BOOLS else "must be True or False"


def optimization_level(value: str) -> str | None:
    """vLLM's ``-O``/``--compilation-config``: a level only. Its JSON form names a compile backend, which
    may be any importable function, so it loads code."""
    if value in ("0", "1", "2", "3"):
        return None
    return "must be an optimization level, 0 to 3: its JSON form can name code for vLLM to import"


def media_directory(value: str) -> str | None:
    """vLLM's ``--allowed-local-media-path``: every client may then have the engine read any file under it."""
    if not value.startswith("/") or posixpath.normpath(value) != value.rstrip("/") or "//" in value:
        return "must be an absolute path written plainly (no '.', '..' or '//')"
    parts = value.strip("/").split("/")
    if len(parts) < 2:
        return "must be a directory at least two levels deep: every client could read any file under it"
    if parts[0] in SYSTEM_ROOTS:
        return f"must not be under /{parts[0]}: every client could read the files there"
    return None


def repository_or_path(value: str) -> str | None:
    """A tokenizer: a Hugging Face repository (``owner/name``) or an absolute path on the node."""
    if _REPO_RE.match(value) and ".." not in value:
        return None
    if value.startswith("/") and "\0" not in value and ".." not in value.split("/"):
        return None
    return "must be a Hugging Face repository (owner/name) or an absolute path"


def inline_template(value: str) -> str | None:
    """vLLM's ``--chat-template``: the template's text. vLLM opens the value as a file first, so a path
    would have the engine read any file on the node into every prompt."""
    if ("{{" in value or "{%" in value) and not value.startswith(("/", ".", "~")):
        return None
    return "must be the template's Jinja text itself, not a file's path"


def template_name(value: str) -> str | None:
    """SGLang's ``--chat-template``: one of its built-in templates by name (a path is read as a file)."""
    if re.match(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$", value):
        return None
    return "must name one of SGLang's built-in templates (letters, digits, '_', '-'), not a file"


def generation_config(value: str) -> str | None:
    """vLLM's ``--generation-config``: ``auto`` or ``vllm`` (a folder's path is read as a file)."""
    return None if value in ("auto", "vllm") else "must be auto or vllm, not a folder's path"


def mm_limits(value: str) -> str | None:
    """vLLM's ``--limit-mm-per-prompt``: a JSON object of modality to count."""
    try:
        limits = json.loads(value)
    except ValueError:
        return "must be a JSON object of modality to count"
    if isinstance(limits, dict) and all(
        isinstance(k, str) and not word(k) and isinstance(v, int) and not isinstance(v, bool) for k, v in limits.items()
    ):
        return None
    return "must be a JSON object of modality to count"


# --- flags -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    """One argument a profile may pass: ``check`` its value's rule, or None for a flag that takes none."""

    check: Check | None = None
    negatable: bool = False
    """A boolean flag also spelt ``--no-<name>`` (argparse's BooleanOptionalAction, as vLLM's are)."""


SWITCH = Flag()
TOGGLE = Flag(negatable=True)
WORD, INT, SIZE, NUM, BOOL = Flag(word), Flag(integer), Flag(size), Flag(number), Flag(boolean)

VLLM_FLAGS: dict[str, Flag] = {
    "max-model-len": SIZE,
    "max-num-seqs": INT,
    "max-num-batched-tokens": SIZE,
    "max-num-partial-prefills": INT,
    "max-long-partial-prefills": INT,
    "max-seq-len-to-capture": INT,
    "block-size": INT,
    "seed": INT,
    "swap-space": NUM,
    "cpu-offload-gb": NUM,
    "gpu-memory-utilization": NUM,
    "kv-cache-memory": SIZE,
    "max-logprobs": INT,
    "max-loras": INT,
    "max-lora-rank": INT,
    "max-cpu-loras": INT,
    "lora-dtype": WORD,
    "dtype": WORD,
    "kv-cache-dtype": WORD,
    "quantization": WORD,
    "load-format": WORD,
    "tokenizer-mode": WORD,
    "scheduling-policy": WORD,
    "preemption-mode": WORD,
    "guided-decoding-backend": WORD,
    "structured-outputs-config.backend": WORD,
    "reasoning-parser": WORD,
    "tool-call-parser": WORD,
    "chat-template-content-format": WORD,
    "response-role": WORD,
    "uvicorn-log-level": WORD,
    "distributed-executor-backend": WORD,
    "max-parallel-loading-workers": INT,
    "num-scheduler-steps": INT,
    "rope-theta": NUM,
    "revision": WORD,
    "code-revision": WORD,
    "tokenizer-revision": WORD,
    "tokenizer": Flag(repository_or_path),
    "chat-template": Flag(inline_template),
    "generation-config": Flag(generation_config),
    "limit-mm-per-prompt": Flag(mm_limits),
    "allowed-local-media-path": Flag(media_directory),
    "compilation-config": Flag(optimization_level),
    "enforce-eager": TOGGLE,
    "enable-prefix-caching": TOGGLE,
    "enable-chunked-prefill": TOGGLE,
    "disable-custom-all-reduce": TOGGLE,
    "disable-sliding-window": TOGGLE,
    "disable-cascade-attn": TOGGLE,
    "enable-expert-parallel": TOGGLE,
    "async-scheduling": TOGGLE,
    "enable-auto-tool-choice": TOGGLE,
    "enable-lora": TOGGLE,
    "enable-log-requests": Flag(negatable=True),  # only as --no-enable-log-requests: see REFUSED_FLAGS
    "disable-log-requests": SWITCH,
    "disable-log-stats": TOGGLE,
    "calculate-kv-scales": TOGGLE,
    "trust-remote-code": TOGGLE,
    "skip-tokenizer-init": TOGGLE,
    "enable-prompt-tokens-details": TOGGLE,
    "disable-fastapi-docs": TOGGLE,
}
# Short spellings argparse reads as the long ones.
VLLM_ALIASES = {"q": "quantization", "O": "compilation-config"}

SGLANG_FLAGS: dict[str, Flag] = {
    "context-length": INT,
    "mem-fraction-static": NUM,
    "max-running-requests": INT,
    "max-total-tokens": INT,
    "max-prefill-tokens": INT,
    "chunked-prefill-size": INT,
    "schedule-policy": WORD,
    "schedule-conservativeness": NUM,
    "stream-interval": INT,
    "random-seed": INT,
    "dtype": WORD,
    "kv-cache-dtype": WORD,
    "quantization": WORD,
    "load-format": WORD,
    "tokenizer-mode": WORD,
    "revision": WORD,
    "tokenizer-path": Flag(repository_or_path),
    "chat-template": Flag(template_name),
    "attention-backend": WORD,
    "sampling-backend": WORD,
    "grammar-backend": WORD,
    "tool-call-parser": WORD,
    "reasoning-parser": WORD,
    "log-level": WORD,
    "cuda-graph-max-bs": INT,
    "torch-compile-max-bs": INT,
    "max-loras-per-batch": INT,
    "max-lora-rank": INT,
    "lora-backend": WORD,
    "ep-size": INT,
    "disable-radix-cache": SWITCH,
    "disable-cuda-graph": SWITCH,
    "enable-torch-compile": SWITCH,
    "enable-mixed-chunk": SWITCH,
    "enable-dp-attention": SWITCH,
    "enable-metrics": SWITCH,
    "trust-remote-code": SWITCH,
    "skip-tokenizer-init": SWITCH,
}

# llama-cpp-python's server takes every setting as ``--name value``, booleans as True/False.
LLAMACPP_FLAGS: dict[str, Flag] = {
    **dict.fromkeys(
        ("n-gpu-layers", "split-mode", "main-gpu", "seed", "n-ctx", "n-batch", "n-ubatch", "n-threads"), INT
    ),
    **dict.fromkeys(("n-threads-batch", "rope-scaling-type", "yarn-orig-ctx", "last-n-tokens-size"), INT),
    **dict.fromkeys(("cache-size", "type-k", "type-v", "draft-model-num-pred-tokens"), INT),
    **dict.fromkeys(("rope-freq-base", "rope-freq-scale", "yarn-ext-factor", "yarn-attn-factor"), NUM),
    **dict.fromkeys(("yarn-beta-fast", "yarn-beta-slow"), NUM),
    **dict.fromkeys(("use-mmap", "use-mlock", "mul-mat-q", "logits-all", "embedding", "offload-kqv"), BOOL),
    **dict.fromkeys(("flash-attn", "numa", "cache", "verbose", "interrupt-requests", "disable-ping-events"), BOOL),
    "chat-format": WORD,
    "cache-type": WORD,
    "draft-model": WORD,
}

ENGINE_FLAGS: dict[str, dict[str, Flag]] = {"vllm": VLLM_FLAGS, "sglang": SGLANG_FLAGS, "llamacpp": LLAMACPP_FLAGS}
ALIASES: dict[str, dict[str, str]] = {"vllm": VLLM_ALIASES}
# A tokenizer named apart from the model, with remote code trusted, runs that repository's (or folder's) code.
TOKENIZER_FLAGS = ("tokenizer", "tokenizer-path")

REFUSED_FLAGS = {
    "host": "the agent binds the engine to the node's advertised address",
    "port": "the agent chooses the port",
    "api-key": "the agent gives the engine the replica's key",
    "admin-api-key": "the agent gives the engine the replica's key",
    "uds": "the engine must listen where the gateway can reach it, with the key",
    "ssl-keyfile": "the gateway speaks plain HTTP to engines on the node network",
    "ssl-certfile": "the gateway speaks plain HTTP to engines on the node network",
    "config": "the engine then reads its arguments from a file, address and key included",
    "config-file": "the engine then reads its settings from a file, address and key included",
    "model": "the agent gives the engine the model's weights",
    "model-path": "the agent gives the engine the model's weights",
    "model-alias": "the agent names the model as the catalog does",
    "served-model-name": "the agent names the model as the catalog does",
    "tensor-parallel-size": "set tp in the profile",
    "tp": "set tp in the profile",
    "tp-size": "set tp in the profile",
    "pipeline-parallel-size": "set pp in the profile",
    "pp": "set pp in the profile",
    "pp-size": "set pp in the profile",
    "middleware": "it imports code into the engine's server",
    "tool-parser-plugin": "it runs a Python file in the engine",
    "reasoning-parser-plugin": "it runs a Python file in the engine",
    "logits-processors": "it imports code into the engine",
    "worker-cls": "it imports code into the engine",
    "worker-extension-cls": "it imports code into the engine",
    "speculative-config": "it names a draft model to download and load, and code to run with it",
    "kv-transfer-config": "it names a connector module for the engine to import",
    "hf-overrides": "it rewrites the model's config, which with remote code chooses the code to run",
    "enable-custom-logit-processor": "it lets every client send code for the engine to run",
    "enable-log-requests": "the engine would log prompts, and its log reaches the control plane",
    "enable-log-outputs": "the engine would log completions, and its log reaches the control plane",
    "log-requests": "the engine would log prompts, and its log reaches the control plane",
    "log-requests-level": "the engine would log prompts, and its log reaches the control plane",
    "lora-path": "it serves an adapter for the base model's name and price, past the catalog's allow-list",
    "lora-paths": "the agent gives the engine the catalog's adapters",
    "lora-modules": "the agent gives the engine the catalog's adapters",
    "lora-base": "the agent gives the engine the model's weights",
    "hf-model-repo-id": "the engine would download a model of the profile's choosing",
    "hf-pretrained-model-name-or-path": "the engine would download a tokenizer of the profile's choosing",
    "rpc-servers": "the engine would send the model to servers of the profile's choosing",
}


# --- environment -------------------------------------------------------------------------------

# Python reads these and runs nothing.
PYTHON_ENV = frozenset(
    {"PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING"}
    | {"PYTHONUTF8", "PYTHONWARNDEFAULTENCODING", "PYTHONNODEBUGRANGES"}
)
_NCCL_TUNING = """
DEBUG DEBUG_SUBSYS SOCKET_IFNAME SOCKET_FAMILY SOCKET_NTHREADS NSOCKS_PERTHREAD IB_HCA IB_DISABLE IB_GID_INDEX
IB_TIMEOUT IB_RETRY_CNT IB_QPS_PER_CONNECTION IB_TC IB_SL IB_ADAPTIVE_ROUTING P2P_DISABLE P2P_LEVEL SHM_DISABLE
NET_GDR_LEVEL NET_GDR_READ CUMEM_ENABLE NVLS_ENABLE MNNVL_ENABLE ALGO PROTO MIN_NCHANNELS MAX_NCHANNELS BUFFSIZE
CROSS_NIC IGNORE_CPU_AFFINITY LAUNCH_MODE ASYNC_ERROR_HANDLING BLOCKING_WAIT COLLNET_ENABLE NET
"""
# NCCL's tuning, by name: its *_PLUGIN and CONF_FILE variables load libraries (REFUSED_ENV).
NCCL_ENV = frozenset(f"NCCL_{n}" for n in _NCCL_TUNING.split())
COMMON_ENV = (
    PYTHON_ENV
    | NCCL_ENV
    | {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_LAUNCH_BLOCKING", "CUDA_DEVICE_MAX_CONNECTIONS"}
    | {"CUDA_MODULE_LOADING", "PYTORCH_CUDA_ALLOC_CONF", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_CUDA_ARCH_LIST"}
    | {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"}
    | {"HF_HOME", "HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"}
    | {"HF_HUB_ENABLE_HF_TRANSFER", "HF_HUB_DOWNLOAD_TIMEOUT", "HF_HUB_ETAG_TIMEOUT", "TZ", "LANG", "LC_ALL"}
)
ENGINE_ENV: dict[str, frozenset[str]] = {
    "vllm": COMMON_ENV
    | {"VLLM_HOST_IP", "VLLM_LOGGING_LEVEL", "VLLM_ATTENTION_BACKEND", "VLLM_USE_V1", "VLLM_WORKER_MULTIPROC_METHOD"}
    | {"VLLM_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_ENGINE_ITERATION_TIMEOUT_S", "VLLM_USE_DEEP_GEMM", "VLLM_RPC_TIMEOUT"}
    | {"VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "VLLM_IMAGE_FETCH_TIMEOUT"}
    | {"VLLM_VIDEO_FETCH_TIMEOUT", "VLLM_AUDIO_FETCH_TIMEOUT", "VLLM_SKIP_P2P_CHECK", "VLLM_DISABLE_COMPILE_CACHE"}
    | {"VLLM_ALL2ALL_BACKEND", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_FUSED_MOE_CHUNK_SIZE"}
    | {"VLLM_MARLIN_USE_ATOMIC_ADD"},
    "sglang": COMMON_ENV
    | {"SGLANG_ENABLE_JIT_DEEPGEMM", "SGL_ENABLE_JIT_DEEPGEMM", "SGLANG_DISABLE_OUTLINES_DISK_CACHE"}
    | {"SGLANG_SET_CPU_AFFINITY", "SGLANG_ENABLE_TORCH_INFERENCE_MODE"},
    # llama-cpp-python's server reads each of its settings from the variable of its name too.
    "llamacpp": COMMON_ENV | {name.replace("-", "_").upper() for name in LLAMACPP_FLAGS},
}
# What placement itself puts in a shard's environment (placement/scheduling/gpus.shard_env): the agent
# takes these from the control plane; a profile may not set the LLMGW_ ones.
PLACEMENT_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NCCL_MNNVL_ENABLE"}) | {
    "LLMGW_NODE_RANK",
    "LLMGW_NNODES",
    "LLMGW_MASTER_NODE",
}

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
REFUSED_ENV = {
    "LD_PRELOAD": "the dynamic linker loads the libraries it names",
    "LD_LIBRARY_PATH": "the dynamic linker loads libraries from it",
    "PATH": "chooses which programs run, the engine itself included",
    "PYTHONPATH": "Python loads code from it",
    "PYTHONSTARTUP": "Python runs the file it names",
    "PYTHONHOME": "Python loads its library from it",
    "CUDA_INJECTION64_PATH": "CUDA loads the library it names into every process that uses a GPU",
    "CUDA_INJECTION32_PATH": "CUDA loads the library it names into every process that uses a GPU",
    "OPENSSL_CONF": "OpenSSL loads the engines and providers its file names",
    "OPENSSL_MODULES": "OpenSSL loads providers from it",
    "HF_ENDPOINT": "the engine would download from a server of the profile's choosing",
    "HF_HUB_CACHE": "the engine would read models and code from a folder of the profile's choosing",
    "VLLM_PLUGINS": "vLLM loads the plugins it names",
    "VLLM_USE_MODELSCOPE": "the engine would download from another hub",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "vLLM would unpickle what it is sent, which runs code",
    "VLLM_LOGGING_CONFIG_PATH": "a logging configuration can name classes for Python to import",
    "VLLM_NCCL_SO_PATH": "vLLM loads the library it names",
    "VLLM_SERVER_DEV_MODE": "it opens the engine's development endpoints",
    "VLLM_API_KEY": "the agent sets the replica's key itself",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "the agent sets it when the model has adapters",
    "NCCL_NET_PLUGIN": "NCCL loads the library it names",
    "NCCL_TUNER_PLUGIN": "NCCL loads the library it names",
    "NCCL_PROFILER_PLUGIN": "NCCL loads the library it names",
    "NCCL_CONF_FILE": "NCCL reads settings from it, plugins included",
    "NODE_OPTIONS": "loads code into Node.js",
    "BASH_ENV": "names a script every bash runs",
    "ENV": "names a script every sh runs",
    "API_KEY": "llama.cpp's server takes its key from it, which the agent sets",
    "HOST": "llama.cpp's server listens where it says, over the address the agent gives",
    "PORT": "llama.cpp's server listens where it says, over the port the agent gives",
    "CONFIG_FILE": "llama.cpp's server then takes every setting from that file, address and key included",
    "LORA_PATH": "llama.cpp's server serves the adapter it names for the base model's name and price",
}
REFUSED_ENV_PREFIXES = {
    "LD_": "the dynamic linker loads libraries by it",
    "DYLD_": "the dynamic linker loads libraries by it",
    "PYTHON": "Python loads code or chooses where code comes from by it",
    "LLMGW_": "it is reserved for what placement tells the agent",
}


# --- the rule ----------------------------------------------------------------------------------


def env_problem(engine: str, name: str, value: str, *, placed: bool = False) -> str | None:
    """Why ``name`` may not be in ``engine``'s environment; None when it may.

    ``placed``: the environment comes from placement (the agent's check), so placement's own
    names (:data:`PLACEMENT_ENV`) are allowed too.
    """
    if not ENV_NAME_RE.match(name):
        return "is not a variable name (letters, digits and '_', not starting with a digit)"
    if "\0" in value:
        return "holds a NUL character, which no environment can carry"
    if name in ENGINE_ENV.get(engine, COMMON_ENV) or (placed and name in PLACEMENT_ENV):
        return None
    upper = name.upper()
    if upper in REFUSED_ENV:
        return REFUSED_ENV[upper]
    for prefix, why in REFUSED_ENV_PREFIXES.items():
        if upper.startswith(prefix):
            return why
    return f"is not a variable llmgw lets a profile set for {engine} (the list: docs/operations.md)"


def flag_name(arg: str) -> str | None:
    """``--Api_Key=x`` → ``api-key``; None for a value rather than a flag (``-1`` included)."""
    if not arg.startswith("-") or arg in ("-", "--") or arg[1:2].isdigit() or arg[1:2] == ".":
        return None
    return arg.lstrip("-").split("=", 1)[0].replace("_", "-").lower()


def _flag(engine: str, arg: str) -> tuple[str, Flag | None, bool]:
    """(the flag's name, its rule or None when not allowed, whether it was spelt ``--no-<name>``)."""
    flags = ENGINE_FLAGS.get(engine, {})
    raw = arg.split("=", 1)[0]
    if not raw.startswith("--"):
        short = raw.lstrip("-")
        if engine == "vllm" and re.match(r"^O\d$", short):  # vLLM's -O3
            return "compilation-config", Flag(), False
        long = ALIASES.get(engine, {}).get(short)
        return (long, flags.get(long), False) if long else (short.lower(), None, False)
    name = flag_name(arg) or ""
    if name in flags:
        return name, flags[name], False
    base = name.removeprefix("no-")
    if base != name and base in flags and flags[base].negatable:
        return name, Flag(), True
    return name, None, False


def _refused_flag(engine: str, name: str) -> str:
    if name in REFUSED_FLAGS:
        return REFUSED_FLAGS[name]
    return f"is not an argument llmgw lets a profile pass to {engine} (the list: docs/operations.md)"


def engine_arg_problems(engine: str, args: Iterable[str]) -> list[tuple[int, str]]:
    """(index, why) for each of ``args`` that ``engine`` may not be given: not an allowed flag, a value
    an allowed flag may not take, or a word that is no flag's value."""
    args = list(args)
    problems: list[tuple[int, str]] = []
    seen: set[str] = set()
    i = 0
    while i < len(args):
        arg = args[i]
        if "\0" in arg:
            problems.append((i, "holds a NUL character, which no command line can carry"))
            i += 1
            continue
        if flag_name(arg) is None:
            problems.append((i, "is not a flag, nor the value of the flag before it"))
            i += 1
            continue
        name, rule, negated = _flag(engine, arg)
        given = arg.split("=", 1)[1] if "=" in arg else None
        if rule is None:
            problems.append((i, _refused_flag(engine, name)))
            # The refused flag's value, if it has one, is not reported again.
            i += 2 if given is None and i + 1 < len(args) and flag_name(args[i + 1]) is None else 1
            continue
        if name == "enable-log-requests" and not negated:
            problems.append((i, REFUSED_FLAGS[name]))
            i += 1
            continue
        seen.add(name)
        if rule.check is None:
            if given is not None:
                problems.append((i, "takes no value"))
            i += 1
            continue
        if given is None:
            if i + 1 >= len(args):
                problems.append((i, "needs a value after it"))
                break
            i += 1
            given = args[i]
        why = rule.check(given)
        if why:
            problems.append((i, f"{arg.split('=', 1)[0]} {why}"))
        i += 1
    if "trust-remote-code" in seen and seen.intersection(TOKENIZER_FLAGS):
        at = next(n for n, a in enumerate(args) if (flag_name(a) or "") in TOKENIZER_FLAGS)
        problems.append(
            (at, "with --trust-remote-code, a tokenizer from anywhere but the model runs that repository's code")
        )
    return problems


def launch_problems(
    engine: str, engine_args: Iterable[str], env: Mapping[str, str], where: str = "", *, placed: bool = False
) -> list[str]:
    """What a profile's ``engine_args`` and ``env`` may not say to ``engine``, each naming the entry at fault.

    ``where`` prefixes each field's path (``profiles[0].``); ``placed`` as :func:`env_problem`.
    """
    args = list(engine_args)
    problems = [
        f"{where}engine_args[{i}] {args[i][:80]!r} is refused: {why}" for i, why in engine_arg_problems(engine, args)
    ]
    for name, value in env.items():
        why = env_problem(engine, name, value, placed=placed)
        if why:
            problems.append(f"{where}env.{name[:80]} is refused: {why}")
    return problems
