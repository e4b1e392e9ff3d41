"""The LLM port the example agents reason through, and two models behind it.

Agents in the examples never call a model directly: they hand a
:class:`LanguageModel` a list of chat messages whose last one carries the
task as JSON, and read a JSON answer back. Two models fit the port:

- :class:`ScriptedModel`, the default: deterministic from a seed, with a
  *playbook* per task that answers the way a model would, mistakes included
  (quantities in the wrong units, stale prices, overconfident explanations,
  obeying an instruction hidden in a news item). Tests and CI use only this.
- :class:`OpenAIChat`, an OpenAI-compatible chat-completions client built on
  the standard library (``urllib``), for people with an endpoint. It reads
  ``OPENAI_API_KEY``, ``OPENAI_MODEL`` and optionally ``OPENAI_BASE_URL``.

The kernel never sees either: what a model says becomes a proposal, and the
proposal is judged like any other.

Each call of :class:`OpenAIChat` is a client span named with OpenTelemetry's GenAI
semantic conventions (``chat <model>``), as an OTel GenAI instrumentation of an
SDK client would make it. The kernel makes the flow's reasoning span the current
context while ``decide()`` runs, so the call nests under it, in the flow's trace.
With ``--llm openai`` and an ``OTEL_EXPORTER_OTLP_ENDPOINT``, :func:`open_model`
installs an SDK TracerProvider as the global one (the kernel's spans go through it too),
exporting over OTLP/HTTP.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import anyio
import msgspec
from opentelemetry import trace
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv._incubating.attributes import server_attributes as server
from opentelemetry.semconv.attributes import error_attributes
from opentelemetry.trace import SpanKind, Status, StatusCode

Message = Mapping[str, str]
"""One chat message: ``{"role": "system" | "user" | "assistant", "content": ...}``."""


class Completion(msgspec.Struct, frozen=True, kw_only=True):
    """What a model answered, and what it says the answer cost."""

    text: str
    tokens: int = 0


class LanguageModel(Protocol):
    """The port: chat messages in, one completion out."""

    async def complete(self, messages: Sequence[Message]) -> Completion:
        """Answer the conversation ``messages``."""
        ...


class ModelError(Exception):
    """The model could not be reached, was not configured, or answered nonsense."""


def task_of(messages: Sequence[Message]) -> dict[str, Any]:
    """Return the JSON task carried by the last user message."""
    for message in reversed(messages):
        if message.get("role") == "user":
            try:
                task = json.loads(message.get("content", ""))
            except json.JSONDecodeError as exc:
                raise ModelError(f"the task is not JSON: {exc}") from exc
            if isinstance(task, dict):
                return task
    raise ModelError("no task in the conversation")


def answer_of(completion: Completion) -> dict[str, Any]:
    """Parse a model's answer as a JSON object, tolerating a fenced code block around it."""
    text = completion.text.strip()
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    try:
        answer = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(f"the model did not answer JSON: {exc}") from exc
    if not isinstance(answer, dict):
        raise ModelError("the model's answer is not a JSON object")
    return answer


def draw(seed: int, *parts: object) -> random.Random:
    """A random stream that depends only on the seed and the names given, never on scheduling."""
    digest = hashlib.sha256("/".join(map(str, (seed, *parts))).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


Playbook = Callable[[dict[str, Any], random.Random], dict[str, Any]]
"""How the scripted model answers one kind of task: (task, seeded draw) -> answer."""


class ScriptedModel:
    """A deterministic stand-in for an LLM: each task kind is answered by its playbook.

    The draw for a call depends on the seed and the task's ``id`` (and attempt), so
    the same run answers the same way whatever the scheduling. Token usage is a
    rough count of the words exchanged, as a real endpoint would report.
    """

    def __init__(self, seed: int, playbooks: Mapping[str, Playbook]) -> None:
        self.seed = seed
        self.playbooks = dict(playbooks)

    async def complete(self, messages: Sequence[Message]) -> Completion:
        task = task_of(messages)
        playbook = self.playbooks.get(str(task.get("task")))
        if playbook is None:
            raise ModelError(f"the scripted model has no playbook for {task.get('task')!r}")
        rng = draw(self.seed, task.get("task"), task.get("id"), task.get("attempt", 1))
        await anyio.lowlevel.checkpoint()
        text = json.dumps(playbook(task, rng), sort_keys=True)
        words = sum(len(m.get("content", "").split()) for m in messages) + len(text.split())
        return Completion(text=text, tokens=words)


class OpenAIChat:
    """An OpenAI-compatible ``/chat/completions`` client on the standard library.

    Raises:
        ModelError: at construction when ``OPENAI_API_KEY`` or ``OPENAI_MODEL`` is
            missing, and on any failed or malformed call.
    """

    def __init__(self, env: Mapping[str, str] | None = None, timeout_s: float = 60.0) -> None:
        env = os.environ if env is None else env
        missing = [name for name in ("OPENAI_API_KEY", "OPENAI_MODEL") if not env.get(name)]
        if missing:
            raise ModelError(
                f"--llm openai needs {' and '.join(missing)} in the environment"
                " (and OPENAI_BASE_URL for an endpoint other than api.openai.com)"
            )
        self.base_url = env.get("OPENAI_BASE_URL", "https://api.openai.com/v1").rstrip("/")
        self.model = env["OPENAI_MODEL"]
        self._key = env["OPENAI_API_KEY"]
        self.timeout_s = timeout_s

    async def complete(self, messages: Sequence[Message]) -> Completion:
        body = json.dumps(
            {
                "model": self.model,
                "messages": [dict(m) for m in messages],
                "temperature": 0,
                "response_format": {"type": "json_object"},
            }
        ).encode()
        request = urllib.request.Request(
            f"{self.base_url}/chat/completions",
            data=body,
            headers={"Authorization": f"Bearer {self._key}", "Content-Type": "application/json"},
        )
        url = urllib.parse.urlsplit(self.base_url)
        attributes: dict[str, str | int] = {
            gen_ai.GEN_AI_OPERATION_NAME: gen_ai.GenAiOperationNameValues.CHAT.value,
            gen_ai.GEN_AI_PROVIDER_NAME: "openai",
            gen_ai.GEN_AI_REQUEST_MODEL: self.model,
            server.SERVER_ADDRESS: url.hostname or "",
        }
        if url.port:
            attributes[server.SERVER_PORT] = url.port
        # The current context is the flow's reasoning span (set by the kernel around
        # decide()): this span is its child.
        tracer = trace.get_tracer("examples.llm")
        with tracer.start_as_current_span(
            f"chat {self.model}", kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            try:
                raw = await anyio.to_thread.run_sync(self._post, request)
                try:
                    reply = json.loads(raw)
                    text = reply["choices"][0]["message"]["content"]
                    usage = reply.get("usage", {})
                    tokens = int(usage.get("total_tokens", 0))
                except (json.JSONDecodeError, KeyError, IndexError, TypeError, ValueError) as exc:
                    raise ModelError(f"unexpected answer from {self.base_url}: {exc}") from exc
            except ModelError as exc:
                span.set_attribute(error_attributes.ERROR_TYPE, type(exc).__name__)
                span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
                raise
            span.set_attribute(gen_ai.GEN_AI_RESPONSE_MODEL, str(reply.get("model", "")))
            for key, name in (
                ("prompt_tokens", gen_ai.GEN_AI_USAGE_INPUT_TOKENS),
                ("completion_tokens", gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS),
            ):
                if isinstance(usage.get(key), int):
                    span.set_attribute(name, usage[key])
        return Completion(text=str(text), tokens=tokens)

    def _post(self, request: urllib.request.Request) -> bytes:
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as exc:
            with exc:  # the error carries the open response: read its reason, then close it
                reason = exc.read(300).decode(errors="replace")
            raise ModelError(f"{self.base_url}: HTTP {exc.code}: {reason}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise ModelError(f"{self.base_url}: {exc}") from exc


def open_model(name: str, seed: int, playbooks: Mapping[str, Playbook]) -> LanguageModel:
    """Return the model ``--llm`` names: ``scripted`` (default) or ``openai``.

    Raises:
        ModelError: for ``openai`` without its environment, or an unknown name.
    """
    if name == "scripted":
        return ScriptedModel(seed, playbooks)
    if name == "openai":
        model = OpenAIChat()
        host_tracing()
        return model
    raise ModelError(f"unknown model {name!r}; use scripted or openai")


def host_tracing(env: Mapping[str, str] | None = None) -> bool:
    """Install an SDK TracerProvider exporting over OTLP, as the global one, when
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set and the process has
    none yet; return whether spans are exported.

    What an application does once at startup: its own spans (here, the LLM calls')
    and the kernel's then go through the same provider, so they share traces. The
    exporter, the resource and the sampler read the standard ``OTEL_*`` variables.
    """
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    env = os.environ if env is None else env
    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return True
    names = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if not any(env.get(name) for name in names):
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise ModelError(
            "OTLP export needs the exporters: pip install 'dir-kernel[otlp]'"
        ) from None
    provider = TracerProvider(resource=Resource.create())  # shut down (flushed) at exit
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True


def conversation(system: str, task: Mapping[str, Any]) -> list[dict[str, str]]:
    """Build the two messages of one reasoning step: the role, then the task as JSON."""
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": json.dumps(task, sort_keys=True)},
    ]
